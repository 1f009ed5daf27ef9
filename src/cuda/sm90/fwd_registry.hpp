#pragma once
// The sm90a forward kernels this build contains. The generated fwd_sm90_registry.inc holds one
// FLASHCPP_SM90_FWD(dtype, hdim) line per instantiation (FLASHCPP_DTYPES x the head dims of
// FLASHCPP_HEAD_DIMS that have an sm90 tile, and only when FLASHCPP_CUDA_ARCHS contains 90a);
// each has a generated TU defining its entry point.
#include <cuda_runtime.h>

#include "cuda/common/fwd_kernel_params.hpp"

namespace flashcpp::detail::cuda::sm90 {

using FwdEntry = void (*)(const FwdKernelParams&, cudaStream_t);

#define FLASHCPP_SM90_FWD(dtype, hdim) \
  void fwd_##dtype##_hdim##hdim(const FwdKernelParams& kp, cudaStream_t stream);
#include "fwd_sm90_registry.inc"
#undef FLASHCPP_SM90_FWD

}  // namespace flashcpp::detail::cuda::sm90
