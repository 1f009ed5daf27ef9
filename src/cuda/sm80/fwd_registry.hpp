#pragma once
// The sm80 forward kernels this build contains. The generated fwd_sm80_registry.inc holds
// one FLASHCPP_SM80_FWD(dtype, hdim) line per instantiation configured through
// FLASHCPP_DTYPES x FLASHCPP_HEAD_DIMS; each has a generated TU defining its entry point.
#include <cuda_runtime.h>

#include "cuda/common/fwd_kernel_params.hpp"

namespace flashcpp::detail::cuda::sm80 {

using FwdEntry = void (*)(const FwdKernelParams&, cudaStream_t);

#define FLASHCPP_SM80_FWD(dtype, hdim) \
  void fwd_##dtype##_hdim##hdim(const FwdKernelParams& kp, cudaStream_t stream);
#include "fwd_sm80_registry.inc"
#undef FLASHCPP_SM80_FWD

}  // namespace flashcpp::detail::cuda::sm80
