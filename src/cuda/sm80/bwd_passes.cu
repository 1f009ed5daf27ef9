// The backward pre- and post-pass entry points (sm80/bwd_passes.hpp), for fp16 and bf16.
#include "cuda/sm80/bwd_passes.hpp"

#include "cuda/common/cuda_check.hpp"
#include "cuda/sm80/bwd_prepost.cuh"

namespace flashcpp::detail::cuda::sm80 {
namespace {

template <class T>
void launch_pass(bool pre, const BwdKernelParams& kp, cudaStream_t stream) {
  const BackwardParams& p = kp.p;
  if (p.seqlen_q <= 0 || p.batch <= 0) return;
  const dim3 grid((p.seqlen_q + bwd::kRowsPerCta - 1) / bwd::kRowsPerCta, p.heads_q, p.batch);
  if (pre)
    bwd::bwd_preprocess<T><<<grid, 32 * bwd::kRowsPerCta, 0, stream>>>(kp);
  else
    bwd::bwd_postprocess<T><<<grid, 32 * bwd::kRowsPerCta, 0, stream>>>(kp);
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
}

void launch_pass(bool pre, const BwdKernelParams& kp, cudaStream_t stream) {
  if (kp.p.dtype == ElementType::bf16)
    launch_pass<__nv_bfloat16>(pre, kp, stream);
  else
    launch_pass<__half>(pre, kp, stream);
}

}  // namespace

void bwd_preprocess(const BwdKernelParams& kp, cudaStream_t stream) {
  launch_pass(true, kp, stream);
}

void bwd_postprocess(const BwdKernelParams& kp, cudaStream_t stream) {
  launch_pass(false, kp, stream);
}

}  // namespace flashcpp::detail::cuda::sm80
