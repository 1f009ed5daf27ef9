#pragma once
// Where key `key` of sequence b, kv head `head` lives in a KV cache: contiguous caches address
// it through the batch stride, paged ones through the sequence's block table (the page
// stride is the cache's batch stride). Shared by the append and the decode kernels.
#include <cstdint>

#include "common/params.hpp"

namespace flashcpp::detail::cuda {

// The page of `key` (paged caches), or -1 when the block table names a page outside the pool:
// such keys are never read or written.
__device__ __forceinline__ int page_of(const KVCacheParams& p, int key) {
  return p.page_shift >= 0 ? key >> p.page_shift : key / p.page_size;
}
__device__ __forceinline__ int row_in_page(const KVCacheParams& p, int key) {
  return p.page_shift >= 0 ? key & (p.page_size - 1) : key % p.page_size;
}

__device__ __forceinline__ int cache_page(const KVCacheParams& p, int b, int key) {
  const int page = p.block_table[b * p.block_table_stride + page_of(p, key)];
  return page >= 0 && page < p.num_pages ? page : -1;
}

// Element offset of key `key` (kv head `head`) of sequence b, given its page from cache_page
// (ignored for a contiguous cache).
__device__ __forceinline__ std::int64_t kvcache_row_offset(const KVCacheParams& p, const Strides& s,
                                                           int b, int page, int key, int head) {
  if (!p.paged()) return b * s.batch + std::int64_t(key) * s.row + std::int64_t(head) * s.head;
  return page * s.batch + std::int64_t(row_in_page(p, key)) * s.row + std::int64_t(head) * s.head;
}

// The same in one step, or -1 for a key on an out-of-range page.
__device__ __forceinline__ std::int64_t cache_offset(const KVCacheParams& p, const Strides& s,
                                                     int b, int key, int head) {
  const int page = p.paged() ? cache_page(p, b, key) : 0;
  return page < 0 ? -1 : kvcache_row_offset(p, s, b, page, key, head);
}

// The keys sequence b attends over: its cached keys plus the appended ones, clamped to the
// capacity (a longer length is the caller's error; the kernels stay inside the cache).
__device__ __forceinline__ int kvcache_keys(const KVCacheParams& p, int b) {
  const std::int64_t n = std::int64_t(p.cache_seqlens[b]) + (p.appends() ? p.seqlen_q : 0);
  return int(n < 0 ? 0 : n > p.seqlen_k ? p.seqlen_k : n);
}

}  // namespace flashcpp::detail::cuda
