#pragma once
// The sm90 backward consumer mainloop split by head dim (d256 and the D != Dv pair 192 x 128;
// bwd_traits_split_d.hpp; "head-dim half" below is half of D for dK and dQ, of Dv for dV): one
// key block of 64 keys, fed by the same producer as the d64/d128 kernel (bwd_producer.hpp).
// Per query block (64 rows), consumer warpgroup w runs
//   S = Q K^T, dP = dO V^T on keys [32w, 32w + 32)  (issued together)
//   P = exp2(S * scale_log2 - lse_log2)             (while dP is still on the tensor cores)
//   dS = P o (dP - dsum)                            (softcap: o (1 - tanh^2), see below)
//   P, dS -> shared memory; both warpgroups meet; then on head-dim half w:
//   dQ = dS K, dV += P^T dO, dK += dS^T Q           (issued together, dQ first)
//   dq_accum += dQ with float4 atomics from registers while dV and dK still run
// dK and dV (half the head dim each) stay in registers across the whole loop (GQA: summed over
// the group's heads). S is not swapped here, so each thread holds 2 query rows and reads
// their lse_log2 and dsum from the ring stage (two values, no shuffles).
// Deterministic (Traits::kDeterministic, bwd_dq_order.hpp): each warp waits for this key
// block's turn before its float4 reductions and counts itself in ss.dq_added after them; the
// announcer thread (announce_dq) arrives for the block once all 8 warps have.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/common/fragment_utils.hpp"
#include "common/mask.hpp"
#include "cuda/sm90/bwd_non_finite.hpp"
#include "cuda/sm90/zero_rows.hpp"
#include "cuda/common/fast_exp2.hpp"
#include "cuda/sm90/bwd_dq_convert.hpp"
#include "cuda/sm90/bwd_dq_order.hpp"
#include "cuda/sm90/bwd_params.hpp"
#include "cuda/sm90/named_barriers.hpp"
#include "cuda/sm90/softmax.hpp"
#include "cuda/sm90/wgmma.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Traits_>
struct BwdMainloopSplitD {
  using Traits = Traits_;
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr bool kDqWriter = false;  // no dQ stages: dQ is added from registers
  // Deterministic: a producer-warpgroup thread arrives for the blocks the warps added.
  static constexpr bool kDqAnnouncer = Traits::kDeterministic;
  static constexpr int kAddingWarps = Traits::kConsumerThreads / 32;

  // Consumer warpgroups (thread index tid among the 256 consumer threads). Accumulates the
  // unscaled dK and dV of this thread's head-dim half (of D and of Dv) into acc_dk, acc_dv;
  // m_range is non-empty.
  template <class AccDk, class AccDv>
  __device__ void mma(const BwdKernelParams& kp, const WindowMask& mask, int n_block,
                      int head_kv, int batch, BlockRange m_range, Pipeline& pipeline_q,
                      Pipeline& pipeline_do, SharedStorage& ss, int tid, AccDk& acc_dk,
                      AccDv& acc_dv) const {
    const BackwardParams& p = kp.p;
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutDo{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQt{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutDot{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});
    Tensor sP = make_tensor(make_smem_ptr(ss.p.data()), typename Traits::SmemLayoutPdS{});
    Tensor sPt = make_tensor(make_smem_ptr(ss.p.data()), typename Traits::SmemLayoutPdSt{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutPdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutPdSt{});

    typename Traits::TiledMmaSdP mma_sdp;
    typename Traits::TiledMmaDk mma_dk;
    typename Traits::TiledMmaDv mma_dv;
    typename Traits::TiledMmaDq mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(tid);
    auto thr_dk = mma_dk.get_thread_slice(tid);
    auto thr_dv = mma_dv.get_thread_slice(tid);
    auto thr_dq = mma_dq.get_thread_slice(tid);
    // Shared-memory descriptors; the B operands of S and dP are this warpgroup's 32 keys, the
    // B operands of dV, dK and dQ its half of the head dim.
    Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);       // (1, 1, D/16, stages)
    Tensor tSrK = thr_sdp.partition_fragment_B(sK);       // (1, 1, D/16)
    Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO);    // (1, 1, D/16, stages)
    Tensor tdPrV = thr_sdp.partition_fragment_B(sV);      // (1, 1, D/16)
    Tensor tdVrPt = thr_dv.partition_fragment_A(sPt);    // (1, 1, kBlockM/16, 2)
    Tensor tdVrdOt = thr_dv.partition_fragment_B(sdOt);  // (1, 1, kBlockM/16, stages)
    Tensor tdKrdSt = thr_dk.partition_fragment_A(sdSt);  // (1, 1, kBlockM/16, 2)
    Tensor tdKrQt = thr_dk.partition_fragment_B(sQt);    // (1, 1, kBlockM/16, stages)
    Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);     // (1, 1, kBlockN/16, 2)
    Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);     // (1, 1, kBlockN/16)

    // (query, key) of every S element this thread holds, in the (row, col) view: 2 query rows
    // and 8 keys, in adjacent pairs (2c, 2c + 1).
    Tensor cS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor cS_rc = make_tensor(cS.data(), wgmma_acc_rowcol(cS.layout()));
    constexpr int kRows = decltype(size<0>(cS_rc))::value;
    constexpr int kCols = decltype(size<1>(cS_rc))::value;

    const int n0 = n_block * kBlockN;
    const int group = p.heads_q / p.heads_kv;
    const int num_m_blocks = int((std::int64_t(p.seqlen_q) + kBlockM - 1) / kBlockM);
    const bool has_softcap = kp.softcap_in_scale != 0.f;
    const float scale_log2 = kp.scale_log2;
    // Deterministic: a dq block's (head * num_m_blocks + m) arrival counter (bwd_dq_order.hpp).
    constexpr bool kDeterministic = Traits::kDeterministic;
    auto dq_counter = [&](int block) {
      return kp.dq_semaphore + (std::int64_t(batch) * p.heads_q * num_m_blocks + block);
    };

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
    for (int head = head_kv * group; head < (head_kv + 1) * group; ++head) {
      for (int m = m_range.begin; m < m_range.end; ++m) {
        const int m0 = m * kBlockM;
        const int stage = state.index();
        Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
        Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
        pipeline_q.consumer_wait(state);
        // Varlen: the scanners zero the Q and dO rows past the sequence's end in the stage
        // (bwd_non_finite.hpp); a tile with such rows waits for them before its products.
        if constexpr (Traits::kVarlen) {
          if (m0 + kBlockM > mask.seqlen_q) BwdNonFinite<Traits>::wait_clean(ss, state);
        }
        Tensor tSrQ_s = tSrQ(_, _, _, stage);
        wgmma<true>(mma_sdp, tSrQ_s, tSrK, acc_s);
        pipeline_do.consumer_wait(state);
        Tensor tdPrdO_s = tdPrdO(_, _, _, stage);
        wgmma<true>(mma_sdp, tdPrdO_s, tdPrV, acc_dp);
        // The K scan ran meanwhile (bwd_non_finite.hpp); this tile's P needs its verdict.
        if (head == head_kv * group && m == m_range.begin)
          BwdNonFinite<Traits>::wait_k_scanned(ss);
        const bool keys_zeroed = BwdNonFinite<Traits>::any_key_zeroed(ss);
        // This thread's rows' statistics, copied with Q and dO into the ring stage (rows past
        // the sequence: lse_log2 = +inf, so P and dS are 0 there).
        float lse[kRows], dsum[kRows];
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const int q = get<0>(cS_rc(r, 0));
          lse[r] = ss.lse_log2[stage][q];
          dsum[r] = ss.dsum[stage][q];
        }

        Tensor s_rc = make_tensor(acc_s.data(), wgmma_acc_rowcol(acc_s.layout()));
        Tensor dp_rc = make_tensor(acc_dp.data(), wgmma_acc_rowcol(acc_dp.layout()));
        // P and dS, compiled twice: tiles inside the band and the sequences skip the
        // per-element mask altogether (as in bwd_mainloop.hpp).
        auto probabilities_and_ds = [&](auto masked_tag) {
          constexpr bool kMasked = decltype(masked_tag)::value;
          // The keys each of this thread's two queries sees, as block-relative bounds.
          int first[kRows], last[kRows];
          if constexpr (kMasked) {
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r)
              mask.row_window(m0 + get<0>(cS_rc(r, 0)), n0, kBlockN, first[r], last[r]);
          }
          auto keep = [&](int r, int c, float x) {
            if constexpr (kMasked) {
              const int k = get<1>(cS_rc(r, c));
              return k >= first[r] && k <= last[r] ? x : 0.f;
            }
            return x;
          };
          // A cut tile: as in bwd_mainloop.hpp (bwd_non_finite.hpp).
          auto select_ds = [&] {
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r) {
              mask.row_window(m0 + get<0>(cS_rc(r, 0)), n0, kBlockN, first[r], last[r]);
              CUTE_UNROLL
              for (int c = 0; c < kCols; ++c) dp_rc(r, c) = keep(r, c, dp_rc(r, c));
            }
            if (BwdNonFinite<Traits>::wait_clean(ss, state)) {
              CUTE_UNROLL
              for (int i = 0; i < size(acc_s); ++i) acc_s(i) += 0.f * acc_dp(i);
            }
          };
          warpgroup_wait<1>();  // S done; dP still running
          warpgroup_fence_operand(acc_s);
          if (!has_softcap) {
            if (kMasked && keys_zeroed) {  // rare: a key whose K chunk was zeroed scores -inf
              CUTE_UNROLL
              for (int c = 0; c < kCols; ++c)
                if (BwdNonFinite<Traits>::key_zeroed(ss, get<1>(cS_rc(0, c)))) {
                  CUTE_UNROLL
                  for (int r = 0; r < kRows; ++r) s_rc(r, c) = -INFINITY;
                }
            }
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r)
              CUTE_UNROLL
              for (int c = 0; c < kCols; ++c)
                s_rc(r, c) = keep(r, c, fast_exp2(s_rc(r, c) * scale_log2 - lse[r]));
          }
          warpgroup_wait<0>();  // dP done
          warpgroup_fence_operand(acc_dp);
          if constexpr (kMasked) {
            // Rare: such a key's exact scores. After the dP wait: a call must not run while
            // a wgmma still writes registers.
            if (has_softcap && keys_zeroed) {
              BwdNonFinite<Traits>::wait_clean(ss, state);  // (the Q stage read here)
              CUTE_UNROLL
              for (int c = 0; c < kCols; ++c) {
                const int key = get<1>(cS_rc(0, c));
                if (!BwdNonFinite<Traits>::key_zeroed(ss, key) || n0 + key >= mask.seqlen_k)
                  continue;
                CUTE_UNROLL
                for (int r = 0; r < kRows; ++r) {
                  const int q = get<0>(cS_rc(r, 0));
                  // (A query past the sequence's end keeps its score: lse = +inf gives P = 0;
                  // the zero Q row there would make 0 * Inf = NaN.)
                  if (m0 + q < mask.seqlen_q)
                    s_rc(r, c) =
                        BwdNonFinite<Traits>::exact_score(p, batch, head_kv, n0 + key, ss, stage, q);
                }
              }
            }
          }
          if (!has_softcap) {
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r)
              CUTE_UNROLL
              for (int c = 0; c < kCols; ++c)
                dp_rc(r, c) = s_rc(r, c) * (dp_rc(r, c) - dsum[r]);
          } else {
            // s = c tanh(x scale / c): P from t = tanh(.), and dS carries ds/dx / scale =
            // 1 - t^2 (the scale is applied to dK at the end and to dQ in the post-pass).
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r)
              CUTE_UNROLL
              for (int c = 0; c < kCols; ++c) {
                const float t = tanhf(s_rc(r, c) * kp.softcap_in_scale);
                const float pr = keep(r, c, fast_exp2(t * scale_log2 - lse[r]));
                s_rc(r, c) = pr;
                dp_rc(r, c) = pr * (dp_rc(r, c) - dsum[r]) * (1.f - t * t);
              }
          }
          if constexpr (kMasked) select_ds();
        };
        // A key whose K chunk was zeroed (rare) takes every tile down the masked path.
        if (mask.tile_unmasked(m, kBlockM, n_block, kBlockN) && !keys_zeroed)
          probabilities_and_ds(std::false_type{});
        else
          probabilities_and_ds(std::true_type{});

        // P and dS to shared memory. The buffer alternates with the blocks, as the 2-stage
        // Q/dO ring index does; buffer `stage` is rewritten two blocks later, after both
        // warpgroups have passed the next block's barrier, i.e. finished this block's products.
        // Elements (2i, 2i + 1) are keys (k, k + 1), k even, of one query: adjacent in the
        // key-contiguous rows (the swizzle moves whole 16-byte chunks), so one 4-byte store.
        store_pairs(convert_fragment<Element>(acc_s), thr_sdp.partition_C(sP(_, _, stage)));
        store_pairs(convert_fragment<Element>(acc_dp), thr_sdp.partition_C(sdS(_, _, stage)));
        // Generic-proxy writes that wgmma (async proxy) reads: fence before the barrier.
        cutlass::arch::fence_view_async_shared();
        named_barrier_sync(NamedBarrier::kBwdDsReady, Traits::kConsumerThreads);

        // dQ first, so that its atomics overlap dV and dK on the tensor cores.
        Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
        Tensor tdQrdS_s = tdQrdS(_, _, _, stage);
        wgmma<true>(mma_dq, tdQrdS_s, tdQrKt, acc_dq);
        Tensor tdVrPt_s = tdVrPt(_, _, _, stage);
        wgmma<false>(mma_dv, tdVrPt_s, tdVrdOt(_, _, _, stage), acc_dv);
        Tensor tdKrdSt_s = tdKrdSt(_, _, _, stage);
        wgmma<false>(mma_dk, tdKrdSt_s, tdKrQt(_, _, _, stage), acc_dk);

        if constexpr (kDeterministic)  // the turn's load overlaps dQ on the tensor cores
          dq_wait_turn(dq_counter(head * num_m_blocks + m),
                       dq_add_rank(mask, m, kBlockM, n_block, kBlockN));
        warpgroup_wait<2>();  // dQ done; dV and dK still running
        warpgroup_fence_operand(acc_dq);
        // Thread tid's element 4v + e at float 4 (v kConsumerThreads + tid) + e of the block
        // (bwd_dq_convert.hpp): each warp's float4 reductions cover 512 contiguous bytes.
        float4* dq = reinterpret_cast<float4*>(
                         kp.dq_accum + dq_block_offset<Traits>(p, batch, head, m, num_m_blocks)) +
                     tid;
        CUTE_UNROLL
        for (int v = 0; v < Traits::kDqPerThread / 4; ++v)
          atomicAdd(dq + v * Traits::kConsumerThreads,
                    make_float4(acc_dq(4 * v), acc_dq(4 * v + 1), acc_dq(4 * v + 2),
                                acc_dq(4 * v + 3)));
        if constexpr (kDeterministic) dq_warp_added(&ss.dq_added);
        warpgroup_wait<1>();  // dV done: dO is free
        pipeline_do.consumer_release(state);
        warpgroup_wait<0>();  // dK done: Q is free
        pipeline_q.consumer_release(state);
        ++state;
      }
    }
  }

  // Deterministic: the announcer, one thread of the producer warpgroup (bwd_dq_order.hpp),
  // over the blocks in the consumers' order. m_range is non-empty.
  __device__ void announce_dq(const BwdKernelParams& kp, int head_kv, int batch,
                              BlockRange m_range, SharedStorage& ss) const {
    static_assert(kDqAnnouncer);
    dq_announce<kAddingWarps, kBlockM>(kp, head_kv, batch, m_range, &ss.dq_added);
  }

 private:
  // regs (converted accumulator) -> smem (its partition_C), two elements per 4-byte store.
  template <class Regs, class Smem>
  __device__ static void store_pairs(Regs const& regs, Smem&& smem) {
    Tensor pairs = recast<std::uint32_t>(regs);
    CUTE_UNROLL
    for (int i = 0; i < size(regs); i += 2)
      *reinterpret_cast<std::uint32_t*>(&smem(i)) = pairs(i / 2);
  }
};

}  // namespace flashcpp::detail::cuda::sm90
