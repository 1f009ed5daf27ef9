#pragma once
// The sm90a backward main kernels this build contains. The generated bwd_sm90_registry.inc
// holds one FLASHCPP_SM90_BWD(dtype, hdim) line per instantiation (FLASHCPP_DTYPES x the head
// dims of FLASHCPP_HEAD_DIMS that have an sm90 backward tile, and only when
// FLASHCPP_CUDA_ARCHS contains 90a); each has a generated TU defining its entry point, which
// launches the sm90 pre-pass, the main kernel and the dq post-pass.
#include <cuda_runtime.h>

#include "cuda/common/bwd_kernel_params.hpp"

namespace flashcpp::detail::cuda::sm90 {

using BwdEntry = void (*)(const BwdKernelParams&, cudaStream_t);

#define FLASHCPP_SM90_BWD(dtype, hdim) \
  void bwd_##dtype##_hdim##hdim(const BwdKernelParams& kp, cudaStream_t stream);
#include "bwd_sm90_registry.inc"
#undef FLASHCPP_SM90_BWD

}  // namespace flashcpp::detail::cuda::sm90
