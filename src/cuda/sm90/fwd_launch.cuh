#pragma once
// Host side of one sm90a forward instantiation: TMA descriptors of Q, K, V and O, the
// persistent grid, shared memory opt-in and launch. Included only by the generated per-instantiation translation units
// (compiled for sm_90a alone).
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/split_kv_combine.hpp"
#include "cuda/sm90/fp8_vt_layout.hpp"
#include "cuda/sm90/fwd_epilogue.hpp"
#include "cuda/sm90/fwd_fp8_vt_prepass.cuh"
#include "cuda/sm90/fwd_kernel.hpp"
#include "cuda/sm90/fwd_mainloop.hpp"
#include "cuda/sm90/fwd_tile_scheduler.hpp"
#include "cuda/sm90/fwd_traits.hpp"
#include "cuda/sm90/tma_view.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda::sm90 {

template <class Traits, bool kSplit>
void launch_fwd(const FwdKernelParams& kp, cudaStream_t stream) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHeadDimV = Traits::kHeadDimV;
  using Scheduler = PersistentTileScheduler<Traits::kBlockM, Traits::kVarlen, kSplit>;
  const ForwardParams& p = kp.p;
  FwdParams<Traits> params;
  params.kp = kp;
  const auto* q = static_cast<const Element*>(p.q);
  const auto* k = static_cast<const Element*>(p.k);
  const auto* v = static_cast<const Element*>(p.v);  // fp8: read by the pre-pass instead
  (void)v;
  params.tma_q = make_tma_copy(
      SM90_TMA_LOAD{}, gmem_view(q, tma_rows_q(p), p.head_dim, p.heads_q, tma_batches(p), p.q_stride),
      typename Traits::SmemLayoutQ{}, Shape<Int<Traits::kBlockM>, Int<kHeadDim>>{}, _1{});
  if constexpr (Traits::kPaged) {
    // The page pool as (row in page, dim, head, page): boxes of kPageBoxRows and of
    // kPageBoxRowsWide rows, and whole key blocks (fwd_mainloop.hpp).
    const PagedKV& pg = kp.paged;
    constexpr int kBox = Traits::kPageBoxRows;
    constexpr int kWide = Traits::kPageBoxRowsWide;
    const auto k_pool = gmem_view(k, pg.page_size, p.head_dim, p.heads_kv, pg.num_pages, p.k_stride);
    const auto v_pool = gmem_view(v, pg.page_size, p.head_dim_v, p.heads_kv, pg.num_pages, p.v_stride);
    // Loads of `rows` pool rows into the first two modes of a shared layout.
    auto k_load = [&](auto smem_layout, auto rows) {
      return make_tma_copy(SM90_TMA_LOAD{}, k_pool, take<0, 2>(smem_layout),
                           Shape<decltype(rows), Int<kHeadDim>>{}, _1{});
    };
    auto v_load = [&](auto smem_layout, auto rows) {
      return make_tma_copy(SM90_TMA_LOAD{}, v_pool, take<0, 2>(smem_layout),
                           Shape<decltype(rows), Int<kHeadDimV>>{}, _1{});
    };
    params.tma_k = k_load(typename Traits::template SmemLayoutKBoxes<kBox>{}, Int<kBox>{});
    params.tma_v = v_load(typename Traits::template SmemLayoutVBoxes<kBox>{}, Int<kBox>{});
    params.tma_k_wide = k_load(typename Traits::template SmemLayoutKBoxes<kWide>{}, Int<kWide>{});
    params.tma_v_wide = v_load(typename Traits::template SmemLayoutVBoxes<kWide>{}, Int<kWide>{});
    params.tma_k_whole = k_load(typename Traits::SmemLayoutK{}, Int<Traits::kBlockN>{});
    params.tma_v_whole = v_load(typename Traits::SmemLayoutV{}, Int<Traits::kBlockN>{});
  } else if constexpr (Traits::kFp8) {
    params.tma_k = make_tma_copy(
        SM90_TMA_LOAD{}, gmem_view(k, tma_rows_k(p), p.head_dim, p.heads_kv, tma_batches(p), p.k_stride),
        take<0, 2>(typename Traits::SmemLayoutK{}), Shape<Int<Traits::kBlockN>, Int<kHeadDim>>{},
        _1{});
    // V^T [Hkv, Dv, W] from the pre-pass, read as (Dv, key, kv head, 1) tiles of Dv x kBlockN.
    const std::int64_t columns = fp8_vt_row_columns(p);
    Strides vt_stride;
    vt_stride.row = columns;
    vt_stride.head = std::int64_t(p.head_dim_v) * columns;
    vt_stride.batch = vt_stride.head * p.heads_kv;
    params.tma_v = make_tma_copy(
        SM90_TMA_LOAD{},
        gmem_view(static_cast<const Element*>(static_cast<const void*>(kp.fp8_v_t)),
                  p.head_dim_v, int(columns), p.heads_kv, 1, vt_stride),
        take<0, 2>(typename Traits::SmemLayoutVt{}), Shape<Int<kHeadDimV>, Int<Traits::kBlockN>>{},
        _1{});
  } else {
    params.tma_k = make_tma_copy(
        SM90_TMA_LOAD{}, gmem_view(k, tma_rows_k(p), p.head_dim, p.heads_kv, tma_batches(p), p.k_stride),
        take<0, 2>(typename Traits::SmemLayoutK{}), Shape<Int<Traits::kBlockN>, Int<kHeadDim>>{},
        _1{});
    params.tma_v = make_tma_copy(
        SM90_TMA_LOAD{}, gmem_view(v, tma_rows_k(p), p.head_dim_v, p.heads_kv, tma_batches(p), p.v_stride),
        take<0, 2>(typename Traits::SmemLayoutV{}), Shape<Int<Traits::kBlockN>, Int<kHeadDimV>>{},
        _1{});
  }

  if constexpr (Traits::kTmaStoreO)
    params.tma_o = make_tma_copy(
        SM90_TMA_STORE{},
        gmem_view(static_cast<typename Traits::ElementOut*>(p.out), tma_rows_q(p), p.head_dim_v, p.heads_q,
                  tma_batches(p), p.out_stride),
        typename Traits::SmemLayoutOHalf{}, Shape<_64, Int<kHeadDimV>>{}, _1{});

  if (kp.tile_counter != nullptr)
    FLASHCPP_CUDA_CHECK(cudaMemsetAsync(kp.tile_counter, 0, sizeof(int), stream));
  const auto kernel = &fwd_kernel<FwdMainloop<Traits>, FwdEpilogue<Traits, kSplit>, Scheduler>;
  constexpr int smem = Traits::kSmemBytes;
  FLASHCPP_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // Persistent: one CTA per SM (shared memory admits no second), each walking its units.
  const std::int64_t slots = std::int64_t(Scheduler::slots_per_head(kp)) *
                             p.heads_q * p.batch * (kSplit ? kp.num_splits : 1);
  if (slots > INT_MAX / 2)  // headroom: a CTA's next slot is computed before the bound test
    throw Error("q: " + std::to_string(slots) +
                " query tiles (batch x heads x ceil(seqlen_q / kBlockM) x splits) exceed the sm90 "
                "forward's limit of 2^30");
  const int units = Scheduler::num_units(kp);
  if (units == 0) return;
  if constexpr (Traits::kFp8)
    launch_fp8_vt_prepass<kHeadDimV>(p, kp.fp8_v_t, kp.fp8_v_nan_keys, stream);
  int device = 0, sms = 0;
  FLASHCPP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHCPP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const unsigned grid = unsigned(units < sms ? units : sms);
  kernel<<<grid, Traits::kThreads, smem, stream>>>(params);
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
  // The splits' partials merge in the combine, a programmatic dependent of this kernel.
  if constexpr (kSplit) launch_combine<Element, true>(kp, true, stream);
}

// Padded and varlen calls run separate instantiations (fwd_traits.hpp, kVarlen), and so do
// split-KV calls (kSplit: the epilogue writes partials for the combine) and the row's short-
// and long-call tiles (fwd_tile_row).
// A paged KV cache (kp.paged) runs the varlen instantiation with paged K/V loads. FP8 runs
// unsplit and unpaged only (the planner plans neither for it), on its fast-accumulation row
// where the call allows it.
template <class Element, int kHeadDim, int kHeadDimV>
void run_fwd(const FwdKernelParams& kp, cudaStream_t stream) {
  if constexpr (std::is_same_v<Element, cutlass::float_e4m3_t>) {
    if (kp.num_splits > 1 || kp.paged.block_table != nullptr)
      throw Error("fp8 forward: no split-KV or paged instantiation (planner error)");
    constexpr FwdTileRow kFast = FwdTileRow::fp8_fast_accum;
    const bool varlen = kp.p.is_varlen();
    if (kp.p.fp8_fast_accum) {
      if (varlen)
        launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, true, false, kFast>, false>(kp, stream);
      else
        launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, false, false, kFast>, false>(kp,
                                                                                        stream);
    } else if (varlen) {
      launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, true>, false>(kp, stream);
    } else {
      launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, false>, false>(kp, stream);
    }
  } else {
    const bool split = kp.num_splits > 1;
    constexpr Sm90FwdTile kTable = sm90_fwd_tile(kHeadDim, kHeadDimV);
    if (kp.long_tile) {  // unsplit, unpaged (fwd_tile_row)
      if constexpr (kTable.long_block_m > 0) {
        constexpr FwdTileRow kLong = FwdTileRow::long_call;
        if (kp.p.is_varlen())
          launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, true, false, kLong>, false>(kp,
                                                                                        stream);
        else
          launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, false, false, kLong>, false>(kp,
                                                                                         stream);
      } else {
        throw Error("sm90 forward: no long-call tile for this head dim (planner error)");
      }
    } else if (kp.paged.block_table != nullptr) {
      if (split)
        launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, true, true>, true>(kp, stream);
      else
        launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, true, true>, false>(kp, stream);
    } else if (kp.p.is_varlen()) {
      if (split)
        launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, true>, true>(kp, stream);
      else
        launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, true>, false>(kp, stream);
    } else if (split) {
      launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, false>, true>(kp, stream);
    } else if (kp.short_tile) {
      if constexpr (kTable.short_block_n > 0)
        launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, false, false, FwdTileRow::short_call>,
                   false>(kp, stream);
      else
        throw Error("sm90 forward: no short-call tile for this head dim (planner error)");
    } else {
      launch_fwd<FwdTraits<Element, kHeadDim, kHeadDimV, false>, false>(kp, stream);
    }
  }
}

}  // namespace flashcpp::detail::cuda::sm90
