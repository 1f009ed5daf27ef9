#pragma once
// The sm80 backward's main kernel (FlashAttention-2 algorithm on mma.sync m16n8k16): one CTA
// per (key block of kBlockN keys, KV head, batch), padded or varlen. K and V stay in shared
// memory; the CTA walks the query heads of its KV head's group (GQA/MQA: dK and dV sum over
// them in registers, no workspace) and, for each, the query blocks that can see its keys (the
// mask policy's bounds, bottom-right aligned per sequence). Q and dO come in by cp.async, the
// next block's while this one computes (two buffers; with one, from the point this block has
// finished with it). Per query block:
//   S = Q K^T, dP = dO V^T                        (registers)
//   P, dS                                         (registers, bwd_p_ds.hpp; to shared memory)
//   dV += P^T dO                                  (registers; written once at the end)
//   dQ_accum += dS K                              (fp32 atomics, bwd_dq_accum_layout.hpp;
//                                                  skipped when deterministic, where
//                                                  bwd_dq_kernel.hpp computes dQ)
//   dK += dS^T Q                                  (registers; written once at the end)
// (with one Q buffer, dK before dQ: the next block's loads wait for it).
// dK and dV are deterministic either way: each CTA owns its rows and walks a fixed order.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/mask.hpp"
#include "cuda/common/bwd_kernel_params.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm80/bwd_dq_accum_layout.hpp"
#include "cuda/sm80/bwd_main_traits.hpp"
#include "cuda/sm80/bwd_non_finite.hpp"
#include "cuda/sm80/bwd_p_ds.hpp"
#include "cuda/sm80/bwd_traits.hpp"  // ws_row
#include "cuda/sm80/bwd_warp_gemm.hpp"
#include "cuda/sm80/mma_ptx.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

// Rows [0, rows) x cols [0, cols) of a kRows x kHeadDim global tile into shared matrix Mat,
// the rest zero-filled, so padding rows and columns contribute exactly 0 (and garbage or NaN
// past a sequence never reaches a product). vec8: 16-byte cp.async chunks (wait with
// cp_async_wait); otherwise element loads, visible after the next barrier.
template <class Tr, class Mat, int kRows, class Element>
__device__ __forceinline__ void load_rows(Element* dst, const Element* src, std::int64_t row_stride,
                                          int rows, int cols, bool vec8) {
  constexpr int kChunks = kRows * Tr::kChunksPerRow;
  // Rows one pass of the CTA covers: when a pass is whole rows, a multiple of 8 of them (the
  // swizzle repeats every 8 rows), a thread keeps its column and the same swizzle on every
  // pass, so its chunks are one shared offset and one global pointer plus fixed steps.
  constexpr int kPassRows = Tr::kThreads / Tr::kChunksPerRow;
  constexpr bool kFixedColumn =
      Tr::kThreads % Tr::kChunksPerRow == 0 && (!Mat::kSwizzled || kPassRows % 8 == 0);
  if (vec8) {
    if constexpr (kFixedColumn) {
      const int r0 = int(threadIdx.x) / Tr::kChunksPerRow;
      const int c = int(threadIdx.x) % Tr::kChunksPerRow * 8;
      Element* const d = dst + Mat::offset(r0, c);
      const Element* s = src + r0 * row_stride + c;
      const std::int64_t pass_stride = row_stride * kPassRows;
      const bool col_ok = c < cols;
#pragma unroll
      for (int it = 0; it < kChunks / Tr::kThreads; ++it) {
        const bool valid = col_ok && r0 + it * kPassRows < rows;
        cp_async_16(d + it * kPassRows * Mat::kLd, valid ? s : src, valid);
        s += pass_stride;
      }
    } else {
#pragma unroll
      for (int it = 0; it < kChunks / Tr::kThreads; ++it) {
        const int idx = it * Tr::kThreads + int(threadIdx.x);
        const int r = idx / Tr::kChunksPerRow, c = idx % Tr::kChunksPerRow * 8;
        const bool valid = r < rows && c < cols;
        cp_async_16(dst + Mat::offset(r, c), valid ? src + r * row_stride + c : src, valid);
      }
    }
  } else {
    // Rare (rows not 16-byte aligned): row by row, so that no index arithmetic of this path
    // is hoisted into the common one.
#pragma unroll 1
    for (int r = 0; r < kRows; ++r)
      for (int c = threadIdx.x; c < Tr::kHeadDim; c += Tr::kThreads)
        dst[Mat::offset(r, c)] = (r < rows && c < cols) ? src[r * row_stride + c] : Element(0.f);
  }
}

// The inverse of load_rows for the epilogue: rows [0, rows) x cols [0, cols) of the shared
// matrix `src` (layout Mat) to global memory in 16-byte chunks (cols a multiple of 8, rows
// 16-byte aligned).
template <class Tr, class Mat, int kRows, class Element>
__device__ __forceinline__ void store_rows(Element* dst, std::int64_t row_stride, const Element* src,
                                           int rows, int cols) {
  constexpr int kChunks = kRows * Tr::kChunksPerRow;
#pragma unroll
  for (int it = 0; it < kChunks / Tr::kThreads; ++it) {
    const int idx = it * Tr::kThreads + int(threadIdx.x);
    const int r = idx / Tr::kChunksPerRow, c = idx % Tr::kChunksPerRow * 8;
    if (r < rows && c < cols)
      *reinterpret_cast<uint4*>(dst + r * row_stride + c) =
          *reinterpret_cast<const uint4*>(src + Mat::offset(r, c));
  }
}

template <class Element, int kTileIndex>
__global__ void __launch_bounds__(BwdMainTraits<Element, kTileIndex>::kThreads, 1)
    bwd_main(const BwdKernelParams kp) {
  using Tr = BwdMainTraits<Element, kTileIndex>;
  using QTile = typename Tr::QTile;
  using KTile = typename Tr::KTile;
  using PTile = typename Tr::PTile;
  using DqAccum = DqAccumBlock<Tr>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  const BackwardParams& p = kp.p;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* const smem = reinterpret_cast<Element*>(smem_raw);
  Element* const sK = smem + Tr::kOffK;
  Element* const sV = smem + Tr::kOffV;
  Element* const sP = smem + Tr::kOffP;
  Element* const sdS = smem + Tr::kOffDS;

  const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const SeqlenInfo seq(p, b);
  const int sq = seq.seqlen_q, sk = seq.seqlen_k, D = p.head_dim;
  const int n0 = n_block * BN;
  // Varlen grids are sized by the longest key sequence; the whole CTA leaves together.
  if (n0 >= sk) return;
  const int rows_k = sk - n0 < BN ? sk - n0 : BN;
  const WindowMask mask(sq, sk, p.window_left, p.window_right);
  const BlockRange m_range = mask.m_blocks(n_block, BN, BM);
  const int n_m = m_range.end > m_range.begin ? m_range.end - m_range.begin : 0;
  const int group = p.heads_q / p.heads_kv;
  const int n_steps = group * n_m;  // (query head, query block) pairs, head-major

  load_rows<Tr, KTile, BN>(sK, static_cast<const Element*>(p.k) +
                                   seq.offset(p.k_stride, seq.batch_k, seq.row_k + n0, hk),
                           p.k_stride.row, rows_k, D, kp.vec8);
  load_rows<Tr, KTile, BN>(sV, static_cast<const Element*>(p.v) +
                                   seq.offset(p.v_stride, seq.batch_k, seq.row_k + n0, hk),
                           p.v_stride.row, rows_k, D, kp.vec8);
  cp_async_commit();

  // Q (kQ) or dO (!kQ) of query head hq, query block m_block into its buffer `stage`.
  auto load_q_or_do = [&](auto is_q, int hq, int m_block, int stage) {
    constexpr bool kQ = decltype(is_q)::value;
    const int m0 = m_block * BM;
    const int rows_q = sq - m0 < BM ? sq - m0 : BM;
    const Strides& st = kQ ? p.q_stride : p.dout_stride;
    load_rows<Tr, QTile, BM>(smem + (kQ ? Tr::kOffQ : Tr::kOffDO) + stage * QTile::kElems,
                             static_cast<const Element*>(kQ ? p.q : p.dout) +
                                 seq.offset(st, seq.batch_q, seq.row_q + m0, hq),
                             st.row, rows_q, D, kp.vec8);
  };
  constexpr std::true_type kIsQ{};
  constexpr std::false_type kIsDo{};
  if (n_steps > 0) {
    load_q_or_do(kIsQ, hk * group, m_range.begin, 0);
    load_q_or_do(kIsDo, hk * group, m_range.begin, 0);
  }
  cp_async_commit();

  // This warp's tile origin in each product's output.
  const int warp = threadIdx.x / 32;
  const int s_row0 = warp % Tr::kSdpWarpsM * Tr::kSdpRows;
  const int s_col0 = warp / Tr::kSdpWarpsM * Tr::kSdpCols;
  const int kv_row0 = warp % Tr::kDkvWarpsN * Tr::kDkvRows;
  const int kv_col0 = warp / Tr::kDkvWarpsN * Tr::kDkvCols;
  const int q_row0 = warp % Tr::kDqWarpsM * Tr::kDqRows;
  const int q_col0 = warp / Tr::kDqWarpsM * Tr::kDqCols;

  float acc_dk[Tr::kDkvMT][Tr::kDkvNT][4], acc_dv[Tr::kDkvMT][Tr::kDkvNT][4];
  clear_acc(acc_dk);
  clear_acc(acc_dv);
  const bool softcap = p.softcap > 0.f;
  const bool atomic_dq = !p.deterministic;  // uniform over the grid

  // Some step is cut (the cut blocks lie at the ends of m_range): K's NaN chunks are zeroed
  // before the first one (bwd_non_finite.hpp); the loop's first barrier publishes the zeros.
  using KChunks = OwnChunks<KTile, BN, Tr::kHeadDim, Tr::kThreads>;
  if (n_steps > 0 && (!mask.tile_unmasked(m_range.begin, BM, n_block, BN) ||
                      !mask.tile_unmasked(m_range.end - 1, BM, n_block, BN))) {
    cp_async_wait<1>();  // K and V landed
    __syncthreads();     // ... for every thread
    if (__syncthreads_or(KChunks::template any<true>(sK))) KChunks::template zero<true>(sK);
  }

  // Steps go head-major: the query blocks of head hk * group, then of the next head, ...
  int hq = hk * group, m_block = m_range.begin;
  for (int i = 0; i < n_steps; ++i) {
    const int q_stage = Tr::kQStages == 2 ? (i & 1) : 0;
    const int do_stage = Tr::kDoStages == 2 ? (i & 1) : 0;
    const int m0 = m_block * BM;
    // Q or dO of the next step (query head, query block) into buffer `stage`.
    auto load_next = [&](auto is_q, int stage) {
      const bool last_block = m_block + 1 == m_range.end;
      load_q_or_do(is_q, last_block ? hq + 1 : hq, last_block ? m_range.begin : m_block + 1, stage);
    };
    const Element* const sQ = smem + Tr::kOffQ + q_stage * QTile::kElems;
    const Element* const sdO = smem + Tr::kOffDO + do_stage * QTile::kElems;
    const std::int64_t ws0 = ws_row(p, b, hq, 0);

    // lse_log2 and dsum of this thread's S rows (loaded before the barrier: their latency
    // hides behind it and the two products).
    float lse[Tr::kSdpMT][2], dsum[Tr::kSdpMT][2];
#pragma unroll
    for (int mt = 0; mt < Tr::kSdpMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + s_row0 + acc_row(mt, h);
        lse[mt][h] = row < sq ? kp.lse_log2[ws0 + row] : INFINITY;
        dsum[mt][h] = row < sq ? kp.dsum[ws0 + row] : 0.f;
      }

    cp_async_wait<0>();  // this step's Q and dO (and, the first time, K and V) landed
    __syncthreads();     // ... for every thread; every warp is done with step i - 1
    // A step the mask cuts: whether this thread's share of Q and dO holds NaN or Inf, voted
    // on at the P/dS barrier below (bwd_non_finite.hpp).
    const bool cut = !mask.tile_unmasked(m_block, BM, n_block, BN);
    using QChunks = OwnChunks<QTile, BM, Tr::kHeadDim, Tr::kThreads>;
    const bool q_do_bad =
        cut && (QChunks::template any<false>(sQ) || QChunks::template any<false>(sdO));
    // Two buffers: the next block's loads go to the one step i - 1 read.
    if (i + 1 < n_steps) {
      if constexpr (Tr::kQStages == 2) load_next(kIsQ, q_stage ^ 1);
      if constexpr (Tr::kDoStages == 2) load_next(kIsDo, do_stage ^ 1);
    }
    cp_async_commit();

    float acc_s[Tr::kSdpMT][Tr::kSdpNT][4], acc_dp[Tr::kSdpMT][Tr::kSdpNT][4];
    clear_acc(acc_s);
    clear_acc(acc_dp);
    warp_gemm<Element, Tr::kSdpMT, Tr::kSdpNT, Tr::kHeadDim, QTile, false, KTile, false>(
        acc_s, sQ, s_row0, sK, s_col0);
    warp_gemm<Element, Tr::kSdpMT, Tr::kSdpNT, Tr::kHeadDim, QTile, false, KTile, false>(
        acc_dp, sdO, s_row0, sV, s_col0);
    if (softcap)
      p_ds_in_registers<true>(acc_s, acc_dp, lse, dsum, kp.scale_log2, kp.softcap_in_scale);
    else
      p_ds_in_registers<false>(acc_s, acc_dp, lse, dsum, kp.scale_log2, kp.softcap_in_scale);
    if (cut) mask_p_ds(acc_s, acc_dp, mask, m0, s_row0, n0, s_col0, BN);
    store_acc<PTile>(sP, acc_s, s_row0, s_col0);
    store_acc<PTile>(sdS, acc_dp, s_row0, s_col0);
    // P and dS of the whole block are in shared memory. A cut step also votes on whether its
    // Q or dO holds NaN or Inf; the rare path cleans them (bwd_non_finite.hpp).
    if (cut) {
      if (__syncthreads_or(q_do_bad))
        clean_cut_step<Tr>(const_cast<Element*>(sQ), const_cast<Element*>(sdO), sP, sdS);
    } else {
      __syncthreads();
    }

    // dQ_accum += dS K (unscaled; the post-pass multiplies by scale): A = dS (stored
    // [query][key]: plain), B = K (stored [key][d] = [k][n]: .trans). A whole block goes in
    // fragment order (bwd_dq_accum_layout.hpp: each atomic instruction one 128-byte line);
    // otherwise row-major, rows past the sequence and columns past the real head dim dropped.
    auto add_dq = [&] {
      if (!atomic_dq) return;
      const bool fragment_order = DqAccum::fragment_order(D, m0, sq);
#pragma unroll
      for (int chunk = 0; chunk < Tr::kDqChunks; ++chunk) {
        const int col0 = q_col0 + chunk * Tr::kDqChunkNT * 8;
        float acc_dq[Tr::kDqMT][Tr::kDqChunkNT][4];
        clear_acc(acc_dq);
        warp_gemm<Element, Tr::kDqMT, Tr::kDqChunkNT, BN, PTile, false, KTile, true>(
            acc_dq, sdS, q_row0, sK, col0);
        if (fragment_order) {
          // One address per thread, the rest compile-time offsets from it.
          float* const base = kp.dq_accum + (ws0 + m0) * Tr::kHeadDim +
                              DqAccum::lane_offset(warp, threadIdx.x & 31, chunk);
#pragma unroll
          for (int mt = 0; mt < Tr::kDqMT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int nt = 0; nt < Tr::kDqChunkNT; ++nt)
#pragma unroll
                for (int e2 = 0; e2 < 2; ++e2)
                  atomicAdd(base + DqAccum::value(mt, h, nt, e2) * 32, acc_dq[mt][nt][2 * h + e2]);
          continue;
        }
        float* const dq_rows = kp.dq_accum + ws0 * D;
#pragma unroll
        for (int mt = 0; mt < Tr::kDqMT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = m0 + q_row0 + acc_row(mt, h);
            if (row >= sq) continue;
            float* const dq_row = dq_rows + std::int64_t(row) * D;
#pragma unroll
            for (int nt = 0; nt < Tr::kDqChunkNT; ++nt)
#pragma unroll
              for (int e2 = 0; e2 < 2; ++e2) {
                const int col = col0 + acc_col(nt, e2);
                if (col < D) atomicAdd(dq_row + col, acc_dq[mt][nt][2 * h + e2]);
              }
          }
      }
    };

    // dV += P^T dO, dK += dS^T Q: A = P^T / dS^T (stored [query][key]: .trans), B = dO / Q
    // (stored [query][d] = [k][n]: .trans). With two Q buffers, as FlashAttention-2: dV, then
    // (one dO buffer: once every warp is done with it) the next dO load, then dQ, whose atomics
    // drain while dK runs. With one Q buffer the next block's loads wait for dK, so they go
    // before dQ, which reads only dS and K.
    warp_gemm<Element, Tr::kDkvMT, Tr::kDkvNT, BM, PTile, true, QTile, true>(acc_dv, sP, kv_row0,
                                                                            sdO, kv_col0);
    if constexpr (Tr::kQStages == 2) {
      if constexpr (Tr::kDoStages == 1) {
        if (i + 1 < n_steps) {
          __syncthreads();
          load_next(kIsDo, 0);
        }
        cp_async_commit();
      }
      add_dq();
      warp_gemm<Element, Tr::kDkvMT, Tr::kDkvNT, BM, PTile, true, QTile, true>(acc_dk, sdS, kv_row0,
                                                                              sQ, kv_col0);
    } else {
      warp_gemm<Element, Tr::kDkvMT, Tr::kDkvNT, BM, PTile, true, QTile, true>(acc_dk, sdS, kv_row0,
                                                                              sQ, kv_col0);
      if (i + 1 < n_steps) {
        __syncthreads();
        load_next(kIsQ, 0);
        if constexpr (Tr::kDoStages == 1) load_next(kIsDo, 0);
      }
      cp_async_commit();
      add_dq();
    }
    if (++m_block == m_range.end) {
      m_block = m_range.begin;
      ++hq;
    }
  }

  cp_async_wait<0>();  // no copy outlives the CTA (n_steps == 0 issued K and V only)

  // dK * scale and dV; rows past the sequence's seqlen_k and columns past the real head dim
  // dropped.
  Element* const dk = static_cast<Element*>(p.dk) +
                      seq.offset(p.dk_stride, seq.batch_k, seq.row_k + n0, hk);
  Element* const dv = static_cast<Element*>(p.dv) +
                      seq.offset(p.dv_stride, seq.batch_k, seq.row_k + n0, hk);
  // The usual case (head dim a multiple of 8, 16-byte aligned rows): through shared memory
  // (K and V are dead), then 16-byte stores of whole row chunks, as the loads came in. Straight
  // from the accumulators, every store instruction of a warp would touch 8 rows with 4 bytes
  // per lane (8 times the store instructions and L2 requests), the CTA's last act before the
  // next one can start on its SM.
  const bool vec_out = kp.vec8 && D % 8 == 0 && p.dk_stride.row % 8 == 0 &&
                       p.dv_stride.row % 8 == 0 &&
                       (reinterpret_cast<std::uintptr_t>(dk) | reinterpret_cast<std::uintptr_t>(dv)) % 16 == 0;
  if (vec_out) {
#pragma unroll
    for (int mt = 0; mt < Tr::kDkvMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < Tr::kDkvNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[mt][nt][e] *= p.scale;
    __syncthreads();  // every warp is done with K and V
    store_acc<KTile>(sK, acc_dk, kv_row0, kv_col0);
    store_acc<KTile>(sV, acc_dv, kv_row0, kv_col0);
    __syncthreads();
    store_rows<Tr, KTile, BN>(dk, p.dk_stride.row, sK, rows_k, D);
    store_rows<Tr, KTile, BN>(dv, p.dv_stride.row, sV, rows_k, D);
    return;
  }
#pragma unroll
  for (int mt = 0; mt < Tr::kDkvMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = kv_row0 + acc_row(mt, h);
      if (row >= rows_k) continue;
#pragma unroll
      for (int nt = 0; nt < Tr::kDkvNT; ++nt)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const int col = kv_col0 + acc_col(nt, e2);
          if (col >= D) continue;
          dk[row * p.dk_stride.row + col] = Element(acc_dk[mt][nt][2 * h + e2] * p.scale);
          dv[row * p.dv_stride.row + col] = Element(acc_dv[mt][nt][2 * h + e2]);
        }
    }
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
