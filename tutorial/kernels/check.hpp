// Error checking shared by the ladder's launchers: every CUDA call and every launch is
// checked, and a failure becomes a flashcpp::Error naming the call and the CUDA error.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashcpp/error.hpp"

namespace flashcpp::ladder {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(std::string("ladder: ") + what + ": " + cudaGetErrorString(status));
  }
}

// Call right after a <<<...>>> launch: catches bad configurations (too many threads, too
// much shared memory) that the launch itself cannot report.
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace flashcpp::ladder
