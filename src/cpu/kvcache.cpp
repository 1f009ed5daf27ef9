// Attention against a KV cache on the CPU: the append, then either the split-key decode kernel
// (few query rows per KV head, AVX-512: kvcache_decode.cpp) or one batch-1 forward per sequence
// through the existing backends (float64 reference or tiled).
// A contiguous cache is attended in place; a paged sequence's keys are first gathered into a
// contiguous copy. Only rows below a sequence's length are touched: rows past it and unused
// pages may hold anything (NaN included).
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/element_io.hpp"
#include "cpu/kvcache_decode.hpp"
#include "cpu/kvcache_rows.hpp"

namespace flashcpp::detail::cpu {
namespace {

// Copies `heads` head vectors of `dim` elements (each contiguous) between two rows.
void copy_row(void* dst, std::int64_t dst_row, std::int64_t dst_head_stride, const void* src,
              std::int64_t src_row, std::int64_t src_head_stride, int heads, int dim,
              std::int64_t bytes) {
  for (int h = 0; h < heads; ++h)
    std::memcpy(static_cast<char*>(dst) + (dst_row + h * dst_head_stride) * bytes,
                static_cast<const char*>(src) + (src_row + h * src_head_stride) * bytes,
                dim * bytes);
}

const void* advance(const void* base, std::int64_t elements, std::int64_t bytes) {
  return static_cast<const char*>(base) + elements * bytes;
}
void* advance(void* base, std::int64_t elements, std::int64_t bytes) {
  return static_cast<char*>(base) + elements * bytes;
}

// `heads` head vectors of a new row quantised into an fp8 cache row: e4m3(x / descale), the
// division rounded in float32 (the CUDA append computes the same bits).
void quantise_row(void* dst, std::int64_t dst_row, std::int64_t dst_head_stride, const void* src,
                  ElementType src_type, std::int64_t src_row, std::int64_t src_head_stride,
                  int heads, int dim, const Descale& descale, int b) {
  for (int h = 0; h < heads; ++h) {
    const float factor = descale.at(b, h);
    for (int e = 0; e < dim; ++e)
      store_element(dst, ElementType::fp8_e4m3, dst_row + h * dst_head_stride + e,
                    load_element(src, src_type, src_row + h * src_head_stride + e) / factor);
  }
}

// k_new / v_new rows [b, 0..Nnew) into the cache at rows cache_seqlens[b] + i.
void append(const KVCacheParams& p) {
  const std::int64_t bytes = element_bytes(p.dtype);
  // The caches are written through the const ForwardParams::k / v: the API hands them over
  // as writable tensors.
  void* k_cache = const_cast<void*>(p.k);
  void* v_cache = const_cast<void*>(p.v);
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.seqlen_q; ++i) {
      const std::int64_t row = std::int64_t{p.cache_seqlens[b]} + i;
      if (p.kv_dtype == ElementType::fp8_e4m3) {
        quantise_row(k_cache, cache_row(p, p.k_stride, b, row), p.k_stride.head, p.k_new, p.dtype,
                     b * p.k_new_stride.batch + i * p.k_new_stride.row, p.k_new_stride.head,
                     p.heads_kv, p.head_dim, p.k_descale, b);
        quantise_row(v_cache, cache_row(p, p.v_stride, b, row), p.v_stride.head, p.v_new, p.dtype,
                     b * p.v_new_stride.batch + i * p.v_new_stride.row, p.v_new_stride.head,
                     p.heads_kv, p.head_dim_v, p.v_descale, b);
        continue;
      }
      copy_row(k_cache, cache_row(p, p.k_stride, b, row), p.k_stride.head, p.k_new,
               b * p.k_new_stride.batch + i * p.k_new_stride.row, p.k_new_stride.head,
               p.heads_kv, p.head_dim, bytes);
      copy_row(v_cache, cache_row(p, p.v_stride, b, row), p.v_stride.head, p.v_new,
               b * p.v_new_stride.batch + i * p.v_new_stride.row, p.v_new_stride.head,
               p.heads_kv, p.head_dim_v, bytes);
    }
}

// The first `keys` rows of sequence b of a paged cache as a dense [keys, Hkv, dim] copy.
std::vector<char> gather(const KVCacheParams& p, const void* cache, const Strides& s, int b,
                         std::int64_t keys, int dim) {
  const std::int64_t bytes = element_bytes(p.kv_dtype);
  std::vector<char> dense(static_cast<std::size_t>(keys * p.heads_kv * dim * bytes));
  for (std::int64_t row = 0; row < keys; ++row)
    copy_row(dense.data(), row * p.heads_kv * dim, dim, cache, cache_row(p, s, b, row), s.head,
             p.heads_kv, dim, bytes);
  return dense;
}

}  // namespace

void kvcache_forward(const KVCacheParams& p, bool reference) {
  if (p.appends()) append(p);
  if (!reference && !p.fp8_inputs() && kvcache_decode_usable(p)) {
    kvcache_decode(p);
    return;
  }
  const std::int64_t bytes = element_bytes(p.dtype);
  const std::int64_t kv_bytes = element_bytes(p.kv_dtype);
  // Sequence b's descales as the factors of a batch-1 call.
  const auto descale_of = [](Descale d, int b) {
    if (d.data != nullptr) d.data += b * d.batch_stride;
    return d;
  };
  for (int b = 0; b < p.batch; ++b) {
    const int keys = p.cache_seqlens[b] + (p.appends() ? p.seqlen_q : 0);
    ForwardParams f = p;  // the call's options, heads and q/out strides
    f.batch = 1;
    f.seqlen_k = keys;
    f.q = advance(p.q, b * p.q_stride.batch, bytes);
    f.out = advance(p.out, b * p.out_stride.batch, bytes);
    f.q_descale = descale_of(p.q_descale, b);
    f.k_descale = descale_of(p.k_descale, b);
    f.v_descale = descale_of(p.v_descale, b);
    if (p.lse) f.lse = p.lse + b * p.lse_batch_stride;
    std::vector<char> k_dense, v_dense;
    if (p.paged()) {
      k_dense = gather(p, p.k, p.k_stride, b, keys, p.head_dim);
      v_dense = gather(p, p.v, p.v_stride, b, keys, p.head_dim_v);
      f.k = k_dense.data();
      f.v = v_dense.data();
      f.k_stride = {0, std::int64_t{p.heads_kv} * p.head_dim, p.head_dim};
      f.v_stride = {0, std::int64_t{p.heads_kv} * p.head_dim_v, p.head_dim_v};
    } else {
      f.k = advance(p.k, b * p.k_stride.batch, kv_bytes);
      f.v = advance(p.v, b * p.v_stride.batch, kv_bytes);
    }
    // NaN tracking on: the cache is not scanned for NaN or Inf (nor for scores that overflow).
    if (reference)
      reference_forward(f);
    else
      tiled_forward(f, true);
  }
}

}  // namespace flashcpp::detail::cpu
