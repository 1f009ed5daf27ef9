#pragma once
// NaN and Inf in the blocks the mask cuts through, sm80 backward (both kernels). A hidden
// (query, key) pair has P = dS = 0 there, but the products still multiply that 0 by the
// pair's rows: dV += P^T dO and dK += dS^T Q by the query's dO and Q rows, dQ += dS K by the
// key's K row, and 0 * NaN = NaN. In those blocks only, the kernels zero the non-finite
// chunks of the operand in shared memory (common/non_finite_rows.hpp) and
//  - Q, dO (per query block): mark the rows; a marked row gets P = dS = NaN at its visible
//    pairs, so the keys it sees (and its dq) still come out NaN, as without the zeroing;
//  - K (main kernel, for dQ only): zero the marked rows just for the dQ product and reload
//    them from global memory afterwards (S = Q K^T of later blocks needs the real values).
#include <cmath>
#include <cstdint>

#include "common/mask.hpp"
#include "cuda/common/non_finite_rows.hpp"
#include "cuda/sm80/bwd_warp_gemm.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

// Marks the rows of the shared matrix `tile` (layout Mat, rows [0, kRows), the CTA's
// threads sharing the chunks) that hold NaN or Inf in row_bits and, with kZero, zeroes those
// chunks. Returns whether this thread found any (the caller's barrier makes the zeros and
// marks visible).
template <class Tr, class Mat, int kRows, bool kZero, class Element>
__device__ __forceinline__ bool mark_non_finite_rows(Element* tile, std::uint32_t* row_bits) {
  bool found = false;
#pragma unroll 1
  for (int idx = threadIdx.x; idx < kRows * Tr::kChunksPerRow; idx += Tr::kThreads) {
    const int r = idx / Tr::kChunksPerRow, c = idx % Tr::kChunksPerRow * 8;
    if constexpr (kZero) {
      found |= zero_non_finite_chunk<Element>(tile + Mat::offset(r, c), r, row_bits);
    } else if (chunk_non_finite<Element>(
                   *reinterpret_cast<const uint4*>(tile + Mat::offset(r, c)))) {
      atomicOr(row_bits + r / 32, 1u << (r % 32));
      found = true;
    }
  }
  return found;
}

// Whether row r (block-relative) is marked.
__device__ __forceinline__ bool row_marked(const std::uint32_t* row_bits, int r) {
  return (row_bits[r / 32] >> (r % 32) & 1u) != 0;
}

// Whether any row is marked (kWords words of marks).
template <int kWords>
__device__ __forceinline__ bool any_marked(const std::uint32_t* row_bits) {
  std::uint32_t any = 0;
#pragma unroll
  for (int w = 0; w < kWords; ++w) any |= row_bits[w];
  return any != 0;
}

// P = dS = NaN at the visible pairs of the marked query rows of the warp tile (rows
// m0 + row0 + ..., keys n0 + col0 + ... of a block of block_n keys).
template <int MT, int NT>
__device__ __forceinline__ void nan_marked_rows(float (&acc_s)[MT][NT][4],
                                                float (&acc_dp)[MT][NT][4],
                                                const WindowMask& mask, int m0, int row0, int n0,
                                                int col0, int block_n,
                                                const std::uint32_t* row_bits) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + acc_row(mt, h);
      if (!row_marked(row_bits, r) || m0 + r >= mask.seqlen_q) continue;
      int first, last;
      mask.row_window(m0 + r, n0, block_n, first, last);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const int col = col0 + acc_col(nt, e2);
          if (col >= first && col <= last)
            acc_s[mt][nt][2 * h + e2] = acc_dp[mt][nt][2 * h + e2] = NAN;
        }
    }
}

// Zeroes the marked rows of the shared kRows x kHeadDim matrix `tile`.
template <class Tr, class Mat, int kRows, class Element>
__device__ __forceinline__ void zero_marked_rows(Element* tile, const std::uint32_t* row_bits) {
  for (int idx = threadIdx.x; idx < kRows * Tr::kChunksPerRow; idx += Tr::kThreads) {
    const int r = idx / Tr::kChunksPerRow, c = idx % Tr::kChunksPerRow * 8;
    if (row_marked(row_bits, r))
      *reinterpret_cast<uint4*>(tile + Mat::offset(r, c)) = make_uint4(0, 0, 0, 0);
  }
}

// Reloads the marked rows of `tile` from global memory (rows [0, rows) x cols [0, cols) at
// src; the marked rows are all inside, zero-filled ones are never marked).
template <class Tr, class Mat, int kRows, class Element>
__device__ __forceinline__ void reload_marked_rows(Element* tile, const Element* src,
                                                   std::int64_t row_stride, int cols,
                                                   const std::uint32_t* row_bits) {
  for (int idx = threadIdx.x; idx < kRows * Tr::kHeadDim; idx += Tr::kThreads) {
    const int r = idx / Tr::kHeadDim, c = idx % Tr::kHeadDim;
    if (row_marked(row_bits, r) && c < cols) tile[Mat::offset(r, c)] = src[r * row_stride + c];
  }
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
