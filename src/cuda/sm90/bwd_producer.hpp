#pragma once
// The producer of the sm90 backward (both layouts of bwd_tile_table.hpp): one elected thread of
// the producer warpgroup loads K and V of the key block once (one transaction barrier) and
// streams Q and dO blocks of kBlockM query rows, each with its rows' lse_log2 (with Q) and dsum
// (with dO) from the pre-pass's blocked statistics, through two TMA rings, for every query head of
// the kv head's group and every query block that sees some of the keys.
//
// Producer and consumers walk the same (head, query block) sequence, so every mbarrier phase
// matches; a key block that no query sees is skipped by both before any barrier is touched.
// Q and dO share one PipelineState: stage i of both rings holds the same query block.
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/mask.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm90/tma_extents.hpp"
#include "cuda/sm90/bwd_params.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Traits_>
struct BwdProducer {
  using Traits = Traits_;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kHeadDimV = Traits::kHeadDimV;

  // One elected thread. K and V of the key block once, then Q_i and dO_i for every
  // (query head, query block) in the consumers' order. m_range is non-empty.
  // `batch` indexes the blocked statistics; `seq` places the sequence's rows (varlen: in the
  // packed tensors).
  __device__ void load(const BwdParams<Traits>& params, const SeqlenInfo& seq, int n_block,
                       int head_kv, int batch,
                       BlockRange m_range, Pipeline& pipeline_q, Pipeline& pipeline_do,
                       SharedStorage& ss) const {
    const BackwardParams& p = params.kp.p;
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutDo{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});

    // (row, dim, head) views shifted to the sequence's first row (0 unless varlen).
    const int rows_q = tma_rows_q(p), rows_k = tma_rows_k(p), batches = tma_batches(p);
    Tensor mQ = domain_offset(
        make_coord(int(seq.row_q), _0{}, _0{}),
        params.tma_q.get_tma_tensor(make_shape(rows_q, p.head_dim, p.heads_q, batches))(
            _, _, _, int(seq.batch_q)));
    Tensor mdO = domain_offset(
        make_coord(int(seq.row_q), _0{}, _0{}),
        params.tma_do.get_tma_tensor(make_shape(rows_q, p.head_dim_v, p.heads_q, batches))(
            _, _, _, int(seq.batch_q)));
    Tensor mK = domain_offset(
        make_coord(int(seq.row_k), _0{}),
        params.tma_k.get_tma_tensor(make_shape(rows_k, p.head_dim, p.heads_kv, batches))(
            _, _, head_kv, int(seq.batch_k)));
    Tensor mV = domain_offset(
        make_coord(int(seq.row_k), _0{}),
        params.tma_v.get_tma_tensor(make_shape(rows_k, p.head_dim_v, p.heads_kv, batches))(
            _, _, head_kv, int(seq.batch_k)));
    Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{},
                           make_coord(n_block, _0{}));  // (kBlockN, kHeadDim)
    Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDimV>>{}, make_coord(n_block, _0{}));
    auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                      group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                      group_modes<0, 2>(gV));

    // K and V are read by this CTA only; Q and dO by every key block of the head: keep those
    // in L2.
    using cute::TMA::CacheHintSm90;
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.kv_full, Traits::kKVBytes);
    copy(params.tma_k.with(ss.kv_full, 0, CacheHintSm90::EVICT_FIRST), tKgK, tKsK);
    copy(params.tma_v.with(ss.kv_full, 0, CacheHintSm90::EVICT_FIRST), tVgV, tVsV);

    const int group = p.heads_q / p.heads_kv;
    const int num_m_blocks = int((std::int64_t(p.seqlen_q) + kBlockM - 1) / kBlockM);
    PipelineState state = cutlass::make_producer_start_state<Pipeline>();
    for (int head = head_kv * group; head < (head_kv + 1) * group; ++head) {
      Tensor gQ = local_tile(mQ(_, _, head), Shape<Int<kBlockM>, Int<kHeadDim>>{},
                             make_coord(_, _0{}));  // (kBlockM, kHeadDim, m)
      Tensor gdO = local_tile(mdO(_, _, head), Shape<Int<kBlockM>, Int<kHeadDimV>>{},
                              make_coord(_, _0{}));
      auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{},
                                        group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto [tdOgdO, tdOsdO] = tma_partition(params.tma_do, _0{}, Layout<_1>{},
                                            group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
      const std::int64_t stats_row = (std::int64_t(batch) * p.heads_q + head) * num_m_blocks;
      for (int m = m_range.begin; m < m_range.end; ++m) {
        const std::int64_t stats = (stats_row + m) * kBlockM;
        pipeline_q.producer_acquire(state);
        auto* q_full = pipeline_q.producer_get_barrier(state);
        copy(params.tma_q.with(*q_full, 0, CacheHintSm90::EVICT_LAST), tQgQ(_, m),
             tQsQ(_, state.index()));
        SM90_BULK_COPY_G2S::copy(params.kp.lse_log2 + stats, q_full, ss.lse_log2[state.index()],
                                 Traits::kStatsBytes);
        pipeline_do.producer_acquire(state);
        auto* do_full = pipeline_do.producer_get_barrier(state);
        copy(params.tma_do.with(*do_full, 0, CacheHintSm90::EVICT_LAST), tdOgdO(_, m),
             tdOsdO(_, state.index()));
        SM90_BULK_COPY_G2S::copy(params.kp.dsum + stats, do_full, ss.dsum[state.index()],
                                 Traits::kStatsBytes);
        ++state;
      }
    }
  }
};

}  // namespace flashcpp::detail::cuda::sm90
