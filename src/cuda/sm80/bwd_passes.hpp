#pragma once
// The backward's pre-pass (dsum = rowsum(dO * O), lse_log2, zeroed dq_accum) and post-pass
// (dq = dq_accum * scale) of sm80/bwd_prepost.cuh as plain entry points, so that main kernels
// built elsewhere (the sm90a backward, compiled for sm_90a only) run between the same two
// passes on the same workspace layout. Compiled with the sm80-family kernels (sm80/bwd_passes.cu).
#include <cuda_runtime.h>

#include "cuda/common/bwd_params.hpp"

namespace flashcpp::detail::cuda::sm80 {

void bwd_preprocess(const BwdKernelParams& kp, cudaStream_t stream);
void bwd_postprocess(const BwdKernelParams& kp, cudaStream_t stream);

}  // namespace flashcpp::detail::cuda::sm80
