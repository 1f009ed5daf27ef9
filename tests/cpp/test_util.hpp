#pragma once
// Shared helpers of the C++ suite: host tensors in fp32/fp16/bf16 with BSHD or BHSD memory,
// reproducible random data, NaN poisoning, error metrics against the float64 reference, and a
// description of one attention problem that every CPU test builds its tensors from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/fp8.hpp"
#include "common/half.hpp"
#include "common/mask.hpp"
#include "flashcpp/flashcpp.hpp"

namespace flashcpp::test {

// ---- values in a dtype ------------------------------------------------------------------------

inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::fp16: return detail::fp16_to_float(detail::float_to_fp16(x));
    case DType::bf16: return detail::bf16_to_float(detail::float_to_bf16(x));
    case DType::fp8_e4m3: return detail::e4m3_to_float(detail::float_to_e4m3(x));
    default: return x;
  }
}

// Spacing of the dtype's representable numbers at magnitude |x| (its "ulp"), normal range.
inline double ulp(DType dtype, double x) {
  const int mantissa_bits = dtype == DType::fp16 ? 10 : dtype == DType::bf16 ? 7 : 23;
  const double min_normal = dtype == DType::fp16 ? 6.103515625e-05 : 1.1754943508222875e-38;
  const double a = std::max(std::fabs(x), min_normal);
  return std::ldexp(1.0, std::ilogb(a) - mantissa_bits);
}

// Memory order of a logical [B, N, H, D] tensor. `padded` is BSHD with 8 unused elements after
// every head vector (filled with NaN by the tests), so garbage next to the data must not leak.
enum class Layout { bshd, bhsd, padded };

inline const char* layout_name(Layout layout) {
  return layout == Layout::bshd ? "bshd" : layout == Layout::bhsd ? "bhsd" : "padded";
}

// ---- host tensors -------------------------------------------------------------------------------

// Owns host memory for a tensor of up to rank 4 and hands out a TensorView of it. Values are
// read and written as float at logical (row-major) indices, whatever the memory order.
class HostTensor {
 public:
  HostTensor() = default;

  // Densely packed, row-major.
  HostTensor(DType dtype, std::vector<std::int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    stride_.assign(shape_.size(), 1);
    for (int d = static_cast<int>(shape_.size()) - 2; d >= 0; --d)
      stride_[d] = stride_[d + 1] * std::max<std::int64_t>(shape_[d + 1], 1);
    allocate();
  }

  // A logical [B, N, H, D] tensor; BHSD stores it as [B, H, N, D] in memory.
  static HostTensor bnhd(DType dtype, std::int64_t b, std::int64_t n, std::int64_t h,
                         std::int64_t d, Layout layout) {
    HostTensor t(dtype, {b, n, h, d});
    if (layout == Layout::bhsd) t.stride_ = {h * n * d, d, n * d, 1};
    if (layout == Layout::padded) t.stride_ = {n * h * (d + 8), h * (d + 8), d + 8, 1};
    t.allocate();
    if (layout == Layout::padded) t.poison();
    return t;
  }

  DType dtype() const { return dtype_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : shape_) n *= s;
    return n;
  }
  void* data() { return storage_.empty() ? nullptr : storage_.data(); }
  // Bytes of storage, gaps of strided layouts included (what a device copy must hold).
  std::size_t bytes() const { return storage_.size(); }

  TensorView view() {
    TensorView v;
    v.data = numel() == 0 ? nullptr : data();
    v.dtype = dtype_;
    v.rank = rank();
    for (int d = 0; d < rank(); ++d) {
      v.shape[d] = shape_[d];
      v.stride[d] = stride_[d];
    }
    return v;
  }

  // Memory offset (in elements) of the logical flat index `i`.
  std::int64_t offset(std::int64_t i) const {
    std::int64_t off = 0;
    for (int d = rank() - 1; d >= 0; --d) {
      off += (i % shape_[d]) * stride_[d];
      i /= shape_[d];
    }
    return off;
  }

  float get(std::int64_t i) const { return load(offset(i)); }
  void set(std::int64_t i, float x) { store(offset(i), x); }
  // Logical element of a rank-4 tensor.
  float at(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) const {
    return load(a * stride_[0] + b * stride_[1] + c * stride_[2] + d * stride_[3]);
  }

  // Every logical element, in row-major order, as double.
  std::vector<double> values() const {
    std::vector<double> out(static_cast<std::size_t>(numel()));
    for (std::int64_t i = 0; i < numel(); ++i) out[i] = get(i);
    return out;
  }

  // The same values, exactly, in an fp32 tensor of the same memory order (half -> fp32 is exact).
  HostTensor to_fp32() const {
    HostTensor t = *this;
    t.dtype_ = DType::fp32;
    t.allocate();
    for (std::int64_t i = 0; i < numel(); ++i) t.set(i, get(i));
    return t;
  }
  // The same values rounded to `dtype` (same memory order).
  HostTensor converted(DType dtype) const {
    HostTensor t = *this;
    t.dtype_ = dtype;
    t.allocate();
    for (std::int64_t i = 0; i < numel(); ++i) t.set(i, get(i));
    return t;
  }

  // Every byte of storage (padding included) set to the dtype's quiet NaN: whatever a backend
  // fails to write shows up.
  void poison() {
    if (dtype_ == DType::fp32 || dtype_ == DType::int32) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (std::size_t i = 0; i + 4 <= storage_.size(); i += 4) std::memcpy(&storage_[i], &nan, 4);
    } else if (dtype_ == DType::fp8_e4m3) {
      std::fill(storage_.begin(), storage_.end(), std::uint8_t{0x7f});
    } else {
      const std::uint16_t nan = dtype_ == DType::fp16 ? 0x7e00 : 0x7fc0;
      for (std::size_t i = 0; i + 2 <= storage_.size(); i += 2) std::memcpy(&storage_[i], &nan, 2);
    }
  }

  bool bitwise_equal(const HostTensor& other) const { return storage_ == other.storage_; }

 private:
  void allocate() {
    std::int64_t extent = 1;  // one past the furthest element
    for (int d = 0; d < rank(); ++d) {
      if (shape_[d] == 0) {
        extent = 0;
        break;
      }
      extent += (shape_[d] - 1) * stride_[d];
    }
    storage_.assign(static_cast<std::size_t>(extent) * dtype_size(dtype_), 0);
  }
  float load(std::int64_t off) const {
    const std::uint8_t* p = storage_.data() + off * static_cast<std::int64_t>(dtype_size(dtype_));
    std::uint16_t h;
    float f;
    switch (dtype_) {
      case DType::fp16: std::memcpy(&h, p, 2); return detail::fp16_to_float(h);
      case DType::bf16: std::memcpy(&h, p, 2); return detail::bf16_to_float(h);
      case DType::fp8_e4m3: return detail::e4m3_to_float(*p);
      case DType::int32: {
        std::int32_t i;
        std::memcpy(&i, p, 4);
        return static_cast<float>(i);
      }
      default: std::memcpy(&f, p, 4); return f;
    }
  }
  void store(std::int64_t off, float x) {
    std::uint8_t* p = storage_.data() + off * static_cast<std::int64_t>(dtype_size(dtype_));
    std::uint16_t h;
    switch (dtype_) {
      case DType::fp16: h = detail::float_to_fp16(x); std::memcpy(p, &h, 2); return;
      case DType::bf16: h = detail::float_to_bf16(x); std::memcpy(p, &h, 2); return;
      case DType::fp8_e4m3: *p = detail::float_to_e4m3(x); return;
      case DType::int32: {
        const auto i = static_cast<std::int32_t>(x);
        std::memcpy(p, &i, 4);
        return;
      }
      default: std::memcpy(p, &x, 4); return;
    }
  }

  DType dtype_ = DType::fp32;
  std::vector<std::int64_t> shape_;
  std::vector<std::int64_t> stride_;
  std::vector<std::uint8_t> storage_;  // operator new: 16-byte aligned
};

// int32 [n] tensor of offsets (cu_seqlens) from lengths: 0, l0, l0 + l1, ...
inline HostTensor cu_seqlens(const std::vector<int>& lengths) {
  HostTensor t(DType::int32, {static_cast<std::int64_t>(lengths.size()) + 1});
  auto* p = static_cast<std::int32_t*>(t.data());
  p[0] = 0;
  for (std::size_t b = 0; b < lengths.size(); ++b) p[b + 1] = p[b] + lengths[b];
  return t;
}

// ---- random data ------------------------------------------------------------------------------

// A generator seeded from the running test's full name and a per-test counter: every call
// draws fresh data, and a test draws the same data whether it runs alone or in the suite.
inline std::mt19937_64 test_rng() {
  static std::string last_test;
  static std::uint64_t counter = 0;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "none";
  if (name != last_test) {
    last_test = name;
    counter = 0;
  }
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return std::mt19937_64(h ^ (0x9e3779b97f4a7c15ull * ++counter));
}

// Standard normal values (Box-Muller, so the data do not depend on the standard library),
// times `scale`, rounded to the tensor's dtype.
inline void fill_normal(HostTensor& t, std::mt19937_64& rng, float scale = 1.0f) {
  const auto uniform = [&rng] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1p-53; };
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    t.set(i, static_cast<float>(scale * r * std::cos(6.283185307179586 * uniform())));
  }
}

// ---- error metrics ------------------------------------------------------------------------------

struct ErrorStats {
  double max_abs = 0;   // max |x - ref|
  double rel_l2 = 0;    // ||x - ref|| / ||ref|| (0 when both are 0)
  double ref_max = 0;   // max |ref|
  std::int64_t non_finite = 0;  // elements of x that are NaN/inf where ref is finite
  std::int64_t worst = -1;      // flat index of max_abs
};

inline ErrorStats compare(const std::vector<double>& x, const std::vector<double>& ref) {
  ErrorStats s;
  double diff2 = 0, ref2 = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i])) continue;  // -inf lse rows are checked separately
    if (!std::isfinite(x[i])) {
      ++s.non_finite;
      continue;
    }
    const double d = std::fabs(x[i] - ref[i]);
    if (d > s.max_abs || s.worst < 0) {
      s.max_abs = d;
      s.worst = static_cast<std::int64_t>(i);
    }
    diff2 += d * d;
    ref2 += ref[i] * ref[i];
    s.ref_max = std::max(s.ref_max, std::fabs(ref[i]));
  }
  s.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return s;
}

// FLASHCPP_TEST_VERBOSE=1 prints every comparison's errors (to see the bounds' headroom).
inline void report(const std::string& what, const ErrorStats& s, double allowed_rel_l2) {
  static const bool verbose = std::getenv("FLASHCPP_TEST_VERBOSE") != nullptr;
  if (!verbose) return;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::printf("[errors] %s %s max_abs=%.3g ref_max=%.3g rel_l2=%.3g (bound %.3g)\n",
              info ? info->name() : "", what.c_str(), s.max_abs, s.ref_max, s.rel_l2,
              allowed_rel_l2);
}

inline std::string describe(const ErrorStats& s) {
  return "max_abs=" + std::to_string(s.max_abs) + " rel_l2=" + std::to_string(s.rel_l2) +
         " ref_max=" + std::to_string(s.ref_max) + " non_finite=" + std::to_string(s.non_finite) +
         " worst_index=" + std::to_string(s.worst);
}

// ---- accuracy of the CPU forward ---------------------------------------------------------------
// The float64 reference's outputs are rounded to fp32 only (~6e-8 relative), so the bounds
// below measure the backend's own error.
//
// fp32: the backend accumulates in fp32. Score, exp and P.V sums over at most 1000 keys and
//   256 dims lose ~1e-7..1e-6 relative; 1e-5 relative (L2) and 2e-5 x max|out| (max) leave
//   a 10x margin without hiding a real bug (a dropped key at N=1000 is ~1e-3).
// fp16/bf16: the inputs are exact in fp32 and the work is fp32, so the final rounding of out
//   to the dtype dominates: half an ulp, by design. We allow 2 ulp of the dtype at each
//   element's magnitude (one more rounding, e.g. of P before P.V, is allowed) plus the fp32 term.
//   L2: fp16 1e-3 (2^-11 = 4.9e-4 is the worst relative half-ulp), bf16 8e-3 (2^-8 = 3.9e-3).
// lse: always fp32, from exactly representable inputs: ~10 in magnitude, fp32 ulp ~1e-6, bound
//   1e-4 absolute, plus 2 fp32 ulps at |lse| for large scores (|lse| ~ 500 has ulp 6e-5).
struct ForwardBounds {
  double out_ulps;     // per element, in ulps of the output dtype at |ref|
  double out_fp32;     // per element, times max(1, max|ref|)
  double out_rel_l2;
  double lse_abs;
};

inline ForwardBounds forward_bounds(DType dtype) {
  switch (dtype) {
    case DType::fp16: return {2.0, 2e-5, 1e-3, 1e-4};
    case DType::bf16: return {2.0, 2e-5, 8e-3, 1e-4};
    default: return {0.0, 2e-5, 1e-5, 1e-4};
  }
}

// A CPU forward's out and lse (logical order) against the reference's, with the bounds above.
// An empty `lse` was not requested. Rows whose reference lse is -inf are not compared here.
inline void expect_forward_close(DType dtype, const std::vector<double>& out,
                                 const std::vector<double>& out_ref, const std::vector<double>& lse,
                                 const std::vector<double>& lse_ref) {
  const ForwardBounds bound = forward_bounds(dtype);
  const ErrorStats s = compare(out, out_ref);
  SCOPED_TRACE("out: " + describe(s));
  report("out", s, bound.out_rel_l2);
  EXPECT_EQ(s.non_finite, 0);
  EXPECT_LE(s.rel_l2, bound.out_rel_l2);
  const double fp32_term = bound.out_fp32 * std::max(1.0, s.ref_max);
  int reported = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double allowed = bound.out_ulps * ulp(dtype, out_ref[i]) + fp32_term;
    if (!(std::fabs(out[i] - out_ref[i]) <= allowed) && reported++ < 5)
      ADD_FAILURE() << "out[" << i << "] = " << out[i] << ", reference " << out_ref[i]
                    << ", error " << std::fabs(out[i] - out_ref[i]) << " > allowed " << allowed;
  }
  if (lse.empty()) return;
  const ErrorStats l = compare(lse, lse_ref);
  SCOPED_TRACE("lse: " + describe(l));
  report("lse", l, 0);
  EXPECT_EQ(l.non_finite, 0);
  reported = 0;
  for (std::size_t i = 0; i < lse.size(); ++i) {
    if (!std::isfinite(lse_ref[i])) continue;  // -inf rows: the callers check them exactly
    const double allowed = bound.lse_abs + 2 * ulp(DType::fp32, lse_ref[i]);
    if (!(std::fabs(lse[i] - lse_ref[i]) <= allowed) && reported++ < 5)
      ADD_FAILURE() << "lse[" << i << "] = " << lse[i] << ", reference " << lse_ref[i]
                    << ", error " << std::fabs(lse[i] - lse_ref[i]) << " > allowed " << allowed;
  }
}

// ---- one attention problem ----------------------------------------------------------------------

// The options of a test case with the usual mask, softcap and scale fields (Problem, KvCase).
template <class Case>
AttentionOptions options_of(const Case& c, Backend backend) {
  AttentionOptions o;
  o.backend = backend;
  o.causal = c.causal;
  o.window_left = c.window_left;
  o.window_right = c.window_right;
  o.softcap = c.softcap;
  o.softmax_scale = c.scale;
  return o;
}

struct Problem {
  int batch = 1;
  int heads_q = 2;
  int heads_kv = 2;
  int seqlen_q = 17;
  int seqlen_k = 17;
  int head_dim = 64;
  int head_dim_v = 0;  // 0: same as head_dim
  DType dtype = DType::fp32;
  Layout layout = Layout::bshd;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  std::optional<float> scale;  // default 1/sqrt(head_dim)
  bool with_lse = true;
  // Varlen when non-empty (same length): per-sequence query and key counts; `batch`,
  // `seqlen_q/k` and `layout` are then ignored.
  std::vector<int> lengths_q, lengths_k;

  int dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool varlen() const { return !lengths_q.empty(); }
  int num_seqs() const { return varlen() ? static_cast<int>(lengths_q.size()) : batch; }
  int len_q(int b) const { return varlen() ? lengths_q[b] : seqlen_q; }
  int len_k(int b) const { return varlen() ? lengths_k[b] : seqlen_k; }
  int total_q() const {
    int n = 0;
    for (int l : lengths_q) n += l;
    return n;
  }
  int total_k() const {
    int n = 0;
    for (int l : lengths_k) n += l;
    return n;
  }

  AttentionOptions options(Backend backend) const { return options_of(*this, backend); }
  // The window actually applied (causal folds into right = 0).
  int right() const { return causal ? 0 : window_right; }
  detail::KeyRange keys(int b, int row) const {
    return detail::WindowMask(len_q(b), len_k(b), window_left, right()).keys(row);
  }
  // Exact count of visible (query, key) pairs over batch and heads: the FLOP model's unit.
  std::int64_t visible_pairs() const {
    std::int64_t pairs = 0;
    for (int b = 0; b < num_seqs(); ++b)
      for (int i = 0; i < len_q(b); ++i) {
        const auto r = keys(b, i);
        pairs += std::max<std::int64_t>(0, r.end - r.begin);
      }
    return pairs * heads_q;
  }
};

// The sweeps' base case: batch 2, two heads, the given lengths, head dim and dtype.
inline Problem shape(int nq, int nk, int d, DType dtype = DType::fp32) {
  Problem p;
  p.batch = 2;
  p.seqlen_q = nq;
  p.seqlen_k = nk;
  p.head_dim = d;
  p.dtype = dtype;
  return p;
}

// A readable, unique test name: "b2_h4x1_q113_k203_d64_fp32_bshd_causal".
inline std::string problem_name(const Problem& p) {
  std::string n;
  if (p.varlen()) {
    n = "varlen";
    for (std::size_t b = 0; b < p.lengths_q.size(); ++b)
      n += "_" + std::to_string(p.lengths_q[b]) + "x" + std::to_string(p.lengths_k[b]);
  } else {
    n = "b" + std::to_string(p.batch) + "_q" + std::to_string(p.seqlen_q) + "_k" +
        std::to_string(p.seqlen_k);
  }
  n += "_h" + std::to_string(p.heads_q) + "x" + std::to_string(p.heads_kv) + "_d" +
       std::to_string(p.head_dim);
  if (p.dv() != p.head_dim) n += "v" + std::to_string(p.dv());
  n += std::string("_") + dtype_name(p.dtype);
  if (!p.varlen()) n += std::string("_") + layout_name(p.layout);
  if (p.causal) n += "_causal";
  if (p.window_left >= 0 || p.window_right >= 0) {
    const auto bound = [](int w) { return w < 0 ? std::string("inf") : std::to_string(w); };
    n += "_win" + bound(p.window_left) + "_" + bound(p.window_right);
  }
  if (p.softcap > 0) n += "_softcap" + std::to_string(static_cast<int>(p.softcap));
  if (p.scale) n += "_scale" + std::to_string(static_cast<int>(*p.scale * 1000)) + "m";
  if (!p.with_lse) n += "_nolse";
  return n;
}

// gtest prints parameters with this (instead of a byte dump) in test names and failures.
inline void PrintTo(const Problem& p, std::ostream* os) { *os << problem_name(p); }

// All tensors of one problem (forward and backward), laid out as the problem says.
struct Tensors {
  HostTensor q, k, v, out, lse, cu_q, cu_k;
  HostTensor dout, dq, dk, dv;

  Tensors() = default;
  explicit Tensors(const Problem& p) : Tensors(p, p.dtype) {}
  Tensors(const Problem& p, DType dtype) {
    if (p.varlen()) {
      q = HostTensor(dtype, {p.total_q(), p.heads_q, p.head_dim});
      k = HostTensor(dtype, {p.total_k(), p.heads_kv, p.head_dim});
      v = HostTensor(dtype, {p.total_k(), p.heads_kv, p.dv()});
      out = HostTensor(dtype, {p.total_q(), p.heads_q, p.dv()});
      lse = HostTensor(DType::fp32, {p.heads_q, p.total_q()});
      cu_q = cu_seqlens(p.lengths_q);
      cu_k = cu_seqlens(p.lengths_k);
    } else {
      q = HostTensor::bnhd(dtype, p.batch, p.seqlen_q, p.heads_q, p.head_dim, p.layout);
      k = HostTensor::bnhd(dtype, p.batch, p.seqlen_k, p.heads_kv, p.head_dim, p.layout);
      v = HostTensor::bnhd(dtype, p.batch, p.seqlen_k, p.heads_kv, p.dv(), p.layout);
      out = HostTensor::bnhd(dtype, p.batch, p.seqlen_q, p.heads_q, p.dv(), p.layout);
      lse = HostTensor(DType::fp32, {p.batch, p.heads_q, p.seqlen_q});
    }
    dout = out;
    dq = q;
    dk = k;
    dv = v;
  }

  void fill_inputs(std::mt19937_64& rng) {
    fill_normal(q, rng);
    fill_normal(k, rng);
    fill_normal(v, rng);
  }
  void poison_outputs() {
    out.poison();
    lse.poison();
  }
  void poison_grads() {
    dq.poison();
    dk.poison();
    dv.poison();
  }
  // Copies of everything in fp32 (exact for fp16/bf16 data): the reference's inputs.
  Tensors to_fp32() const {
    Tensors t = *this;
    for (HostTensor* x : {&t.q, &t.k, &t.v, &t.out, &t.dout, &t.dq, &t.dk, &t.dv}) *x = x->to_fp32();
    return t;
  }

  RunInfo forward(const Problem& p, Backend backend) {
    TensorView lse_view = lse.view();
    const TensorView* lse_ptr = p.with_lse ? &lse_view : nullptr;
    const AttentionOptions o = p.options(backend);
    if (p.varlen())
      return flashcpp::forward_varlen(q.view(), k.view(), v.view(), out.view(), lse_ptr,
                                      cu_q.view(), cu_k.view(), max_len(p.lengths_q),
                                      max_len(p.lengths_k), o);
    return flashcpp::forward(q.view(), k.view(), v.view(), out.view(), lse_ptr, o);
  }

  RunInfo backward(const Problem& p, Backend backend, bool deterministic = false) {
    AttentionOptions o = p.options(backend);
    o.deterministic = deterministic;
    if (p.varlen())
      return flashcpp::backward_varlen(q.view(), k.view(), v.view(), out.view(), dout.view(),
                                       lse.view(), dq.view(), dk.view(), dv.view(), cu_q.view(),
                                       cu_k.view(), max_len(p.lengths_q), max_len(p.lengths_k),
                                       o);
    return flashcpp::backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(),
                              dq.view(), dk.view(), dv.view(), o);
  }

  static int max_len(const std::vector<int>& lengths) {
    return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  }
};

// The float64 reference through the public API (Backend::cpu_reference), run on exact fp32
// copies of the inputs so its outputs carry only fp32 rounding (~6e-8 relative), not the
// rounding of a half output dtype: errors of fp16/bf16 results are measured in full.
inline Tensors reference_forward(const Problem& p, const Tensors& inputs) {
  Tensors ref = inputs.to_fp32();
  Problem p32 = p;
  p32.dtype = DType::fp32;
  p32.with_lse = true;
  ref.poison_outputs();
  const RunInfo info = ref.forward(p32, Backend::cpu_reference);
  EXPECT_EQ(info.backend, Backend::cpu_reference);
  return ref;
}

// The reference's backward on fp32 copies of `inputs` (q, k, v, out, dout, lse as given).
inline Tensors reference_backward(const Problem& p, const Tensors& inputs) {
  Tensors ref = inputs.to_fp32();
  Problem p32 = p;
  p32.dtype = DType::fp32;
  ref.poison_grads();
  ref.backward(p32, Backend::cpu_reference);
  return ref;
}

// True when flashcpp was built with CUDA and a GPU is usable.
inline bool has_cuda() { return flashcpp::cuda_available(); }

}  // namespace flashcpp::test
