// The CPU backend's backward (dq, dk, dv) against the float64 reference's backward, on a
// smaller grid in the style of the forward sweep; the reference's own gradients against
// central finite differences of its forward; and bitwise determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "test_util.hpp"

namespace flashcpp::test {
namespace {

// ---- accuracy bounds ------------------------------------------------------------------------
// Both backward calls get identical inputs: q, k, v, dout in the dtype, out = the reference
// forward rounded to the dtype, lse from the reference (fp32). The reference's inputs are exact
// fp32 copies; its gradients are float64 rounded to fp32.
//
// fp32: dS = P * (dP - rowsum(dout * out)) cancels (dP and the row sum are O(sqrt(Dv)) while
//   dS is O(1/N)), and dk/dv sum over up to 1000 query rows, so fp32 gradients lose ~10x more
//   than the forward: 1e-4 relative (L2) and 2e-4 x max|grad| per element.
//   The cancellation also sets an absolute floor: where the exact gradient is ~0 (a row that
//   sees one key has P = 1 and dS = dP - D = 0), fp32 still leaves ~eps * |dP| * scale * |q|
//   ~ 6e-8 * 16 * 0.125 * 4 ~ 1e-6..1e-5, so the max term uses max(max|grad|, 0.1) and the L2
//   bound is skipped for gradients that are ~0 everywhere.
// fp16/bf16: fp32 work, then one rounding of each gradient to the dtype: 2 ulp at the
//   element's magnitude plus the fp32 term; L2 fp16 2e-3, bf16 1e-2 (4x the worst half-ulp,
//   because gradients have many small entries near cancellation).
struct BackwardBounds {
  double ulps;
  double fp32;  // times max|grad|
  double rel_l2;
};

BackwardBounds backward_bounds(DType dtype) {
  switch (dtype) {
    case DType::fp16: return {2.0, 2e-4, 2e-3};
    case DType::bf16: return {2.0, 2e-4, 1e-2};
    default: return {0.0, 2e-4, 1e-4};
  }
}

void check_grad(const char* name, DType dtype, const HostTensor& got, const HostTensor& ref) {
  const BackwardBounds bound = backward_bounds(dtype);
  const std::vector<double> x = got.values();
  const std::vector<double> r = ref.values();
  const ErrorStats s = compare(x, r);
  SCOPED_TRACE(std::string(name) + ": " + describe(s));
  report(name, s, bound.rel_l2);
  EXPECT_EQ(s.non_finite, 0);
  if (s.ref_max >= 0.1) {
    EXPECT_LE(s.rel_l2, bound.rel_l2);
  }
  const double fp32_term = bound.fp32 * std::max(s.ref_max, 0.1);
  int reported = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double allowed = bound.ulps * ulp(dtype, r[i]) + fp32_term;
    if (!(std::fabs(x[i] - r[i]) <= allowed) && reported++ < 5)
      ADD_FAILURE() << name << "[" << i << "] = " << x[i] << ", reference " << r[i]
                    << ", error " << std::fabs(x[i] - r[i]) << " > allowed " << allowed;
  }
}

// Inputs for a backward call: random q, k, v, dout; out and lse from the reference forward.
Tensors backward_inputs(const Problem& p) {
  auto rng = test_rng();
  Tensors t(p);
  t.fill_inputs(rng);
  fill_normal(t.dout, rng);
  const Tensors fwd = reference_forward(p, t);
  for (std::int64_t i = 0; i < t.out.numel(); ++i) t.out.set(i, fwd.out.get(i));  // rounds
  for (std::int64_t i = 0; i < t.lse.numel(); ++i) t.lse.set(i, fwd.lse.get(i));
  return t;
}

// dq rows of queries that see no key, and dk/dv rows of keys no query sees, are exactly 0.
void expect_unseen_rows_zero(const Problem& p, const Tensors& t) {
  int reported = 0;
  std::int64_t q_base = 0, k_base = 0;
  for (int b = 0; b < p.num_seqs(); ++b) {
    std::vector<bool> key_seen(static_cast<std::size_t>(p.len_k(b)), false);
    for (int i = 0; i < p.len_q(b); ++i) {
      const auto keys = p.keys(b, i);
      for (auto j = keys.begin; j < keys.end; ++j) key_seen[j] = true;
      if (keys.begin < keys.end) continue;
      for (int h = 0; h < p.heads_q; ++h)
        for (int d = 0; d < p.head_dim; ++d) {
          const std::int64_t row = p.varlen() ? q_base + i : static_cast<std::int64_t>(b) * p.seqlen_q + i;
          const float g = t.dq.get((row * p.heads_q + h) * p.head_dim + d);
          if (g != 0.0f && reported++ < 5)
            ADD_FAILURE() << "dq of query (b=" << b << ", i=" << i << ", h=" << h
                          << ") that sees no key is " << g << ", expected 0";
        }
    }
    for (int j = 0; j < p.len_k(b); ++j) {
      if (key_seen[j]) continue;
      const std::int64_t row = p.varlen() ? k_base + j : static_cast<std::int64_t>(b) * p.seqlen_k + j;
      for (int h = 0; h < p.heads_kv; ++h) {
        for (int d = 0; d < p.head_dim; ++d) {
          const float g = t.dk.get((row * p.heads_kv + h) * p.head_dim + d);
          if (g != 0.0f && reported++ < 5)
            ADD_FAILURE() << "dk of key (b=" << b << ", j=" << j << ") no query sees is " << g;
        }
        for (int d = 0; d < p.dv(); ++d) {
          const float g = t.dv.get((row * p.heads_kv + h) * p.dv() + d);
          if (g != 0.0f && reported++ < 5)
            ADD_FAILURE() << "dv of key (b=" << b << ", j=" << j << ") no query sees is " << g;
        }
      }
    }
    if (p.varlen()) {
      q_base += p.len_q(b);
      k_base += p.len_k(b);
    }
  }
}

// ---- the sweeps ------------------------------------------------------------------------------

std::vector<Problem> backward_cases() {
  std::vector<Problem> cases;
  for (int d : {32, 64, 80, 96, 128, 192, 256}) {
    Problem a = shape(113, 203, d);
    a.batch = 1;
    cases.push_back(a);
    Problem b = shape(17, 17, d, DType::bf16);
    b.causal = true;
    cases.push_back(b);
  }
  for (auto [nq, nk] : {std::pair{1, 1}, {17, 17}, {113, 203}, {203, 113}, {128, 128}})
    for (int d : {64, 128}) cases.push_back(shape(nq, nk, d));
  {
    Problem p = shape(1000, 1000, 64);
    p.batch = 1;
    p.heads_q = p.heads_kv = 1;
    cases.push_back(p);
  }
  struct Option {
    bool causal;
    int left, right;
    float softcap;
  };
  for (Option o : {Option{true, -1, -1, 0}, {false, 32, 8, 0}, {false, -1, 16, 0},
                   {false, -1, -1, 30}})
    for (auto [nq, nk] : {std::pair{113, 203}, {203, 113}})
      for (DType dt : {DType::fp32, DType::fp16, DType::bf16}) {
        if (dt == DType::fp16 && nq == 203) continue;
        Problem p = shape(nq, nk, 64, dt);
        p.causal = o.causal;
        p.window_left = o.left;
        p.window_right = o.right;
        p.softcap = o.softcap;
        cases.push_back(p);
      }
  for (auto [hq, hkv] : {std::pair{16, 2}, {8, 1}})  // GQA 8:1, MQA: dk/dv sum over heads
    for (DType dt : {DType::fp32, DType::bf16}) {
      Problem p = shape(113, 203, 64, dt);
      p.batch = 1;
      p.heads_q = hq;
      p.heads_kv = hkv;
      p.causal = dt == DType::bf16;
      cases.push_back(p);
    }
  for (DType dt : {DType::fp32, DType::bf16}) {
    Problem p = shape(113, 203, 128, dt);
    p.head_dim_v = 64;
    cases.push_back(p);
  }
  for (Layout layout : {Layout::bhsd, Layout::padded})
    for (DType dt : {DType::fp32, DType::bf16}) {
      Problem p = shape(113, 203, 64, dt);
      p.layout = layout;
      p.causal = true;
      p.heads_q = 4;
      p.heads_kv = 2;
      cases.push_back(p);
    }
  for (DType dt : {DType::fp32, DType::bf16})
    for (bool causal : {false, true}) {
      Problem p;
      p.dtype = dt;
      p.heads_q = 4;
      p.heads_kv = 2;
      p.lengths_q = {17, 0, 113, 1, 9};
      p.lengths_k = {17, 9, 203, 0, 1};
      p.causal = causal;
      cases.push_back(p);
    }
  {
    Problem p = shape(40, 8, 64);  // most rows see no key
    p.causal = true;
    p.window_left = 0;
    cases.push_back(p);
    cases.push_back(shape(17, 0, 64));  // no keys at all: dq = 0
  }
  std::set<std::string> seen;
  std::vector<Problem> unique;
  for (auto& p : cases)
    if (seen.insert(problem_name(p)).second) unique.push_back(p);
  return unique;
}

class CpuBackward : public ::testing::TestWithParam<Problem> {};

TEST_P(CpuBackward, MatchesReference) {
  const Problem& p = GetParam();
  Tensors t = backward_inputs(p);
  const Tensors ref = reference_backward(p, t);
  expect_unseen_rows_zero(p, ref);
  t.poison_grads();
  const RunInfo info = t.backward(p, Backend::cpu);
  EXPECT_EQ(info.backend, Backend::cpu);
  expect_unseen_rows_zero(p, t);
  check_grad("dq", p.dtype, t.dq, ref.dq);
  check_grad("dk", p.dtype, t.dk, ref.dk);
  check_grad("dv", p.dtype, t.dv, ref.dv);
}

INSTANTIATE_TEST_SUITE_P(Sweep, CpuBackward, ::testing::ValuesIn(backward_cases()),
                         [](const auto& info) { return problem_name(info.param); });

TEST(CpuBackwardProps, BitwiseDeterministic) {
  for (DType dt : {DType::fp32, DType::bf16}) {
    Problem p = shape(203, 113, 64, dt);
    p.heads_q = 4;
    p.heads_kv = 1;  // dk/dv reduce over 4 query heads: where races would show
    p.causal = dt == DType::bf16;
    Tensors a = backward_inputs(p);
    Tensors b = a;
    a.poison_grads();
    b.poison_grads();
    a.backward(p, Backend::cpu, /*deterministic=*/true);
    b.backward(p, Backend::cpu, /*deterministic=*/true);
    EXPECT_TRUE(a.dq.bitwise_equal(b.dq)) << dtype_name(dt);
    EXPECT_TRUE(a.dk.bitwise_equal(b.dk)) << dtype_name(dt);
    EXPECT_TRUE(a.dv.bitwise_equal(b.dv)) << dtype_name(dt);
  }
}

// With one thread every (batch, kv head) pair is a fused task; with eight the two-pass
// algorithm runs (fewer than two pairs per thread). Both must give the same bits.
TEST(CpuBackwardProps, FusedAndTwoPassBitwiseEqual) {
  const int threads = omp_get_max_threads();
  for (DType dt : {DType::fp32, DType::bf16}) {
    Problem p = shape(203, 300, 64, dt);
    p.batch = 2;
    p.heads_q = 4;
    p.heads_kv = 2;
    p.causal = dt == DType::bf16;
    p.window_left = dt == DType::fp32 ? 90 : -1;
    Tensors a = backward_inputs(p);
    Tensors b = a;
    a.poison_grads();
    b.poison_grads();
    omp_set_num_threads(1);
    a.backward(p, Backend::cpu, /*deterministic=*/true);
    omp_set_num_threads(8);
    b.backward(p, Backend::cpu, /*deterministic=*/true);
    omp_set_num_threads(threads);
    EXPECT_TRUE(a.dq.bitwise_equal(b.dq)) << dtype_name(dt);
    EXPECT_TRUE(a.dk.bitwise_equal(b.dk)) << dtype_name(dt);
    EXPECT_TRUE(a.dv.bitwise_equal(b.dv)) << dtype_name(dt);
  }
}

// ---- the reference's gradients against finite differences -------------------------------------
// L = sum(out * G). Inputs are multiples of 2^-10 in [-4, 4] and the step is h = 2^-6, so
// x +- h and x +- 2h are exact in fp32. The reference computes in float64 but rounds out to
// fp32 (~6e-8 relative): over ~80 terms that is ~5e-7 of noise in L, ~4e-5 in the derivative
// through the 4th-order stencil below (truncation O(h^4) ~ 1e-8). Relative tolerance 1e-3 of
// the gradient's max magnitude.
struct FdCase {
  const char* name;
  bool causal;
  int left, right;
  float softcap;
};

void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }

class ReferenceGradient : public ::testing::TestWithParam<FdCase> {};

TEST_P(ReferenceGradient, MatchesFiniteDifferences) {
  const FdCase c = GetParam();
  Problem p;
  p.batch = 1;
  p.heads_q = 2;
  p.heads_kv = 1;
  p.seqlen_q = 5;
  p.seqlen_k = 7;
  p.head_dim = 8;
  p.causal = c.causal;
  p.window_left = c.left;
  p.window_right = c.right;
  p.softcap = c.softcap;
  p.scale = 0.8f;  // scores of a few units: softmax and softcap far from linear

  auto rng = test_rng();
  Tensors t(p);
  t.fill_inputs(rng);
  fill_normal(t.dout, rng);  // G
  for (HostTensor* x : {&t.q, &t.k, &t.v, &t.dout})
    for (std::int64_t i = 0; i < x->numel(); ++i)
      x->set(i, std::clamp(std::round(x->get(i) * 1024.0f) / 1024.0f, -4.0f, 4.0f));

  const auto loss = [&](Tensors& s) {
    s.forward(p, Backend::cpu_reference);
    double l = 0;
    for (std::int64_t i = 0; i < s.out.numel(); ++i) l += double{s.out.get(i)} * s.dout.get(i);
    return l;
  };
  Tensors base = t;
  loss(base);
  Tensors grads = base;
  grads.poison_grads();
  grads.backward(p, Backend::cpu_reference);

  const double h = 0x1p-6;
  const struct {
    const char* name;
    HostTensor Tensors::*input;
    const HostTensor* grad;
  } wrt[] = {{"dq", &Tensors::q, &grads.dq}, {"dk", &Tensors::k, &grads.dk},
             {"dv", &Tensors::v, &grads.dv}};
  for (const auto& w : wrt) {
    const std::vector<double> analytic = w.grad->values();
    double max_grad = 0;
    for (double g : analytic) max_grad = std::max(max_grad, std::fabs(g));
    ASSERT_GT(max_grad, 0.0) << w.name;
    int reported = 0;
    for (std::int64_t i = 0; i < (t.*w.input).numel(); ++i) {
      const float x0 = (t.*w.input).get(i);
      double f[4];
      const double steps[4] = {-2 * h, -h, h, 2 * h};
      for (int s = 0; s < 4; ++s) {
        Tensors probe = t;
        (probe.*w.input).set(i, static_cast<float>(x0 + steps[s]));
        f[s] = loss(probe);
      }
      const double numeric = (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * h);
      if (!(std::fabs(numeric - analytic[i]) <= 1e-3 * max_grad) && reported++ < 5)
        ADD_FAILURE() << c.name << " " << w.name << "[" << i << "]: analytic " << analytic[i]
                      << ", finite difference " << numeric << " (max |grad| " << max_grad << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, ReferenceGradient,
                         ::testing::Values(FdCase{"full", false, -1, -1, 0.0f},
                                           FdCase{"causal", true, -1, -1, 0.0f},
                                           FdCase{"window_2_1", false, 2, 1, 0.0f},
                                           FdCase{"softcap_2", false, -1, -1, 2.0f},
                                           FdCase{"causal_softcap_2", true, -1, -1, 2.0f}),
                         [](const auto& info) { return std::string(info.param.name); });


// No queries but some keys: dk and dv are outputs all the same, and their value is 0.
TEST(CpuBackwardProps, NoQueriesGivesZeroKeyGradients) {
  for (Backend backend : {Backend::cpu, Backend::cpu_reference}) {
    Problem p = shape(0, 9, 32);
    Tensors t(p);
    auto rng = test_rng();
    t.fill_inputs(rng);
    t.poison_grads();
    t.backward(p, backend);
    for (std::int64_t i = 0; i < t.dk.numel(); ++i) ASSERT_EQ(t.dk.get(i), 0.0f) << backend_name(backend);
    for (std::int64_t i = 0; i < t.dv.numel(); ++i) ASSERT_EQ(t.dv.get(i), 0.0f) << backend_name(backend);
  }
}

// ---- non-finite q or dout rows ----------------------------------------------------------------
// docs/semantics.md: a NaN in q or dout makes that row's outputs and the gradients of the keys
// it sees NaN, nothing else. Query blocks (64 rows) meet key blocks (128 keys) the mask cuts
// through, so a NaN row shares block products with keys it does not see (P = dS = 0 there).
// Rows 0..9 of head 0 get a NaN; both algorithms (fused: one thread, two passes: eight).
std::string nan_rows_outcome(const Problem& p, bool in_dout, int threads) {
  constexpr int kNanRows = 10;
  const int d = p.head_dim;
  Tensors t = backward_inputs(p);
  for (int i = 0; i < kNanRows; ++i)
    (in_dout ? t.dout : t.q).set((std::int64_t{i} * p.heads_q + 0) * d + 5,
                                        std::numeric_limits<float>::quiet_NaN());
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  t.forward(p, Backend::cpu);
  t.poison_grads();
  t.backward(p, Backend::cpu);
  omp_set_num_threads(saved);

  const auto row_finite = [&](const HostTensor& x, int heads, int row, int head) {
    for (int e = 0; e < d; ++e)
      if (!std::isfinite(x.get((std::int64_t{row} * heads + head) * d + e))) return false;
    return true;
  };
  std::int64_t seen_end = 0;  // rows 0..9 see keys [0, seen_end)
  for (int i = 0; i < kNanRows; ++i)
    seen_end = std::max<std::int64_t>(seen_end, p.keys(0, i).end);
  for (int h = 0; h < p.heads_q; ++h)
    for (int i = 0; i < p.seqlen_q; ++i) {
      const bool nan_row = h == 0 && i < kNanRows;
      if (!nan_row && !row_finite(t.out, p.heads_q, i, h))
        return "out row " + std::to_string(i) + " head " + std::to_string(h) + " not finite";
      if (row_finite(t.dq, p.heads_q, i, h) == nan_row)
        return "dq row " + std::to_string(i) + " head " + std::to_string(h) +
               (nan_row ? " finite" : " not finite");
    }
  for (int h = 0; h < p.heads_kv; ++h)
    for (int j = 0; j < p.seqlen_k; ++j) {
      const bool seen = h == 0 && j < seen_end;
      for (const auto& [x, name] : {std::pair{&t.dk, "dk"}, std::pair{&t.dv, "dv"}})
        if (row_finite(*x, p.heads_kv, j, h) == seen)
          return std::string(name) + " key " + std::to_string(j) + " head " + std::to_string(h) +
                 (seen ? " finite" : " not finite");
    }
  return "ok";
}

TEST(CpuBackwardProps, NanRowsReachOnlyWhatTheySee) {
  for (DType dt : {DType::fp32, DType::bf16})
    for (int heads_q : {2, 4})
      for (bool causal : {false, true})
        for (bool in_dout : {false, true})
          for (int threads : {1, 8}) {
            Problem p = shape(300, 300, 64, dt);
            p.batch = 1;
            p.heads_q = heads_q;
            p.heads_kv = 2;
            p.causal = causal;
            if (!causal) p.window_left = p.window_right = 4;
            EXPECT_EQ(nan_rows_outcome(p, in_dout, threads), "ok")
                << problem_name(p) << (in_dout ? " NaN in dout" : " NaN in q") << ", " << threads
                << " threads";
          }
}

}  // namespace
}  // namespace flashcpp::test
