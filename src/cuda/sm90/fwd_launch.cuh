#pragma once
// Host side of one sm90a forward instantiation: TMA descriptors of Q, K, V, grid, shared
// memory opt-in and launch. Included only by the generated per-instantiation translation units
// (compiled for sm_90a alone).
#include <climits>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include "cuda/common/cuda_check.hpp"
#include "cuda/sm90/fwd_kernel.hpp"
#include "cuda/sm90/kernel_traits.hpp"
#include "cuda/sm90/tma_view.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda::sm90 {

template <class Element, int kHeadDim>
void run_fwd(const FwdKernelParams& kp, cudaStream_t stream) {
  using namespace cute;
  using Traits = FwdTraits<Element, kHeadDim>;
  const ForwardParams& p = kp.p;
  FwdParams<Traits> params;
  params.kp = kp;
  params.tma_q = make_tma_copy(
      SM90_TMA_LOAD{},
      gmem_view<Traits>(p.q, p.seqlen_q, p.head_dim, p.heads_q, p.batch, p.q_stride),
      typename Traits::SmemLayoutQ{}, Shape<Int<Traits::kBlockM>, Int<kHeadDim>>{}, _1{});
  params.tma_k = make_tma_copy(
      SM90_TMA_LOAD{},
      gmem_view<Traits>(p.k, p.seqlen_k, p.head_dim, p.heads_kv, p.batch, p.k_stride),
      take<0, 2>(typename Traits::SmemLayoutK{}), Shape<Int<Traits::kBlockN>, Int<kHeadDim>>{},
      _1{});
  params.tma_v = make_tma_copy(
      SM90_TMA_LOAD{},
      gmem_view<Traits>(p.v, p.seqlen_k, p.head_dim_v, p.heads_kv, p.batch, p.v_stride),
      take<0, 2>(typename Traits::SmemLayoutV{}), Shape<Int<Traits::kBlockN>, Int<kHeadDim>>{},
      _1{});

  const auto kernel = &fwd_kernel<Traits>;
  constexpr int smem = Traits::kSmemBytes;
  FLASHCPP_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const std::int64_t blocks = std::int64_t(kp.num_m_blocks) * p.heads_q * p.batch;
  if (blocks > INT_MAX)
    throw Error("cuda sm90 forward: " + std::to_string(blocks) +
                " thread blocks exceed the grid limit (2^31 - 1)");
  kernel<<<unsigned(blocks), Traits::kThreads, smem, stream>>>(params);
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashcpp::detail::cuda::sm90
