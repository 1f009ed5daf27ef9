#pragma once
// Host side of the KV-cache decode seen by the planner (cuda_backend.cu): which
// instantiations this build has, the split count and the kernel names reported in RunInfo.
// Not covered: dtypes other than fp16/bf16, and fp8_e4m3 caches with other than bf16 q (a
// clear error). An fp8_e4m3 entry of the registry is a bf16-q kernel over an e4m3 cache.
#include <algorithm>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "common/params.hpp"
#include "cuda/common/intern_name.hpp"
#include "cuda/common/kernel_registry.hpp"
#include "cuda/common/kvcache_kernel_params.hpp"
#include "cuda/sm80/decode_tile_table.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda::sm80 {

// The KV-cache decode kernels this build contains: the generated decode_sm80_registry.inc
// holds one FLASHCPP_SM80_DECODE(dtype, hdim) line per instantiation (FLASHCPP_DTYPES x the
// head dims of FLASHCPP_HEAD_DIMS that have a decode tile).
using DecodeEntry = void (*)(const KVCacheKernelParams&, cudaStream_t);

#define FLASHCPP_SM80_DECODE(dtype, hdim) \
  void decode_##dtype##_hdim##hdim(const KVCacheKernelParams& kp, cudaStream_t stream);
#include "decode_sm80_registry.inc"
#undef FLASHCPP_SM80_DECODE

using DecodeKernel = RegistryEntry<DecodeEntry>;

#define FLASHCPP_SM80_DECODE(dtype, hdim) {ElementType::dtype, hdim, &decode_##dtype##_hdim##hdim},
inline constexpr DecodeKernel kDecodeKernels[] = {
#include "decode_sm80_registry.inc"
    kRegistrySentinel<DecodeEntry>};
#undef FLASHCPP_SM80_DECODE

// The instantiation whose (padded) head dim covers both D and Dv: K and Q are zero-filled past
// D and V past Dv, so the smaller of the two runs in the larger's tile.
inline const DecodeKernel& decode_kernel_for(const KVCacheParams& p) {
  if (p.dtype != ElementType::fp16 && p.dtype != ElementType::bf16)
    throw Error(std::string("cuda kvcache: dtype ") + dtype_name(p.dtype) +
                " is not supported (supported: fp16, bf16)");
  const bool fp8 = p.kv_dtype == ElementType::fp8_e4m3;
  if (fp8 && p.dtype != ElementType::bf16)
    throw Error(std::string("cuda kvcache: an fp8_e4m3 cache takes q, k_new, v_new and out in "
                            "bf16, got ") + dtype_name(p.dtype));
  // The kernel moves e4m3 rows in 16-byte chunks: a head dim of 8 (mod 16) would read 8
  // bytes past each head vector.
  if (fp8 && (p.head_dim % 16 != 0 || p.head_dim_v % 16 != 0))
    throw Error("cuda kvcache: an fp8_e4m3 cache needs head dims that are multiples of 16, got " +
                std::to_string(p.head_dim) + " and " + std::to_string(p.head_dim_v));
  const ElementType key = fp8 ? ElementType::fp8_e4m3 : p.dtype;
  const char* what = fp8 ? "fp8_e4m3 cache" : dtype_name(p.dtype);
  const int head_dim = std::max(p.head_dim, p.head_dim_v);
  const DecodeKernel* k = smallest_covering(kDecodeKernels, key, head_dim);
  if (!k)
    throw Error("cuda kvcache: no decode kernel for head dim " + std::to_string(head_dim) + " " +
                what + " in this build (built head dims for " + what + ": " +
                built_head_dims(kDecodeKernels, key) +
                "); configure with -DFLASHCPP_HEAD_DIMS=... and -DFLASHCPP_DTYPES=...");
  return *k;
}

// The tile an instantiation runs: fp8 caches have more stages.
inline DecodeTile decode_tile_of(const DecodeKernel& k) {
  return k.dtype == ElementType::fp8_e4m3 ? decode_tile_fp8(k.head_dim) : decode_tile(k.head_dim);
}

inline int decode_rows(const KVCacheParams& p) { return p.seqlen_q * (p.heads_q / p.heads_kv); }
inline int decode_m_tiles(const KVCacheParams& p) {
  return (decode_rows(p) + kDecodeRows - 1) / kDecodeRows;
}

// Splits for about one CTA per SM. A CTA streams its K/V at several times an SM's share of
// the memory bandwidth, so one per SM keeps the memory busy, and fewer splits leave fewer
// partials for the combine and fewer CTA start-ups; each split keeps at least 2 key blocks of
// the capacity (short caches are latency-bound: more splits walk shorter chains). Decided from shapes only: the lengths live on the device.
// An fp8 cache also aims at one CTA per SM, contiguous or paged alike, but keeps that count
// at every batch: its CTA converts every element it reads, so one CTA per (sequence, kv head)
// does not saturate the memory by itself. (H100, GQA 32:8, D 128, L 4k and 16k: two CTAs per
// SM, the earlier rule, took 1.3x the time of one per SM at B 8 and 1.04-1.09x at B 16.)
inline int decode_splits(const KVCacheParams& p, const DecodeTile& t, int sm_count) {
  const std::int64_t ctas = std::int64_t(p.batch) * p.heads_kv * decode_m_tiles(p);
  const std::int64_t blocks = (std::int64_t(p.seqlen_k) + t.block_n - 1) / t.block_n;
  const std::int64_t by_blocks = std::max<std::int64_t>(1, blocks / 2);
  if (p.kv_dtype == ElementType::fp8_e4m3) {
    if (ctas <= 0 || 2 * ctas > sm_count) return 1;
    return int(std::min<std::int64_t>({sm_count / ctas, by_blocks, 128}));
  }
  if (ctas <= 0 || 2 * ctas > sm_count) return 1;
  std::int64_t splits = std::min<std::int64_t>({sm_count / ctas, by_blocks, 128});
  // Contiguous caches with a third of the SMs or more busy: one CTA per (sequence, kv head)
  // nearly saturates the memory by itself, so split only long caches, where the combine is
  // small against the stream (H100, B8: unsplit 4% faster at L = 4k, 2 splits 3% faster at
  // 16k). A paged CTA streams slower (B8 L4k unsplit: 16-key pages at 0.75x contiguous).
  if (!p.paged() && 3 * ctas >= sm_count)
    splits = std::min<std::int64_t>(splits, std::max<std::int64_t>(1, blocks / 128));
  return int(splits);
}

// RunInfo::kernel, e.g. "sm80_decode_bf16_hdim128_16x64_s4_splitkv" ("fp8_e4m3" names a bf16
// kernel over an e4m3 cache).
inline const char* decode_kernel_name(const DecodeKernel& k, bool split) {
  const DecodeTile t = decode_tile_of(k);
  return intern_name(std::string("sm80_decode_") + dtype_name(k.dtype) + "_hdim" +
                     std::to_string(k.head_dim) + "_" + std::to_string(kDecodeRows) + "x" +
                     std::to_string(t.block_n) + "_s" + std::to_string(t.stages) +
                     (split ? "_splitkv" : ""));
}

}  // namespace flashcpp::detail::cuda::sm80
