#pragma once
// Host side of one sm90a KV-cache decode instantiation: the decode kernel of
// sm80/decode_kernel.hpp with its splits merged inside a thread-block cluster
// (sm90/decode_cluster_combine.hpp), so a split call is one kernel; and, for an fp8 cache,
// the same kernel without the cluster, compiled for sm_90a (its e4m3 -> f16 conversion
// instruction exists from sm89 on; the sm80 translation units carry sm_80 code). Included
// only by the generated per-instantiation translation units (compiled for sm_90a alone).
#include <atomic>
#include <climits>
#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/kvcache_append.hpp"
#include "cuda/sm80/decode_kernel.hpp"
#include "cuda/sm80/decode_launch.cuh"
#include "cuda/sm90/decode_dispatch.hpp"
#include "cuda/sm90/decode_cluster_combine.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda::sm90 {

// Runs a split call with one cluster per (sequence, kv head, row tile), one CTA per SM; false,
// having launched nothing, where that does not apply (no split, more splits than a cluster
// holds, or a cluster of this size that the GPU cannot place): the caller then runs the
// combine kernel.
template <class Element, int kHeadDim, class Cache = Element>
bool run_decode_cluster(const KVCacheKernelParams& kp, cudaStream_t stream) {
  using Traits = sm80::DecodeTraits<Element, kHeadDim, Cache>;
  const KVCacheParams& p = kp.p;
  if (kp.num_splits < 2 || kp.num_splits > kDecodeClusterMaxSplits) return false;
  const bool softcap = kp.softcap_in_scale != 0.f, paged = p.paged();
  const auto kernel = softcap ? (paged ? &sm80::decode_kernel<Traits, true, true, true>
                                       : &sm80::decode_kernel<Traits, true, false, true>)
                              : (paged ? &sm80::decode_kernel<Traits, false, true, true>
                                       : &sm80::decode_kernel<Traits, false, false, true>);
  // One CTA per SM: the GPU places a cluster inside one GPC and would otherwise pack two of
  // its CTAs on an SM, leaving other SMs idle (H100, B1 L16k: 8 splits packed or spread alike,
  // 16 splits spread 30% slower than packed, since 16-CTA clusters of one CTA per SM do not
  // all fit at once). Asking for half an SM's shared memory spreads them. An fp8 cache's CTA
  // fills an SM by itself (8 warps' registers from d128 down, its stages' shared memory at d256).
  int device = 0, smem_per_sm = 0;
  FLASHCPP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHCPP_CUDA_CHECK(
      cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  const int smem = Traits::kFp8 ? Traits::kSmemBytes : std::max(Traits::kSmemBytes, smem_per_sm / 2);
  FLASHCPP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  FLASHCPP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared));
  const std::int64_t seq_heads = std::int64_t(p.batch) * p.heads_kv;
  if (seq_heads > INT_MAX || kp.num_m_tiles > 65535)
    throw Error("q: batch x kv heads, splits or row tiles exceed the decode kernel's grid");

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(seq_heads), unsigned(kp.num_splits), unsigned(kp.num_m_tiles));
  config.blockDim = dim3(Traits::kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = 1;
  attrs[0].val.clusterDim.y = unsigned(kp.num_splits);
  attrs[0].val.clusterDim.z = 1;
  // An fp8 cache's kernel is a programmatic dependent of the kernel ahead (decode_kernel.hpp).
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attrs;
  config.numAttrs = Traits::kFp8 ? 2 : 1;
  // Whether the GPU can place a cluster of this size: asked once per variant and size.
  static std::atomic<signed char> fits[2][2][kDecodeClusterMaxSplits + 1] = {};  // 0: not asked
  std::atomic<signed char>& known = fits[softcap][paged][kp.num_splits];
  if (known.load(std::memory_order_relaxed) == 0) {
    int placeable = 0;
    const bool ok = cudaOccupancyMaxActiveClusters(&placeable, kernel, &config) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();  // a refused query leaves nothing for the next check
    known.store(ok && placeable >= 1 ? 1 : -1, std::memory_order_relaxed);
  }
  if (known.load(std::memory_order_relaxed) < 0) return false;
  if (p.appends()) launch_kvcache_append<Element, Cache>(kp, stream);
  FLASHCPP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, kp));
  return true;
}

// The sm90a entry: the cluster merge where asked for and possible; otherwise, for an fp8
// cache, the kernel and (split) the combine kernel from this sm_90a code; nothing for 16-bit
// caches (the caller runs the sm80-family kernel).
template <class Element, int kHeadDim, class Cache = Element>
DecodeSm90Ran run_decode_sm90(const KVCacheKernelParams& kp, bool merge_in_cluster, cudaStream_t stream) {
  if (merge_in_cluster && run_decode_cluster<Element, kHeadDim, Cache>(kp, stream))
    return DecodeSm90Ran::cluster;
  if constexpr (sm80::DecodeTraits<Element, kHeadDim, Cache>::kFp8) {
    sm80::run_decode<Element, kHeadDim, Cache, true>(kp, stream);
    return DecodeSm90Ran::unmerged;
  }
  return DecodeSm90Ran::nothing;
}

}  // namespace flashcpp::detail::cuda::sm90
