#pragma once
// The KV-cache tests' problem (KvCase), its host tensors and an independent float64 oracle
// written from the contract (flashcpp/kvcache.hpp, docs/semantics.md), shared by
// kvcache_cpu_test.cpp and kvcache_cuda_test.cpp. The caches are NaN everywhere but in the
// rows below each sequence's length: rows past it, unused pages and layout gaps. Paged caches
// take their pages in shuffled order from a pool with spare pages no table names. An fp8 cache
// holds e4m3 codes; the oracle multiplies them by the descales (exact in float64) and quantises
// the appended rows as the contract says: e4m3(float32(x / descale)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/fp8.hpp"
#include "flashcpp/flashcpp.hpp"
#include "test_util.hpp"

namespace flashcpp::test {

struct KvCase {
  std::vector<int> lengths{17};  // cache_seqlens: keys held before the call; B = size
  int nnew = 1;
  int heads_q = 4;
  int heads_kv = 4;
  int head_dim = 64;
  int head_dim_v = 0;  // 0: same as head_dim
  DType dtype = DType::fp32;
  int page_size = 0;  // 0: contiguous cache
  bool append = false;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  std::optional<float> scale;
  bool with_lse = true;
  Layout layout = Layout::bshd;  // of q, out, the caches, k_new and v_new
  int capacity = 0;  // keys per sequence; 0: the longest sequence after the call, plus slack
  // Paged: block-table slots past a sequence's pages hold -1 instead of a (NaN) page. Only
  // where the table is validated on the host; CUDA tests keep every slot a valid page.
  bool invalid_unused_slots = false;
  Backend backend = Backend::cpu;
  int num_splits = 0;  // 0: the plan's choice
  // fp8_e4m3 k_cache / v_cache (q, k_new, v_new and out in `dtype`), with descales: 0 none,
  // 1 one per tensor ([1]), 2 one per sequence and kv head ([B, Hkv], strided).
  bool fp8_cache = false;
  int descales = 0;

  int batch() const { return static_cast<int>(lengths.size()); }
  DType cache_dtype() const { return fp8_cache ? DType::fp8_e4m3 : dtype; }
  int dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool paged() const { return page_size > 0; }
  // Keys sequence b attends over.
  int keys(int b) const { return lengths[b] + (append ? nnew : 0); }
  int max_length() const { return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end()); }
  int most_keys() const {
    int most = 0;
    for (int b = 0; b < batch(); ++b) most = std::max(most, keys(b));
    return most;
  }
  int pages_per_seq() const {
    if (capacity > 0) return (capacity + page_size - 1) / page_size;
    return (most_keys() + page_size - 1) / page_size + 1;  // one unused slot at least
  }
  int num_pages() const { return batch() * pages_per_seq() + 3; }  // 3 spare pages
  // Keys per sequence in the cache tensor: Nmax (contiguous) or one page's rows (paged).
  int cache_rows() const {
    if (paged()) return page_size;
    return capacity > 0 ? capacity : most_keys() + 5;
  }
  AttentionOptions options() const {
    AttentionOptions o = options_of(*this, backend);
    o.num_splits = num_splits;
    return o;
  }
};

// "b3_n4_h16x2_d64_bf16_page16_append_causal_len0_33_250": unique, readable, a gtest name.
inline std::string kv_case_name(const KvCase& c) {
  std::string n = "b" + std::to_string(c.batch()) + "_n" + std::to_string(c.nnew) + "_h" +
                  std::to_string(c.heads_q) + "x" + std::to_string(c.heads_kv) + "_d" +
                  std::to_string(c.head_dim);
  if (c.dv() != c.head_dim) n += "v" + std::to_string(c.dv());
  n += std::string("_") + dtype_name(c.dtype);
  n += c.paged() ? "_page" + std::to_string(c.page_size) : std::string("_contiguous");
  if (c.layout != Layout::bshd) n += std::string("_") + layout_name(c.layout);
  if (c.append) n += "_append";
  if (c.causal) n += "_causal";
  if (c.window_left >= 0 || c.window_right >= 0) {
    const auto bound = [](int w) { return w < 0 ? std::string("inf") : std::to_string(w); };
    n += "_win" + bound(c.window_left) + "_" + bound(c.window_right);
  }
  if (c.softcap > 0) n += "_softcap" + std::to_string(static_cast<int>(c.softcap));
  if (c.scale) n += "_scale" + std::to_string(static_cast<int>(*c.scale * 1000)) + "m";
  if (!c.with_lse) n += "_nolse";
  if (c.capacity > 0) n += "_cap" + std::to_string(c.capacity);
  if (c.num_splits > 0) n += "_splits" + std::to_string(c.num_splits);
  if (c.backend == Backend::cpu_reference) n += "_reference";
  if (c.fp8_cache) n += "_fp8cache";
  if (c.descales > 0) n += "_descale" + std::to_string(c.descales);
  n += "_len";  // then _L for each sequence
  for (int b = 0; b < c.batch(); ++b) n.append("_").append(std::to_string(c.lengths[b]));
  return n;
}

inline void PrintTo(const KvCase& c, std::ostream* os) { *os << kv_case_name(c); }

// Views of a case's tensors, wherever their memory is; tensors() points into this object.
struct KvViews {
  TensorView q, k_cache, v_cache, cache_seqlens, out, block_table, k_new, v_new, lse;
  TensorView k_descale, v_descale;

  // The case's options with the descales of these views.
  AttentionOptions options(const KvCase& c) const {
    AttentionOptions o = c.options();
    if (c.descales > 0) {
      o.descale.k = &k_descale;
      o.descale.v = &v_descale;
    }
    return o;
  }

  KVCacheTensors tensors(const KvCase& c) const {
    KVCacheTensors t{q, k_cache, v_cache, cache_seqlens, out};
    if (c.paged()) t.block_table = &block_table;
    if (c.append) {
      t.k_new = &k_new;
      t.v_new = &v_new;
    }
    if (c.with_lse) t.lse = &lse;
    return t;
  }
};

// A case's host tensors: inputs random (rounded to the dtype), outputs NaN.
struct KvTensors {
  HostTensor q, k_cache, v_cache, k_new, v_new, out, lse, cache_seqlens, block_table;
  // fp32 descales: [1], or [B, Hkv] stored with a padded batch stride (strides are free).
  HostTensor k_descale, v_descale;
  // The keys and values held before the call, logical [B, longest length, Hkv, D|Dv]: what
  // the cache holds below the lengths, and the oracle's input.
  HostTensor k_old, v_old;

  KvTensors(const KvCase& c, std::mt19937_64& rng) {
    const int B = c.batch(), hkv = c.heads_kv, d = c.head_dim, dv = c.dv();
    const int first_dim = c.paged() ? c.num_pages() : B;
    q = HostTensor::bnhd(c.dtype, B, c.nnew, c.heads_q, d, c.layout);
    out = HostTensor::bnhd(c.dtype, B, c.nnew, c.heads_q, dv, c.layout);
    k_cache = HostTensor::bnhd(c.cache_dtype(), first_dim, c.cache_rows(), hkv, d, c.layout);
    v_cache = HostTensor::bnhd(c.cache_dtype(), first_dim, c.cache_rows(), hkv, dv, c.layout);
    k_new = HostTensor::bnhd(c.dtype, B, c.nnew, hkv, d, c.layout);
    v_new = HostTensor::bnhd(c.dtype, B, c.nnew, hkv, dv, c.layout);
    lse = HostTensor(DType::fp32, {B, c.heads_q, c.nnew});
    k_old = HostTensor(c.cache_dtype(), {B, c.max_length(), hkv, d});
    v_old = HostTensor(c.cache_dtype(), {B, c.max_length(), hkv, dv});
    for (HostTensor* t : {&q, &k_new, &v_new, &k_old, &v_old}) fill_normal(*t, rng);
    if (c.descales == 1) {
      k_descale = HostTensor(DType::fp32, {1});
      v_descale = HostTensor(DType::fp32, {1});
    } else if (c.descales == 2) {
      k_descale = HostTensor(DType::fp32, {B, hkv + 3});
      v_descale = HostTensor(DType::fp32, {B, hkv + 3});
    }
    const auto uniform = [&rng] { return 0.25 + 0.75 * static_cast<double>(rng() >> 11) * 0x1p-53; };
    for (HostTensor* t : {&k_descale, &v_descale})
      for (std::int64_t i = 0; c.descales > 0 && i < t->numel(); ++i)
        t->set(i, static_cast<float>(uniform()));
    out.poison();
    lse.poison();

    cache_seqlens = HostTensor(DType::int32, {B});
    for (int b = 0; b < B; ++b) cache_seqlens.set(b, static_cast<float>(c.lengths[b]));
    if (c.paged()) {
      // Every slot names a distinct page of the shuffled pool; the last pages stay spare.
      const int pps = c.pages_per_seq();
      std::vector<int> pages(c.num_pages());
      for (int i = 0; i < c.num_pages(); ++i) pages[i] = i;
      std::shuffle(pages.begin(), pages.end(), rng);
      block_table = HostTensor(DType::int32, {B, pps});
      for (int b = 0; b < B; ++b)
        for (int s = 0; s < pps; ++s) {
          const bool used = s * c.page_size < c.keys(b);
          const int page = c.invalid_unused_slots && !used ? -1 : pages[b * pps + s];
          block_table.set(std::int64_t{b} * pps + s, static_cast<float>(page));
        }
    }

    k_cache.poison();
    v_cache.poison();
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < c.lengths[b]; ++j) {
        const auto [first, row] = slot(c, b, j);
        for (int h = 0; h < hkv; ++h) {
          for (int e = 0; e < d; ++e)
            k_cache.set(((first * c.cache_rows() + row) * hkv + h) * d + e, k_old.at(b, j, h, e));
          for (int e = 0; e < dv; ++e)
            v_cache.set(((first * c.cache_rows() + row) * hkv + h) * dv + e, v_old.at(b, j, h, e));
        }
      }
  }

  // Where key `row` of sequence b lives: (index 0, index 1) of the cache tensors.
  std::pair<std::int64_t, std::int64_t> slot(const KvCase& c, int b, int row) const {
    if (!c.paged()) return {b, row};
    const float page = block_table.get(std::int64_t{b} * c.pages_per_seq() + row / c.page_size);
    return {static_cast<std::int64_t>(page), row % c.page_size};
  }

  // The descale of kv head g of sequence b (1 without descales).
  static float factor(const KvCase& c, const HostTensor& t, int b, int g) {
    if (c.descales == 0) return 1.0f;
    if (c.descales == 1) return t.get(0);
    return t.get(std::int64_t{b} * (c.heads_kv + 3) + g);
  }
  float k_factor(const KvCase& c, int b, int g) const { return factor(c, k_descale, b, g); }
  float v_factor(const KvCase& c, int b, int g) const { return factor(c, v_descale, b, g); }

  KvViews host_views() {
    KvViews v{q.view(), k_cache.view(), v_cache.view(), cache_seqlens.view(), out.view(),
              block_table.view(), k_new.view(), v_new.view(), lse.view(),
              k_descale.view(), v_descale.view()};
    // [B, Hkv] views of the padded [B, Hkv + 3] storage.
    if (k_descale.rank() == 2) v.k_descale.shape[1] = v.v_descale.shape[1] = k_descale.shape()[1] - 3;
    return v;
  }
};

// ---- the oracle ---------------------------------------------------------------------------------

struct KvExpected {
  std::vector<double> out;  // logical [B, Nnew, Hq, Dv]
  std::vector<double> lse;  // [B, Hq, Nnew]; -inf for rows that see no key
};

// Straight from the contract: sequence b's keys are its L cached ones then, when appending,
// its Nnew new ones; with o = keys - Nnew, key j is visible to new token i iff
// i + o - left <= j <= i + o + right (-1: unbounded; causal is right = 0); scores are
// scale * q.k, softcapped; kv head = query head / (Hq / Hkv).
inline KvExpected kv_oracle(const KvCase& c, const KvTensors& t) {
  const int B = c.batch(), nq = c.nnew, hq = c.heads_q, hkv = c.heads_kv;
  const int d = c.head_dim, dv = c.dv(), longest = c.max_length();
  const int right = c.causal ? 0 : c.window_right;
  const double scale = c.scale ? *c.scale : 1.0f / std::sqrt(static_cast<float>(d));
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> q = t.q.values(), k_old = t.k_old.values(), v_old = t.v_old.values(),
                      k_new = t.k_new.values(), v_new = t.v_new.values();
  if (c.fp8_cache) {
    // Cached rows: codes times descales; new rows: quantised by the append, then the same.
    for (int b = 0; b < B; ++b)
      for (int g = 0; g < hkv; ++g) {
        const double kf = t.k_factor(c, b, g), vf = t.v_factor(c, b, g);
        for (int j = 0; j < longest; ++j) {
          for (int a = 0; a < d; ++a) k_old[((std::int64_t{b} * longest + j) * hkv + g) * d + a] *= kf;
          for (int a = 0; a < dv; ++a) v_old[((std::int64_t{b} * longest + j) * hkv + g) * dv + a] *= vf;
        }
        const auto quantised = [](double x, float f) {
          return static_cast<double>(detail::e4m3_to_float(detail::float_to_e4m3(static_cast<float>(x) / f))) * f;
        };
        for (int i = 0; i < nq; ++i) {
          for (int a = 0; a < d; ++a) {
            double& x = k_new[((std::int64_t{b} * nq + i) * hkv + g) * d + a];
            x = quantised(x, static_cast<float>(kf));
          }
          for (int a = 0; a < dv; ++a) {
            double& x = v_new[((std::int64_t{b} * nq + i) * hkv + g) * dv + a];
            x = quantised(x, static_cast<float>(vf));
          }
        }
      }
  }
  KvExpected e{std::vector<double>(static_cast<std::size_t>(B) * nq * hq * dv, 0.0),
               std::vector<double>(static_cast<std::size_t>(B) * hq * nq, -inf)};
  for (int b = 0; b < B; ++b) {
    const std::int64_t L = c.lengths[b], n = c.keys(b), o = n - nq;
    // Row j of kv head g: a cached key, or new token j - L.
    const auto row = [&](const std::vector<double>& old, const std::vector<double>& fresh,
                         std::int64_t j, int g, int dim) {
      return j < L ? &old[((b * std::int64_t{longest} + j) * hkv + g) * dim]
                   : &fresh[((b * std::int64_t{nq} + j - L) * hkv + g) * dim];
    };
    std::vector<double> s(static_cast<std::size_t>(n));
    for (int h = 0; h < hq; ++h) {
      const int g = h / (hq / hkv);
      for (int i = 0; i < nq; ++i) {
        const double* qi = &q[((b * std::int64_t{nq} + i) * hq + h) * d];
        double max = -inf;
        for (std::int64_t j = 0; j < n; ++j) {
          const bool visible = (c.window_left < 0 || j >= i + o - c.window_left) &&
                               (right < 0 || j <= i + o + right);
          s[j] = -inf;
          if (!visible) continue;
          const double* kj = row(k_old, k_new, j, g, d);
          double x = 0;
          for (int a = 0; a < d; ++a) x += qi[a] * kj[a];
          x *= scale;
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          s[j] = x;
          max = std::max(max, x);
        }
        if (max == -inf) continue;  // no visible key: out 0, lse -inf
        double sum = 0;
        for (std::int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - max);
        const double lse = max + std::log(sum);
        e.lse[(b * std::int64_t{hq} + h) * nq + i] = lse;
        double* oi = &e.out[((b * std::int64_t{nq} + i) * hq + h) * dv];
        for (std::int64_t j = 0; j < n; ++j) {
          if (s[j] == -inf) continue;
          const double p = std::exp(s[j] - lse);
          const double* vj = row(v_old, v_new, j, g, dv);
          for (int a = 0; a < dv; ++a) oi[a] += p * vj[a];
        }
      }
    }
  }
  return e;
}

// ---- checks shared by both backends --------------------------------------------------------------

// Rows that see no key give exactly out = 0 and lse = -inf (when lse was requested); without
// lse, the lse buffer is untouched (still NaN).
inline void expect_empty_rows_exact(const KvCase& c, const KvTensors& got, const KvExpected& e) {
  const int nq = c.nnew, hq = c.heads_q, dv = c.dv();
  int reported = 0;
  for (int b = 0; b < c.batch(); ++b)
    for (int h = 0; h < hq; ++h)
      for (int i = 0; i < nq; ++i) {
        const std::int64_t l = (std::int64_t{b} * hq + h) * nq + i;
        if (!c.with_lse) {
          if (!std::isnan(got.lse.get(l)) && reported++ < 5)
            ADD_FAILURE() << "lse was not requested but lse[" << l << "] was written";
          continue;
        }
        if (e.lse[l] != -std::numeric_limits<double>::infinity()) continue;
        bool zero = true;
        for (int a = 0; a < dv; ++a)
          zero = zero && got.out.get(((std::int64_t{b} * nq + i) * hq + h) * dv + a) == 0.0f;
        if ((!zero || got.lse.get(l) != -INFINITY) && reported++ < 5)
          ADD_FAILURE() << "row (b=" << b << ", i=" << i << ", h=" << h
                        << ") sees no key but gives lse " << got.lse.get(l)
                        << " (expected out = 0, lse = -inf)";
      }
}

// The cache as the call must leave it: `before` with the new tokens' rows written at
// cache_seqlens[b] + i when appending, every other element (NaN padding included) unchanged.
inline void expect_cache_after(const KvCase& c, const KvTensors& before, const HostTensor& k_after,
                               const HostTensor& v_after) {
  HostTensor k_want = before.k_cache, v_want = before.v_cache;
  const int hkv = c.heads_kv, d = c.head_dim, dv = c.dv();
  if (c.append)
    for (int b = 0; b < c.batch(); ++b)
      for (int i = 0; i < c.nnew; ++i) {
        const auto [first, row] = before.slot(c, b, c.lengths[b] + i);
        for (int h = 0; h < hkv; ++h) {
          // An fp8 cache gets e4m3(x / descale): set() rounds the float32 quotient to e4m3.
          const float kf = c.fp8_cache ? before.k_factor(c, b, h) : 1.0f;
          const float vf = c.fp8_cache ? before.v_factor(c, b, h) : 1.0f;
          for (int a = 0; a < d; ++a)
            k_want.set(((first * c.cache_rows() + row) * hkv + h) * d + a, before.k_new.at(b, i, h, a) / kf);
          for (int a = 0; a < dv; ++a)
            v_want.set(((first * c.cache_rows() + row) * hkv + h) * dv + a, before.v_new.at(b, i, h, a) / vf);
        }
      }
  for (const auto& [want, got, name] :
       {std::tuple{&k_want, &k_after, "k_cache"}, {&v_want, &v_after, "v_cache"}}) {
    if (want->bitwise_equal(*got)) continue;
    std::int64_t first_diff = -1;  // logical index, to say where (NaN equals NaN here)
    for (std::int64_t i = 0; i < want->numel() && first_diff < 0; ++i) {
      const float w = want->get(i), g = got->get(i);
      if (!(w == g || (std::isnan(w) && std::isnan(g)))) first_diff = i;
    }
    ADD_FAILURE() << name << " differs from the expected cache (appended rows written, nothing "
                  << "else changed); first logical difference at " << first_diff
                  << " (-1: only in the gaps of the layout)";
  }
}

}  // namespace flashcpp::test
