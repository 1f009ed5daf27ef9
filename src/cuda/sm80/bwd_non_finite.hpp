#pragma once
// NaN and Inf in the blocks the mask cuts through, sm80 backward (both kernels). A hidden
// (query, key) pair has P = dS = 0 there (a select, so a NaN S or dP never gets in), but the
// products still multiply that 0 by the pair's rows: dV += P^T dO and dK += dS^T Q by the
// query's dO and Q rows, dQ += dS K by the key's K row, and 0 * NaN = NaN. So:
//  - Q and dO, in those blocks only, once S and dP are done: their NaN/Inf chunks are zeroed
//    (common/non_finite_rows.hpp) before dK and dV. No row marks are needed: such a row's S
//    or dP is already non-finite at its visible pairs, so P or dS is NaN there, and
//    P += 0 * dsum carries a non-finite dsum (a non-finite dO row) into P, so that dV of the
//    keys a NaN dO row sees stays NaN although that row is now zero.
//  - K, once per CTA whose key block has such blocks: its NaN chunks are zeroed before the
//    loop. A row that sees such a key had a NaN score in the forward, hence a NaN lse, so its
//    P is NaN whatever S is. Inf chunks stay: a -Inf score (weight 0) at a visible key would
//    otherwise get a wrong finite P; 0 * Inf at a hidden pair still gives NaN there.
#include <cmath>
#include <cstdint>

#include "common/mask.hpp"
#include "cuda/common/non_finite_rows.hpp"
#include "cuda/sm80/bwd_p_ds.hpp"
#include "cuda/sm80/bwd_warp_gemm.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

// Zeroes the chunks of rows [0, kRows) of the shared matrix `tile` (layout Mat) that hold NaN
// or Inf (kWithInf) or NaN only, the CTA's threads sharing the chunks (the caller's barrier
// makes the zeros visible).
template <class Tr, class Mat, int kRows, bool kWithInf, class Element>
__device__ __forceinline__ void zero_non_finite(Element* tile) {
#pragma unroll 1
  for (int idx = threadIdx.x; idx < kRows * Tr::kChunksPerRow; idx += Tr::kThreads) {
    uint4* const chunk =
        reinterpret_cast<uint4*>(tile + Mat::offset(idx / Tr::kChunksPerRow,
                                                    idx % Tr::kChunksPerRow * 8));
    if (kWithInf ? chunk_non_finite<Element>(*chunk) : chunk_has_nan<Element>(*chunk))
      *chunk = make_uint4(0, 0, 0, 0);
  }
}

// mask_p_ds (bwd_p_ds.hpp), and P += 0 * dsum of the row: a non-finite dO row has a
// non-finite dsum (rowsum(dO * O); Inf * 0 is NaN too), which makes its P NaN. Hidden pairs
// are then made 0 again by the mask (it runs after).
template <int MT, int NT>
__device__ __forceinline__ void mask_p_ds_keep_nan(float (&acc_s)[MT][NT][4],
                                                   float (&acc_dp)[MT][NT][4],
                                                   const float (&dsum)[MT][2],
                                                   const WindowMask& mask, int m0, int row0,
                                                   int n0, int col0, int block_n) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] += 0.f * dsum[mt][e / 2];
  mask_p_ds(acc_s, acc_dp, mask, m0, row0, n0, col0, block_n);
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
