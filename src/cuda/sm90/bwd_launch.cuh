#pragma once
// Host side of one sm90a backward main kernel: TMA descriptors of Q, dO, K, V, grid, shared
// memory opt-in and launch. The dispatcher runs the sm80 pre-pass before it and the sm80
// post-pass after it. Included only by the generated per-instantiation translation units
// (compiled for sm_90a alone).
#include <climits>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include "cuda/common/cuda_check.hpp"
#include "cuda/sm90/bwd_kernel.hpp"
#include "cuda/sm90/bwd_traits.hpp"
#include "cuda/sm90/tma_view.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda::sm90 {

template <class Element, int kHeadDim>
void run_bwd(const BwdKernelParams& kp, cudaStream_t stream) {
  using namespace cute;
  using Traits = BwdTraits<Element, kHeadDim>;
  const BackwardParams& p = kp.p;
  if (kp.num_n_blocks <= 0) return;
  BwdParams<Traits> params;
  params.kp = kp;
  const auto q_tile = Shape<Int<Traits::kBlockM>, Int<kHeadDim>>{};
  const auto kv_tile = Shape<Int<Traits::kBlockN>, Int<kHeadDim>>{};
  params.tma_q = make_tma_copy(
      SM90_TMA_LOAD{},
      gmem_view(static_cast<const Element*>(p.q), p.seqlen_q, p.head_dim, p.heads_q, p.batch,
                p.q_stride),
      take<0, 2>(typename Traits::SmemLayoutQ{}), q_tile, _1{});
  params.tma_do = make_tma_copy(
      SM90_TMA_LOAD{},
      gmem_view(static_cast<const Element*>(p.dout), p.seqlen_q, p.head_dim_v, p.heads_q, p.batch,
                p.dout_stride),
      take<0, 2>(typename Traits::SmemLayoutDo{}), q_tile, _1{});
  params.tma_k = make_tma_copy(
      SM90_TMA_LOAD{},
      gmem_view(static_cast<const Element*>(p.k), p.seqlen_k, p.head_dim, p.heads_kv, p.batch,
                p.k_stride),
      typename Traits::SmemLayoutK{}, kv_tile, _1{});
  params.tma_v = make_tma_copy(
      SM90_TMA_LOAD{},
      gmem_view(static_cast<const Element*>(p.v), p.seqlen_k, p.head_dim_v, p.heads_kv, p.batch,
                p.v_stride),
      typename Traits::SmemLayoutV{}, kv_tile, _1{});

  const auto kernel = &bwd_kernel<Traits>;
  constexpr int smem = Traits::kSmemBytes;
  FLASHCPP_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const std::int64_t blocks = std::int64_t(kp.num_n_blocks) * p.heads_kv * p.batch;
  if (blocks > INT_MAX)
    throw Error("cuda sm90 backward: " + std::to_string(blocks) +
                " thread blocks exceed the grid limit (2^31 - 1)");
  kernel<<<unsigned(blocks), Traits::kThreads, smem, stream>>>(params);
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashcpp::detail::cuda::sm90
