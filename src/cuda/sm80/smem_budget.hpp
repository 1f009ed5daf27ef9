#pragma once
// The shared memory per block the sm80 kernels may use, which picks the tile rows of the
// forward (fwd_tile_table.hpp) and of the backward's main kernel (bwd_tile_table.hpp): the
// device's opt-in limit (163 KB on A100, 227 KB on H100/H200, 99 KB on sm86/sm89), or less
// when FLASHCPP_SM80_SMEM_BUDGET (in KB, read once) says so, so that the 99 KB rows can be
// tested on a larger GPU (FLASHCPP_SM80_SMEM_BUDGET=99).
#include <cstdlib>
#include <string>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda::sm80 {

// FLASHCPP_SM80_SMEM_BUDGET in bytes, or 0 when unset.
inline int sm80_smem_budget_from_env() {
  static const int bytes = [] {
    const char* v = std::getenv("FLASHCPP_SM80_SMEM_BUDGET");
    if (v == nullptr || *v == '\0') return 0;
    char* end = nullptr;
    const long kb = std::strtol(v, &end, 10);
    if (*end != '\0' || kb <= 0 || kb > 1024 * 1024)
      throw Error(std::string("FLASHCPP_SM80_SMEM_BUDGET: '") + v +
                  "' is not a positive number of KB (e.g. 99)");
    return int(kb * 1024);
  }();
  return bytes;
}

inline int sm80_smem_budget(int device) {
  int optin = 0;
  FLASHCPP_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int forced = sm80_smem_budget_from_env();
  return forced > 0 && forced < optin ? forced : optin;
}

}  // namespace flashcpp::detail::cuda::sm80
