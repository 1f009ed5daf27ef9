#pragma once
// The steps the main backward kernel and the deterministic dq kernel share, on one pair of a
// query block (Q, dO, lse_log2, dsum) and a key block (K, V) held in shared memory:
//   s_dp_products: S = Q K^T and dP = dO V^T, fp32, to shared memory;
//   p_ds:          P = exp2(S * scale_log2 - lse_log2)   (softcap: s = c tanh(x / c))
//                  dS = P (dP - dsum)                    (softcap: dS *= 1 - tanh^2)
//                  element-wise, invisible or out-of-range pairs exactly 0, rounded to the
//                  dtype (as FlashAttention does) for the products that follow;
//   dq_tile:       one 16 x 16 tile of dS K.
// The products are warp-level mma.sync (WMMA 16x16x16, fp16/bf16 in, fp32 out).
#include <mma.h>

#include "common/mask.hpp"
#include "cuda/sm80/bwd_traits.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

namespace wmma = nvcuda::wmma;
using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Each warp owns kSTilesPerWarp consecutive 16 x 16 tiles of S and dP (64 x 64: query-row
// tile warp / 2, key tiles 2 (warp % 2) + {0, 1}).
template <class Tr, class T>
__device__ __forceinline__ void s_dp_products(const BwdSmem<Tr, T>& sm) {
  constexpr int kKeyTiles = Tr::kBlockN / 16;
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int cc = 0; cc < Tr::kSTilesPerWarp; ++cc) {
    const int t = warp * Tr::kSTilesPerWarp + cc;
    const int srt = t / kKeyTiles, sct = t % kKeyTiles;
    AccFrag acc_s, acc_dp;
    wmma::fill_fragment(acc_s, 0.f);
    wmma::fill_fragment(acc_dp, 0.f);
#pragma unroll
    for (int kk = 0; kk < Tr::kDim / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bt;
      wmma::load_matrix_sync(a, sm.q + srt * 16 * Tr::kLd + kk * 16, Tr::kLd);
      wmma::load_matrix_sync(bt, sm.k + sct * 16 * Tr::kLd + kk * 16, Tr::kLd);
      wmma::mma_sync(acc_s, a, bt, acc_s);
      wmma::load_matrix_sync(a, sm.dout + srt * 16 * Tr::kLd + kk * 16, Tr::kLd);
      wmma::load_matrix_sync(bt, sm.v + sct * 16 * Tr::kLd + kk * 16, Tr::kLd);
      wmma::mma_sync(acc_dp, a, bt, acc_dp);
    }
    wmma::store_matrix_sync(sm.s + srt * 16 * Tr::kLdS + sct * 16, acc_s, Tr::kLdS,
                            wmma::mem_row_major);
    wmma::store_matrix_sync(sm.dp + srt * 16 * Tr::kLdS + sct * 16, acc_dp, Tr::kLdS,
                            wmma::mem_row_major);
  }
}

// P (when kWithP: the main kernel needs it for dV, the dq kernel does not) and dS of query
// rows [m0, m0 + kBlockM) x keys [n0, n0 + kBlockN) of a sequence with sq queries; the mask
// also drops keys past the sequence's seqlen_k.
template <class Tr, bool kWithP, class T>
__device__ __forceinline__ void p_ds(const BwdKernelParams& kp, const WindowMask& mask, int m0,
                                     int n0, int sq, const BwdSmem<Tr, T>& sm) {
  constexpr int BN = Tr::kBlockN;
  const bool softcap = kp.p.softcap > 0.f;
  for (int idx = threadIdx.x; idx < Tr::kBlockM * BN; idx += Tr::kThreads) {
    const int i = idx / BN, j = idx % BN;
    const int row = m0 + i, col = n0 + j;
    float pv = 0.f, ds = 0.f;
    if (row < sq && mask.visible(row, col)) {
      const float x = sm.s[i * Tr::kLdS + j];
      float t = 0.f, s2;
      if (softcap) {
        t = tanhf(x * kp.softcap_in_scale);
        s2 = t * kp.scale_log2;
      } else {
        s2 = x * kp.scale_log2;
      }
      pv = exp2f(s2 - sm.lse[i]);
      ds = pv * (sm.dp[i * Tr::kLdS + j] - sm.dsum[i]);
      if (softcap) ds *= 1.f - t * t;
    }
    if constexpr (kWithP) sm.p[i * Tr::kLdP + j] = from_f<T>(pv);
    sm.ds[i * Tr::kLdP + j] = from_f<T>(ds);
  }
}

// acc += dS[query-row tile rt, :] K[:, col .. col + 16): one 16 x 16 tile of dQ (unscaled).
template <class Tr, class T>
__device__ __forceinline__ void dq_tile(const BwdSmem<Tr, T>& sm, int rt, int col, AccFrag& acc) {
#pragma unroll
  for (int kk = 0; kk < Tr::kBlockN / 16; ++kk) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bm;
    wmma::load_matrix_sync(a, sm.ds + rt * 16 * Tr::kLdP + kk * 16, Tr::kLdP);
    wmma::load_matrix_sync(bm, sm.k + kk * 16 * Tr::kLd + col, Tr::kLd);
    wmma::mma_sync(acc, a, bm, acc);
  }
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
