// The CPU backend's forward (Backend::cpu) against the float64 reference, over structured
// sweeps of head dims, awkward lengths, masks, softcap, GQA/MQA, D != Dv, varlen with empty
// sequences, dtypes and memory layouts. Not the cartesian product: every axis is swept with a
// few values of the others, so the suite stays within a couple of minutes on 2 cores.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace flashcpp::test {
namespace {

// Flat logical indices of out row (b, i, h) and its lse entry.
struct RowIndex {
  std::int64_t out;  // first element of the Dv-vector
  std::int64_t lse;
};

RowIndex row_index(const Problem& p, int b, int i, int h) {
  if (p.varlen()) {
    std::int64_t row = i;
    for (int s = 0; s < b; ++s) row += p.lengths_q[s];
    return {(row * p.heads_q + h) * p.dv(), static_cast<std::int64_t>(h) * p.total_q() + row};
  }
  return {((static_cast<std::int64_t>(b) * p.seqlen_q + i) * p.heads_q + h) * p.dv(),
          (static_cast<std::int64_t>(b) * p.heads_q + h) * p.seqlen_q + i};
}

// Rows with no visible key must be exactly out = 0 and lse = -inf (contract); checks `t`.
void expect_empty_rows_exact(const Problem& p, const Tensors& t, const char* who) {
  int reported = 0;
  for (int b = 0; b < p.num_seqs(); ++b)
    for (int i = 0; i < p.len_q(b); ++i) {
      const auto keys = p.keys(b, i);
      if (keys.begin < keys.end) continue;
      for (int h = 0; h < p.heads_q; ++h) {
        const RowIndex r = row_index(p, b, i, h);
        bool zero = true;
        for (int d = 0; d < p.dv(); ++d) zero = zero && t.out.get(r.out + d) == 0.0f;
        const bool neg_inf = !p.with_lse || t.lse.get(r.lse) == -INFINITY;
        if ((!zero || !neg_inf) && reported++ < 5)
          ADD_FAILURE() << who << ": row (b=" << b << ", i=" << i << ", h=" << h
                        << ") sees no key but out[0]=" << t.out.get(r.out)
                        << " lse=" << (p.with_lse ? t.lse.get(r.lse) : 0.0f)
                        << " (expected out=0, lse=-inf)";
      }
    }
}

void check_forward(const Problem& p, const Tensors& got, const Tensors& ref) {
  expect_empty_rows_exact(p, ref, "reference");
  expect_empty_rows_exact(p, got, "cpu backend");

  expect_forward_close(p.dtype, got.out.values(), ref.out.values(),
                       p.with_lse ? got.lse.values() : std::vector<double>{}, ref.lse.values());
}

// ---- the sweeps ------------------------------------------------------------------------------

const int kHeadDims[] = {32, 64, 80, 96, 128, 192, 256};
const std::pair<int, int> kShapes[] = {{1, 1},     {17, 17},   {113, 203},
                                       {203, 113}, {128, 128}, {1000, 1000}};

struct Option {
  const char* what;
  bool causal;
  int left, right;
  float softcap;
};
const Option kOptions[] = {
    {"causal", true, -1, -1, 0.0f},         {"window 32,8", false, 32, 8, 0.0f},
    {"window -1,16", false, -1, 16, 0.0f},  {"window 8,0", false, 8, 0, 0.0f},
    {"softcap 30", false, -1, -1, 30.0f},   {"causal softcap 5", true, -1, -1, 5.0f},
};

Problem with_option(Problem p, const Option& o) {
  p.causal = o.causal;
  p.window_left = o.left;
  p.window_right = o.right;
  p.softcap = o.softcap;
  return p;
}

std::vector<Problem> forward_cases() {
  std::vector<Problem> cases;
  // Every head dim on two shapes (one fp32, one bf16 causal).
  for (int d : kHeadDims) {
    cases.push_back(shape(113, 203, d));
    Problem p = shape(17, 17, d, DType::bf16);
    p.causal = true;
    cases.push_back(p);
  }
  // Every shape on two head dims; the (1000, 1000) ones are the large, slow checks.
  for (auto [nq, nk] : kShapes)
    for (int d : {64, 128}) {
      Problem p = shape(nq, nk, d);
      if (nq == 1000) p.batch = 1;
      cases.push_back(p);
    }
  {
    Problem p = shape(1000, 1000, 128, DType::bf16);
    p.batch = 1;
    p.causal = true;
    cases.push_back(p);
  }
  // Every mask / softcap option on three shapes in every dtype.
  for (const Option& o : kOptions)
    for (auto [nq, nk] : {std::pair{113, 203}, {203, 113}, {128, 128}})
      for (DType dt : {DType::fp32, DType::fp16, DType::bf16})
        cases.push_back(with_option(shape(nq, nk, 64, dt), o));
  // GQA 8:1 and MQA.
  for (auto [hq, hkv] : {std::pair{16, 2}, {8, 1}})
    for (DType dt : {DType::fp32, DType::bf16})
      for (bool causal : {false, true}) {
        Problem p = shape(113, 203, 64, dt);
        p.batch = 1;
        p.heads_q = hq;
        p.heads_kv = hkv;
        p.causal = causal;
        cases.push_back(p);
      }
  // D != Dv.
  for (auto [d, dv] : {std::pair{128, 64}, {64, 128}, {256, 32}})
    for (DType dt : {DType::fp32, DType::bf16}) {
      Problem p = shape(113, 203, d, dt);
      p.head_dim_v = dv;
      p.causal = dt == DType::bf16;
      cases.push_back(p);
    }
  // BHSD memory, and BSHD with NaN-filled gaps after every head vector.
  for (Layout layout : {Layout::bhsd, Layout::padded}) {
    Problem a = shape(113, 203, 80);
    a.layout = layout;
    cases.push_back(a);
    Problem b = shape(203, 113, 128, DType::bf16);
    b.causal = true;
    b.layout = layout;
    cases.push_back(b);
    Problem c = with_option(shape(128, 128, 64, DType::fp16), kOptions[1]);
    c.heads_q = 4;
    c.heads_kv = 1;
    c.layout = layout;
    cases.push_back(c);
  }
  // Varlen batches with empty sequences: no queries, no keys, neither.
  for (DType dt : {DType::fp32, DType::bf16})
    for (int option : {-1, 0, 1}) {
      Problem p;
      p.dtype = dt;
      p.heads_q = 4;
      p.heads_kv = 2;
      p.lengths_q = {17, 0, 113, 1, 64, 0, 9};
      p.lengths_k = {17, 9, 203, 0, 64, 0, 1};
      if (option >= 0) p = with_option(p, kOptions[option]);
      cases.push_back(p);
    }
  // Rows with no visible key: Nq > Nk causal; a window that sees nothing for most rows; Nk = 0.
  {
    Problem p = shape(40, 8, 64);
    p.causal = true;
    p.window_left = 0;  // only the diagonal key, which exists for the last 8 rows
    cases.push_back(p);
    for (DType dt : {DType::fp32, DType::fp16, DType::bf16}) cases.push_back(shape(17, 0, 64, dt));
    Problem q = shape(1, 1000, 32);
    q.window_left = 3;
    q.window_right = 3;
    cases.push_back(q);
  }
  // lse not requested; an explicit softmax scale.
  for (DType dt : {DType::fp32, DType::bf16}) {
    Problem p = shape(113, 203, 64, dt);
    p.with_lse = false;
    p.causal = true;
    cases.push_back(p);
    Problem s = shape(113, 203, 64, dt);
    s.scale = 0.5f;
    cases.push_back(s);
  }
  return cases;
}

class CpuForward : public ::testing::TestWithParam<Problem> {};

TEST_P(CpuForward, MatchesReference) {
  const Problem& p = GetParam();
  auto rng = test_rng();
  Tensors t(p);
  t.fill_inputs(rng);
  const Tensors ref = reference_forward(p, t);
  t.poison_outputs();
  const RunInfo info = t.forward(p, Backend::cpu);
  EXPECT_EQ(info.backend, Backend::cpu);
  check_forward(p, t, ref);
  if (!p.with_lse) {  // lse was not passed: its buffer must be untouched (still NaN)
    for (std::int64_t i = 0; i < t.lse.numel(); ++i) ASSERT_TRUE(std::isnan(t.lse.get(i)));
  }
}

std::vector<Problem> unique_cases(std::vector<Problem> cases) {
  std::set<std::string> seen;
  std::vector<Problem> out;
  for (auto& p : cases)
    if (seen.insert(problem_name(p)).second) out.push_back(p);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Sweep, CpuForward, ::testing::ValuesIn(unique_cases(forward_cases())),
                         [](const auto& info) { return problem_name(info.param); });

// ---- properties that are not a comparison ----------------------------------------------------

TEST(CpuForwardProps, RunInfoNamesCpuBackend) {
  Problem p = shape(17, 17, 64);
  Tensors t(p);
  auto rng = test_rng();
  t.fill_inputs(rng);
  const RunInfo info = t.forward(p, Backend::automatic);
  EXPECT_EQ(info.backend, Backend::cpu);
  EXPECT_NE(std::string(info.kernel), "");
  EXPECT_EQ(info.num_splits, 1);
  EXPECT_EQ(select_backend(t.q.view()), Backend::cpu);
}

TEST(CpuForwardProps, BitwiseDeterministic) {
  for (DType dt : {DType::fp32, DType::bf16}) {
    Problem p = shape(203, 113, 96, dt);
    p.heads_q = 4;
    p.heads_kv = 2;
    p.causal = dt == DType::bf16;
    Tensors a(p);
    auto rng = test_rng();
    a.fill_inputs(rng);
    Tensors b = a;
    a.poison_outputs();
    b.poison_outputs();
    a.forward(p, Backend::cpu);
    b.forward(p, Backend::cpu);
    EXPECT_TRUE(a.out.bitwise_equal(b.out)) << dtype_name(dt);
    EXPECT_TRUE(a.lse.bitwise_equal(b.lse)) << dtype_name(dt);
  }
}

// Zero batch or zero queries: valid, and nothing is written. The empty views point into a
// sentinel buffer (a backend that wrote anyway would change it); null pointers are valid too.
TEST(CpuForwardProps, EmptyProblemIsNoOp) {
  std::vector<float> sentinel(4096, 7.0f);
  std::vector<float> inputs(64 * 33 * 2 * 2, 0.5f);
  for (Backend backend : {Backend::cpu, Backend::cpu_reference}) {
    for (auto [b, nq] : {std::pair{0, 17}, {2, 0}}) {
      for (bool null_data : {false, true}) {
        SCOPED_TRACE(std::string(backend_name(backend)) + " B=" + std::to_string(b) +
                     " Nq=" + std::to_string(nq) + (null_data ? " null" : " sentinel"));
        void* out_data = null_data ? nullptr : sentinel.data();
        const auto q = TensorView::contiguous(null_data && b == 0 ? nullptr : inputs.data(),
                                              DType::fp32, {b, nq, 2, 64});
        const auto kv = TensorView::contiguous(b == 0 && null_data ? nullptr : inputs.data(),
                                               DType::fp32, {b, 33, 2, 64});
        const auto out = TensorView::contiguous(out_data, DType::fp32, {b, nq, 2, 64});
        const auto lse = TensorView::contiguous(out_data, DType::fp32, {b, 2, nq});
        AttentionOptions o;
        o.backend = backend;
        EXPECT_NO_THROW(forward(q, kv, kv, out, &lse, o));
        for (float x : sentinel) ASSERT_EQ(x, 7.0f);
      }
    }
  }
}

// Large scores: exp must not overflow (online softmax subtracts the running max).
TEST(CpuForwardProps, LargeScoresStayFinite) {
  Problem p = shape(64, 300, 64);
  p.scale = 8.0f;  // scores up to ~8 * 64 = 512: exp would overflow fp32 without the max
  Tensors t(p);
  auto rng = test_rng();
  t.fill_inputs(rng);
  const Tensors ref = reference_forward(p, t);
  t.poison_outputs();
  t.forward(p, Backend::cpu);
  check_forward(p, t, ref);
}

// Workspace queries exist for padded and varlen calls; the CPU backends need none.
TEST(CpuForwardProps, WorkspaceQueriesOnTheCpu) {
  Problem p;
  p.lengths_q = {3, 0, 5};
  p.lengths_k = {4, 2, 6};
  Tensors t(p);
  EXPECT_EQ(forward_varlen_workspace_size(t.q.view(), t.k.view(), t.v.view(), t.cu_q.view(),
                                          t.cu_k.view(), 5, 6),
            0u);
  EXPECT_EQ(backward_varlen_workspace_size(t.q.view(), t.k.view(), t.v.view(), t.cu_q.view(),
                                           t.cu_k.view(), 5, 6),
            0u);
  Problem padded;
  Tensors u(padded);
  EXPECT_EQ(forward_workspace_size(u.q.view(), u.k.view(), u.v.view()), 0u);
  EXPECT_EQ(backward_workspace_size(u.q.view(), u.k.view(), u.v.view()), 0u);
}

}  // namespace
}  // namespace flashcpp::test
