#pragma once
// Host side of one sm90a backward: the pre-pass (bwd_prepass.hpp: dsum, lse_log2, zeroed
// dq_accum; deterministic: zeroed dq counters), the main kernel (TMA descriptors of Q, dO, K,
// V, grid, shared-memory opt-in, launch) and the dq post-pass (bwd_dq_convert.hpp), all on the
// blocked workspace layouts.
// Included only by the generated per-instantiation translation units (compiled for sm_90a
// alone).
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include "cuda/common/cuda_check.hpp"
#include "cuda/sm90/bwd_dq_convert.hpp"
#include "cuda/sm90/bwd_epilogue.hpp"
#include "cuda/sm90/bwd_kernel.hpp"
#include "cuda/sm90/bwd_mainloop.hpp"
#include "cuda/sm90/bwd_mainloop_split_d.hpp"
#include "cuda/sm90/bwd_producer.hpp"
#include "cuda/sm90/bwd_tile_scheduler.hpp"
#include "cuda/sm90/bwd_prepass.hpp"
#include "cuda/sm90/bwd_traits.hpp"
#include "cuda/sm90/bwd_traits_split_d.hpp"
#include "cuda/sm90/tma_extents.hpp"
#include "cuda/sm90/tma_view.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda::sm90 {

template <class Traits>
void run_bwd_main(const BwdKernelParams& kp, cudaStream_t stream);

// The consumer mainloop of the tile's layout (bwd_tile_table.hpp).
template <class Traits>
using BwdMainloopOf = std::conditional_t<Traits::kTile.split_d, BwdMainloopSplitD<Traits>,
                                         BwdMainloop<Traits>>;

// The traits of the head dims' tile layout (bwd_tile_table.hpp); split by keys only for
// D == Dv.
template <class Element, int kHeadDim, int kHeadDimV, bool kVarlen, bool kDeterministic>
using BwdTraitsOf =
    std::conditional_t<sm90_bwd_tile(kHeadDim, kHeadDimV).split_d,
                       BwdTraitsSplitD<Element, kHeadDim, kHeadDimV, kVarlen, kDeterministic>,
                       BwdTraits<Element, kHeadDim, kVarlen, kDeterministic>>;

template <class Traits>
void run_bwd_passes(const BwdKernelParams& kp, cudaStream_t stream) {
  using namespace cute;
  const BackwardParams& p = kp.p;
  const int num_m_blocks =
      int((std::int64_t(p.seqlen_q) + Traits::kBlockM - 1) / Traits::kBlockM);
  const dim3 query_blocks(unsigned(num_m_blocks), unsigned(p.heads_q), unsigned(p.batch));
  bwd_prepass<Traits><<<query_blocks, kPrepassThreads, 0, stream>>>(kp);
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
  if (kp.num_n_blocks > 0) run_bwd_main<Traits>(kp, stream);
  // No keys: dq is zero, written from the zeroed dq_accum like any other.
  bwd_dq_convert<Traits><<<query_blocks, kDqConvertThreads, 0, stream>>>(kp);
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
}

// Padded and varlen calls run separate main-kernel instantiations (kVarlen of the traits), and
// so do deterministic ones (kDeterministic; D == Dv only, bwd_dispatch.hpp).
template <class Element, int kHeadDim, int kHeadDimV>
void run_bwd(const BwdKernelParams& kp, cudaStream_t stream) {
  if constexpr (kHeadDim == kHeadDimV) {
    if (kp.p.deterministic) {
      if (kp.dq_semaphore == nullptr || kp.tile_ticket == nullptr || kp.ticket_head_group < 1)
        throw Error("cuda sm90 backward: deterministic call without its dq counters");
      if (kp.p.is_varlen())
        run_bwd_passes<BwdTraitsOf<Element, kHeadDim, kHeadDimV, true, true>>(kp, stream);
      else
        run_bwd_passes<BwdTraitsOf<Element, kHeadDim, kHeadDimV, false, true>>(kp, stream);
      return;
    }
  }
  if (kp.p.deterministic)
    throw Error("cuda sm90 backward: no deterministic kernel for head_dim_v != head_dim");
  if (kp.p.is_varlen())
    run_bwd_passes<BwdTraitsOf<Element, kHeadDim, kHeadDimV, true, false>>(kp, stream);
  else
    run_bwd_passes<BwdTraitsOf<Element, kHeadDim, kHeadDimV, false, false>>(kp, stream);
}

template <class Traits>
void run_bwd_main(const BwdKernelParams& kp, cudaStream_t stream) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHeadDimV = Traits::kHeadDimV;
  const BackwardParams& p = kp.p;
  BwdParams<Traits> params;
  params.kp = kp;
  const auto q_tile = Shape<Int<Traits::kBlockM>, Int<kHeadDim>>{};
  const auto kv_tile = Shape<Int<Traits::kBlockN>, Int<kHeadDim>>{};
  const auto do_tile = Shape<Int<Traits::kBlockM>, Int<kHeadDimV>>{};
  const auto v_tile = Shape<Int<Traits::kBlockN>, Int<kHeadDimV>>{};
  params.tma_q = make_tma_copy(
      SM90_TMA_LOAD{},
      gmem_view(static_cast<const Element*>(p.q), tma_rows_q(p), p.head_dim, p.heads_q,
                tma_batches(p), p.q_stride),
      take<0, 2>(typename Traits::SmemLayoutQ{}), q_tile, _1{});
  params.tma_do = make_tma_copy(
      SM90_TMA_LOAD{},
      gmem_view(static_cast<const Element*>(p.dout), tma_rows_q(p), p.head_dim_v, p.heads_q,
                tma_batches(p), p.dout_stride),
      take<0, 2>(typename Traits::SmemLayoutDo{}), do_tile, _1{});
  params.tma_k = make_tma_copy(
      SM90_TMA_LOAD{},
      gmem_view(static_cast<const Element*>(p.k), tma_rows_k(p), p.head_dim, p.heads_kv,
                tma_batches(p), p.k_stride),
      typename Traits::SmemLayoutK{}, kv_tile, _1{});
  params.tma_v = make_tma_copy(
      SM90_TMA_LOAD{},
      gmem_view(static_cast<const Element*>(p.v), tma_rows_k(p), p.head_dim_v, p.heads_kv,
                tma_batches(p), p.v_stride),
      typename Traits::SmemLayoutV{}, v_tile, _1{});
  if constexpr (!Traits::kTile.split_d) {
    const auto out_tile = Shape<_64, Int<kHeadDim>>{};
    const auto stage = take<0, 2>(typename Traits::SmemLayoutQ{});
    params.tma_dk = make_tma_copy(
        SM90_TMA_STORE{},
        gmem_view(static_cast<Element*>(p.dk), tma_rows_k(p), p.head_dim, p.heads_kv,
                  tma_batches(p), p.dk_stride),
        stage, out_tile, _1{});
    params.tma_dv = make_tma_copy(
        SM90_TMA_STORE{},
        gmem_view(static_cast<Element*>(p.dv), tma_rows_k(p), p.head_dim_v, p.heads_kv,
                  tma_batches(p), p.dv_stride),
        stage, out_tile, _1{});
  }

  // Deterministic: tiles in ticket order, the order dQ is added in (bwd_dq_order.hpp).
  using Scheduler = std::conditional_t<Traits::kDeterministic, OrderedKeyBlockScheduler,
                                       KeyBlockScheduler>;
  const auto kernel = &bwd_kernel<BwdProducer<Traits>, BwdMainloopOf<Traits>, BwdEpilogue<Traits>,
                                  Scheduler>;
  constexpr int smem = Traits::kSmemBytes;
  FLASHCPP_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const std::int64_t blocks = Scheduler::num_ctas(kp);
  if (blocks > INT_MAX)
    throw Error("cuda sm90 backward: " + std::to_string(blocks) +
                " thread blocks exceed the grid limit (2^31 - 1)");
  kernel<<<unsigned(blocks), Traits::kThreads, smem, stream>>>(params);
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashcpp::detail::cuda::sm90
