#pragma once
// The deterministic backward's dQ: one CTA per (query block of kBlockM rows, query head,
// batch), padded or varlen. Q, dO, lse_log2 and dsum of the block stay in shared memory; the
// CTA walks the key blocks its rows can see (the mask policy's n_blocks, the same bounds as
// the forward) in increasing order, recomputes S, dP and dS (bwd_tile_math.hpp) and adds
// dS K into dQ accumulators held in registers. With no atomics and a fixed order the sums
// are bitwise identical run to run; the rows are written once, dq = dQ * scale.
// Why recompute instead of a per-key-block dQ workspace reduced in order: the workspace would
// be (key blocks) x the size of dq in fp32, and a semaphore-ordered accumulation can stall
// (CTAs are not scheduled in any guaranteed order); recomputing costs the two products
// S = Q K^T and dP = dO V^T again (the main kernel then skips its dQ product and atomics).
#include <cstdint>

#include "common/mask.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm80/bwd_non_finite.hpp"
#include "cuda/sm80/bwd_tile_math.hpp"
#include "cuda/sm80/bwd_traits.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

template <class T, int kHeadDim>
__global__ void __launch_bounds__(BwdTraits<T, kHeadDim>::kThreads)
    bwd_dq_deterministic(const BwdKernelParams kp) {
  using Tr = BwdTraits<T, kHeadDim>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  const BackwardParams& p = kp.p;
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdSmem<Tr, T> sm(smem);

  const int m_block = blockIdx.x, hq = blockIdx.y, b = blockIdx.z;
  const SeqlenInfo seq(p, b);
  const int sq = seq.seqlen_q, sk = seq.seqlen_k, D = p.head_dim;
  const int m0 = m_block * BM;
  // Varlen grids are sized by the longest query sequence; the whole CTA leaves together.
  if (m0 >= sq) return;
  const int rows_q = sq - m0 < BM ? sq - m0 : BM;
  const int hk = hq / (p.heads_q / p.heads_kv);
  const WindowMask mask(sq, sk, p.window_left, p.window_right);
  const BlockRange range = mask.n_blocks(m_block, BM, BN);  // empty: dq rows are 0

  const T* qbase = static_cast<const T*>(p.q) +
                   seq.offset(p.q_stride, seq.batch_q, seq.row_q + m0, hq);
  const T* gbase = static_cast<const T*>(p.dout) +
                   seq.offset(p.dout_stride, seq.batch_q, seq.row_q + m0, hq);
  load_tile<Tr, BM>(sm.q, qbase, p.q_stride.row, rows_q, D, kp.vec8);
  load_tile<Tr, BM>(sm.dout, gbase, p.dout_stride.row, rows_q, D, kp.vec8);
  const std::int64_t row_base = ws_row(p, b, hq, m0);
  for (int t = threadIdx.x; t < BM; t += Tr::kThreads) {
    sm.lse[t] = t < rows_q ? kp.lse_log2[row_base + t] : INFINITY;
    sm.dsum[t] = t < rows_q ? kp.dsum[row_base + t] : 0.f;
  }

  // dQ tiles of this warp: t = warp + c * kWarps over (kBlockM / 16) x (kHeadDim / 16).
  constexpr int kColT = kHeadDim / 16;
  const int warp = threadIdx.x / 32;
  AccFrag acc[Tr::kDqTilesPerWarp];
#pragma unroll
  for (int c = 0; c < Tr::kDqTilesPerWarp; ++c) wmma::fill_fragment(acc[c], 0.f);

  for (int n_block = range.begin; n_block < range.end; ++n_block) {
    const int n0 = n_block * BN;
    const int rows_k = sk - n0 < BN ? sk - n0 : BN;
    __syncthreads();  // the previous block's readers of K, V and dS are done
    const T* kbase = static_cast<const T*>(p.k) +
                     seq.offset(p.k_stride, seq.batch_k, seq.row_k + n0, hk);
    const T* vbase = static_cast<const T*>(p.v) +
                     seq.offset(p.v_stride, seq.batch_k, seq.row_k + n0, hk);
    load_tile<Tr, BN>(sm.k, kbase, p.k_stride.row, rows_k, D, kp.vec8);
    load_tile<Tr, BN>(sm.v, vbase, p.v_stride.row, rows_k, D, kp.vec8);
    __syncthreads();  // K, V (and, the first time, Q, dO, lse, dsum) are in place
    s_dp_products<Tr>(sm);
    __syncthreads();
    p_ds<Tr, false>(kp, mask, m0, n0, sq, sm);
    // A block the mask cuts: K's NaN chunks would reach the rows that do not see them
    // through dS = 0 (bwd_non_finite.hpp); zeroed after S, before dQ += dS K.
    if (!mask.tile_unmasked(m_block, BM, n_block, BN))
      OwnChunks<void, BN, kHeadDim, Tr::kThreads, Tr::kLd>::template zero<true>(sm.k);
    __syncthreads();
#pragma unroll
    for (int c = 0; c < Tr::kDqTilesPerWarp; ++c) {
      const int t = warp + c * Tr::kWarps;
      dq_tile<Tr>(sm, t / kColT, (t % kColT) * 16, acc[c]);
    }
  }

  // Epilogue: dQ * scale through the fp32 staging (the whole buffer, dead after the barrier).
  __syncthreads();
#pragma unroll
  for (int c = 0; c < Tr::kDqTilesPerWarp; ++c) {
    const int t = warp + c * Tr::kWarps;
#pragma unroll
    for (int e = 0; e < acc[c].num_elements; ++e) acc[c].x[e] *= p.scale;
    wmma::store_matrix_sync(sm.end_stage + (t / kColT) * 16 * Tr::kLdA + (t % kColT) * 16,
                            acc[c], Tr::kLdA, wmma::mem_row_major);
  }
  __syncthreads();
  T* dq = static_cast<T*>(p.dq) + seq.offset(p.dq_stride, seq.batch_q, seq.row_q + m0, hq);
  for (int idx = threadIdx.x; idx < BM * kHeadDim; idx += Tr::kThreads) {
    const int r = idx / kHeadDim, d = idx % kHeadDim;
    if (r < rows_q && d < D) dq[r * p.dq_stride.row + d] = from_f<T>(sm.end_stage[r * Tr::kLdA + d]);
  }
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
