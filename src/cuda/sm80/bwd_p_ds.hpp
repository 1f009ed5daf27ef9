#pragma once
// The element-wise step of the sm80 backward, in registers on the S and dP accumulators of a
// warp (the layout of bwd_warp_gemm.hpp):
//   P  = exp2(S * scale_log2 - lse_log2)          (softcap: S -> c tanh(S scale / c))
//   dS = P (dP - dsum)                             (softcap: dS *= 1 - tanh^2, the chain rule)
// invisible pairs (mask rule, rows past seqlen_q, keys past seqlen_k) exactly 0; then P and dS
// rounded to the element type (as FlashAttention does) into shared memory for the products
// that read them transposed (dV = P^T dO, dK = dS^T Q) or by rows (dQ = dS K).
#include <cmath>
#include <cstdint>

#include "common/mask.hpp"
#include "cuda/common/fast_exp2.hpp"
#include "cuda/sm80/bwd_warp_gemm.hpp"
#include "cuda/sm80/mma_ptx.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

// acc_s -> P, acc_dp -> dS in place. lse / dsum: this thread's rows (acc_row(mt, h)).
// lse_log2 is +inf for rows past the sequence and rows with no visible key, so P = 0 there.
template <bool kSoftcap, int MT, int NT>
__device__ __forceinline__ void p_ds_in_registers(float (&acc_s)[MT][NT][4], float (&acc_dp)[MT][NT][4],
                                                  const float (&lse)[MT][2], const float (&dsum)[MT][2],
                                                  float scale_log2, float softcap_in_scale) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        float s2, dtanh = 1.f;
        if constexpr (kSoftcap) {
          const float th = tanhf(acc_s[mt][nt][e] * softcap_in_scale);
          s2 = th * scale_log2;
          dtanh = 1.f - th * th;
        } else {
          s2 = acc_s[mt][nt][e] * scale_log2;
        }
        const float pv = fast_exp2(s2 - lse[mt][h]);
        acc_s[mt][nt][e] = pv;
        acc_dp[mt][nt][e] = pv * (acc_dp[mt][nt][e] - dsum[mt][h]) * dtanh;
      }
}

// Zeroes P and dS of the pairs the mask hides in the warp tile at query rows m0 + row0 + ...,
// keys n0 + col0 + ... of a block of block_n keys (run only on blocks the mask cuts).
template <int MT, int NT>
__device__ __forceinline__ void mask_p_ds(float (&acc_s)[MT][NT][4], float (&acc_dp)[MT][NT][4],
                                          const WindowMask& mask, int m0, int row0, int n0,
                                          int col0, int block_n) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + row0 + acc_row(mt, h);
      int first = 0, last = -1;  // rows past seqlen_q see nothing
      if (row < mask.seqlen_q) mask.row_window(row, n0, block_n, first, last);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const int col = col0 + acc_col(nt, e2);
          if (col < first || col > last) {
            acc_s[mt][nt][2 * h + e2] = 0.f;
            acc_dp[mt][nt][2 * h + e2] = 0.f;
          }
        }
    }
}

// Writes the warp tile (rows row0 + ..., cols col0 + ...) of acc into the shared matrix
// `dst` (layout Mat) in the element type, two neighbouring columns per 32-bit store. row0 is a
// multiple of 16 and col0 of 8 NT (the warp grids of bwd_main_traits.hpp), so a thread's rows
// all have r & 7 = g and, NT being a power of two, its chunk in column tile nt is
// (col0 / 8 + nt) ^ g = (col0 / 8 ^ g) ^ nt: NT addresses per thread, the rows fixed offsets
// from them (no per-store swizzle arithmetic). Other NT on a swizzled matrix: per store.
template <class Mat, class Element, int MT, int NT>
__device__ __forceinline__ void store_acc(Element* dst, const float (&acc)[MT][NT][4], int row0,
                                          int col0) {
  const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
  if constexpr (Mat::kSwizzled && (NT & (NT - 1)) != 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<std::uint32_t*>(
              dst + Mat::offset(row0 + mt * 16 + h * 8 + g, col0 + nt * 8 + 2 * t)) =
              pack2<Element>(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
  } else {
    Element* const row = dst + (row0 + g) * Mat::kLd + 2 * t;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      Element* const col = row + (Mat::kSwizzled ? ((col0 / 8 ^ g) ^ nt) * 8 : col0 + nt * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<std::uint32_t*>(col + (mt * 16 + h * 8) * Mat::kLd) =
              pack2<Element>(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
    }
  }
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
