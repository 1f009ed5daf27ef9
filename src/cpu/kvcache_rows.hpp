#pragma once
// Where row `row` of sequence b starts in a KV cache, contiguous or paged.
#include <cstdint>

#include "common/params.hpp"

namespace flashcpp::detail::cpu {

// Element offset of row `row` (head 0, dim 0) of sequence b in a cache with strides `s`.
inline std::int64_t cache_row(const KVCacheParams& p, const Strides& s, int b, std::int64_t row) {
  if (!p.paged()) return b * s.batch + row * s.row;
  const std::int64_t page = p.block_table[b * p.block_table_stride + row / p.page_size];
  return page * s.batch + row % p.page_size * s.row;
}

}  // namespace flashcpp::detail::cpu
