#pragma once
// Host side of the sm80 backward seen by the planner (cuda_backend.cu): which instantiations
// this build has and the kernel names reported in RunInfo. It takes every backward call of
// fp16/bf16 with head_dim_v == head_dim below sm90, and on Hopper what the sm90a backward does
// not cover.
#include <string>

#include <cuda_runtime.h>

#include "common/params.hpp"
#include "cuda/common/intern_name.hpp"
#include "cuda/common/kernel_registry.hpp"
#include "cuda/common/bwd_kernel_params.hpp"
#include "cuda/sm80/smem_budget.hpp"
#include "cuda/sm80/bwd_tile_table.hpp"

namespace flashcpp::detail::cuda::sm80 {

// The sm80 backward kernels this build contains: the generated bwd_sm80_registry.inc holds one
// FLASHCPP_SM80_BWD(dtype, hdim) line per instantiation (every head dim of FLASHCPP_HEAD_DIMS,
// every dtype of FLASHCPP_DTYPES).
using BwdEntry = void (*)(const BwdKernelParams&, cudaStream_t);

#define FLASHCPP_SM80_BWD(dtype, hdim) \
  void bwd_##dtype##_hdim##hdim(const BwdKernelParams& kp, cudaStream_t stream);
#include "bwd_sm80_registry.inc"
#undef FLASHCPP_SM80_BWD

using BwdKernel = RegistryEntry<BwdEntry>;

#define FLASHCPP_SM80_BWD(dtype, hdim) {ElementType::dtype, hdim, &bwd_##dtype##_hdim##hdim},
inline constexpr BwdKernel kBwdKernels[] = {
#include "bwd_sm80_registry.inc"
    kRegistrySentinel<BwdEntry>};
#undef FLASHCPP_SM80_BWD

// The smallest instantiation of this dtype whose head dim covers the call's, or null.
inline const BwdKernel* find_bwd_kernel(const ForwardParams& p) {
  return smallest_covering(kBwdKernels, p.dtype, p.head_dim);
}

// RunInfo::kernel, e.g. "sm80_bwd_bf16_hdim128_64x128_8w_q2do2_deterministic": the main kernel's
// tile row for this device's shared-memory budget (smem_budget.hpp); "_nosmem" when no
// row fits (the launch then throws, naming the bytes needed).
inline const char* bwd_kernel_name(const BwdKernel& k, bool deterministic, int device) {
  const int index = sm80_bwd_tile_index(k.head_dim, sm80_smem_budget(device));
  std::string tile = "nosmem";
  if (index >= 0) {
    const Sm80BwdTile t = kSm80BwdTiles[index];
    tile = std::to_string(t.block_m) + "x" + std::to_string(t.block_n) + "_" +
           std::to_string(t.warps) + "w_q" + std::to_string(t.q_stages) + "do" +
           std::to_string(t.do_stages);
  }
  return intern_name(std::string("sm80_bwd_") + dtype_name(k.dtype) + "_hdim" +
                     std::to_string(k.head_dim) + "_" + tile +
                     (deterministic ? "_deterministic" : ""));
}

}  // namespace flashcpp::detail::cuda::sm80
