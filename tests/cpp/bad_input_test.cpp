// The bad and extreme inputs of issue 23, one table row each: what the call does with them, as
// one string (the error's text, or a verdict computed from the outputs). Every row reproduced a
// crash, a memory error or a silently wrong result before the fix. Rows run on the CPU
// backends; the CUDA side of the same inputs is in cuda_bad_input_test.cpp.
#include <gtest/gtest.h>
#include <dlfcn.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace flashcpp::test {
namespace {

constexpr std::int64_t kAbove32 = (std::int64_t{1} << 32) + 4;
constexpr std::int64_t kBatch31 = std::int64_t{1} << 31;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A valid fp32 call, B = 1, Nq = Nk = 24, Hq = Hkv = 1, D = 16, whose views the rows bend.
struct Call {
  Problem problem;
  Tensors t;
  AttentionOptions options;

  TensorView q, k, v, out, lse, dout, dq, dk, dv;

  explicit Call(Backend backend = Backend::cpu) {
    problem = shape(24, 24, 16);
    problem.batch = 1;
    problem.heads_q = problem.heads_kv = 1;
    t = Tensors(problem);
    auto rng = test_rng();
    t.fill_inputs(rng);
    fill_normal(t.dout, rng);
    options = problem.options(backend);
    q = t.q.view(), k = t.k.view(), v = t.v.view(), out = t.out.view(), lse = t.lse.view();
    dout = t.dout.view(), dq = t.dq.view(), dk = t.dk.view(), dv = t.dv.view();
  }

  std::string forward() {
    return outcome([&] { flashcpp::forward(q, k, v, out, &lse, options); });
  }
  std::string backward() {
    return outcome(
        [&] { flashcpp::backward(q, k, v, out, dout, lse, dq, dk, dv, options); });
  }

  static std::string outcome(const std::function<void()>& call) {
    try {
      call();
      return "no error";
    } catch (const Error& e) {
      return e.what();
    }
  }
};

// Views must be rebuilt after `t` changed shape; the tests that reshape build their own.
TensorView with_shape(TensorView t, int dim, std::int64_t size) {
  t.shape[dim] = size;
  return t;
}

// A varlen problem: sequences of the given lengths (q and k alike), D = 16, one head.
Problem varlen_problem(std::vector<int> lengths) {
  Problem p = shape(1, 1, 16);
  p.heads_q = p.heads_kv = 1;
  p.lengths_q = lengths;
  p.lengths_k = lengths;
  return p;
}

// "equal" when the two tensors hold the same values, else where they first differ.
std::string compare_values(const HostTensor& a, const HostTensor& b) {
  const auto x = a.values(), y = b.values();
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i]) && !(std::isnan(x[i]) && std::isnan(y[i])))
      return "differ at " + std::to_string(i) + ": " + std::to_string(x[i]) + " vs " +
             std::to_string(y[i]);
  return "equal";
}

// ---- the rows ---------------------------------------------------------------------------------

struct Row {
  const char* item;  // issue 23 item
  const char* name;
  std::function<std::string()> run;
  std::string expected;
};

// More than 2^31 - 1 query heads (q, out and lse agree). In place: the views point into c.t.
void bend_query_heads_above_int32(Call& c) {
  c.q = with_shape(c.q, 2, kAbove32);
  c.out = with_shape(c.out, 2, kAbove32);
  c.lse = with_shape(c.lse, 1, kAbove32);
}

std::string heads_above_int32() {
  Call c;
  bend_query_heads_above_int32(c);
  return c.forward();
}

std::string kv_heads_above_int32() {
  Call c;
  bend_query_heads_above_int32(c);
  c.k = with_shape(c.k, 2, kAbove32);
  c.v = with_shape(c.v, 2, kAbove32);
  return c.forward();
}

std::string batch_above_int32() {
  Call c;
  for (TensorView* t : {&c.q, &c.k, &c.v, &c.out, &c.lse}) {
    t->shape[0] = kBatch31;
    t->stride[0] = 0;  // broadcast inputs; the outputs' self-overlap would be refused too
  }
  c.out.stride[0] = c.lse.stride[0] = 1 << 20;
  return c.forward();
}

std::string keys_above_int32() {
  Call c;
  c.k = with_shape(c.k, 1, kBatch31);
  c.v = with_shape(c.v, 1, kBatch31);
  c.k.stride[1] = c.v.stride[1] = 0;
  return c.forward();
}

// Another thread rewrites cu_seqlens while calls run: the library must work on its own copy
// (before, a changed offset made the block products read and write out of bounds).
std::string offsets_changed_during_call() {
  const Problem p = varlen_problem({300, 1200, 100});
  Tensors t(p);
  auto rng = test_rng();
  t.fill_inputs(rng);
  auto* offsets = static_cast<std::int32_t*>(t.cu_q.data());
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    const std::int32_t valid = offsets[1];
    std::atomic_ref<std::int32_t> offset(offsets[1]);
    for (std::uint64_t n = 0; !stop.load(std::memory_order_relaxed); ++n) {
      offset.store(n % 2 ? valid : std::numeric_limits<std::int32_t>::min() / 2,
                   std::memory_order_relaxed);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    offset.store(valid);
  });
  std::string verdict = "ok";
  for (int i = 0; i < 30; ++i) {
    const std::string e = Call::outcome([&] { t.forward(p, Backend::cpu); });
    if (e != "no error" && e.find("cu_seqlens_q") == std::string::npos) verdict = e;
  }
  stop = true;
  writer.join();
  return verdict;
}

// Varlen with max_seqlen = 2^31 - 1 (a valid bound): the same result as the tight bound, fast.
std::string max_seqlen_near_int32(bool backward) {
  const Problem p = varlen_problem({16, 5});
  Tensors tight(p);
  auto rng = test_rng();
  tight.fill_inputs(rng);
  fill_normal(tight.dout, rng);
  tight.forward(p, Backend::cpu);
  Tensors loose = tight;
  loose.poison_outputs();
  loose.poison_grads();
  const int max_len = std::numeric_limits<int>::max();
  const auto start = std::chrono::steady_clock::now();
  const AttentionOptions o = p.options(Backend::cpu);
  if (backward) {
    tight.backward(p, Backend::cpu);
    loose.out = tight.out;
    loose.lse = tight.lse;
    flashcpp::backward_varlen(loose.q.view(), loose.k.view(), loose.v.view(), loose.out.view(),
                              loose.dout.view(), loose.lse.view(), loose.dq.view(),
                              loose.dk.view(), loose.dv.view(), loose.cu_q.view(),
                              loose.cu_k.view(), max_len, max_len, o);
  } else {
    TensorView lse = loose.lse.view();
    flashcpp::forward_varlen(loose.q.view(), loose.k.view(), loose.v.view(), loose.out.view(),
                             &lse, loose.cu_q.view(), loose.cu_k.view(), max_len, max_len, o);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (seconds > 2.0) return "took " + std::to_string(seconds) + " s";
  if (backward) {
    const std::string dq = compare_values(loose.dq, tight.dq);
    const std::string dk = compare_values(loose.dk, tight.dk);
    return "dq " + dq + ", dk " + dk + ", dv " + compare_values(loose.dv, tight.dv);
  }
  return "out " + compare_values(loose.out, tight.out) + ", lse " +
         compare_values(loose.lse, tight.lse);
}

std::string overlap(const std::function<void(Call&)>& bend, bool backward) {
  Call c;
  c.t.forward(c.problem, Backend::cpu);
  bend(c);
  return backward ? c.backward() : c.forward();
}

// dq, dk, dv as interleaved slices of one packed [B, N, 3, H, D] buffer: disjoint, accepted.
std::string packed_gradients_accepted() {
  Call c;
  c.t.forward(c.problem, Backend::cpu);
  HostTensor packed(DType::fp32, {1, 24, 3, 1, 16});
  auto* base = static_cast<float*>(packed.data());
  for (int i = 0; i < 3; ++i) {
    TensorView* g = i == 0 ? &c.dq : i == 1 ? &c.dk : &c.dv;
    *g = TensorView::strided(base + i * 16, DType::fp32, {1, 24, 1, 16}, {24 * 48, 48, 16, 1});
  }
  return c.backward();
}

std::string nan_in_q_gives_nan() {
  for (Backend backend : {Backend::cpu, Backend::cpu_reference}) {
    Call c(backend);
    c.t.q.set(3 * 16 + 5, kNaN);  // row 3
    c.forward();
    for (int i = 0; i < 24; ++i) {
      const bool nan = std::isnan(c.t.lse.get(i)) && std::isnan(c.t.out.get(i * 16));
      if (nan != (i == 3))
        return std::string(backend_name(backend)) + ": row " + std::to_string(i) + " lse " +
               std::to_string(c.t.lse.get(i)) + " out " + std::to_string(c.t.out.get(i * 16));
    }
  }
  return "row 3 NaN, others finite";
}

std::string huge_inputs() {
  Call c;
  for (std::int64_t i = 0; i < c.t.q.numel(); ++i) c.t.q.set(i, c.t.q.get(i) * 1e30f);
  for (std::int64_t i = 0; i < c.t.k.numel(); ++i) c.t.k.set(i, c.t.k.get(i) * 1e30f);
  return c.forward();
}

std::string huge_scale() {
  Call c;
  c.options.softmax_scale = 1e38f;
  return c.forward();
}

std::string tiny_softcap() {
  Call c;
  c.options.softcap = 1e-40f;
  return c.forward();
}

// NaN (or `value`) in k or v at keys 0..9, which rows >= 14 cannot see (window (4, 4)): their
// outputs stay finite, and so do dq of those rows and dk, dv of keys >= 18 (seen only by them).
std::string nan_at_hidden_keys(bool in_v, float value = kNaN) {
  for (Backend backend : {Backend::cpu, Backend::cpu_reference}) {
    Call c(backend);
    c.options.window_left = c.options.window_right = 4;
    for (int j = 0; j < 10; ++j) (in_v ? c.t.v : c.t.k).set(j * 16 + 2, value);
    c.forward();
    c.backward();
    const struct {
      const HostTensor& t;
      const char* name;
      int first_row;
    } checks[] = {{c.t.out, "out", 14}, {c.t.dq, "dq", 14}, {c.t.dk, "dk", 18}, {c.t.dv, "dv", 18}};
    for (const auto& check : checks)
      for (int i = check.first_row; i < 24; ++i)
        for (int d = 0; d < 16; ++d)
          if (!std::isfinite(check.t.get(i * 16 + d)))
            return std::string(backend_name(backend)) + ": " + check.name + " row " +
                   std::to_string(i) + " is " + std::to_string(check.t.get(i * 16 + d));
  }
  return "rows past the NaN keys finite";
}

std::string misaligned_offsets() {
  const Problem p = varlen_problem({3, 4});
  Tensors t(p);
  std::vector<std::int32_t> storage(8, 0);
  auto* bytes = reinterpret_cast<char*>(storage.data()) + 2;
  const std::int32_t offsets[] = {0, 3, 7};
  std::memcpy(bytes, offsets, sizeof offsets);
  TensorView cu = TensorView::contiguous(bytes, DType::int32, {3});
  TensorView lse = t.lse.view();
  return Call::outcome([&] {
    flashcpp::forward_varlen(t.q.view(), t.k.view(), t.v.view(), t.out.view(), &lse, cu,
                             t.cu_k.view(), 4, 4, p.options(Backend::cpu));
  });
}

// Rows past cu_seqlens[B]: out 0, lse -inf, dq/dk/dv 0 (they were left as they were).
std::string varlen_tails(const std::vector<int>& lengths) {
  // Tensors for the sequences plus 2 rows, and the offsets of the sequences alone.
  std::vector<int> with_tail = lengths;
  with_tail.push_back(2);
  const Problem p = varlen_problem(with_tail);
  Tensors t(p);
  t.cu_q = cu_seqlens(lengths);
  t.cu_k = cu_seqlens(lengths);
  const std::int64_t end = t.q.shape()[0] - 2;
  auto rng = test_rng();
  for (Backend backend : {Backend::cpu, Backend::cpu_reference}) {
    t.fill_inputs(rng);
    fill_normal(t.dout, rng);
    t.poison_outputs();
    t.poison_grads();
    TensorView lse = t.lse.view();
    const AttentionOptions o = p.options(backend);
    flashcpp::forward_varlen(t.q.view(), t.k.view(), t.v.view(), t.out.view(), &lse,
                             t.cu_q.view(), t.cu_k.view(), 8, 8, o);
    flashcpp::backward_varlen(t.q.view(), t.k.view(), t.v.view(), t.out.view(), t.dout.view(),
                              t.lse.view(), t.dq.view(), t.dk.view(), t.dv.view(), t.cu_q.view(),
                              t.cu_k.view(), 8, 8, o);
    const std::string who = backend_name(backend);
    for (std::int64_t r = end; r < end + 2; ++r) {
      if (t.lse.get(r) != -INFINITY) return who + ": lse row " + std::to_string(r) + " not -inf";
      for (int d = 0; d < 16; ++d) {
        const std::int64_t i = r * 16 + d;
        if (t.out.get(i) != 0.0f || t.dq.get(i) != 0.0f || t.dk.get(i) != 0.0f ||
            t.dv.get(i) != 0.0f)
          return who + ": out, dq, dk or dv row " + std::to_string(r) + " not 0";
      }
    }
  }
  return "tails written";
}

// OpenBLAS's thread count, found at run time (no header: the tests do not link it directly).
std::string blas_threads_kept() {
  using Get = int (*)();
  using Set = void (*)(int);
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  auto set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (get == nullptr || set == nullptr) return "kept";  // the loops build has no BLAS
  set(2);
  Call c;
  c.forward();
  c.backward();
  const int after = get();
  set(1);
  return after == 2 ? "kept" : "changed to " + std::to_string(after);
}

std::string rank_five_view() {
  float x = 0;
  return Call::outcome(
      [&] { TensorView::contiguous(&x, DType::fp32, {1, 1, 1, 1, 1}); });
}

std::string stride_count_mismatch() {
  float x = 0;
  return Call::outcome(
      [&] { TensorView::strided(&x, DType::fp32, {1, 1, 1}, {1, 1}); });
}

std::string dtype_out_of_range() {
  Call c;
  for (TensorView* t : {&c.q, &c.k, &c.v, &c.out}) t->dtype = static_cast<DType>(9);
  return c.forward();
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = {
      {"1", "query heads above int32", heads_above_int32,
       "q: 4294967300 query heads exceed 2^31 - 1"},
      {"1", "kv heads above int32", kv_heads_above_int32,
       "k: 4294967300 kv heads exceed 2^31 - 1"},
      {"1", "batch above int32", batch_above_int32, "q: batch size 2147483648 exceeds 2^31 - 1"},
      {"8", "keys above int32 name k", keys_above_int32, "k: 2147483648 keys exceed 2^31 - 1"},
      {"2", "cu_seqlens rewritten during calls", offsets_changed_during_call, "ok"},
      {"3", "max_seqlen 2^31-1 forward", [] { return max_seqlen_near_int32(false); },
       "out equal, lse equal"},
      {"3", "max_seqlen 2^31-1 backward", [] { return max_seqlen_near_int32(true); },
       "dq equal, dk equal, dv equal"},
      {"4", "out = k", [] { return overlap([](Call& c) { c.out = c.k; }, false); },
       "out: overlaps k in memory (outputs may not share memory with inputs or other outputs)"},
      {"4", "out = v causal",
       [] { return overlap([](Call& c) { c.out = c.v, c.options.causal = true; }, false); },
       "out: overlaps v in memory (outputs may not share memory with inputs or other outputs)"},
      {"4", "lse inside out",
       [] {
         return overlap([](Call& c) {
           c.lse = TensorView::contiguous(c.out.data, DType::fp32, {1, 1, 24});
         }, false);
       },
       "lse: overlaps out in memory (outputs may not share memory with inputs or other outputs)"},
      {"4", "dk = k", [] { return overlap([](Call& c) { c.dk = c.k; }, true); },
       "dk: overlaps k in memory (outputs may not share memory with inputs or other outputs)"},
      {"4", "dv = dout", [] { return overlap([](Call& c) { c.dv = c.dout; }, true); },
       "dv: overlaps dout in memory (outputs may not share memory with inputs or other outputs)"},
      {"4", "dk and dv one buffer", [] { return overlap([](Call& c) { c.dv = c.dk; }, true); },
       "dv: overlaps dk in memory (outputs may not share memory with inputs or other outputs)"},
      {"4", "writable stride-0 out",
       [] { return overlap([](Call& c) { c.out.stride[1] = 0; }, false); },
       "out: several elements share one memory location (stride 0 or overlapping strides); "
       "an output must not overlap itself"},
      {"4", "packed dq/dk/dv accepted", packed_gradients_accepted, "no error"},
      {"5", "NaN in q", nan_in_q_gives_nan, "row 3 NaN, others finite"},
      {"5", "|q|, |k| ~ 1e30", huge_inputs,
       "q, k: scores overflow float32 (softmax_scale 0.25, max|q| ..."},
      {"5", "softmax_scale 1e38", huge_scale,
       "q, k: scores overflow float32 (softmax_scale 1e+38, max|q| ..."},
      {"5", "softcap 1e-40", tiny_softcap,
       "softcap: softmax_scale / softcap (0.25 / 9.99995e-41) must be finite"},
      {"6", "NaN in v at masked keys", [] { return nan_at_hidden_keys(true); },
       "rows past the NaN keys finite"},
      {"6", "NaN in k at masked keys", [] { return nan_at_hidden_keys(false); },
       "rows past the NaN keys finite"},
      {"6", "Inf in k at masked keys", [] { return nan_at_hidden_keys(false, kInf); },
       "rows past the NaN keys finite"},
      {"7", "misaligned cu_seqlens", misaligned_offsets,
       "cu_seqlens_q: data pointer is not 4-byte aligned"},
      {"9", "varlen tails", [] { return varlen_tails({3, 5}); }, "tails written"},
      {"9", "varlen tails, B = 0", [] { return varlen_tails({}); }, "tails written"},
      {"10", "BLAS thread count kept", blas_threads_kept, "kept"},
      {"11", "rank-5 view", rank_five_view, "TensorView: at most 4 dimensions, got 5"},
      {"11", "stride count", stride_count_mismatch,
       "TensorView::strided: 2 strides for 3 dimensions"},
      {"11", "dtype out of range", dtype_out_of_range, "q: dtype 9 is not a flashcpp::DType"},
  };
  return table;
}

void PrintTo(const Row& row, std::ostream* os) { *os << "item " << row.item << ": " << row.name; }

class BadInput : public ::testing::TestWithParam<Row> {};

TEST_P(BadInput, Outcome) {
  const Row& row = GetParam();
  SCOPED_TRACE(std::string("issue 23 item ") + row.item + ": " + row.name);
  const std::string outcome = row.run();
  // "..." ends an expected prefix (the overflow rows print the inputs' magnitudes).
  const std::string_view expected = row.expected;
  if (expected.ends_with("..."))
    EXPECT_TRUE(outcome.starts_with(expected.substr(0, expected.size() - 3))) << outcome;
  else
    EXPECT_EQ(outcome, row.expected);
}

std::string row_name(const ::testing::TestParamInfo<Row>& info) {
  std::string name = std::string("item") + info.param.item + "_";
  for (const char* c = info.param.name; *c; ++c)
    name += std::isalnum(static_cast<unsigned char>(*c)) ? *c : '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Issue23, BadInput, ::testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace flashcpp::test
