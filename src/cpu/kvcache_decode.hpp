#pragma once
// Decode against a KV cache on AVX-512, split over the keys across threads
// (kvcache_decode.cpp); kvcache_forward takes it after the append.
#include "common/params.hpp"

namespace flashcpp::detail::cpu {

// AVX-512 present (and not turned off by FLASHCPP_CPU_KERNEL=generic) and at most 16 query
// rows (Nnew times Hq / Hkv) per KV head.
bool kvcache_decode_usable(const KVCacheParams& params);

// Attention of the new rows against the cache (already appended), into out and lse.
void kvcache_decode(const KVCacheParams& params);

}  // namespace flashcpp::detail::cpu
