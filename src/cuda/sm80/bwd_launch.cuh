#pragma once
// Host side of one sm80 backward instantiation: grids, shared-memory opt-in, launches.
//   default:       pre-pass -> main (dK, dV, atomic dQ_accum) -> post-pass (dq)
//   deterministic: pre-pass -> main (dK, dV)                  -> dq kernel (dq)
// Grids cover the (max) sequence lengths; varlen CTAs past their sequence return at once.
// Included only by the generated per-instantiation translation units.
#include <string>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/sm80/bwd_dq_kernel.hpp"
#include "cuda/sm80/bwd_kernel.hpp"
#include "cuda/sm80/bwd_prepost.hpp"
#include "cuda/sm80/bwd_traits.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

// Consumer Ampere/Ada parts (sm86/sm89) allow 99 KB per block: say so instead of failing the
// launch with "invalid argument".
inline void check_smem_fits(std::size_t bytes, int head_dim) {
  int device = 0, optin = 0;
  FLASHCPP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHCPP_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > std::size_t(optin))
    throw Error("q: head dim " + std::to_string(head_dim) + ": the sm80 backward kernel needs " +
                std::to_string(bytes) + " bytes of shared memory per block, this GPU allows " +
                std::to_string(optin));
}

template <class E, int kHeadDim>
void run_bwd(const BwdKernelParams& kp, cudaStream_t stream) {
  using T = typename NativeOf<E>::type;
  using Tr = BwdTraits<T, kHeadDim>;
  const BackwardParams& p = kp.p;
  check_smem_fits(Tr::kSmemBytes, p.head_dim);
  // Block counts in int64: seqlen + block - 1 overflows int near 2^31.
  const int row_ctas = int((std::int64_t(p.seqlen_q) + kRowsPerCta - 1) / kRowsPerCta);
  const dim3 row_grid(row_ctas, p.heads_q, p.batch);
  if (p.seqlen_q > 0) {
    bwd_preprocess<T><<<row_grid, 32 * kRowsPerCta, 0, stream>>>(kp);
    FLASHCPP_CUDA_CHECK(cudaGetLastError());
  }
  const int n_blocks = int((std::int64_t(p.seqlen_k) + Tr::kBlockN - 1) / Tr::kBlockN);
  if (n_blocks > 0) {
    auto kernel = bwd_main<T, kHeadDim>;
    FLASHCPP_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::kSmemBytes)));
    const dim3 grid(n_blocks, p.heads_kv, p.batch);
    kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(kp);
    FLASHCPP_CUDA_CHECK(cudaGetLastError());
  }
  if (p.seqlen_q == 0) return;
  if (p.deterministic) {
    auto kernel = bwd_dq_deterministic<T, kHeadDim>;
    FLASHCPP_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::kSmemBytes)));
    const int m_blocks = int((std::int64_t(p.seqlen_q) + Tr::kBlockM - 1) / Tr::kBlockM);
    const dim3 grid(m_blocks, p.heads_q, p.batch);
    kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(kp);
  } else {
    bwd_postprocess<T><<<row_grid, 32 * kRowsPerCta, 0, stream>>>(kp);
  }
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
