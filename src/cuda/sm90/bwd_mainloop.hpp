#pragma once
// The sm90 backward consumer mainloop for one key block (128 keys of one kv head), split by
// keys (d64, d128): the producer (bwd_producer.hpp) loads K and V once and streams Q and dO
// blocks of 64 query rows (with their lse_log2 and dsum) through two TMA rings, for every
// query head of the kv head's group and every query block that sees some of the keys; each
// consumer warpgroup (64 of the keys) runs, per query block,
//   S^T = K Q^T, dP^T = V dO^T                  (issued together; d64: K and V from
//                                                registers, loaded once per CTA)
//   P^T = exp2(S^T * scale_log2 - lse_log2)     (while dP^T is still on the tensor cores)
//   dS^T = P^T o (dP^T - dsum)                  (softcap: o (1 - tanh^2), see below)
//   dV += P^T dO, dK += dS^T Q                  (P^T, dS^T straight from registers)
//   dS^T -> shared memory; both warpgroups meet; dQ = dS K (d128: each warpgroup half the
//   columns; d64: one warpgroup, the two taking turns block by block)
//   dQ -> dq_accum: d128, through a shared-memory stage that one thread adds to dq_accum with
//   a bulk reduction after the next meeting; d64, float4 reductions from the registers of the
//   warpgroup whose turn it is (see bwd_traits.hpp, kDqAlternate)
// dK and dV stay in registers across the whole loop (GQA: summed over the group's heads).
// Deterministic (Traits::kDeterministic, bwd_dq_order.hpp): each block's dQ is added when this
// key block's turn for it has come. d128: the bulk reductions move from consumer thread 0 to a
// dQ writer thread in the producer warpgroup (write_dq below), so that the consumers never wait
// for a turn: thread 0 only tells the writer that a stage is full (dq_full) and, before the
// consumers rewrite a stage, waits until the writer has read it (dq_empty); the writer waits
// for the turn, reduces, frees the stage and arrives once the reduction has completed. d64: each
// warp of the warpgroup on dQ duty waits before its float4 reductions and counts itself in
// ss.dq_added after them; the announcer thread (announce_dq) arrives for the block once all 4
// warps have.
//
// Producer and consumers walk the same (head, query block) sequence, so every mbarrier phase
// matches; a key block that no query sees is skipped by both before any barrier is touched.
// Q and dO share one PipelineState: stage i of both rings holds the same query block.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/common/fragment_utils.hpp"
#include "common/mask.hpp"
#include "cuda/sm90/zero_rows.hpp"
#include "cuda/common/fast_exp2.hpp"
#include "cuda/sm90/bulk_reduce.hpp"
#include "cuda/sm90/bwd_dq_order.hpp"
#include "cuda/sm90/bwd_dq_convert.hpp"
#include "cuda/sm90/bwd_non_finite.hpp"
#include "cuda/sm90/bwd_params.hpp"
#include "cuda/sm90/named_barriers.hpp"
#include "cuda/sm90/softmax.hpp"
#include "cuda/sm90/wgmma.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Traits_>
struct BwdMainloop {
  using Traits = Traits_;
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  // Deterministic d128: a producer-warpgroup thread adds the dQ stages (write_dq).
  static constexpr bool kDqWriter = Traits::kDeterministic && !Traits::kDqAlternate;
  // Deterministic d64: a producer-warpgroup thread arrives for the blocks the warps on dQ duty
  // added (announce_dq).
  static constexpr bool kDqAnnouncer = Traits::kDeterministic && Traits::kDqAlternate;
  static constexpr int kAddingWarps = Traits::kDqThreads / 32;

  // Consumer warpgroups (thread index tid among the 256 consumer threads). Accumulates the
  // unscaled dK and dV of this thread's keys into acc_dk, acc_dv; m_range is non-empty.
  template <class AccDkv>
  __device__ void mma(const BwdKernelParams& kp, const WindowMask& mask, int n_block,
                      int head_kv, int batch, BlockRange m_range, Pipeline& pipeline_q,
                      Pipeline& pipeline_do, SharedStorage& ss, int tid, AccDkv& acc_dk,
                      AccDkv& acc_dv) const {
    const BackwardParams& p = kp.p;
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutDo{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQt{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutDot{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutDs{});
    Tensor sdSt = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutDst{});

    typename Traits::TiledMmaSdP mma_sdp;
    typename Traits::TiledMmaDkv mma_dkv;
    typename Traits::TiledMmaDq mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(tid);
    auto thr_dkv = mma_dkv.get_thread_slice(tid);
    // Taking turns on dQ (d64), warpgroup w computes the dQ of the blocks it with it % 2 == w
    // (it counts the blocks this CTA has walked), as thread dq_tid of its 128.
    const int warpgroup = tid / 128;
    const int dq_tid = Traits::kDqAlternate ? tid % 128 : tid;
    auto thr_dq = mma_dq.get_thread_slice(dq_tid);
    // Shared-memory descriptors (or, kKVInRegisters, register fragments); the A operands of
    // S^T and dP^T are this warpgroup's 64 keys.
    Tensor tSrK = thr_sdp.partition_fragment_A(sK);       // (1, 1, D/16)
    Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);       // (1, 1, D/16, stages)
    Tensor tdPrV = thr_sdp.partition_fragment_A(sV);      // (1, 1, D/16)
    Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);    // (1, 1, D/16, stages)
    Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);  // (1, 1, kBlockM/16, stages)
    Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);    // (1, 1, kBlockM/16, stages)
    Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);     // (1, 1, kBlockN/16, 2)
    Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);     // (1, 1, kBlockN/16)
    // dS^T registers to shared memory (stmatrix, see the store below).
    auto ds_copy = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto ds_copy_thr = ds_copy.get_thread_slice(tid);
    Tensor tdSsdS = ds_copy_thr.partition_D(sdSt);      // (CPY, CPY_N, CPY_M, buffers)

    // This thread's key of S^T row r (tid = threadIdx.x - 128), worked out afresh where it is
    // used (the rare path): the compiler hoisted it out of the loop otherwise, registers live
    // across the loop that spilled 24-64 B at d128.
    auto key_of_row = [&](int r) {
      int t;
      asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
      Tensor c = mma_sdp.get_thread_slice(t - 128).partition_C(
          make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
      return int(get<0>(make_tensor(c.data(), wgmma_acc_rowcol(c.layout()))(r, 0)));
    };
    // (key, query) of every S^T element this thread holds, in the (row, col) view: each thread
    // holds 2 key rows and 16 query columns, in adjacent pairs (2c, 2c + 1).
    Tensor cS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor cS_rc = make_tensor(cS.data(), wgmma_acc_rowcol(cS.layout()));
    constexpr int kRows = decltype(size<0>(cS_rc))::value;
    constexpr int kCols = decltype(size<1>(cS_rc))::value;
    // dsum values loaded before the dP^T wait (see probabilities_and_ds): half of this thread's
    // columns (P^T is live by then; all of them spilled 20 B at d128).
    constexpr int kDsumPrefetch = kCols / 2;
    static_assert(kCols % 2 == 0);
    // dQ stages: thread tid's accumulators as float4s at [j][tid] (conflict-free, linear).
    float4* dq_stage = reinterpret_cast<float4*>(ss.dq.data());
    constexpr int kDqVecs = Traits::kDqPerThread / 4;
    constexpr int kStageVecs = Traits::kDqBlockFloats / 4;
    const int num_m_blocks = int((std::int64_t(p.seqlen_q) + kBlockM - 1) / kBlockM);
    // The staged block not yet handed to the bulk reduction (consumer thread 0 issues it), as
    // kStages x (head * num_m_blocks + m) + stage buffer; -1 before the first block. One register
    // instead of two pointers: the loop runs at the register limit.
    int pending = -1;
    // Deterministic d64 (bwd_dq_order.hpp): a dq block's (head * num_m_blocks + m) arrival
    // counter.
    constexpr bool kDeterministic = Traits::kDeterministic;
    auto dq_counter = [&](int block) {
      return kp.dq_semaphore + (std::int64_t(batch) * p.heads_q * num_m_blocks + block);
    };
    auto reduce_pending = [&] {
      const int block = pending / Traits::kStages;
      bulk_reduce_add(kp.dq_accum + dq_block_offset<Traits>(p, batch, block / num_m_blocks,
                                                            block % num_m_blocks, num_m_blocks),
                      reinterpret_cast<const float*>(dq_stage + (pending % Traits::kStages) * kStageVecs),
                      Traits::kDqBlockFloats * sizeof(float));
      tma_store_arrive();
    };

    const int n0 = n_block * kBlockN;
    const int group = p.heads_q / p.heads_kv;
    const bool has_softcap = kp.softcap_in_scale != 0.f;
    const float scale_log2 = kp.scale_log2;

    // The per-query statistics of this thread's columns, which the producer copied into the
    // ring stage with Q (lse_log2) and dO (dsum): columns (c, c + 1), c even, are queries
    // (q, q + 1) with q even, so one 8-byte shared-memory load gives both.
    auto stats_of = [&](const float* stage, int c) {
      return *reinterpret_cast<const float2*>(stage + get<1>(cS_rc(0, c)));
    };

    const int num_blocks = group * (m_range.end - m_range.begin);
    int it = 0;
    PipelineState state;  // consumer states start at phase 0
    cutlass::arch::ClusterTransactionBarrier::wait(&ss.kv_full, 0);
    // Varlen: K and V rows past the sequence's end (the next sequence's) are zeroed once.
    if constexpr (Traits::kVarlen) {
      if (n0 + kBlockN > mask.seqlen_k) {
        zero_rows_and_sync(mask.seqlen_k - n0, tid, Traits::kConsumerThreads,
                           NamedBarrier::kBwdKvTail, sK, sV);
      }
      BwdNonFinite<Traits>::kv_tail_zeroed(ss);  // (the scanners read K after it)
    }
    if constexpr (Traits::kKVInRegisters) {
      // This warpgroup's K and V rows as register A operands, for the whole loop; K once the
      // scanners are done with it (bwd_non_finite.hpp: no generic reads racing their writes).
      BwdNonFinite<Traits>::wait_k_scanned(ss);
      copy(thr_sdp.partition_A(sK), tSrK);
      copy(thr_sdp.partition_A(sV), tdPrV);
    }
    for (int head = head_kv * group; head < (head_kv + 1) * group; ++head) {
      for (int m = m_range.begin; m < m_range.end; ++m) {
        const int m0 = m * kBlockM;
        Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
        Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
        pipeline_q.consumer_wait(state);
        // Varlen: the scanners zero the Q and dO rows past the sequence's end in the stage
        // (bwd_non_finite.hpp); a tile with such rows waits for them before its products.
        if constexpr (Traits::kVarlen) {
          if (m0 + kBlockM > mask.seqlen_q) BwdNonFinite<Traits>::wait_clean(ss, state);
        }
        wgmma<true>(mma_sdp, tSrK, tSrQ(_, _, _, state.index()), acc_s);
        pipeline_do.consumer_wait(state);
        wgmma<true>(mma_sdp, tdPrV, tdPrdO(_, _, _, state.index()), acc_dp);
        // The K scan ran meanwhile (bwd_non_finite.hpp); this tile's P needs its verdict.
        if (it == 0) BwdNonFinite<Traits>::wait_k_scanned(ss);
        const bool keys_zeroed = BwdNonFinite<Traits>::any_key_zeroed(ss);

        Tensor s_rc = make_tensor(acc_s.data(), wgmma_acc_rowcol(acc_s.layout()));
        Tensor dp_rc = make_tensor(acc_dp.data(), wgmma_acc_rowcol(acc_dp.layout()));
        const float* lse_stage = ss.lse_log2[state.index()];
        const float* dsum_stage = ss.dsum[state.index()];
        // P^T and dS^T, compiled twice: tiles inside the band and the sequences (all of a
        // non-causal call but the sequence ends) skip the per-element mask altogether, which
        // otherwise costs more issue slots than the exponentials.
        auto probabilities_and_ds = [&](auto masked_tag) {
          constexpr bool kMasked = decltype(masked_tag)::value;
          // The queries each of this thread's two keys sees, as block-relative bounds.
          int first[kRows], last[kRows];
          if constexpr (kMasked) {
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r)
              mask.col_window(n0 + get<0>(cS_rc(r, 0)), m0, kBlockM, first[r], last[r]);
          }
          auto keep = [&](int r, int c, float x) {
            if constexpr (kMasked) {
              const int q = get<1>(cS_rc(r, c));
              return q >= first[r] && q <= last[r] ? x : 0.f;
            }
            return x;
          };
          // A cut tile (bwd_non_finite.hpp): dS = 0 at the hidden pairs whatever dP and dsum
          // hold (the key windows recomputed: kept live across the dP^T wait they cost
          // registers); the products after this read Q, dO and K, so wait until they are
          // clean; a zeroed dO row's dsum is not finite: 0 * dS makes its P NaN at the pairs
          // it sees, so dV of those keys stays NaN.
          auto select_ds = [&] {
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r) {
              mask.col_window(n0 + get<0>(cS_rc(r, 0)), m0, kBlockM, first[r], last[r]);
              CUTE_UNROLL
              for (int c = 0; c < kCols; ++c) dp_rc(r, c) = keep(r, c, dp_rc(r, c));
            }
            if (BwdNonFinite<Traits>::wait_clean(ss, state)) {
              CUTE_UNROLL
              for (int i = 0; i < size(acc_s); ++i) acc_s(i) += 0.f * acc_dp(i);
            }
          };
          // The statistics are loaded before the accumulator waits: shared memory is busy with
          // wgmma operands and TMA writes, and a load issued after the wait put its whole
          // latency in front of the first exponential (the consumers' most sampled stall in
          // Nsight Compute at d128).
          float2 lse[kCols / 2];
          CUTE_UNROLL
          for (int c = 0; c < kCols; c += 2) lse[c / 2] = stats_of(lse_stage, c);
          warpgroup_wait<1>();  // S^T done; dP^T still running
          if (!has_softcap) {
            if (kMasked && keys_zeroed) {  // rare: a key whose K chunk was zeroed scores -inf
              CUTE_UNROLL
              for (int r = 0; r < kRows; ++r)
                if (BwdNonFinite<Traits>::key_zeroed(ss, key_of_row(r))) {
                  CUTE_UNROLL
                  for (int c = 0; c < kCols; ++c) s_rc(r, c) = -INFINITY;
                }
            }
            CUTE_UNROLL
            for (int c = 0; c < kCols; c += 2) {
              const float2 lse_c = lse[c / 2];
              CUTE_UNROLL
              for (int r = 0; r < kRows; ++r)
                CUTE_UNROLL
                for (int e = 0; e < 2; ++e)
                  s_rc(r, c + e) = keep(
                      r, c + e, fast_exp2(s_rc(r, c + e) * scale_log2 - (e ? lse_c.y : lse_c.x)));
            }
          }
          float2 dsum_first[kDsumPrefetch / 2];
          CUTE_UNROLL
          for (int c = 0; c < kDsumPrefetch; c += 2) dsum_first[c / 2] = stats_of(dsum_stage, c);
          warpgroup_wait<0>();  // dP^T done
          if constexpr (kMasked) {
            // Rare: such a key's exact scores. After the dP wait: a call must not run while
            // a wgmma still writes registers.
            if (has_softcap && keys_zeroed) {
              BwdNonFinite<Traits>::wait_clean(ss, state);  // (the Q stage read here)
              CUTE_UNROLL
              for (int r = 0; r < kRows; ++r) {
                const int key = key_of_row(r);
                if (!BwdNonFinite<Traits>::key_zeroed(ss, key) || n0 + key >= mask.seqlen_k)
                  continue;
                CUTE_UNROLL
                for (int c = 0; c < kCols; ++c) {
                  const int q = get<1>(cS_rc(r, c));
                  // (A query past the sequence's end keeps its score: lse = +inf gives P = 0.)
                  if (m0 + q < mask.seqlen_q)
                    s_rc(r, c) = BwdNonFinite<Traits>::exact_score(p, batch, head_kv, n0 + key,
                                                                   ss, state.index(), q);
                }
              }
            }
          }
          if (!has_softcap) {
            CUTE_UNROLL
            for (int c = 0; c < kCols; c += 2) {
              const float2 dsum = c < kDsumPrefetch ? dsum_first[c / 2] : stats_of(dsum_stage, c);
              CUTE_UNROLL
              for (int r = 0; r < kRows; ++r)
                CUTE_UNROLL
                for (int e = 0; e < 2; ++e)
                  dp_rc(r, c + e) = s_rc(r, c + e) * (dp_rc(r, c + e) - (e ? dsum.y : dsum.x));
            }
          } else {
            // s = c tanh(x scale / c): P from t = tanh(.), and dS carries ds/dx / scale =
            // 1 - t^2 (the scale is applied to dK at the end and to dQ in the post-pass).
            CUTE_UNROLL
            for (int c = 0; c < kCols; c += 2) {
              // Reloaded: keeping lse live across the dP^T wait spilled 72 B at d128.
              const float2 lse_c = stats_of(lse_stage, c);
              const float2 dsum = stats_of(dsum_stage, c);
              CUTE_UNROLL
              for (int r = 0; r < kRows; ++r)
                CUTE_UNROLL
                for (int e = 0; e < 2; ++e) {
                  const float t = tanhf(s_rc(r, c + e) * kp.softcap_in_scale);
                  const float pr =
                      keep(r, c + e, fast_exp2(t * scale_log2 - (e ? lse_c.y : lse_c.x)));
                  s_rc(r, c + e) = pr;
                  dp_rc(r, c + e) =
                      pr * (dp_rc(r, c + e) - (e ? dsum.y : dsum.x)) * (1.f - t * t);
                }
            }
          }
          if constexpr (kMasked) select_ds();
        };
        // Only tiles crossing a band edge or a sequence end carry the per-element mask.
        // A key whose K chunk was zeroed (rare) takes every tile down the masked path.
        if (mask.tile_unmasked(m, kBlockM, n_block, kBlockN) && !keys_zeroed)
          probabilities_and_ds(std::false_type{});
        else
          probabilities_and_ds(std::true_type{});

        // dV += P^T dO.
        Tensor p_regs = convert_fragment<Element>(acc_s);
        Tensor tdVrP = make_tensor(p_regs.data(), wgmma_acc_as_a_operand(p_regs.layout()));
        wgmma<false>(mma_dkv, tdVrP, tdVrdOt(_, _, _, state.index()), acc_dv);

        // dS^T to shared memory for dQ, then dK += dS^T Q. The dS buffer cycles with the
        // blocks, as the Q/dO ring index does.
        Tensor ds_regs = convert_fragment<Element>(acc_dp);
        const int buf = state.index();
        // Taking turns: buffer `buf` was last read by the dQ of block it - 2, which the
        // warpgroup whose turn this block is computed; the other one waits for it.
        const bool my_turn = Traits::kDqAlternate && (it & 1) == warpgroup;
        if constexpr (Traits::kDqAlternate)
          if (it >= 2 && !my_turn)
            named_barrier_sync(NamedBarrier::kBwdDsFree + buf, Traits::kConsumerThreads);
        // stmatrix: one instruction stores four 8 x 8 tiles (rows are keys, 8 queries each,
        // contiguous in the query-contiguous dS), a quarter of the 4-byte stores' instructions
        // through the MIO queue.
        copy(ds_copy, ds_copy_thr.retile_S(ds_regs), tdSsdS(_, _, _, buf));
        Tensor tdKrdS = make_tensor(ds_regs.data(), wgmma_acc_as_a_operand(ds_regs.layout()));
        wgmma<false>(mma_dkv, tdKrdS, tdKrQt(_, _, _, state.index()), acc_dk);
        // Generic-proxy writes that wgmma (async proxy) reads: fence before the barrier. After
        // dK's issue, so that dK does not wait for the store to complete.
        cutlass::arch::fence_view_async_shared();
        warpgroup_wait<1>();  // dV done: the P registers are free before dQ's accumulators,
        pipeline_do.consumer_release(state);  // and dO (read by dP^T and dV only) is too
        if constexpr (Traits::kDqAlternate) {
          if (my_turn) {
            named_barrier_sync(NamedBarrier::kBwdDsReady + buf, Traits::kConsumerThreads);
            Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
            Tensor tdQrdS_buf = tdQrdS(_, _, _, buf);
            wgmma<true>(mma_dq, tdQrdS_buf, tdQrKt, acc_dq);
            warpgroup_wait<1>();  // dK done: Q is free
            pipeline_q.consumer_release(state);
            if constexpr (kDeterministic)  // the turn's load overlaps dQ on the tensor cores
              dq_wait_turn(dq_counter(head * num_m_blocks + m),
                           dq_add_rank(mask, m, kBlockM, n_block, kBlockN));
            warpgroup_wait<0>();  // dQ done: dS buffer `buf` is free
            if (it + 2 < num_blocks)
              named_barrier_arrive(NamedBarrier::kBwdDsFree + buf, Traits::kConsumerThreads);
            // Straight from registers into dq_accum: thread dq_tid's element 4v + e goes to
            // float 4 (v kDqThreads + dq_tid) + e of the block (bwd_dq_convert.hpp), so each
            // warp's float4 reductions cover 512 contiguous bytes.
            float4* dq = reinterpret_cast<float4*>(kp.dq_accum + dq_block_offset<Traits>(
                                                                     p, batch, head, m, num_m_blocks)) +
                         dq_tid;
            CUTE_UNROLL
            for (int v = 0; v < kDqVecs; ++v)
              atomicAdd(dq + v * Traits::kDqThreads,
                        make_float4(acc_dq(4 * v), acc_dq(4 * v + 1), acc_dq(4 * v + 2),
                                    acc_dq(4 * v + 3)));
            if constexpr (kDeterministic) dq_warp_added(&ss.dq_added);
          } else {
            named_barrier_arrive(NamedBarrier::kBwdDsReady + buf, Traits::kConsumerThreads);
            warpgroup_wait<0>();  // dK done: Q is free
            pipeline_q.consumer_release(state);
          }
        } else {
          // dQ = dS K needs both warpgroups' keys. Buffer `buf` is rewritten kStages blocks later,
          // after both warpgroups have passed the next barrier, i.e. finished this dQ product.
          // The same barrier publishes the previous block's dQ stage: thread 0 first makes sure
          // the stage before it (which this block's dQ will overwrite) has been read, and after
          // the barrier hands the previous one to the copy engine.
          // Deterministic: the writer has read the stage (it added block it - 2 from it), and
          // is told after the barrier that the previous block's stage is full.
          if (tid == 0) {
            if constexpr (kDqWriter) {
              if (it >= Traits::kStages)
                cutlass::arch::ClusterBarrier::wait(&ss.dq_empty[buf],
                                                    ((it - Traits::kStages) / Traits::kStages) & 1);
            } else {
              tma_store_wait<0>();
            }
          }
          named_barrier_sync(NamedBarrier::kBwdDsReady, Traits::kConsumerThreads);
          if (tid == 0 && pending >= 0) {
            if constexpr (kDqWriter)
              cutlass::arch::ClusterBarrier::arrive(&ss.dq_full[pending % Traits::kStages]);
            else
              reduce_pending();
          }
          Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
          Tensor tdQrdS_buf = tdQrdS(_, _, _, buf);
          wgmma<true>(mma_dq, tdQrdS_buf, tdQrKt, acc_dq);
          warpgroup_wait<0>();  // dK, dQ done: Q and dS buffer `buf` are free
          pipeline_q.consumer_release(state);

          // Stage dQ (the buffer cycles like dS's); reduced after the next barrier.
          float4* stage = dq_stage + buf * kStageVecs;
          CUTE_UNROLL
          for (int v = 0; v < kDqVecs; ++v)
            stage[v * Traits::kDqThreads + tid] =
                make_float4(acc_dq(4 * v), acc_dq(4 * v + 1), acc_dq(4 * v + 2), acc_dq(4 * v + 3));
          // No proxy fence here: the next block's fence after its dS store (before the barrier
          // that publishes this stage to the bulk reduction) covers these writes too, and the
          // stores complete behind the next block's products instead of stalling this thread.
          pending = Traits::kStages * (head * num_m_blocks + m) + buf;
        }
        ++state;
        ++it;
      }
    }
    if constexpr (!Traits::kDqAlternate) {
      // The last block's stage: every consumer has written it (and fenced it for the copy
      // engine), then thread 0 reduces it and waits for completion (the shared memory must
      // stay valid until then).
      cutlass::arch::fence_view_async_shared();
      named_barrier_sync(NamedBarrier::kBwdDsReady, Traits::kConsumerThreads);
      if (tid == 0) {
        if constexpr (kDqWriter) {  // the writer keeps the CTA alive until it has added it
          cutlass::arch::ClusterBarrier::arrive(&ss.dq_full[pending % Traits::kStages]);
        } else {
          reduce_pending();
          bulk_wait_all();
        }
      }
    }
  }

  // Deterministic d64: the announcer, one thread of the producer warpgroup (bwd_dq_order.hpp),
  // over the blocks in the consumers' order. m_range is non-empty.
  __device__ void announce_dq(const BwdKernelParams& kp, int head_kv, int batch,
                              BlockRange m_range, SharedStorage& ss) const {
    static_assert(kDqAnnouncer);
    dq_announce<kAddingWarps, kBlockM>(kp, head_kv, batch, m_range, &ss.dq_added);
  }

  // Deterministic d128: the dQ writer, one thread of the producer warpgroup. For every block
  // the consumers walk, in their order (stage i % kStages for the i-th): waits for this key
  // block's turn (bwd_dq_order.hpp, one arrival per key block) and for the consumers to have
  // staged the block (dq_full), adds the stage to dq_accum with one bulk reduction, frees the
  // stage once it has been read (dq_empty), and arrives once the reduction has completed.
  // m_range is non-empty.
  __device__ void write_dq(const BwdKernelParams& kp, const WindowMask& mask, int n_block,
                           int head_kv, int batch, BlockRange m_range, SharedStorage& ss) const {
    static_assert(kDqWriter);
    const BackwardParams& p = kp.p;
    const int group = p.heads_q / p.heads_kv;
    const int num_m_blocks = int((std::int64_t(p.seqlen_q) + kBlockM - 1) / kBlockM);
    // dq_accum blocks and their counters of this batch, named head * num_m_blocks + m.
    int* const counters = kp.dq_semaphore + std::int64_t(batch) * p.heads_q * num_m_blocks;
    float* const accum = kp.dq_accum + dq_block_offset<Traits>(p, batch, 0, 0, num_m_blocks);
    int i = 0;
    for (int head = head_kv * group; head < (head_kv + 1) * group; ++head) {
      for (int m = m_range.begin; m < m_range.end; ++m, ++i) {
        const int stage = i % Traits::kStages;
        const int block = head * num_m_blocks + m;
        dq_wait_turn_or_trap(counters + block, dq_add_rank(mask, m, kBlockM, n_block, kBlockN));
        dq_fence_to_async_proxy();
        cutlass::arch::ClusterBarrier::wait(&ss.dq_full[stage], (i / Traits::kStages) & 1);
        bulk_reduce_add(accum + std::int64_t(block) * Traits::kDqBlockFloats,
                        ss.dq.data() + stage * Traits::kDqBlockFloats,
                        Traits::kDqBlockFloats * sizeof(float));
        tma_store_arrive();
        tma_store_wait<0>();  // the stage has been read
        cutlass::arch::ClusterBarrier::arrive(&ss.dq_empty[stage]);
        bulk_wait_all();  // and added
        dq_arrive_after_bulk(counters + block);
      }
    }
  }
};

}  // namespace flashcpp::detail::cuda::sm90
