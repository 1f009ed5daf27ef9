#pragma once
// Appends k_new / v_new into the cache: row t of sequence b goes to key cache_seqlens[b] + t.
// One warp per (sequence, new token, kv head), 16-byte vectors along the head dim. Rows that
// would land past the capacity or on an out-of-range page are dropped (kvcache_layout.hpp).
// An fp8 cache (Cache = std::uint8_t) stores e4m3(x / descale) (common/fp8.hpp: the division
// rounded in float32, then nearest even, saturating at +-448: the CPU append's bits).
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include "common/fp8.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/kvcache_kernel_params.hpp"
#include "cuda/common/kvcache_layout.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda {

inline constexpr int kAppendWarps = 4;

template <class Element>
__device__ __forceinline__ void copy_row(Element* dst, const Element* src, int dim, int lane) {
  for (int c = lane; c * 8 < dim; c += 32)
    reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(src)[c];
}

// 8 elements at a time: 16 bytes of the new row into 8 bytes of the fp8 cache row.
template <class Element>
__device__ __forceinline__ void quantise_row(std::uint8_t* dst, const Element* src, int dim, int lane,
                                             float descale) {
  for (int c = lane; c * 8 < dim; c += 32) {
    const uint4 in = reinterpret_cast<const uint4*>(src)[c];
    const Element* x = reinterpret_cast<const Element*>(&in);
    std::uint32_t word[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i)
      word[i / 4] |= std::uint32_t{float_to_e4m3(float(x[i]) / descale)} << (8 * (i % 4));
    reinterpret_cast<uint2*>(dst)[c] = make_uint2(word[0], word[1]);
  }
}

template <class Element, class Cache = Element>
__global__ void __launch_bounds__(kAppendWarps * 32)
    kvcache_append_kernel(const __grid_constant__ KVCacheKernelParams kp) {
  const KVCacheParams& p = kp.p;
  const std::int64_t row = std::int64_t(blockIdx.x) * kAppendWarps + threadIdx.x / 32;
  if (row >= std::int64_t(p.batch) * p.seqlen_q * p.heads_kv) return;
  const int head = int(row % p.heads_kv);
  const int t = int(row / p.heads_kv % p.seqlen_q);
  const int b = int(row / (std::int64_t(p.heads_kv) * p.seqlen_q));
  const std::int64_t key = std::int64_t(p.cache_seqlens[b]) + t;
  if (key < 0 || key >= p.seqlen_k) return;
  const int lane = threadIdx.x % 32;
  const std::int64_t k_at = cache_offset(p, p.k_stride, b, int(key), head);
  const std::int64_t v_at = cache_offset(p, p.v_stride, b, int(key), head);
  if (k_at < 0 || v_at < 0) return;
  const auto src = [&](const void* base, const Strides& s) {
    return static_cast<const Element*>(base) + b * s.batch + std::int64_t(t) * s.row +
           std::int64_t(head) * s.head;
  };
  // The caches are the caller's writable views; ForwardParams only types them as inputs.
  Cache* k_cache = static_cast<Cache*>(const_cast<void*>(p.k));
  Cache* v_cache = static_cast<Cache*>(const_cast<void*>(p.v));
  if constexpr (std::is_same_v<Cache, std::uint8_t>) {
    quantise_row(k_cache + k_at, src(p.k_new, p.k_new_stride), p.head_dim, lane, p.k_descale.at(b, head));
    quantise_row(v_cache + v_at, src(p.v_new, p.v_new_stride), p.head_dim_v, lane, p.v_descale.at(b, head));
  } else {
    copy_row(k_cache + k_at, src(p.k_new, p.k_new_stride), p.head_dim, lane);
    copy_row(v_cache + v_at, src(p.v_new, p.v_new_stride), p.head_dim_v, lane);
  }
}

// Launches the append of a call with k_new (16-bit caches only move rows, so fp16 and bf16 may
// share the std::uint16_t instantiation).
template <class Element, class Cache = Element>
void launch_kvcache_append(const KVCacheKernelParams& kp, cudaStream_t stream) {
  const KVCacheParams& p = kp.p;
  const std::int64_t rows = std::int64_t(p.batch) * p.seqlen_q * p.heads_kv;
  const std::int64_t blocks = (rows + kAppendWarps - 1) / kAppendWarps;
  if (blocks == 0) return;
  if (blocks > INT_MAX)
    throw Error("k_new: " + std::to_string(rows) + " rows exceed the append's grid");
  kvcache_append_kernel<Element, Cache><<<unsigned(blocks), kAppendWarps * 32, 0, stream>>>(kp);
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashcpp::detail::cuda
