// attention_with_kvcache on the CPU backends (Backend::cpu, and cpu_reference on a subset)
// against the test's own float64 oracle (kvcache_harness.hpp): contiguous and paged caches
// (page sizes 3, 16, 64 and 256, shuffled tables), appends, zero-length sequences, GQA, MQA
// and MHA, causal, windows, softcap, lse and memory layouts. Every run starts from NaN
// outputs and NaN in every cache row past the lengths; each checks the output, the lse and
// that the cache changed exactly in the appended rows. fp8_e4m3 caches (with and without
// descales, quantising appends) run on the float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "kvcache_harness.hpp"

namespace flashcpp::test {
namespace {

KvCase make(std::vector<int> lengths, int nnew, int hq, int hkv, int d, DType dtype) {
  KvCase c;
  c.lengths = std::move(lengths);
  c.nnew = nnew;
  c.heads_q = hq;
  c.heads_kv = hkv;
  c.head_dim = d;
  c.dtype = dtype;
  return c;
}

// A paged variant; `invalid_unused` puts -1 in the table slots no key lives in.
KvCase paged(KvCase c, int page_size, bool invalid_unused) {
  c.page_size = page_size;
  c.invalid_unused_slots = invalid_unused;
  return c;
}

KvCase appending(KvCase c) {
  c.append = true;
  return c;
}

KvCase causal(KvCase c) {
  c.causal = true;
  return c;
}

std::vector<KvCase> cpu_cases() {
  std::vector<KvCase> cases;
  const DType f32 = DType::fp32, f16 = DType::fp16, b16 = DType::bf16;
  // Decode against a contiguous cache, MHA, a zero-length sequence in the batch.
  cases.push_back(causal(make({0, 1, 17, 300}, 1, 4, 4, 64, f32)));
  // GQA 8:1, appending 4 tokens, a long sequence.
  cases.push_back(causal(appending(make({5, 0, 1000}, 4, 16, 2, 128, b16))));
  // Paged, every page size, shuffled tables; lengths on and around page boundaries.
  cases.push_back(paged(causal(appending(make({0, 33, 250, 16}, 16, 16, 2, 64, f16))), 16, true));
  KvCase window = paged(make({2000, 0, 64, 65}, 4, 8, 1, 64, b16), 64, false);  // MQA
  window.window_left = 32;
  window.window_right = 0;
  cases.push_back(window);
  KvCase big = paged(appending(make({3000, 255, 256, 0, 1, 2, 3, 4}, 1, 2, 2, 64, f32)), 256, true);
  big.softcap = 30.0f;
  cases.push_back(big);
  KvCase odd_page = paged(causal(appending(make({0, 7, 100}, 4, 8, 2, 64, b16))), 3, false);
  odd_page.window_left = 8;
  cases.push_back(odd_page);
  // No mask: every new token sees all keys, later new tokens included.
  cases.push_back(paged(appending(make({40, 3}, 16, 4, 4, 64, f32)), 16, false));
  // A window that reaches past the diagonal.
  KvCase ahead = appending(make({100, 20}, 16, 4, 2, 64, f16));
  ahead.window_left = 16;
  ahead.window_right = 4;
  cases.push_back(ahead);
  // Softcap with causal, no lse (its buffer must stay untouched).
  KvCase capped = paged(causal(appending(make({50, 0, 9}, 4, 4, 1, 64, f16))), 64, true);
  capped.softcap = 5.0f;
  capped.with_lse = false;
  cases.push_back(capped);
  // D != Dv, which the CPU backends take.
  KvCase dv = paged(causal(appending(make({77, 0}, 4, 4, 2, 128, b16))), 16, false);
  dv.head_dim_v = 64;
  cases.push_back(dv);
  // Rows that see no key: an empty cache without appends; fewer keys than new tokens, causal.
  cases.push_back(causal(make({0}, 4, 2, 2, 64, f32)));
  cases.push_back(causal(make({2, 20}, 4, 2, 1, 64, b16)));
  // An empty cache with appends: the new tokens see each other only.
  cases.push_back(appending(make({0}, 16, 2, 2, 64, f32)));
  // No slack: the call fills the cache to its capacity exactly.
  KvCase full = causal(appending(make({13, 29}, 4, 4, 2, 64, f32)));
  full.capacity = 33;
  cases.push_back(full);
  full.page_size = 11;
  cases.push_back(full);
  // Memory layouts: [pages, Hkv, page_size, D] caches (bhsd), and NaN gaps after every head
  // vector of every tensor (padded).
  for (Layout layout : {Layout::bhsd, Layout::padded}) {
    KvCase p = paged(causal(appending(make({0, 70, 31}, 4, 8, 2, 64, b16))), 16, true);
    p.layout = layout;
    cases.push_back(p);
    KvCase q = causal(appending(make({9, 130}, 1, 4, 1, 64, f32)));
    q.layout = layout;
    cases.push_back(q);
  }
  // An explicit softmax scale.
  KvCase scaled = paged(appending(make({45, 3}, 4, 4, 2, 64, f32)), 16, false);
  scaled.scale = 0.5f;
  cases.push_back(scaled);
  // The float64 reference backend on a subset: contiguous, every paged flavour, appends.
  for (std::size_t i : {1, 2, 4, 5, 8}) {
    KvCase r = cases[i];
    r.backend = Backend::cpu_reference;
    cases.push_back(r);
  }
  // fp8_e4m3 caches (the reference: automatic picks it for them): descales per (sequence, kv
  // head) and per tensor, none; bf16, fp16 and fp32 queries; appends quantised.
  const auto fp8 = [](KvCase c, int descales) {
    c.fp8_cache = true;
    c.descales = descales;
    c.backend = Backend::cpu_reference;
    return c;
  };
  cases.push_back(fp8(causal(appending(make({0, 17, 300}, 4, 8, 2, 64, b16))), 2));
  KvCase capped_fp8 = fp8(paged(appending(make({33, 0, 70}, 1, 8, 1, 128, f16)), 16, true), 1);
  capped_fp8.softcap = 20.0f;
  cases.push_back(capped_fp8);
  cases.push_back(fp8(paged(causal(appending(make({5, 40}, 4, 4, 4, 64, f32))), 3, false), 0));
  KvCase dv_fp8 = fp8(paged(causal(make({77, 1}, 4, 4, 2, 128, b16)), 64, false), 2);
  dv_fp8.head_dim_v = 64;
  dv_fp8.layout = Layout::padded;
  cases.push_back(dv_fp8);
  return cases;
}

class KvCacheCpu : public ::testing::TestWithParam<KvCase> {};

TEST_P(KvCacheCpu, MatchesOracle) {
  const KvCase& c = GetParam();
  auto rng = test_rng();
  KvTensors t(c, rng);
  const KvTensors before = t;
  const KvExpected e = kv_oracle(c, t);
  const KvViews views = t.host_views();
  const RunInfo info = attention_with_kvcache(views.tensors(c), views.options(c));
  EXPECT_EQ(info.backend, c.backend);
  EXPECT_EQ(info.num_splits, 1);
  expect_empty_rows_exact(c, t, e);
  expect_forward_close(c.dtype, t.out.values(), e.out,
                       c.with_lse ? t.lse.values() : std::vector<double>{}, e.lse);
  expect_cache_after(c, before, t.k_cache, t.v_cache);
}

std::vector<KvCase> unique(std::vector<KvCase> cases) {
  std::set<std::string> seen;
  std::vector<KvCase> out;
  for (auto& c : cases)
    if (seen.insert(kv_case_name(c)).second) out.push_back(c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Sweep, KvCacheCpu, ::testing::ValuesIn(unique(cpu_cases())),
                         [](const auto& info) { return kv_case_name(info.param); });

// ---- properties that are not a comparison ------------------------------------------------------

// The CPU runs a plan of its own: no splits, no workspace; automatic picks the CPU backend.
TEST(KvCacheCpuProps, PlanOnTheCpu) {
  KvCase c = paged(appending(make({5, 40}, 4, 4, 2, 64, DType::bf16)), 16, false);
  auto rng = test_rng();
  KvTensors t(c, rng);
  const KvViews views = t.host_views();
  for (Backend backend : {Backend::automatic, Backend::cpu, Backend::cpu_reference}) {
    c.backend = backend;
    const KVCachePlan plan = plan_attention_with_kvcache(views.tensors(c), c.options());
    const Backend expected = backend == Backend::automatic ? Backend::cpu : backend;
    EXPECT_EQ(plan.backend, expected);
    EXPECT_EQ(plan.workspace_bytes, 0u);
    EXPECT_EQ(plan.num_splits, 1);
    EXPECT_NE(std::string(plan.kernel), "");
    const RunInfo info = attention_with_kvcache(views.tensors(c), c.options());
    EXPECT_EQ(info.backend, expected);
    EXPECT_EQ(std::string(info.kernel), plan.kernel);
  }
}

// An fp8 cache runs on the reference when the backend is automatic; an explicit `cpu` is refused.
TEST(KvCacheCpuProps, Fp8CacheRunsOnTheReference) {
  KvCase c = paged(appending(make({5, 40}, 4, 4, 2, 64, DType::bf16)), 16, false);
  c.fp8_cache = true;
  c.descales = 2;
  c.backend = Backend::automatic;
  auto rng = test_rng();
  KvTensors t(c, rng);
  const KvViews views = t.host_views();
  EXPECT_EQ(plan_attention_with_kvcache(views.tensors(c), views.options(c)).backend,
            Backend::cpu_reference);
  EXPECT_EQ(attention_with_kvcache(views.tensors(c), views.options(c)).backend, Backend::cpu_reference);
  c.backend = Backend::cpu;
  try {
    attention_with_kvcache(views.tensors(c), views.options(c));
    ADD_FAILURE() << "backend cpu took an fp8 cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend: cpu does not take fp8_e4m3"), std::string::npos)
        << e.what();
  }
}

// The same call twice gives the same bits (the append rewrites the same rows).
TEST(KvCacheCpuProps, BitwiseDeterministic) {
  const KvCase c = paged(causal(appending(make({300, 0, 77}, 4, 8, 2, 64, DType::bf16))), 16, false);
  auto rng = test_rng();
  KvTensors t(c, rng);
  const KvViews views = t.host_views();
  attention_with_kvcache(views.tensors(c), c.options());
  const HostTensor out = t.out, lse = t.lse, k_cache = t.k_cache;
  t.out.poison();
  t.lse.poison();
  attention_with_kvcache(views.tensors(c), c.options());
  EXPECT_TRUE(t.out.bitwise_equal(out));
  EXPECT_TRUE(t.lse.bitwise_equal(lse));
  EXPECT_TRUE(t.k_cache.bitwise_equal(k_cache));
}

// Decoding step by step (append one token, advance the length) fills the cache as one call
// appending all of them does, and the last step's output is that call's last row.
TEST(KvCacheCpuProps, StepwiseDecodeMatchesOneChunk) {
  const int steps = 4;
  KvCase chunk = paged(causal(appending(make({21, 0}, steps, 4, 2, 64, DType::fp32))), 16, false);
  auto rng = test_rng();
  KvTensors whole(chunk, rng);
  KvTensors stepwise = whole;  // same cache, pages and new tokens
  const KvViews views = whole.host_views();
  attention_with_kvcache(views.tensors(chunk), chunk.options());

  KvCase one = chunk;
  one.nnew = 1;
  one.with_lse = false;
  for (int s = 0; s < steps; ++s) {
    HostTensor q(DType::fp32, {2, 1, 4, 64}), k(DType::fp32, {2, 1, 2, 64}),
        v(DType::fp32, {2, 1, 2, 64}), out(DType::fp32, {2, 1, 4, 64});
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 4; ++h)
        for (int a = 0; a < 64; ++a) {
          q.set((b * 4 + h) * 64 + a, stepwise.q.at(b, s, h, a));
          if (h < 2) {
            k.set((b * 2 + h) * 64 + a, stepwise.k_new.at(b, s, h, a));
            v.set((b * 2 + h) * 64 + a, stepwise.v_new.at(b, s, h, a));
          }
        }
    KvViews step = stepwise.host_views();
    step.q = q.view();
    step.k_new = k.view();
    step.v_new = v.view();
    step.out = out.view();
    attention_with_kvcache(step.tensors(one), one.options());
    for (int b = 0; b < 2; ++b) {
      stepwise.cache_seqlens.set(b, stepwise.cache_seqlens.get(b) + 1);
      for (int h = 0; h < 4; ++h)
        for (int a = 0; a < 64; ++a)
          EXPECT_NEAR(out.at(b, 0, h, a), whole.out.at(b, s, h, a), 1e-5)
              << "step " << s << " b " << b << " h " << h;
    }
  }
  EXPECT_TRUE(stepwise.k_cache.bitwise_equal(whole.k_cache));
  EXPECT_TRUE(stepwise.v_cache.bitwise_equal(whole.v_cache));
}

// A zero batch and zero new tokens are valid calls that write nothing.
TEST(KvCacheCpuProps, EmptyCallsWriteNothing) {
  for (const auto& [lengths, nnew] : {std::pair{std::vector<int>{}, 4}, {std::vector<int>{3, 9}, 0}})
    for (int page_size : {0, 16}) {
      KvCase c = appending(make(lengths, nnew, 4, 2, 64, DType::fp32));
      c.page_size = page_size;
      SCOPED_TRACE(kv_case_name(c));
      auto rng = test_rng();
      KvTensors t(c, rng);
      const KvTensors before = t;
      const KvViews views = t.host_views();
      EXPECT_NO_THROW(attention_with_kvcache(views.tensors(c), c.options()));
      EXPECT_TRUE(t.k_cache.bitwise_equal(before.k_cache));
      EXPECT_TRUE(t.v_cache.bitwise_equal(before.v_cache));
      EXPECT_TRUE(t.out.bitwise_equal(before.out));
      EXPECT_TRUE(t.lse.bitwise_equal(before.lse));
    }
}

}  // namespace
}  // namespace flashcpp::test
