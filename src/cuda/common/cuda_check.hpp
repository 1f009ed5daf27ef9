#pragma once
// Every CUDA runtime call is checked; a failure becomes flashcpp::Error carrying the call and
// CUDA's own error string.
#include <string>

#include <cuda_runtime.h>

#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // a non-sticky error must not resurface at the next call's check
  throw Error(std::string("cuda: ") + what + " failed: " + cudaGetErrorName(status) + " (" +
                cudaGetErrorString(status) + ")");
}

}  // namespace flashcpp::detail::cuda

#define FLASHCPP_CUDA_CHECK(call) ::flashcpp::detail::cuda::check_cuda((call), #call)
