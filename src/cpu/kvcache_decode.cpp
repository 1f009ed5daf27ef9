// Decode against a KV cache on AVX-512: few query rows per KV head, many keys, so the work is
// reading the cache once. Tasks are (batch, key split): each reads its keys' rows of K and V
// once, as one stream, for all query rows (the Hq / Hkv heads of each KV head times Nnew), keeps a partial
// online softmax (max, sum, unnormalised output) per row, and a second pass combines the
// splits. The split count gives every thread several tasks even when B * Hkv is small.
// Extra memory: the partials, B * Hq * Nnew * splits * (Dv + 2) floats, plus per thread a
// converted key block (32 * Hkv * (D + Dv) floats) and the query rows (Hq * Nnew * D floats).
#include "cpu/kvcache_decode.hpp"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/avx512_forward.hpp"
#include "cpu/block_mask.hpp"
#include "cpu/element_io.hpp"
#include "cpu/exp2_avx512.hpp"
#include "cpu/kvcache_rows.hpp"
#include "cpu/load_avx512.hpp"
#include "cpu/scores.hpp"

namespace flashcpp::detail::cpu {
namespace {

constexpr int kMaxRows = 16;      // query rows per KV head that this path takes
constexpr int kBlockKeys = 32;    // keys converted to fp32 at a time, all KV heads (in L2)
constexpr int kMinSplitKeys = 512;
// Software prefetch of the next key block (in-place bf16 path): 1 thread at L 16k read 5.7 GB/s
// without it and 7.2 GB/s with it as one burst per block; spread over the block's compute
// (each row's lines asked for as its head's scores and P V reach the same key of this block)
// 10.7 -> 13.6 GB/s (min of 15 calls, same minute).
constexpr auto kPrefetchHint = _MM_HINT_T0;
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

struct Workspace {
  Workspace(int d, int dv, int heads_kv, int q_rows)
      : k(static_cast<std::size_t>(heads_kv) * kBlockKeys * d),
        v(static_cast<std::size_t>(heads_kv) * kBlockKeys * dv),
        q(static_cast<std::size_t>(q_rows) * d) {}
  std::vector<float> k, v, q;
};

// Where a split's partial results live: [B][Hkv][splits][rows][Dv + 2] (m, l, then o).
struct Partials {
  int splits, rows, dv;
  std::vector<float> data;
  float* at(int b, int kv_head, int heads_kv, int split) {
    return data.data() +
           ((static_cast<std::int64_t>(b) * heads_kv + kv_head) * splits + split) * rows * (dv + 2);
  }
};

// vdpbf16ps for the scores: bf16, D of 64, 128 or 256, and AVX512-BF16 (CPUID 7.1 EAX bit 5).
bool use_bf16_dot(const KVCacheParams& p) {
  static const bool present = [] {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1u);
  }();
  return present && p.dtype == ElementType::bf16 &&
         (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256);
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512bf16")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

inline __mmask16 lanes_of(int n) {
  return n >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

float dot(const float* a, const float* b, int n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 lanes = lanes_of(n - i);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes, a + i), _mm512_maskz_loadu_ps(lanes, b + i),
                           acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// Asks for the cache lines of one row of n bf16 elements (the next key block's, read while
// this block computes; one burst of prefetches for a whole block stalled on the fill buffers).
inline void fetch_row(const std::uint16_t* row, int n) {
  for (int e = 0; e < n; e += 32)
    _mm_prefetch(reinterpret_cast<const char*>(row + e), kPrefetchHint);
}

// For kRows rows r: o_r[0..dv) = o_r * scale[r] + sum over j in [lo, hi) of p_r[j] * v[j][..],
// 64 columns at a time held in registers; each V row is loaded once for all rows. Row r's
// o is at o + r * ldo, its p at p + r * kBlockKeys.
// V rows as fp32 (converted block, row j at v + j * dv) or, for bf16 caches, read in place
// (row j at v_bf16 + v_rows[j]).
struct ValueRows {
  const float* v = nullptr;
  const std::uint16_t* v_bf16 = nullptr;
  const std::int64_t* v_rows = nullptr;
  const std::int64_t* next_rows = nullptr;  // the next block's V rows, to prefetch (bf16)
  int next_count = 0;
};

template <int kRows, bool kBf16>
void accumulate_rows(float* o, std::int64_t ldo, const float* scale, const float* p, int lo,
                     int hi, const ValueRows& values, int dv) {
  for (int c0 = 0; c0 < dv; c0 += 64) {
    __mmask16 lanes[4];
    __m512 acc[kRows][4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c)
      lanes[c] = dv - c0 - 16 * c > 0 ? lanes_of(dv - c0 - 16 * c) : __mmask16(0);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512 s = _mm512_set1_ps(scale[r]);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c)
        acc[r][c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes[c], o + r * ldo + c0 + 16 * c), s);
    }
    for (int j = lo; j < hi; ++j) {
      __m512 vj[4];
      if constexpr (kBf16) {
        if (c0 == 0 && j < values.next_count) fetch_row(values.v_bf16 + values.next_rows[j], dv);
        const std::uint16_t* v_row = values.v_bf16 + values.v_rows[j] + c0;
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c)
          vj[c] = _mm512_castsi512_ps(_mm512_slli_epi32(
              _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes[c], v_row + 16 * c)), 16));
      } else {
        const float* v_row = values.v + static_cast<std::int64_t>(j) * dv + c0;
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) vj[c] = _mm512_maskz_loadu_ps(lanes[c], v_row + 16 * c);
      }
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) {
        const __m512 pj = _mm512_set1_ps(p[r * kBlockKeys + j]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(pj, vj[c], acc[r][c]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c)
        _mm512_mask_storeu_ps(o + r * ldo + c0 + 16 * c, lanes[c], acc[r][c]);
  }
}

// Lane t of the result: the sum of the 16 lanes of v[t]. A tree of in-lane and cross-lane
// shuffles: 16 separate horizontal sums took about 40% of the decode's time (1 thread, L 16k).
inline __m512 sum_lanes_16(__m512 v[16]) {
  __m512 x[8], y[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: (v2i, v2i+1) sums of lanes {0,2}, {1,3}
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: the lane sums of v4i .. v4i+3
    y[i] = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x[2 * i]), _mm512_castps_pd(x[2 * i + 1]))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x[2 * i]), _mm512_castps_pd(x[2 * i + 1]))));
  // Add the four 128-bit lanes: [y0, y1] and [y2, y3] halve, then once more.
  const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88),
                                   _mm512_shuffle_f32x4(y[0], y[1], 0xdd));
  const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x88),
                                   _mm512_shuffle_f32x4(y[2], y[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xdd));
}

// q . k of one cache row, as 16 partial sums, q as bf16 pairs.
template <int kChunks>
inline __m512 dot_bf16(const __m512i q_pairs[kChunks], const std::uint16_t* k) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int c = 0; c < kChunks; c += 2) {
    acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)q_pairs[c], (__m512bh)_mm512_loadu_si512(k + 32 * c));
    if (c + 1 < kChunks)
      acc1 = _mm512_dpbf16_ps(acc1, (__m512bh)q_pairs[c + 1],
                              (__m512bh)_mm512_loadu_si512(k + 32 * c + 32));
  }
  return _mm512_add_ps(acc0, acc1);
}

// bf16 caches on CPUs with AVX512-BF16: scores straight from the cache rows with vdpbf16ps
// (exact products, fp32 sums), no conversion of K. s[j] = alpha * q . k[j] for j in [lo, hi);
// returns the max (NaN scores left out of it). q holds the row's raw bf16 elements. 16 keys
// at a time share one horizontal sum.
template <int kChunks>
float scores_bf16(const std::uint16_t* q, const std::uint16_t* cache, const std::int64_t* rows,
                  int lo, int hi, float alpha, float softcap_log2, float* s,
                  const std::int64_t* prefetch_rows, int prefetch_count) {
  __m512i q_pairs[kChunks];
#pragma GCC unroll 8
  for (int c = 0; c < kChunks; ++c) q_pairs[c] = _mm512_loadu_si512(q + 32 * c);
  const __m512 scale = _mm512_set1_ps(alpha);
  __m512 max16 = _mm512_set1_ps(kMinusInf);
  int j = lo;
  for (; j + 16 <= hi; j += 16) {
    __m512 partial[16];
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) partial[t] = dot_bf16<kChunks>(q_pairs, cache + rows[j + t]);
    for (int t = j; t < j + 16 && t < prefetch_count; ++t)
      fetch_row(cache + prefetch_rows[t], 32 * kChunks);
    __m512 x = _mm512_mul_ps(sum_lanes_16(partial), scale);
    if (softcap_log2 > 0) {
      _mm512_storeu_ps(s + j, x);
      for (int t = 0; t < 16; ++t) s[j + t] = softcap_log2 * std::tanh(s[j + t]);
      x = _mm512_loadu_ps(s + j);
    }
    _mm512_storeu_ps(s + j, x);
    max16 = _mm512_max_ps(x, max16);  // returns max16 where x is NaN
  }
  float max = _mm512_reduce_max_ps(max16);
  for (; j < hi; ++j) {
    if (j < prefetch_count) fetch_row(cache + prefetch_rows[j], 32 * kChunks);
    float x = _mm512_reduce_add_ps(dot_bf16<kChunks>(q_pairs, cache + rows[j])) * alpha;
    if (softcap_log2 > 0) x = softcap_log2 * std::tanh(x);
    s[j] = x;
    max = x > max ? x : max;
  }
  return max;
}

// scores_bf16 for 4 query heads of one KV head at once: each K row is loaded once for the
// four (one head at a time reread the block's rows 4 times, and rows Hkv * D apart alias in
// L1). The 16-lane partial sums go through a 4 KiB buffer to sum_lanes_16.
template <int kChunks>
void scores_bf16_4(const std::uint16_t* const q[4], const std::uint16_t* cache,
                   const std::int64_t* rows, int lo, int hi, float alpha, float softcap_log2,
                   float* const s[4], float max_out[4], const std::int64_t* prefetch_rows,
                   int prefetch_count) {
  __m512i q_pairs[4][kChunks];
#pragma GCC unroll 4
  for (int h = 0; h < 4; ++h)
#pragma GCC unroll 8
    for (int c = 0; c < kChunks; ++c) q_pairs[h][c] = _mm512_loadu_si512(q[h] + 32 * c);
  const __m512 scale = _mm512_set1_ps(alpha);
  __m512 max16[4];
  for (int h = 0; h < 4; ++h) max16[h] = _mm512_set1_ps(kMinusInf);
  alignas(64) float partial[4][16][16];
  int j = lo;
  for (; j + 16 <= hi; j += 16) {
    for (int t = 0; t < 16; ++t) {
      const std::uint16_t* k = cache + rows[j + t];
      __m512 acc[4];
#pragma GCC unroll 4
      for (int h = 0; h < 4; ++h) acc[h] = _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int c = 0; c < kChunks; ++c) {
        const __m512bh kc = (__m512bh)_mm512_loadu_si512(k + 32 * c);
#pragma GCC unroll 4
        for (int h = 0; h < 4; ++h) acc[h] = _mm512_dpbf16_ps(acc[h], (__m512bh)q_pairs[h][c], kc);
      }
#pragma GCC unroll 4
      for (int h = 0; h < 4; ++h) _mm512_store_ps(partial[h][t], acc[h]);
    }
    for (int t = j; t < j + 16 && t < prefetch_count; ++t)
      fetch_row(cache + prefetch_rows[t], 32 * kChunks);
    for (int h = 0; h < 4; ++h) {
      __m512 v[16];
      for (int t = 0; t < 16; ++t) v[t] = _mm512_load_ps(partial[h][t]);
      __m512 x = _mm512_mul_ps(sum_lanes_16(v), scale);
      if (softcap_log2 > 0) {
        _mm512_storeu_ps(s[h] + j, x);
        for (int t = 0; t < 16; ++t) s[h][j + t] = softcap_log2 * std::tanh(s[h][j + t]);
        x = _mm512_loadu_ps(s[h] + j);
      }
      _mm512_storeu_ps(s[h] + j, x);
      max16[h] = _mm512_max_ps(x, max16[h]);  // returns max16 where x is NaN
    }
  }
  for (int h = 0; h < 4; ++h) max_out[h] = _mm512_reduce_max_ps(max16[h]);
  for (; j < hi; ++j) {
    if (j < prefetch_count) fetch_row(cache + prefetch_rows[j], 32 * kChunks);
    for (int h = 0; h < 4; ++h) {
      const __m512 acc = dot_bf16<kChunks>(q_pairs[h], cache + rows[j]);
      float x = _mm512_reduce_add_ps(acc) * alpha;
      if (softcap_log2 > 0) x = softcap_log2 * std::tanh(x);
      s[h][j] = x;
      max_out[h] = x > max_out[h] ? x : max_out[h];
    }
  }
}

// Keys [begin, end) of sequence b for every query row; partial m, l, o per row into
// partials.at(b, kv_head, split). The key blocks run outermost and the KV heads inside, so the
// cache is read as one contiguous stream. Rows of a KV head are (new token i, query head h of
// its group), i slowest.
void split_task(const KVCacheParams& p, int b, std::int64_t keys, std::int64_t begin,
                std::int64_t end, Partials& partials, int split, Workspace& w) {
  const int group = p.heads_q / p.heads_kv;
  const int rows = p.seqlen_q * group;
  const int d = p.head_dim, dv = p.head_dim_v;
  const BlockMask mask(p.seqlen_q, keys, p.window_left, p.window_right);
  const ScoreTransform transform = score_transform(p);
  const std::int64_t row_floats = dv + 2;
  const bool bf16_dot = use_bf16_dot(p);
  const auto* q_raw = static_cast<const std::uint16_t*>(p.q);
  for (int kv_head = 0; kv_head < p.heads_kv; ++kv_head) {
    float* partial = partials.at(b, kv_head, p.heads_kv, split);
    for (int r = 0; r < rows; ++r) {
      const int token = r / group, head = kv_head * group + r % group;
      load_scaled_row(p.q, p.dtype,
                      b * p.q_stride.batch + token * p.q_stride.row + head * p.q_stride.head, d,
                      transform.alpha,
                      w.q.data() + (static_cast<std::int64_t>(kv_head) * rows + r) * d);
      float* out = partial + r * row_floats;
      out[0] = kMinusInf;
      out[1] = 0.0f;
      for (int c = 0; c < dv; ++c) out[2 + c] = 0.0f;
    }
  }
  alignas(64) float s_rows[kMaxRows][kBlockKeys];  // per row of a token: scores, then P
  std::int64_t k_rows[kBlockKeys];  // element offsets of the block's K and V rows (head 0)
  std::int64_t v_rows[kBlockKeys];
  std::int64_t k_next[kBlockKeys];  // and of the next block's (bf16 in place: prefetched)
  std::int64_t v_next[kBlockKeys];
  for (std::int64_t c0 = begin; c0 < end; c0 += kBlockKeys) {
   const int cols = static_cast<int>(std::min<std::int64_t>(kBlockKeys, end - c0));
   // Row by row over all heads, so the cache is read in address order (the prefetchers
   // follow it; one head's rows alone are 256-byte pieces strided by Hkv * D).
   const int next_cols = static_cast<int>(
       std::clamp<std::int64_t>(end - c0 - kBlockKeys, 0, kBlockKeys));
   for (int j = 0; j < cols; ++j) {
     const std::int64_t k_row = cache_row(p, p.k_stride, b, c0 + j);
     const std::int64_t v_row = cache_row(p, p.v_stride, b, c0 + j);
     k_rows[j] = k_row;
     v_rows[j] = v_row;
     if (bf16_dot) {  // read in place; the next block's rows are fetched during this one's
       if (c0 + kBlockKeys + j < end) {
         k_next[j] = cache_row(p, p.k_stride, b, c0 + kBlockKeys + j);
         v_next[j] = cache_row(p, p.v_stride, b, c0 + kBlockKeys + j);
       }
       continue;
     }
     for (int h = 0; h < p.heads_kv; ++h) {
       load_scaled_row(p.k, p.dtype, k_row + h * p.k_stride.head, d, 1.0f,
                       w.k.data() + (static_cast<std::int64_t>(h) * kBlockKeys + j) * d);
       load_scaled_row(p.v, p.dtype, v_row + h * p.v_stride.head, dv, 1.0f,
                       w.v.data() + (static_cast<std::int64_t>(h) * kBlockKeys + j) * dv);
     }
   }
   for (int kv_head = 0; kv_head < p.heads_kv; ++kv_head) {
    float* partial = partials.at(b, kv_head, p.heads_kv, split);
    const float* k_block = w.k.data() + static_cast<std::int64_t>(kv_head) * kBlockKeys * d;
    const float* v_block = w.v.data() + static_cast<std::int64_t>(kv_head) * kBlockKeys * dv;
    // The rows of one new token (its Hq / Hkv query heads) see the same keys: their scores
    // and softmax go row by row, their P V together, so each V row is loaded once for all.
    for (int token = 0; token < p.seqlen_q; ++token) {
     const KeyRange visible = mask.keys(token);
     const int lo = static_cast<int>(std::clamp<std::int64_t>(visible.begin - c0, 0, cols));
     const int hi = static_cast<int>(std::clamp<std::int64_t>(visible.end - c0, 0, cols));
     if (lo >= hi) continue;
     alignas(64) float correction[kMaxRows];
     // Query heads in fours share each K row load (d 64 and 128).
     const bool by_fours = bf16_dot && group % 4 == 0 && (d == 64 || d == 128);
     float max_of[kMaxRows];
     for (int g0 = 0; by_fours && g0 < group; g0 += 4) {
       const std::uint16_t* q_rows[4];
       float* s_of[4];
       for (int h = 0; h < 4; ++h) {
         const int head = kv_head * group + g0 + h;
         q_rows[h] = q_raw + b * p.q_stride.batch + token * p.q_stride.row + head * p.q_stride.head;
         s_of[h] = s_rows[g0 + h];
       }
       const auto* k_head = static_cast<const std::uint16_t*>(p.k) + kv_head * p.k_stride.head;
       const int fetch = g0 == 0 && token == 0 ? next_cols : 0;  // once per head and block
       if (d == 64)
         scores_bf16_4<2>(q_rows, k_head, k_rows, lo, hi, transform.alpha, transform.softcap_log2,
                          s_of, max_of + g0, k_next, fetch);
       else
         scores_bf16_4<4>(q_rows, k_head, k_rows, lo, hi, transform.alpha, transform.softcap_log2,
                          s_of, max_of + g0, k_next, fetch);
     }
     for (int g = 0; g < group; ++g) {
      const int r = token * group + g;
      float* s = s_rows[g];
      const float* q = w.q.data() + (static_cast<std::int64_t>(kv_head) * rows + r) * d;
      float max = kMinusInf;
      if (by_fours) {
        max = max_of[g];
      } else if (bf16_dot) {
        const int head = kv_head * group + g;
        const std::uint16_t* q_row =
            q_raw + b * p.q_stride.batch + token * p.q_stride.row + head * p.q_stride.head;
        const auto* k_head = static_cast<const std::uint16_t*>(p.k) + kv_head * p.k_stride.head;
        const float alpha = transform.alpha;
        const int fetch = g == 0 && token == 0 ? next_cols : 0;  // once per head and block
        if (d == 64)
          max = scores_bf16<2>(q_row, k_head, k_rows, lo, hi, alpha, transform.softcap_log2, s,
                                k_next, fetch);
        else if (d == 128)
          max = scores_bf16<4>(q_row, k_head, k_rows, lo, hi, alpha, transform.softcap_log2, s,
                                k_next, fetch);
        else
          max = scores_bf16<8>(q_row, k_head, k_rows, lo, hi, alpha, transform.softcap_log2, s,
                                k_next, fetch);
      }
      for (int j = bf16_dot ? hi : lo; j < hi; ++j) {
        float x = dot(q, k_block + static_cast<std::int64_t>(j) * d, d);
        if (transform.softcap_log2 > 0) x = transform.softcap_log2 * std::tanh(x);
        s[j] = x;
        max = x > max ? x : max;  // NaN scores do not reach the max; they reach l below
      }
      float* out = partial + r * row_floats;
      const float new_max = std::max(out[0], max);
      const float base = new_max == kMinusInf ? 0.0f : new_max;
      correction[g] = out[0] == new_max ? 1.0f : std::exp2(out[0] - base);
      __m512 sum = _mm512_setzero_ps();
      for (int j = lo; j < hi; j += 16) {
        const __mmask16 lanes = lanes_of(hi - j);
        const __m512 pj = exp2_lanes(
            _mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, s + j), _mm512_set1_ps(base)));
        _mm512_mask_storeu_ps(s + j, lanes, pj);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(lanes, pj));
      }
      out[1] = out[1] * correction[g] + _mm512_reduce_add_ps(sum);
      out[0] = new_max;
     }
     float* out = partial + token * group * row_floats;
     ValueRows values;
     values.v = v_block;
     values.v_bf16 = static_cast<const std::uint16_t*>(p.v) + kv_head * p.v_stride.head;
     values.v_rows = v_rows;
     values.next_rows = v_next;
     values.next_count = token == 0 && bf16_dot ? next_cols : 0;
     for (int g = 0; g < group; g += 4) {
       const int n = std::min(4, group - g);
       float* o = out + g * row_floats + 2;
       const float* pg = s_rows[g];
       if (bf16_dot) {
         if (n == 4) accumulate_rows<4, true>(o, row_floats, correction + g, pg, lo, hi, values, dv);
         if (n == 3) accumulate_rows<3, true>(o, row_floats, correction + g, pg, lo, hi, values, dv);
         if (n == 2) accumulate_rows<2, true>(o, row_floats, correction + g, pg, lo, hi, values, dv);
         if (n == 1) accumulate_rows<1, true>(o, row_floats, correction + g, pg, lo, hi, values, dv);
       } else {
         if (n == 4) accumulate_rows<4, false>(o, row_floats, correction + g, pg, lo, hi, values, dv);
         if (n == 3) accumulate_rows<3, false>(o, row_floats, correction + g, pg, lo, hi, values, dv);
         if (n == 2) accumulate_rows<2, false>(o, row_floats, correction + g, pg, lo, hi, values, dv);
         if (n == 1) accumulate_rows<1, false>(o, row_floats, correction + g, pg, lo, hi, values, dv);
       }
     }
    }
   }
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

bool kvcache_decode_usable(const KVCacheParams& p) {
  return avx512_forward_usable() && p.seqlen_q * (p.heads_q / p.heads_kv) <= kMaxRows;
}

void kvcache_decode(const KVCacheParams& p) {
  const int group = p.heads_q / p.heads_kv;
  const int rows = p.seqlen_q * group;
  const int dv = p.head_dim_v;
  std::int64_t max_keys = 0;
  for (int b = 0; b < p.batch; ++b)
    max_keys = std::max<std::int64_t>(max_keys, p.cache_seqlens[b] + (p.appends() ? p.seqlen_q : 0));
  // Enough splits for 4 tasks per thread, none shorter than kMinSplitKeys keys.
  const std::int64_t heads = std::int64_t{p.batch} * p.heads_kv;
  const std::int64_t wanted = (4 * omp_get_max_threads() + p.batch - 1) / p.batch;
  const int splits = static_cast<int>(std::clamp<std::int64_t>(
      std::min(wanted, (max_keys + kMinSplitKeys - 1) / kMinSplitKeys), 1, 1024));
  Partials partials{splits, rows, dv,
                    std::vector<float>(static_cast<std::size_t>(heads * splits * rows * (dv + 2)))};

  const std::int64_t tasks = std::int64_t{p.batch} * splits;
#pragma omp parallel
  {
    Workspace w(p.head_dim, dv, p.heads_kv, p.heads_q * p.seqlen_q);
#pragma omp for schedule(dynamic)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const int split = static_cast<int>(t % splits);
      const int b = static_cast<int>(t / splits);
      const std::int64_t keys = p.cache_seqlens[b] + (p.appends() ? p.seqlen_q : 0);
      const std::int64_t per_split = (keys + splits - 1) / splits;
      const std::int64_t begin = std::min(keys, split * per_split);
      const std::int64_t end = std::min(keys, begin + per_split);
      split_task(p, b, keys, begin, end, partials, split, w);
    }
  }

  // Combine the splits of each row: out = sum_s o_s 2^(m_s - m) / sum_s l_s 2^(m_s - m).
  const std::int64_t outputs = heads * rows;
#pragma omp parallel for
  for (std::int64_t t = 0; t < outputs; ++t) {
    const int r = static_cast<int>(t % rows);
    const int kv_head = static_cast<int>(t / rows % p.heads_kv);
    const int b = static_cast<int>(t / rows / p.heads_kv);
    const int token = r / group, head = kv_head * group + r % group;
    float max = kMinusInf;
    for (int s = 0; s < splits; ++s)
      max = std::max(max, partials.at(b, kv_head, p.heads_kv, s)[r * (dv + 2)]);
    const float base = max == kMinusInf ? 0.0f : max;
    std::vector<float> o(dv, 0.0f);
    float l = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* part = partials.at(b, kv_head, p.heads_kv, s) + r * (dv + 2);
      if (part[0] == kMinusInf && part[1] == 0.0f) continue;  // saw no key
      const float f = std::exp2(part[0] - base);
      l += part[1] * f;
      for (int c = 0; c < dv; ++c) o[c] += part[2 + c] * f;
    }
    const bool empty = l == 0.0f;  // no visible key: out = 0, lse = -inf (NaN stays NaN)
    const float inv_l = empty ? 0.0f : 1.0f / l;
    for (int c = 0; c < dv; ++c) o[c] *= inv_l;
    store_row(p.out, p.dtype,
              b * p.out_stride.batch + token * p.out_stride.row + head * p.out_stride.head,
              o.data(), dv);
    if (p.lse) {
      p.lse[b * p.lse_batch_stride + head * p.lse_head_stride + token] =
          empty ? kMinusInf : (max + std::log2(l)) * kLn2;
    }
  }
}

}  // namespace flashcpp::detail::cpu
