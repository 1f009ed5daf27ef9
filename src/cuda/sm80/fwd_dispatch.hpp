#pragma once
// Host side of the sm80 forward seen by the planner (cuda_backend.cu): which instantiations
// this build has, whether a call is covered, which tile row runs it, the split-KV heuristic's
// inputs, and the kernel names reported in RunInfo. The sm80 kernels also run on Hopper: for what the sm90a kernels
// do not cover, and with FLASHCPP_DISABLE_SM90=1.
//
// Not covered: head_dim_v != head_dim and dtypes other than fp16/bf16 (clear errors).
#include <cstdint>
#include <cstdlib>
#include <string>

#include <cuda_runtime.h>

#include "common/params.hpp"
#include "cuda/common/fwd_kernel_params.hpp"
#include "cuda/common/intern_name.hpp"
#include "cuda/common/kernel_registry.hpp"
#include "cuda/sm80/fwd_tile_table.hpp"
#include "cuda/sm80/smem_budget.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda::sm80 {

// The sm80 forward kernels this build contains. The generated fwd_sm80_registry.inc holds
// one FLASHCPP_SM80_FWD(dtype, hdim) line per instantiation configured through
// FLASHCPP_DTYPES x FLASHCPP_HEAD_DIMS; each has a generated TU defining its entry point, which
// launches tile row `tile` (an index into kSm80FwdTiles of that head dim).
using FwdEntry = void (*)(const FwdKernelParams&, int tile, cudaStream_t);

#define FLASHCPP_SM80_FWD(dtype, hdim) \
  void fwd_##dtype##_hdim##hdim(const FwdKernelParams& kp, int tile, cudaStream_t stream);
#include "fwd_sm80_registry.inc"
#undef FLASHCPP_SM80_FWD

using FwdKernel = RegistryEntry<FwdEntry>;

#define FLASHCPP_SM80_FWD(dtype, hdim) {ElementType::dtype, hdim, &fwd_##dtype##_hdim##hdim},
inline constexpr FwdKernel kFwdKernels[] = {
#include "fwd_sm80_registry.inc"
    kRegistrySentinel<FwdEntry>};
#undef FLASHCPP_SM80_FWD

// The smallest instantiation of this dtype whose head dim covers the call's (smaller head
// dims run zero-padded); throws when the call is of a kind the sm80 forward does not take or
// no instantiation of this build covers it.
inline const FwdKernel& fwd_kernel_for(const ForwardParams& p) {
  if (p.head_dim_v != p.head_dim)
    throw Error("cuda sm80 forward: head_dim_v (" + std::to_string(p.head_dim_v) +
                ") different from head_dim (" + std::to_string(p.head_dim) +
                ") is not supported yet");
  if (p.dtype != ElementType::fp16 && p.dtype != ElementType::bf16)
    throw Error(std::string("cuda sm80 forward: dtype ") + dtype_name(p.dtype) +
                " is not supported (supported: fp16, bf16)");
  const FwdKernel* k = smallest_covering(kFwdKernels, p.dtype, p.head_dim);
  if (!k)
    throw Error("cuda: no sm80 kernel for head dim " + std::to_string(p.head_dim) + " " +
                dtype_name(p.dtype) + " in this build (built head dims for " +
                dtype_name(p.dtype) + ": " + built_head_dims(kFwdKernels, p.dtype) +
                "); configure with -DFLASHCPP_HEAD_DIMS=... and -DFLASHCPP_DTYPES=...");
  return *k;
}

// The tile row that runs call `p` on kernel `k`: the one FLASHCPP_SM80_FWD_TILE_D<d> names
// (d: the instantiated head dim; read at every call, so that one process can compare rows),
// else the tile table's choice for this device's shared-memory budget (smem_budget.hpp) and
// the call's shape. Throws when the named row is not one of head dim d or does not fit.
inline int fwd_tile_for(const ForwardParams& p, const FwdKernel& k) {
  const int budget = sm80_smem_budget(p.device);
  const std::string var = "FLASHCPP_SM80_FWD_TILE_D" + std::to_string(k.head_dim);
  const char* forced = std::getenv(var.c_str());
  if (forced != nullptr && *forced != '\0') {
    const int tile = sm80_fwd_tile_index_named(k.head_dim, forced);
    if (tile < 0) {
      std::string names;
      for (int i = 0; i < kSm80FwdTileCount; ++i)
        if (kSm80FwdTiles[i].head_dim == k.head_dim)
          names += (names.empty() ? "" : ", ") + sm80_fwd_tile_name(kSm80FwdTiles[i]);
      throw Error(var + ": '" + forced + "' is not a tile of the sm80 forward at head dim " +
                  std::to_string(k.head_dim) + " (tiles: " + names + ")");
    }
    if (sm80_fwd_smem_bytes(kSm80FwdTiles[tile]) > budget)
      throw Error(var + ": tile " + forced + " needs " +
                  std::to_string(sm80_fwd_smem_bytes(kSm80FwdTiles[tile])) +
                  " bytes of shared memory per block, this GPU (or FLASHCPP_SM80_SMEM_BUDGET) "
                  "allows " + std::to_string(budget));
    return tile;
  }
  const Sm80FwdShape shape{p.seqlen_q, p.seqlen_k, p.causal};
  const int tile = sm80_fwd_tile_index(k.head_dim, budget, shape);
  if (tile < 0)
    throw Error("cuda sm80 forward: head dim " + std::to_string(p.head_dim) +
                ": no tile fits the " + std::to_string(budget) +
                " bytes of shared memory per block this GPU (or FLASHCPP_SM80_SMEM_BUDGET) allows");
  return tile;
}

inline int fwd_num_m_blocks(const ForwardParams& p, const Sm80FwdTile& t) {
  return int((std::int64_t(p.seqlen_q) + t.block_m - 1) / t.block_m);
}
inline int fwd_num_n_blocks(const ForwardParams& p, const Sm80FwdTile& t) {
  return int((std::int64_t(p.seqlen_k) + t.block_n - 1) / t.block_n);
}

// RunInfo::kernel, e.g. "sm80_fwd_bf16_hdim128_128x64_4w_splitkv" ("..._4w_paged..." over a
// paged KV cache); the tile part is the row's name (sm80_fwd_tile_name).
inline const char* fwd_kernel_name(const FwdKernel& k, int tile, bool split, bool paged = false) {
  return intern_name(std::string("sm80_fwd_") + dtype_name(k.dtype) + "_hdim" +
                     std::to_string(k.head_dim) + "_" + sm80_fwd_tile_name(kSm80FwdTiles[tile]) +
                     (paged ? "_paged" : "") + (split ? "_splitkv" : ""));
}

}  // namespace flashcpp::detail::cuda::sm80
