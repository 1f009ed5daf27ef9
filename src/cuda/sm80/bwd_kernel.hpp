#pragma once
// The sm80 backward's main kernel (FlashAttention-2 algorithm): one CTA per (key block of
// kBlockN keys, KV head, batch), padded or varlen. K and V stay in shared memory; the CTA
// loops over the query heads of its KV head's group (GQA/MQA: dK and dV sum over them in
// registers, no workspace) and, for each, over the query blocks that can see its keys (the
// mask policy's bounds, bottom-right aligned per sequence), recomputing S, P, dP, dS
// (bwd_tile_math.hpp) and accumulating
//     dV += P^T dO,  dK += dS^T Q                 (registers; written once at the end)
//     dQ_accum += dS K                            (fp32 atomicAdd; skipped when deterministic,
//                                                  where bwd_dq_kernel.hpp computes dQ)
// dK and dV are deterministic either way: each CTA owns its rows and walks a fixed order.
#include <cstdint>

#include "common/mask.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm80/bwd_tile_math.hpp"
#include "cuda/sm80/bwd_traits.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

template <class T, int kHeadDim>
__global__ void __launch_bounds__(BwdTraits<T, kHeadDim>::kThreads)
    bwd_main(const BwdKernelParams kp) {
  using Tr = BwdTraits<T, kHeadDim>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  const BackwardParams& p = kp.p;
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdSmem<Tr, T> sm(smem);

  const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const SeqlenInfo seq(p, b);
  const int sq = seq.seqlen_q, sk = seq.seqlen_k, D = p.head_dim;
  const int n0 = n_block * BN;
  // Varlen grids are sized by the longest key sequence; the whole CTA leaves together.
  if (n0 >= sk) return;
  const int rows_k = sk - n0 < BN ? sk - n0 : BN;
  const WindowMask mask(sq, sk, p.window_left, p.window_right);
  const BlockRange m_range = mask.m_blocks(n_block, BN, BM);

  const T* kbase = static_cast<const T*>(p.k) +
                   seq.offset(p.k_stride, seq.batch_k, seq.row_k + n0, hk);
  const T* vbase = static_cast<const T*>(p.v) +
                   seq.offset(p.v_stride, seq.batch_k, seq.row_k + n0, hk);
  load_tile<Tr, BN>(sm.k, kbase, p.k_stride.row, rows_k, D, kp.vec8);
  load_tile<Tr, BN>(sm.v, vbase, p.v_stride.row, rows_k, D, kp.vec8);

  const int warp = threadIdx.x / 32;
  // dK, dV: key-row tile warp % 4, head-dim tiles (warp / 4) * kColTiles + c.
  const int rt = warp % 4, cbase = (warp / 4) * Tr::kColTiles;
  AccFrag acc_dk[Tr::kColTiles], acc_dv[Tr::kColTiles];
#pragma unroll
  for (int c = 0; c < Tr::kColTiles; ++c) {
    wmma::fill_fragment(acc_dk[c], 0.f);
    wmma::fill_fragment(acc_dv[c], 0.f);
  }

  const int group = p.heads_q / p.heads_kv;
  const bool atomic_dq = !p.deterministic;  // uniform over the grid
  for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
    const std::int64_t row_base = ws_row(p, b, hq, 0);
    for (int m_block = m_range.begin; m_block < m_range.end; ++m_block) {
      const int m0 = m_block * BM;
      const int rows_q = sq - m0 < BM ? sq - m0 : BM;
      __syncthreads();  // the previous iteration's readers of Q, dO, P, dS and staging are done
      const T* qbase = static_cast<const T*>(p.q) +
                       seq.offset(p.q_stride, seq.batch_q, seq.row_q + m0, hq);
      const T* gbase = static_cast<const T*>(p.dout) +
                       seq.offset(p.dout_stride, seq.batch_q, seq.row_q + m0, hq);
      load_tile<Tr, BM>(sm.q, qbase, p.q_stride.row, rows_q, D, kp.vec8);
      load_tile<Tr, BM>(sm.dout, gbase, p.dout_stride.row, rows_q, D, kp.vec8);
      for (int t = threadIdx.x; t < BM; t += Tr::kThreads) {
        sm.lse[t] = t < rows_q ? kp.lse_log2[row_base + m0 + t] : INFINITY;
        sm.dsum[t] = t < rows_q ? kp.dsum[row_base + m0 + t] : 0.f;
      }
      __syncthreads();
      s_dp_products<Tr>(sm);
      __syncthreads();
      p_ds<Tr, true>(kp, mask, m0, n0, sq, sm);
      __syncthreads();

      // dV += P^T dO, dK += dS^T Q (A operands read transposed: column-major views of P, dS).
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> pt, dst;
        wmma::load_matrix_sync(pt, sm.p + kk * 16 * Tr::kLdP + rt * 16, Tr::kLdP);
        wmma::load_matrix_sync(dst, sm.ds + kk * 16 * Tr::kLdP + rt * 16, Tr::kLdP);
#pragma unroll
        for (int c = 0; c < Tr::kColTiles; ++c) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bm;
          wmma::load_matrix_sync(bm, sm.dout + kk * 16 * Tr::kLd + (cbase + c) * 16, Tr::kLd);
          wmma::mma_sync(acc_dv[c], pt, bm, acc_dv[c]);
          wmma::load_matrix_sync(bm, sm.q + kk * 16 * Tr::kLd + (cbase + c) * 16, Tr::kLd);
          wmma::mma_sync(acc_dk[c], dst, bm, acc_dk[c]);
        }
      }
      if (!atomic_dq) continue;
      // dQ (this key block's part) = dS K, a column chunk at a time, staged in fp32 where S
      // and dP were (dead since the barrier above), then added to dq_accum.
      float* dq_rows = kp.dq_accum + (row_base + m0) * D;
#pragma unroll 1
      for (int chunk = 0; chunk < Tr::kDqChunks; ++chunk) {
        const int c0 = chunk * Tr::kDqChunkCols;
        if (chunk > 0) __syncthreads();  // the previous chunk's atomics have read the staging
        constexpr int kColT = Tr::kDqChunkCols / 16;
#pragma unroll
        for (int c = 0; c < Tr::kDqChunkTiles / Tr::kWarps; ++c) {
          const int t = warp + c * Tr::kWarps;
          const int qrt = t / kColT, ct = t % kColT;
          AccFrag acc_q;
          wmma::fill_fragment(acc_q, 0.f);
          dq_tile<Tr>(sm, qrt, c0 + ct * 16, acc_q);
          wmma::store_matrix_sync(sm.dq_stage + qrt * 16 * Tr::kLdDq + ct * 16, acc_q,
                                  Tr::kLdDq, wmma::mem_row_major);
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < BM * Tr::kDqChunkCols; idx += Tr::kThreads) {
          const int i = idx / Tr::kDqChunkCols, d = idx % Tr::kDqChunkCols;
          if (i < rows_q && c0 + d < D)
            atomicAdd(dq_rows + std::int64_t(i) * D + c0 + d, sm.dq_stage[i * Tr::kLdDq + d]);
        }
      }
    }
  }

  // Epilogue: dK * scale and dV through the fp32 staging (the whole buffer, dead now), rows
  // past the sequence's seqlen_k dropped.
  T* dk = static_cast<T*>(p.dk) + seq.offset(p.dk_stride, seq.batch_k, seq.row_k + n0, hk);
  T* dv = static_cast<T*>(p.dv) + seq.offset(p.dv_stride, seq.batch_k, seq.row_k + n0, hk);
#pragma unroll
  for (int c = 0; c < Tr::kColTiles; ++c) {
#pragma unroll
    for (int e = 0; e < acc_dk[c].num_elements; ++e) acc_dk[c].x[e] *= p.scale;
  }
  // One call per array (not a runtime select between them, which put both in local memory).
  auto write_rows = [&](const AccFrag (&acc)[Tr::kColTiles], T* dst, std::int64_t rs) {
    __syncthreads();
#pragma unroll
    for (int c = 0; c < Tr::kColTiles; ++c)
      wmma::store_matrix_sync(sm.end_stage + rt * 16 * Tr::kLdA + (cbase + c) * 16, acc[c],
                              Tr::kLdA, wmma::mem_row_major);
    __syncthreads();
    for (int idx = threadIdx.x; idx < BN * kHeadDim; idx += Tr::kThreads) {
      const int r = idx / kHeadDim, d = idx % kHeadDim;
      if (r < rows_k && d < D) dst[r * rs + d] = from_f<T>(sm.end_stage[r * Tr::kLdA + d]);
    }
  };
  write_rows(acc_dk, dk, p.dk_stride.row);
  write_rows(acc_dv, dv, p.dv_stride.row);
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
