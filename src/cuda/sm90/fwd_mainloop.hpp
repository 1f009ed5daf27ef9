#pragma once
// The sm90 forward mainloop: a producer (one thread of the producer warpgroup) loads each
// tile's Q once and streams K, V block by block through TMA into shared-memory rings guarded by mbarriers; each
// consumer warpgroup runs S = Q K^T (wgmma, both operands in shared memory), the online
// softmax in registers and O += P V (wgmma, P from registers).
//
// Key blocks run from the last visible one down (the partial/diagonal blocks, which need the
// mask, come first). Producer and consumers walk the same block range, so every mbarrier phase
// matches; a tile with no visible key is skipped by both before any barrier is touched.
//
// Intra-warpgroup overlap (FA3): for block n the consumer issues S_n = Q K_n^T, then
// O += P_{n+1} V_{n+1}, waits for S_n only and runs the mask and softmax of S_n while the
// P V product is still on the tensor cores; O is rescaled after that product completes.
//
// Ping-pong (d <= 128, where the softmax is as long as the products): the consumer
// warpgroups (two, or three on 192-row tiles) take turns issuing their GEMMs through one named
// barrier each, so one warpgroup's softmax runs while the others' products occupy the tensor
// cores. Each warpgroup issues k + 1 times for k key blocks (first S, k - 1 steady steps, last
// P V) and hands the turn to the next after each. The turns run on across tiles: the last
// warpgroup's last hand-over of a tile lets warpgroup 0 start the next tile while the others
// still run their epilogues. The last warpgroup gives the very first turn (pingpong_start)
// and warpgroup 0 takes the one hand-over left at the end (pingpong_finish), so every barrier
// ends balanced.
//
// FP8 (Traits::kFp8): V tiles come from the pre-pass's V^T in the workspace (K-major), P is
// packed into e4m3 A registers in the accumulator's own key order (fp8_pv_order.hpp), the
// q and k descales of the tile's (sequence, kv head) scale the scores, and each key block's
// P V is summed apart from O in chunks of Dv columns (fp8_pv_chunks.hpp): the first chunk
// runs under the softmax of S_n, the others after it (with two temporaries, each while the
// one before is added to O).
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/common/fragment_utils.hpp"
#include "common/mask.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm90/fp8_pv_chunks.hpp"
#include "cuda/sm90/fp8_pv_order.hpp"
#include "cuda/sm90/fp8_vt_layout.hpp"
#include "cuda/sm90/fwd_non_finite_v.hpp"
#include "cuda/sm90/fwd_params.hpp"
#include "cuda/sm90/named_barriers.hpp"
#include "cuda/sm90/softmax.hpp"
#include "cuda/sm90/wgmma.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Traits_>
struct FwdMainloop {
  using Traits = Traits_;
  // Ping-pong bookends, called once per CTA by every consumer thread (tid among the consumer
  // threads) before its first tile and after its last (no-ops without ping-pong).
  __device__ static void pingpong_start(int tid) {
    if constexpr (Traits::kPingPong)
      if (tid / 128 == Traits::kConsumerWarpgroups - 1)
        named_barrier_arrive(NamedBarrier::kWarpScheduler0, 256);
  }
  __device__ static void pingpong_finish(int tid) {
    if constexpr (Traits::kPingPong)
      if (tid / 128 == 0) named_barrier_sync(NamedBarrier::kWarpScheduler0, 256);
  }

  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kHeadDimV = Traits::kHeadDimV;

  // Producer: one elected thread. K_n, Q, V_n, then K_n and V_n for n = end-2 down to begin.
  // `work` counts the tiles with work this CTA has loaded before (the Q barriers' phase);
  // `state` is the K/V ring position, carried from tile to tile. The first K block is issued
  // before waiting for the Q buffer, which frees only when the previous tile's last S = Q K^T
  // has completed. `batch` is the tile's sequence (the paged instantiation's block table row).
  // The V of a key block the mask cuts is scanned for NaN/Inf before the consumers use it
  // (fwd_non_finite_v.hpp).
  __device__ void load(const FwdParams<Traits>& params, const SeqlenInfo& seq, int m_block,
                       int head, int batch, BlockRange range, int work, PipelineState& state,
                       Pipeline& pipeline_k, Pipeline& pipeline_v, SharedStorage& ss) const {
    const ForwardParams& p = params.kp.p;
    const int head_kv = head / (p.heads_q / p.heads_kv);
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});

    // This sequence's rows: (row, dim) views shifted to its first row (0 unless varlen).
    Tensor mQ = domain_offset(
        make_coord(int(seq.row_q), _0{}),
        params.tma_q.get_tma_tensor(make_shape(tma_rows_q(p), p.head_dim, p.heads_q,
                                               tma_batches(p)))(_, _, head, int(seq.batch_q)));
    Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, _0{}));
    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                      group_modes<0, 2>(gQ));

    // Q is read by this CTA only; K and V by every query tile of the head: keep them in L2.
    // The paged instantiation runs this on the 32 lanes of warp 0: thread 0 leads (Q, and the
    // pipelines' arrivals: their is_leader).
    using cute::TMA::CacheHintSm90;
    const bool leader = !Traits::kPaged || threadIdx.x == 0;
    // FP8: the sequence's first column in V^T (fp8_vt_layout.hpp).
    int vt_start = 0;
    if constexpr (Traits::kFp8)
      vt_start = int(fp8_vt_seq_start(seq.row_k + seq.batch_k * p.seqlen_k, batch));
    if constexpr (Traits::kScanV) {
      if (leader) {
        // FP8: where the NaN key bits of the tile's keys start.
        const int nan_word = Traits::kFp8 ? fp8_v_nan_key_word(p, head_kv, vt_start) : 0;
        FwdNonFiniteV<Traits>::publish_tile(ss, work, range, m_block, seq.seqlen_q, seq.seqlen_k,
                                            nan_word);
      }
    }
    auto issue = [&](auto&& load_k, auto&& load_v) {
      load_k(range.end - 1);
      if (work > 0) cutlass::arch::ClusterBarrier::wait(&ss.q_empty, (work - 1) & 1);
      if (leader) {
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.q_full,
                                                                       Traits::kQBytes);
        copy(params.tma_q.with(ss.q_full, 0, CacheHintSm90::EVICT_FIRST), tQgQ, tQsQ);
      }
      load_v(range.end - 1);
      for (int n = range.end - 2; n >= range.begin; --n) {
        load_k(n);
        load_v(n);
      }
    };

    if constexpr (Traits::kPaged) {
      load_paged(params, seq, head_kv, batch, state, pipeline_k, pipeline_v, ss, issue);
    } else {
      Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
      Tensor mK = domain_offset(
          make_coord(int(seq.row_k), _0{}),
          params.tma_k.get_tma_tensor(make_shape(tma_rows_k(p), p.head_dim, p.heads_kv,
                                                 tma_batches(p)))(_, _, head_kv, int(seq.batch_k)));
      Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{},
                             make_coord(_, _0{}));  // (kBlockN, kHeadDim, n)
      auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{},
                                        group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      auto [tVgV, tVsV] = [&] {
        if constexpr (Traits::kFp8) {
          // V^T of this sequence and kv head: (Dv, key) from its start in the workspace.
          Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutVt{});
          Tensor mVt = domain_offset(
              make_coord(_0{}, vt_start),
              params.tma_v.get_tma_tensor(make_shape(p.head_dim_v, int(fp8_vt_row_columns(p)),
                                                     p.heads_kv, 1))(_, _, head_kv, 0));
          Tensor gVt = local_tile(mVt, Shape<Int<kHeadDimV>, Int<kBlockN>>{},
                                  make_coord(_0{}, _));  // (Dv, kBlockN, n)
          return tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sVt),
                               group_modes<0, 2>(gVt));
        } else {
          Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
          Tensor mV = domain_offset(
              make_coord(int(seq.row_k), _0{}),
              params.tma_v.get_tma_tensor(make_shape(tma_rows_k(p), p.head_dim_v, p.heads_kv,
                                                     tma_batches(p)))(_, _, head_kv,
                                                                      int(seq.batch_k)));
          Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDimV>>{}, make_coord(_, _0{}));
          return tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                               group_modes<0, 2>(gV));
        }
      }();
      auto load_k = [&](int n) {
        pipeline_k.producer_acquire(state);
        copy(params.tma_k.with(*pipeline_k.producer_get_barrier(state), 0,
                               CacheHintSm90::EVICT_LAST),
             tKgK(_, n), tKsK(_, state.index()));
      };
      auto load_v = [&](int n) {
        pipeline_v.producer_acquire(state);
        copy(params.tma_v.with(*pipeline_v.producer_get_barrier(state), 0,
                               CacheHintSm90::EVICT_LAST),
             tVgV(_, n), tVsV(_, state.index()));
        ++state;
      };
      issue(load_k, load_v);
    }
  }

  // Consumer warpgroups (thread index tid among the consumer threads). Leaves the
  // unnormalised O in acc_o (cleared by the caller) and the row statistics in softmax; range
  // is non-empty. `work` and the ring position `state` carry over from tile to tile as in
  // load(); within the tile the K and V positions part (S of block n runs ahead of P V of
  // block n + 1) and meet again at its end. Returns the ring stage of the tile's last key
  // block: with Traits::kOInRing its K and V stages are still held (the epilogue stages O in
  // them and releases them).
  template <class AccO, class SoftmaxT>
  __device__ int mma(const FwdKernelParams& kp, const SeqlenInfo& seq, const WindowMask& mask,
                      int m_block, int head, int batch, BlockRange range, BlockRange unmasked,
                      int work,
                      PipelineState& state, Pipeline& pipeline_k, Pipeline& pipeline_v,
                      SharedStorage& ss, int tid, AccO& acc_o, SoftmaxT& softmax) const {
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutVt{});

    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(tid);
    auto thr_pv = mma_pv.get_thread_slice(tid);
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // descriptors (1, 1, D/16)
    Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (1, 1, D/16, stages)
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (1, 1, kBlockN/16, stages)
    // (row, col) of every S element in the kBlockM x kBlockN tile (rows include this
    // warpgroup's 64-row offset).
    Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor c_rc = make_tensor(tScS.data(), wgmma_acc_rowcol(tScS.layout()));

    constexpr int kRows = decltype(size<0>(wgmma_acc_rowcol(acc_o.layout())))::value;
    Tensor o_rc = make_tensor(acc_o.data(), wgmma_acc_rowcol(acc_o.layout()));
    // One key block's P V: pv_start issues it (inside the ping-pong turn); pv_finish waits for
    // it, calls done() once the product no longer reads P's registers or the V stage, and
    // leaves O = (O + P V), times each row's o_scale with rescale (true_type). FP8 with
    // Traits::kPvChunk: summed apart from O in chunks of Dv columns and added to O in fp32
    // (fp8_pv_chunks.hpp: the FP8 adder of the tensor cores would drop small terms from an O
    // carried along a long row); otherwise O is the tensor cores' accumulator.
    constexpr bool kChunked = Traits::kPvChunk > 0;
    auto chunks = [&] {
      if constexpr (kChunked)
        return Fp8PvChunks<Traits>{};
      else
        return 0;
    }();
    auto tOrVChunks = [&] {
      if constexpr (kChunked)
        return chunks.b_fragments(tid, sVt);  // (1, chunk, kBlockN/32, stages)
      else
        return 0;
    }();
    // The wgmma commit groups pv_start leaves pending.
    constexpr int kPvGroups = [] {
      if constexpr (kChunked)
        return Fp8PvChunks<Traits>::kGroupsInFlight;
      else
        return 1;
    }();
    auto pv_start = [&](auto& p_operand, int stage) {
      if constexpr (kChunked)
        chunks.start(p_operand, tOrVChunks, stage);
      else
        wgmma<false>(mma_pv, p_operand, tOrV(_, _, _, stage), acc_o);
    };
    auto pv_finish = [&](auto rescale, auto& p_operand, int stage, const auto& o_scale,
                         auto&& done) {
      if constexpr (kChunked) {
        chunks.template finish<decltype(rescale)::value>(p_operand, tOrVChunks, stage, o_rc,
                                                         o_scale, done);
      } else {
        warpgroup_wait<0>();
        done();
        if constexpr (decltype(rescale)::value) Softmax<kRows>::rescale_o(o_rc, o_scale);
      }
    };
    const int m0 = m_block * kBlockM;
    const bool has_softcap = kp.softcap_in_scale != 0.f;
    // FP8: the scores are Q K^T of the codes; q_descale * k_descale joins the score scale (the
    // softcap's input scale when capped). scale_log2 and softcap_in_scale are kp's otherwise.
    const float qk_descale = Traits::kFp8 ? score_descale(kp.p, head, batch) : 1.f;
    const float scale_log2 =
        Traits::kFp8 && !has_softcap ? kp.scale_log2 * qk_descale : kp.scale_log2;
    const float softcap_in_scale =
        Traits::kFp8 ? kp.softcap_in_scale * qk_descale : kp.softcap_in_scale;

    // Softcap, then the mask on blocks outside the unmasked band (a uniform branch).
    auto score_mod = [&](auto& acc_s, int n) {
      if (has_softcap) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) acc_s(i) = tanhf(acc_s(i) * softcap_in_scale);
      }
      if (n >= unmasked.end || n < unmasked.begin) {
        // The row's visible keys in this block once per row (64-bit), then two int compares
        // per element: the per-element 64-bit test was a third of the instructions of a d64
        // causal N = 512 call (ncu on the H100).
        const int n0 = n * kBlockN;
        Tensor sc_rc = make_tensor(acc_s.data(), wgmma_acc_rowcol(acc_s.layout()));
        CUTE_UNROLL
        for (int r = 0; r < size<0>(sc_rc); ++r) {
          int first, last;
          mask.row_window(m0 + get<0>(c_rc(r, 0)), n0, kBlockN, first, last);
          CUTE_UNROLL
          for (int c = 0; c < size<1>(sc_rc); ++c) {
            const int col = get<1>(c_rc(r, c));
            if (col < first || col > last) sc_rc(r, c) = -INFINITY;
          }
        }
      }
    };

    // Turn-taking of the consumer warpgroups in the order 0, 1(, 2) (no-ops without
    // ping-pong): each barrier joins a warpgroup and the one whose turn came before.
    const int wg = tid / 128;
    auto turn_begin = [&] {
      if constexpr (Traits::kPingPong) named_barrier_sync(fwd_scheduler_barrier(wg), 256);
    };
    auto turn_end = [&] {
      if constexpr (Traits::kPingPong)
        named_barrier_arrive(
            fwd_scheduler_barrier(wg + 1 == Traits::kConsumerWarpgroups ? 0 : wg + 1), 256);
    };

    // Rows that see a non-finite V in a cut block get NaN (fwd_non_finite_v.hpp).
    using NonFiniteV = FwdNonFiniteV<Traits>;

    PipelineState k_state = state, v_state = state;
    auto release_v = [&] {
      pipeline_v.consumer_release(v_state);
      ++v_state;
    };
    // K of block n is done with once S_n has completed; the last block's stage stays with the
    // consumers when O goes through the ring.
    auto release_k = [&](int n) {
      if (!(Traits::kOInRing && n == range.begin)) pipeline_k.consumer_release(k_state);
      ++k_state;
    };
    cutlass::arch::ClusterTransactionBarrier::wait(&ss.q_full, work & 1);

    // ---- first block: S, softmax, P (nothing to overlap with yet) ----
    int n = range.end - 1;
    Tensor acc_s = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
    Tensor s_rc = make_tensor(acc_s.data(), wgmma_acc_rowcol(acc_s.layout()));
    // S = Q K_stage^T. FP8: descriptors recomputed at each issue (opaque_descriptors, wgmma.hpp).
    // Traits::kQDescPerIteration (bf16/fp16): Q's descriptors likewise; otherwise the compiler
    // keeps all D/16 of them (64-bit each) live across the loop, which at d256 spilled: six
    // 8-byte reloads per key block. K's and V's made no difference there when rebuilt too.
    auto qk = [&](int stage) {
      if constexpr (Traits::kFp8) {
        Tensor q = opaque_descriptors(tSrQ);
        wgmma<true>(mma_qk, q, opaque_descriptors(tSrK(_, _, _, stage)), acc_s);
      } else if constexpr (Traits::kQDescPerIteration) {
        Tensor q = opaque_descriptors(tSrQ);
        wgmma<true>(mma_qk, q, tSrK(_, _, _, stage), acc_s);
      } else {
        wgmma<true>(mma_qk, tSrQ, tSrK(_, _, _, stage), acc_s);
      }
    };
    float o_scale[kRows];
    pipeline_k.consumer_wait(k_state);
    turn_begin();
    qk(k_state.index());
    turn_end();
    warpgroup_wait<0>();
    release_k(n);
    score_mod(acc_s, n);
    softmax.step(s_rc, scale_log2, o_scale);
    Tensor p_regs = first_p(acc_s, mma_pv);
    Tensor tOrP = make_tensor(p_regs.data(), p_operand_layout(p_regs.layout()));
    // Chunked FP8: the next block's P, packed while the chunks of this one still read p_regs.
    auto p_next = [&] {
      if constexpr (kChunked)
        return make_fragment_like(p_regs);
      else
        return 0;
    }();
    // Varlen: the rows of the last key block past the sequence's end are the next sequence's
    // keys. The mask gives them P = 0, but 0 * NaN (or Inf) in their V would still reach O,
    // so they are zeroed before the block's P V (padded calls load zeros there): by the V
    // scan, since such a block is cut (fwd_non_finite_v.hpp). FP8: the pre-pass wrote zeros
    // there.
    static_assert(Traits::kScanV || Traits::kFp8, "the V scan zeroes the varlen tail rows");
    // Cut block `block`, whose V is in v_state's stage (scanned, not yet released): the rows
    // that see a key the scan flagged become NaN in O (fwd_non_finite_v.hpp). FP8: at the end
    // of the tile instead, from the pre-pass's bits, if a cut block had a flagged key: the
    // test between the P V chunks' issues made ptxas serialise the wgmmas (C7513).
    auto nan_rows_seeing_flagged_keys = [&](int block) {
      if constexpr (Traits::kScanV && !Traits::kFp8) {
        if (block_is_cut(block, unmasked) && ss.v_flagged[v_state.index()]) {
          if (const std::uint32_t rows = NonFiniteV::template rows_seeing_flagged_keys<kRows>(
                  ss, v_state.index(), mask, c_rc, m0, block * kBlockN)) {
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r)
              if (rows >> r & 1) {
                CUTE_UNROLL
                for (int c = 0; c < size<1>(o_rc); ++c) o_rc(r, c) = NAN;
              }
          }
        }
      }
    };

    // ---- steady state: S_n overlaps P_{n+1} V_{n+1} ----
    for (--n; n >= range.begin; --n) {
      pipeline_k.consumer_wait(k_state);
      turn_begin();
      qk(k_state.index());
      pipeline_v.consumer_wait(v_state);
      if constexpr (Traits::kScanV)
        if (block_is_cut(n + 1, unmasked)) NonFiniteV::wait_scanned(ss, v_state);
      pv_start(tOrP, v_state.index());
      turn_end();
      warpgroup_wait<kPvGroups>();  // S_n done; P V still running
      release_k(n);
      score_mod(acc_s, n);
      softmax.step(s_rc, scale_log2, o_scale);
      if constexpr (Traits::kScanV && !Traits::kFp8) {
        if (block_is_cut(n + 1, unmasked) && ss.v_flagged[v_state.index()]) {
          // A NaN rescale makes the whole O row NaN from here on.
          if (const std::uint32_t rows = NonFiniteV::template rows_seeing_flagged_keys<kRows>(
                  ss, v_state.index(), mask, c_rc, m0, (n + 1) * kBlockN)) {
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r)
              if (rows >> r & 1) o_scale[r] = NAN;
          }
        }
      }
      // P_{n+1} V_{n+1} done and in O, O rescaled where a row's max moved (a warp-uniform
      // branch, Softmax::any_row_rescales): the V stage and P's registers are free.
      const bool rescale = Softmax<kRows>::any_row_rescales(o_scale);
      auto pv_finish_rescaling = [&] {
        if (rescale)
          pv_finish(cute::true_type{}, tOrP, v_state.index(), o_scale, release_v);
        else
          pv_finish(cute::false_type{}, tOrP, v_state.index(), o_scale, release_v);
      };
      if constexpr (kChunked) {
        // P_n packed first, into p_next (the chunks still read p_regs): S's fp32 registers
        // are then free while the chunks are added to O.
        pack_p_fp8(acc_s, p_next);
        pv_finish_rescaling();
        Tensor from = recast<std::uint32_t>(p_next);
        Tensor to = recast<std::uint32_t>(p_regs);
        CUTE_UNROLL
        for (int i = 0; i < size(to); ++i) to(i) = from(i);
      } else {
        pv_finish_rescaling();
        if constexpr (Traits::kFp8) {
          pack_p_fp8(acc_s, p_regs);
        } else {
          Tensor p_converted = convert_fragment<Element>(acc_s);
          CUTE_UNROLL
          for (int i = 0; i < size(p_converted); ++i) p_regs(i) = p_converted(i);
        }
      }
    }

    // Every S = Q K^T of the tile has completed: the producer may load the next tile's Q.
    cutlass::arch::ClusterBarrier::arrive(&ss.q_empty);

    // ---- last P V ----
    pipeline_v.consumer_wait(v_state);
    if constexpr (Traits::kScanV)
      if (block_is_cut(range.begin, unmasked)) NonFiniteV::wait_scanned(ss, v_state);
    turn_begin();
    pv_start(tOrP, v_state.index());
    turn_end();
    // The last block's rows that see a flagged key are NaN once its P V is in O (read before
    // the stage, and its flag, are released).
    bool flagged = false;  // FP8: a cut block of the tile had a NaN key
    const int last = v_state.index();
    pv_finish(cute::false_type{}, tOrP, v_state.index(), o_scale, [&] {
      nan_rows_seeing_flagged_keys(range.begin);
      if constexpr (Traits::kFp8) flagged = NonFiniteV::tile_flagged(ss, work);
      if constexpr (Traits::kOInRing)
        ++v_state;  // held for O (the epilogue releases it)
      else
        release_v();
    });
    if constexpr (Traits::kFp8) {
      if (flagged) {
        const ForwardParams& p = kp.p;
        const int head_kv = head / (p.heads_q / p.heads_kv);
        const int vt_start = int(fp8_vt_seq_start(seq.row_k + seq.batch_k * p.seqlen_k, batch));
        NonFiniteV::template nan_rows_seeing_nan_keys<kRows>(
            kp.fp8_v_nan_keys, fp8_v_nan_key_word(p, head_kv, vt_start), range, unmasked, mask,
            c_rc, m0, o_rc);
      }
    }
    state = v_state;  // == k_state: every block's K and V consumed
    return last;
  }

 private:
  // P of the first key block in registers, and the A-operand view of those registers: the
  // 16-bit P converted in the accumulator's layout, viewed as k16 slices; FP8: the e4m3 A
  // fragment itself (pack_p_fp8).
  template <class AccS, class TiledMmaPV>
  __device__ static auto first_p(const AccS& acc_s, const TiledMmaPV& mma_pv) {
    if constexpr (Traits::kFp8) {
      Tensor p = make_tensor<Element>(
          partition_shape_A(mma_pv, Shape<Int<kBlockM>, Int<kBlockN>>{}));
      pack_p_fp8(acc_s, p);
      return p;
    } else {
      return convert_fragment<Element>(acc_s);
    }
  }
  template <class Layout>
  __device__ static auto p_operand_layout(Layout l) {
    if constexpr (Traits::kFp8)
      return l;
    else
      return wgmma_acc_as_a_operand(l);
  }

  // FP8: q_descale * k_descale of the tile's (sequence, kv head).
  __device__ static float score_descale(const ForwardParams& p, int head, int batch) {
    const int head_kv = head / (p.heads_q / p.heads_kv);
    return p.q_descale.at(batch, head_kv) * p.k_descale.at(batch, head_kv);
  }

  // FP8: P (the S accumulator after the softmax step, ((2, 2, kBlockN/8), 1, 1) in the wgmma
  // f32 layout) into the e4m3 A fragment of P V without leaving the thread: for each 32-key
  // chunk c, byte b of A register r gets accumulator value 16c + fp8_pv_acc_index(r, b)
  // (fp8_pv_order.hpp: the keys this puts in each slot, which V^T's order matches).
  // cvt.rn.satfinite.e4m3x2.f32 rounds to nearest (P is in [0, 1]; nothing saturates).
  template <class AccS, class TensorP>
  __device__ static void pack_p_fp8(const AccS& acc_s, TensorP& p) {
    static_assert(decltype(size(acc_s))::value == kBlockN / 2);
    static_assert(decltype(size(p))::value == kBlockN / 2);
    Tensor p32 = recast<std::uint32_t>(p);
    auto pair = [&](int i) {
      std::uint16_t packed;
      // The first source operand goes to the upper byte.
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;"
          : "=h"(packed)
          : "f"(float(acc_s(i))), "f"(float(acc_s(i + 1))));
      return std::uint32_t(packed);
    };
    CUTE_UNROLL
    for (int c = 0; c < kBlockN / 32; ++c) {
      CUTE_UNROLL
      for (int reg = 0; reg < 4; ++reg)
        p32(4 * c + reg) = pair(16 * c + fp8_pv_acc_index(reg, 0)) |
                           (pair(16 * c + fp8_pv_acc_index(reg, 2)) << 16);
    }
  }

  // The paged instantiation's K and V loads: key block n arrives as one box of kBlockN rows
  // where the page size is a multiple of kBlockN, else as boxes of 64 rows (kPageBoxRowsWide,
  // page sizes that are multiples of 64) or 16 rows (kPageBoxRows), each from its own page;
  // the stage's transaction byte count is the contiguous one. A box past the sequence's
  // keys, or whose block-table entry is outside [0, num_pages), is addressed at page num_pages,
  // outside the descriptor: TMA fills it with zeros and reads no memory (its bytes still count).
  // Rows past the sequence inside a used page are masked (K) and zeroed (V) by the consumers.
  template <class Issue>
  __device__ void load_paged(const FwdParams<Traits>& params, const SeqlenInfo& seq,
                             int head_kv, int batch, PipelineState& state,
                             Pipeline& pipeline_k, Pipeline& pipeline_v, SharedStorage& ss,
                             Issue&& issue) const {
    using cute::TMA::CacheHintSm90;
    constexpr int kBoxRows = Traits::kPageBoxRows;
    const ForwardParams& p = params.kp.p;
    const PagedKV& pg = params.kp.paged;
    const std::int32_t* table = pg.block_table + batch * pg.block_table_stride;
    // The block-table entry of key row `key` (< the sequence's keys), or num_pages (outside the
    // descriptor: TMA loads zeros) where the entry is outside [0, num_pages).
    auto page_of_key = [&](int key, int& in_page) {
      const int index = pg.page_shift >= 0 ? key >> pg.page_shift : key / pg.page_size;
      in_page = key - index * pg.page_size;
      const int entry = table[index];
      return entry < 0 || entry >= pg.num_pages ? pg.num_pages : entry;
    };

    if (pg.page_size % kBlockN == 0) {
      // Whole key blocks in one page: one table entry and one box (the contiguous kernel's)
      // per block. Every block of the range holds a key of the sequence, so its page is used.
      Tensor mK = params.tma_k_whole.get_tma_tensor(
          make_shape(pg.page_size, p.head_dim, p.heads_kv, pg.num_pages))(_, _, head_kv, _);
      Tensor mV = params.tma_v_whole.get_tma_tensor(
          make_shape(pg.page_size, p.head_dim_v, p.heads_kv, pg.num_pages))(_, _, head_kv, _);
      Tensor gK = flat_divide(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{})(_, _, _, _0{}, _);
      Tensor gV = flat_divide(mV, Shape<Int<kBlockN>, Int<kHeadDimV>>{})(_, _, _, _0{}, _);
      Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
      Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
      // tKgK (TMA, block in page, page); tKsK (TMA, stage); the same for V.
      auto [tKgK, tKsK] = tma_partition(params.tma_k_whole, _0{}, Layout<_1>{},
                                        group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      auto [tVgV, tVsV] = tma_partition(params.tma_v_whole, _0{}, Layout<_1>{},
                                        group_modes<0, 2>(sV), group_modes<0, 2>(gV));
      const bool leader = threadIdx.x == 0;
      auto load_k = [&](int n) {
        pipeline_k.producer_acquire(state);
        if (leader) {
          int in_page;
          const int page = page_of_key(n * kBlockN, in_page);
          copy(params.tma_k_whole.with(*pipeline_k.producer_get_barrier(state), 0,
                                       CacheHintSm90::EVICT_LAST),
               tKgK(_, in_page / kBlockN, page), tKsK(_, state.index()));
        }
      };
      auto load_v = [&](int n) {
        pipeline_v.producer_acquire(state);
        if (leader) {
          int in_page;
          const int page = page_of_key(n * kBlockN, in_page);
          copy(params.tma_v_whole.with(*pipeline_v.producer_get_barrier(state), 0,
                                       CacheHintSm90::EVICT_LAST),
               tVgV(_, in_page / kBlockN, page), tVsV(_, state.index()));
        }
        ++state;
      };
      issue(load_k, load_v);
      return;
    }

    // Boxes of 64 rows where the page size allows (4x fewer TMA issues than 16-row boxes).
    if constexpr (Traits::kPageBoxRowsWide != kBoxRows) {
      if (pg.page_size % Traits::kPageBoxRowsWide == 0) {
        load_boxes<Traits::kPageBoxRowsWide>(params, params.tma_k_wide, params.tma_v_wide, seq,
                                             head_kv, table, state, pipeline_k, pipeline_v, ss,
                                             issue);
        return;
      }
    }
    load_boxes<kBoxRows>(params, params.tma_k, params.tma_v, seq, head_kv, table, state,
                         pipeline_k, pipeline_v, ss, issue);
  }

  // Key block n as kBlockN / kRows boxes of kRows rows, box j from the page of key
  // n * kBlockN + j * kRows (the page size is a multiple of kRows), into rows j * kRows... of
  // the stage, through the descriptors tma_k and tma_v of kRows-row boxes.
  template <int kRows, class TmaKBoxes, class TmaVBoxes, class Issue>
  __device__ void load_boxes(const FwdParams<Traits>& params, const TmaKBoxes& tma_k,
                             const TmaVBoxes& tma_v, const SeqlenInfo& seq, int head_kv,
                             const std::int32_t* table, PipelineState& state,
                             Pipeline& pipeline_k, Pipeline& pipeline_v, SharedStorage& ss,
                             Issue&& issue) const {
    using cute::TMA::CacheHintSm90;
    constexpr int kBoxes = kBlockN / kRows;
    static_assert(kBoxes <= 32, "lane j of warp 0 issues box j: a key block has at most 32 boxes");
    const ForwardParams& p = params.kp.p;
    const PagedKV& pg = params.kp.paged;
    // (row in page, dim, page) views of the pool, cut into boxes: (box rows, dim, box, page).
    Tensor mK = tma_k.get_tma_tensor(
        make_shape(pg.page_size, p.head_dim, p.heads_kv, pg.num_pages))(_, _, head_kv, _);
    Tensor mV = tma_v.get_tma_tensor(
        make_shape(pg.page_size, p.head_dim_v, p.heads_kv, pg.num_pages))(_, _, head_kv, _);
    Tensor gK = flat_divide(mK, Shape<Int<kRows>, Int<kHeadDim>>{})(_, _, _, _0{}, _);
    Tensor gV = flat_divide(mV, Shape<Int<kRows>, Int<kHeadDimV>>{})(_, _, _, _0{}, _);
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()),
                            typename Traits::template SmemLayoutKBoxes<kRows>{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()),
                            typename Traits::template SmemLayoutVBoxes<kRows>{});
    // tKgK (TMA, box in page, page); tKsK (TMA, box in block, stage); the same for V.
    auto [tKgK, tKsK] = tma_partition(tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                      group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                      group_modes<0, 2>(gV));

    // Lane j < kBoxes of warp 0 looks up the page of box j and issues it: the table reads and
    // the box copies of a block go out side by side, not one after the other from one thread
    // (whose copies, asm that clobbers memory, also kept each table read behind the previous
    // box). A lane's entry (num_pages for a box past the sequence's keys or an entry outside
    // [0, num_pages)) serves its V box too: the producer issues V_n right after K_n. The
    // leader's arrival (producer_acquire) precedes the lanes' copies (__syncwarp).
    const int lane = threadIdx.x % 32;
    int entry = pg.num_pages, box = 0;
    auto look_up = [&](int n) {
      const int key = n * kBlockN + lane * kRows;
      const int index = pg.page_shift >= 0 ? key >> pg.page_shift : key / pg.page_size;
      box = (key - index * pg.page_size) / kRows;
      const int e = key < seq.seqlen_k ? table[index] : -1;
      entry = e < 0 || e >= pg.num_pages ? pg.num_pages : e;
    };
    auto load_k = [&](int n) {
      pipeline_k.producer_acquire(state);
      __syncwarp();
      if (lane < kBoxes) {
        look_up(n);
        copy(tma_k.with(*pipeline_k.producer_get_barrier(state), 0, CacheHintSm90::EVICT_LAST),
             tKgK(_, box, entry), tKsK(_, lane, state.index()));
      }
    };
    auto load_v = [&](int n) {
      pipeline_v.producer_acquire(state);
      __syncwarp();
      if (lane < kBoxes)
        copy(tma_v.with(*pipeline_v.producer_get_barrier(state), 0, CacheHintSm90::EVICT_LAST),
             tVgV(_, box, entry), tVsV(_, lane, state.index()));
      ++state;
    };
    issue(load_k, load_v);
  }
};

}  // namespace flashcpp::detail::cuda::sm90
