#pragma once
// The sm80 backward kernels this build contains: the generated bwd_sm80_registry.inc holds one
// FLASHCPP_SM80_BWD(dtype, hdim) line per instantiation (every head dim of FLASHCPP_HEAD_DIMS,
// every dtype of FLASHCPP_DTYPES).
#include <cuda_runtime.h>

#include "cuda/common/bwd_kernel_params.hpp"

namespace flashcpp::detail::cuda::sm80 {

using BwdEntry = void (*)(const BwdKernelParams&, cudaStream_t);

#define FLASHCPP_SM80_BWD(dtype, hdim) \
  void bwd_##dtype##_hdim##hdim(const BwdKernelParams& kp, cudaStream_t stream);
#include "bwd_sm80_registry.inc"
#undef FLASHCPP_SM80_BWD

}  // namespace flashcpp::detail::cuda::sm80
