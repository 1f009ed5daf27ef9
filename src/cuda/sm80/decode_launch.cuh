#pragma once
// Host side of one KV-cache decode instantiation: the append (when k_new is given), the decode
// kernel and, for split calls, the combine. Included only by the generated per-instantiation
// translation units.
#include <climits>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/kvcache_append.hpp"
#include "cuda/common/split_kv_combine.hpp"
#include "cuda/sm80/decode_kernel.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda::sm80 {

// Cache: the caches' element type (Element, or std::uint8_t for an e4m3 cache).
// kDependentLaunch (sm90a translation units' fp8 caches only, whose kernel waits for the
// kernel ahead; decode_kernel.hpp says why only fp8): the decode kernel is a programmatic
// dependent of the kernel ahead in the stream. It also marks the caller as sm90a code: the
// kernel and the combine are then that code's own instantiations (kSm90Code).
template <class Element, int kHeadDim, class Cache = Element, bool kDependentLaunch = false>
void run_decode(const KVCacheKernelParams& kp, cudaStream_t stream) {
  using Traits = DecodeTraits<Element, kHeadDim, Cache>;
  constexpr bool kSm90 = kDependentLaunch;
  const KVCacheParams& p = kp.p;
  if (p.appends()) launch_kvcache_append<Element, Cache>(kp, stream);
  const bool softcap = kp.softcap_in_scale != 0.f, paged = p.paged();
  const auto kernel = softcap ? (paged ? &decode_kernel<Traits, true, true, false, kSm90>
                                       : &decode_kernel<Traits, true, false, false, kSm90>)
                              : (paged ? &decode_kernel<Traits, false, true, false, kSm90>
                                       : &decode_kernel<Traits, false, false, false, kSm90>);
  constexpr int smem = Traits::kSmemBytes;
  if constexpr (smem > 40 * 1024)  // dynamic + static (merge arrays) above 48 KB must opt in
    FLASHCPP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // The tile is sized for ctas_per_sm resident CTAs: ask for the shared-memory carve-out
  // that holds them (the default may keep L1 larger and fit fewer).
  FLASHCPP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared));
  const std::int64_t seq_heads = std::int64_t(p.batch) * p.heads_kv;
  if (seq_heads > INT_MAX || kp.num_splits > 65535 || kp.num_m_tiles > 65535)
    throw Error("q: batch x kv heads, splits or row tiles exceed the decode kernel's grid");
  const dim3 grid(unsigned(seq_heads), unsigned(kp.num_splits), unsigned(kp.num_m_tiles));
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(Traits::kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = kDependentLaunch ? 1 : 0;
  FLASHCPP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, kp));
  if (kp.num_splits > 1) {
    // The forward's combine merges the same [split, b, h, row, Dv] partials.
    FwdKernelParams fk;
    fk.p = p;
    fk.num_splits = kp.num_splits;
    fk.o_accum = kp.o_accum;
    fk.lse_accum = kp.lse_accum;
    launch_combine<Element, kSm90>(fk, kp.overlap_combine, stream);
  }
}

}  // namespace flashcpp::detail::cuda::sm80
