#pragma once
// The KV-cache decode kernels this build contains: the generated decode_sm80_registry.inc
// holds one FLASHCPP_SM80_DECODE(dtype, hdim) line per instantiation (FLASHCPP_DTYPES x the
// head dims of FLASHCPP_HEAD_DIMS that have a decode tile).
#include <cuda_runtime.h>

#include "cuda/common/kvcache_kernel_params.hpp"

namespace flashcpp::detail::cuda::sm80 {

using DecodeEntry = void (*)(const KVCacheKernelParams&, cudaStream_t);

#define FLASHCPP_SM80_DECODE(dtype, hdim) \
  void decode_##dtype##_hdim##hdim(const KVCacheKernelParams& kp, cudaStream_t stream);
#include "decode_sm80_registry.inc"
#undef FLASHCPP_SM80_DECODE

}  // namespace flashcpp::detail::cuda::sm80
