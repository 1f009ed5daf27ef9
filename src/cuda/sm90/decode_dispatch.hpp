#pragma once
// Host side of the sm90a KV-cache decode seen by the planner (cuda_backend.cu): which
// instantiations this build has, which calls they take and the kernel names in RunInfo. The
// kernel is the decode kernel of sm80/decode_kernel.hpp with its splits merged in a cluster
// (sm90/decode_cluster_combine.hpp); unsplit calls, calls of more splits than a cluster holds
// and calls whose cluster the GPU cannot place run the sm80-family kernel and, split, the
// combine kernel (same splits, same workspace; RunInfo names the kernel that ran). An fp8
// cache runs all its calls here (the e4m3 conversion instruction is sm89+ code), with the
// combine kernel where the cluster does not apply.
#include <cstdlib>
#include <string>

#include <cuda_runtime.h>

#include "common/params.hpp"
#include "cuda/common/intern_name.hpp"
#include "cuda/common/kernel_registry.hpp"
#include "cuda/common/kvcache_kernel_params.hpp"
#include "cuda/sm80/decode_tile_table.hpp"

namespace flashcpp::detail::cuda::sm90 {

// The generated decode_sm90_registry.inc holds one FLASHCPP_SM90_DECODE(dtype, hdim) line per
// instantiation (the decode instantiations of the build, when 90a is listed). An entry
// merges the splits in a cluster where asked (merge_in_cluster) and possible; otherwise an
// fp8 cache's entry runs the unmerged kernel, and a 16-bit cache's launches nothing.
enum class DecodeSm90Ran { nothing, cluster, unmerged };
using DecodeClusterEntry = DecodeSm90Ran (*)(const KVCacheKernelParams&, bool merge_in_cluster,
                                             cudaStream_t);

#define FLASHCPP_SM90_DECODE(dtype, hdim)                                                       \
  DecodeSm90Ran decode_cluster_##dtype##_hdim##hdim(const KVCacheKernelParams& kp,              \
                                                    bool merge_in_cluster, cudaStream_t stream);
#include "decode_sm90_registry.inc"
#undef FLASHCPP_SM90_DECODE

using DecodeClusterKernel = RegistryEntry<DecodeClusterEntry>;

#define FLASHCPP_SM90_DECODE(dtype, hdim) \
  {ElementType::dtype, hdim, &decode_cluster_##dtype##_hdim##hdim},
inline constexpr DecodeClusterKernel kDecodeClusterKernels[] = {
#include "decode_sm90_registry.inc"
    kRegistrySentinel<DecodeClusterEntry>};
#undef FLASHCPP_SM90_DECODE

// FLASHCPP_DECODE_CLUSTER=0 (read once) keeps the combine kernel on Hopper, e.g. to compare.
inline bool decode_cluster_disabled_by_env() {
  static const bool disabled = [] {
    const char* v = std::getenv("FLASHCPP_DECODE_CLUSTER");
    return v != nullptr && std::string(v) == "0";
  }();
  return disabled;
}

// The split count a call runs with the cluster merge, or 0 for the combine kernel: the
// heuristic's count capped at a cluster's 8 where it asked for at most 16 (at B = 1 and 8 kv
// heads, 8 splits of one CTA per SM in clusters beat 16 splits and the combine kernel at every
// length on an H100: 8.3 / 11.8 / 30.9 / 97.0 us against 10.2 / 13.7 / 33.9 / 97.5 at L = 1k /
// 4k / 16k / 64k); more splits (few kv heads and a long cache) keep their count and the
// combine. An fp8 cache is not capped (its CTAs convert every element, so halving them cost
// a third of the speed: B1 L16k 551 against 829 GB/s, before the f16 conversion): the
// cluster only where the heuristic asks for at most 8. A count the caller asked for uses the
// cluster from 2 to 8.
inline int decode_cluster_splits(int splits, bool from_heuristic, bool fp8_cache) {
  if (decode_cluster_disabled_by_env() || splits < 2) return 0;
  if (from_heuristic && !fp8_cache) return splits <= 16 ? (splits < 8 ? splits : 8) : 0;
  return splits <= 8 ? splits : 0;
}

// The instantiation of this registry key (dtype, or fp8_e4m3 for an e4m3 cache) and head dim.
inline const DecodeClusterKernel* find_decode_cluster_kernel(ElementType key, int head_dim) {
  return smallest_covering(kDecodeClusterKernels, key, head_dim);
}

// RunInfo::kernel, e.g. "sm90_decode_bf16_hdim128_16x64_s3_cluster8"; unmerged (fp8 caches),
// "sm90_decode_fp8_e4m3_hdim128_16x64_s6" or "..._splitkv".
inline const char* decode_cluster_kernel_name(const DecodeClusterKernel& k, int splits, bool cluster) {
  const DecodeTile t = k.dtype == ElementType::fp8_e4m3 ? decode_tile_fp8(k.head_dim)
                                                        : decode_tile(k.head_dim);
  const std::string how = cluster ? "_cluster" + std::to_string(splits) : (splits > 1 ? "_splitkv" : "");
  return intern_name(std::string("sm90_decode_") + dtype_name(k.dtype) + "_hdim" +
                     std::to_string(k.head_dim) + "_" + std::to_string(kDecodeRows) + "x" +
                     std::to_string(t.block_n) + "_s" + std::to_string(t.stages) + how);
}

}  // namespace flashcpp::detail::cuda::sm90
