// The shared harness of the sm90a FP8 forward tests (fp8_cuda_test.cpp, fp8_cuda_nan_test.cpp):
// one case (Fp8Case) and its inputs (make_data), the float64 reference, the run on the GPU,
// the FP8 bound and the comparisons, and the skip for machines or builds without the FP8
// forward (SKIP_WITHOUT_FP8_FORWARD). All of it needs CUDA: in a build without it the header
// holds nothing.
//
// The sm90a FP8 forward (e4m3 q, k, v with descales, bf16 out) on a Hopper GPU against the
// float64 reference of the dequantised inputs (Backend::cpu_reference on float32 copies holding
// code x descale, exact products: codes and descales have 4 significant bits each).
//
// Two kinds of inputs:
//  - exact P: q and k codes in {-1, 0, 1} with at most 4 nonzero q entries per row, q_descale
//    x k_descale = 4 and softmax scale ln 2 / 4 (without descales: 1 and ln 2), so every score
//    is an integer in [-4, 4] in units of ln 2 and every P = 2^(s - max) is an e4m3 value:
//    the kernel's only roundings are then the sums (exact here: small integers) and the bf16
//    out, and `out` is held to 2^-8 relative plus 1e-3,
//    `lse` to 1e-3 (a wrong key order, V^T layout, descale or mask shows up as O(0.1) errors);
//  - Gaussian (and Gaussian with outlier channels, x20): the FP8 bound of docs/semantics.md,
//    computed per element from the codes (fp8_bound below): the tensor cores' FP8 sums keep
//    about 13 bits below the largest term of each k32 step, so each score is off by up to
//    2^-8 x scale x descales x sum |q_c k_c| (E), which moves lse by up to
//    ln sum_j w_j e^E_j and each softmax weight by a factor e^(E_j + that); P rounded to e4m3
//    adds 2^-4 relative, or up to 2^-10 absolute below e4m3's smallest normal 2^-6.
// Rows without a visible key must give lse exactly -inf. Outputs are poisoned (NaN) first.
// Every test skips without a Hopper GPU or without the fp8_e4m3 sm90a forward in this build.
#pragma once

#include <gtest/gtest.h>

#ifdef FLASHCPP_TEST_WITH_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/mask.hpp"
#include "cuda_harness.hpp"
#include "flashcpp/flashcpp.hpp"
#include "test_util.hpp"

namespace flashcpp::fp8_test {

using cuda_test::cuda_ok;
using cuda_test::DeviceBuffer;
using test::HostTensor;

enum class Inputs { exact_p, gaussian, outliers };

struct Fp8Case {
  // Padded: B sequences of Nq queries and Nk keys. Varlen: one per entry of lq / lk.
  int B = 2, Nq = 200, Nk = 300;
  std::vector<int> lq, lk;
  int Hq = 4, Hkv = 2, D = 128;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  int descales = 2;  // 0: none, 1: one per tensor ([1]), 2: per (sequence, kv head) ([B, Hkv])
  Inputs inputs = Inputs::exact_p;
  bool fast_accum = false;  // AttentionOptions::fp8_fast_accum
  DType out = DType::bf16;  // out's dtype: bf16 or fp16
  bool varlen() const { return !lq.empty(); }
  int batch() const { return varlen() ? int(lq.size()) : B; }
};

// Varlen lengths with an empty query sequence, an empty key sequence and a one-query one.
inline void set_ragged_varlen(Fp8Case& c) {
  c.lq = {200, 0, 77, 1};
  c.lk = {300, 5, 0, 129};
}

inline std::string describe(const Fp8Case& c) {
  std::ostringstream s;
  s << "D=" << c.D << " Hq=" << c.Hq << " Hkv=" << c.Hkv;
  if (c.varlen()) {
    s << " varlen q/k lengths";
    for (std::size_t i = 0; i < c.lq.size(); ++i) s << " " << c.lq[i] << "/" << c.lk[i];
  } else {
    s << " B=" << c.B << " Nq=" << c.Nq << " Nk=" << c.Nk;
  }
  if (c.causal) s << " causal";
  if (c.window_left >= 0 || c.window_right >= 0)
    s << " window=(" << c.window_left << "," << c.window_right << ")";
  if (c.softcap > 0) s << " softcap=" << c.softcap;
  s << " descales=" << c.descales;
  s << (c.inputs == Inputs::exact_p ? " exact-P" : c.inputs == Inputs::gaussian ? " gaussian" : " outliers");
  if (c.fast_accum) s << " fast-accum";
  if (c.out != DType::bf16) s << " out " << dtype_name(c.out);
  return s.str();
}

// Exact-P inputs with descales: q_descale x k_descale = 2^2.
inline constexpr int kExactPScoreDescaleLog2 = 2;

// Host tensors of a case: the e4m3 codes, the descales and the dequantised float32 copies.
struct Fp8Data {
  HostTensor q8, k8, v8, dq, dk, dv, q32, k32, v32, cu_q, cu_k;
  int max_q = 0, max_k = 0;
};

inline std::vector<int> lengths_q(const Fp8Case& c) {
  return c.varlen() ? c.lq : std::vector<int>(c.B, c.Nq);
}
inline std::vector<int> lengths_k(const Fp8Case& c) {
  return c.varlen() ? c.lk : std::vector<int>(c.B, c.Nk);
}

inline HostTensor make_tensor(const Fp8Case& c, DType t, const std::vector<int>& lengths, int heads,
                              int dim) {
  if (!c.varlen()) return HostTensor(t, {c.B, lengths.empty() ? 0 : lengths[0], heads, dim});
  int total = 0;
  for (int n : lengths) total += n;
  return HostTensor(t, {total, heads, dim});
}

// Sequence of each row (padded: row / N).
inline std::vector<int> sequence_of_rows(const std::vector<int>& lengths) {
  std::vector<int> seq;
  for (std::size_t b = 0; b < lengths.size(); ++b) seq.insert(seq.end(), lengths[b], int(b));
  return seq;
}

// A factor with 4 significant bits in [2^lo, 2^(lo+1)).
inline float four_bit_factor(std::mt19937_64& rng, int lo) {
  return std::ldexp(static_cast<float>(8 + rng() % 8) / 8.0f, lo);
}

inline Fp8Data make_data(const Fp8Case& c) {
  auto rng = test::test_rng();
  Fp8Data d;
  const std::vector<int> lq = lengths_q(c), lk = lengths_k(c);
  d.max_q = lq.empty() ? 0 : *std::max_element(lq.begin(), lq.end());
  d.max_k = lk.empty() ? 0 : *std::max_element(lk.begin(), lk.end());
  d.q8 = make_tensor(c, DType::fp8_e4m3, lq, c.Hq, c.D);
  d.k8 = make_tensor(c, DType::fp8_e4m3, lk, c.Hkv, c.D);
  d.v8 = make_tensor(c, DType::fp8_e4m3, lk, c.Hkv, c.D);
  const int B = c.batch();
  const std::vector<std::int64_t> per_head = {B, c.Hkv}, per_tensor = {1};
  d.dq = HostTensor(DType::fp32, c.descales == 2 ? per_head : per_tensor);
  d.dk = HostTensor(DType::fp32, c.descales == 2 ? per_head : per_tensor);
  d.dv = HostTensor(DType::fp32, c.descales == 2 ? per_head : per_tensor);
  // Descales: exact P needs q_descale x k_descale = 2^kExactPScoreDescaleLog2 (powers of two,
  // undone by the softmax scale, options_of; so lse's descale is checked to 1e-3 too);
  // Gaussian inputs use 4-bit factors sized so that the codes stay well inside e4m3's range (448).
  for (std::int64_t i = 0; i < d.dq.numel(); ++i) {
    if (c.descales == 0) {
      d.dq.set(i, 1.f), d.dk.set(i, 1.f), d.dv.set(i, 1.f);
    } else if (c.inputs == Inputs::exact_p) {
      const int e = static_cast<int>(rng() % 5) - 2;
      d.dq.set(i, std::ldexp(1.f, e));
      d.dk.set(i, std::ldexp(1.f, kExactPScoreDescaleLog2 - e));
      d.dv.set(i, four_bit_factor(rng, -3));
    } else {
      const int lo = c.inputs == Inputs::outliers ? -2 : -5;
      d.dq.set(i, four_bit_factor(rng, lo));
      d.dk.set(i, four_bit_factor(rng, lo));
      d.dv.set(i, four_bit_factor(rng, lo));
    }
  }
  const std::vector<int> seq_q = sequence_of_rows(lq), seq_k = sequence_of_rows(lk);
  // The descale of element i of a [rows, heads, dim] view (rows: b * N + r, or packed).
  const auto factor = [&](const HostTensor& f, std::int64_t i, int heads, bool query, int group) {
    if (f.numel() == 1) return f.get(0);
    const std::int64_t row = i / (std::int64_t{heads} * c.D);
    const int h = static_cast<int>(i / c.D % heads) / group;
    const int b = (query ? seq_q : seq_k)[row];
    return f.get(std::int64_t{b} * c.Hkv + h);
  };
  const auto uniform = [&] { return static_cast<double>(rng() >> 11) * 0x1p-53; };
  const auto normal = [&] {
    const double r = std::sqrt(-2.0 * std::log(uniform() + 0x1p-60));
    return r * std::cos(6.283185307179586 * uniform());
  };
  // Outlier channels (Gaussian x 20) in q, k and v: channels 3 and D/2 + 1.
  const auto outlier = [&](std::int64_t i) {
    const int ch = static_cast<int>(i % c.D);
    return c.inputs == Inputs::outliers && (ch == 3 || ch == c.D / 2 + 1) ? 20.0 : 1.0;
  };
  const int group = c.Hq / c.Hkv;
  for (std::int64_t i = 0; i < d.q8.numel(); ++i) {
    if (c.inputs == Inputs::exact_p) {
      // At most 4 nonzero entries of +-1 per row (channels 0..7, half of them zero).
      const int ch = static_cast<int>(i % c.D);
      d.q8.set(i, ch < 8 && rng() % 2 ? (rng() % 2 ? 1.f : -1.f) : 0.f);
    } else {
      d.q8.set(i, static_cast<float>(normal() * outlier(i) / factor(d.dq, i, c.Hq, true, group)));
    }
  }
  if (c.inputs == Inputs::exact_p) {
    // Keep at most 4 nonzeros per q row.
    for (std::int64_t row = 0; row * c.D < d.q8.numel(); ++row) {
      int nonzero = 0;
      for (int ch = 0; ch < c.D; ++ch)
        if (d.q8.get(row * c.D + ch) != 0.f && ++nonzero > 4) d.q8.set(row * c.D + ch, 0.f);
    }
  }
  for (std::int64_t i = 0; i < d.k8.numel(); ++i) {
    if (c.inputs == Inputs::exact_p)
      d.k8.set(i, static_cast<float>(static_cast<int>(rng() % 3) - 1));
    else
      d.k8.set(i, static_cast<float>(normal() * outlier(i) / factor(d.dk, i, c.Hkv, false, 1)));
    d.v8.set(i, static_cast<float>(normal() * outlier(i) / factor(d.dv, i, c.Hkv, false, 1)));
  }
  d.q32 = d.q8.converted(DType::fp32);
  d.k32 = d.k8.converted(DType::fp32);
  d.v32 = d.v8.converted(DType::fp32);
  for (std::int64_t i = 0; i < d.q32.numel(); ++i) d.q32.set(i, d.q32.get(i) * factor(d.dq, i, c.Hq, true, group));
  for (std::int64_t i = 0; i < d.k32.numel(); ++i) {
    d.k32.set(i, d.k32.get(i) * factor(d.dk, i, c.Hkv, false, 1));
    d.v32.set(i, d.v32.get(i) * factor(d.dv, i, c.Hkv, false, 1));
  }
  if (c.varlen()) {
    d.cu_q = test::cu_seqlens(lq);
    d.cu_k = test::cu_seqlens(lk);
  }
  return d;
}

inline AttentionOptions options_of(const Fp8Case& c) {
  AttentionOptions o;
  o.causal = c.causal;
  o.window_left = c.window_left;
  o.window_right = c.window_right;
  o.softcap = c.softcap;
  o.fp8_fast_accum = c.fast_accum;
  // Exact P: exp2 of the code scores (ln 2 over the descales' product).
  if (c.inputs == Inputs::exact_p)
    o.softmax_scale = std::ldexp(0.69314718055994530942f, c.descales == 0 ? 0 : -kExactPScoreDescaleLog2);
  return o;
}

struct Outputs {
  HostTensor out, lse;
};

inline Outputs outputs_of(const Fp8Case& c, DType out_dtype) {
  Outputs o;
  o.out = make_tensor(c, out_dtype, lengths_q(c), c.Hq, c.D);
  const std::vector<int> lq = lengths_q(c);
  int total = 0;
  for (int n : lq) total += n;
  o.lse = c.varlen() ? HostTensor(DType::fp32, {c.Hq, total}) : HostTensor(DType::fp32, {c.B, c.Hq, c.Nq});
  return o;
}

// The float64 reference of the dequantised inputs.
inline Outputs reference(const Fp8Case& c, Fp8Data& d) {
  Outputs r = outputs_of(c, DType::fp32);
  HostTensor& v = d.v32;
  AttentionOptions o = options_of(c);
  o.backend = Backend::cpu_reference;
  o.fp8_fast_accum = false;  // float32 inputs: exact either way, and the option is fp8's
  const TensorView lse = r.lse.view();
  if (c.varlen())
    forward_varlen(d.q32.view(), d.k32.view(), v.view(), r.out.view(), &lse, d.cu_q.view(), d.cu_k.view(),
                   d.max_q, d.max_k, o);
  else
    forward(d.q32.view(), d.k32.view(), v.view(), r.out.view(), &lse, o);
  return r;
}

// A host tensor's bytes on the device, and its view there.
struct OnDevice {
  DeviceBuffer buf;
  TensorView view;
  explicit OnDevice(HostTensor& t) : buf(std::max<std::size_t>(t.bytes(), 1)) {
    if (t.bytes() > 0) cuda_ok(cudaMemcpy(buf.ptr, t.data(), t.bytes(), cudaMemcpyHostToDevice));
    view = t.view();
    view.data = t.numel() == 0 ? nullptr : buf.ptr;
    view.device = Device::cuda(0);
  }
  void download(HostTensor& t) const {
    if (t.bytes() > 0) cuda_ok(cudaMemcpy(t.data(), buf.ptr, t.bytes(), cudaMemcpyDeviceToHost));
  }
};

// Why this machine cannot run the FP8 forward, or empty.
inline std::string fp8_skip_reason() {
  if (!cuda_available()) return "no CUDA GPU";
  if (const std::string why = cuda_test::not_sm90_reason(); !why.empty()) return why;
  HostTensor q(DType::fp8_e4m3, {1, 1, 1, 128});
  OnDevice dq(q);
  try {
    (void)forward_workspace_size(dq.view, dq.view, dq.view, {});
  } catch (const Error& e) {
    return e.what();  // e.g. no fp8 sm90a kernel in this build
  }
  return "";
}

// Why this build cannot run the bf16 sm90a forward that the accuracy comparison runs beside
// the FP8 one (head dims 128 and 256), or empty: an fp8-only build has none. Any other error
// is the test's failure, not a reason to skip.
inline std::string bf16_forward_skip_reason() {
  for (int d : {128, 256}) {
    HostTensor q(DType::bf16, {1, 1, 1, d});
    OnDevice dq(q);
    AttentionOptions o;
    o.backend = Backend::cuda_sm90;
    o.num_splits = 1;
    try {
      (void)forward_workspace_size(dq.view, dq.view, dq.view, o);
    } catch (const Error& e) {
      if (std::string(e.what()).find("in this build") == std::string::npos) throw;
      return e.what();
    }
  }
  return "";
}

#define SKIP_WITHOUT_FP8_FORWARD()                                  \
  do {                                                              \
    static const std::string why = ::flashcpp::fp8_test::fp8_skip_reason(); \
    if (!why.empty()) GTEST_SKIP() << why;                          \
  } while (0)

// Runs the case on the GPU (out in the case's dtype, poisoned first; inputs fp8 or, for the
// bf16 comparison, the dequantised values in bf16 with a bf16 out) and returns out and lse.
inline Outputs run_gpu(const Fp8Case& c, Fp8Data& d, RunInfo* info = nullptr, bool bf16_inputs = false) {
  Outputs r = outputs_of(c, bf16_inputs ? DType::bf16 : c.out);
  r.out.poison();
  r.lse.poison();
  HostTensor qb, kb, vb;
  if (bf16_inputs) {  // code x descale has 8 significant bits: exact in bf16
    qb = d.q32.converted(DType::bf16);
    kb = d.k32.converted(DType::bf16);
    vb = d.v32.converted(DType::bf16);
  }
  OnDevice q(bf16_inputs ? qb : d.q8), k(bf16_inputs ? kb : d.k8), v(bf16_inputs ? vb : d.v8);
  OnDevice out(r.out), lse(r.lse), dq(d.dq), dk(d.dk), dv(d.dv);
  AttentionOptions o = options_of(c);
  o.backend = Backend::cuda_sm90;
  if (!bf16_inputs && c.descales > 0) o.descale = {&dq.view, &dk.view, &dv.view};
  if (bf16_inputs) {
    o.num_splits = 1;
    o.fp8_fast_accum = false;
  }
  std::size_t ws_bytes = 0;
  std::unique_ptr<OnDevice> cu_q, cu_k;
  if (c.varlen()) {
    cu_q = std::make_unique<OnDevice>(d.cu_q);
    cu_k = std::make_unique<OnDevice>(d.cu_k);
    ws_bytes = forward_varlen_workspace_size(q.view, k.view, v.view, cu_q->view, cu_k->view, d.max_q,
                                             d.max_k, o);
  } else {
    ws_bytes = forward_workspace_size(q.view, k.view, v.view, o);
  }
  DeviceBuffer ws(ws_bytes);
  // Poisoned workspace: whatever the pre-pass does not write is NaN in e4m3.
  if (ws_bytes > 0) cuda_ok(cudaMemset(ws.ptr, 0x7f, ws_bytes));
  const Workspace w{ws.ptr, ws_bytes};
  const RunInfo ran =
      c.varlen() ? forward_varlen(q.view, k.view, v.view, out.view, &lse.view, cu_q->view, cu_k->view,
                                  d.max_q, d.max_k, o, nullptr, w)
                 : forward(q.view, k.view, v.view, out.view, &lse.view, o, nullptr, w);
  cuda_ok(cudaDeviceSynchronize());
  out.download(r.out);
  lse.download(r.lse);
  if (info) *info = ran;
  return r;
}

struct Errors {
  double max_out = 0, max_lse = 0, rel_l2 = 0;
  std::int64_t bad = 0;
};

// out and lse against the reference, element i of out within out_bound(i, |ref|) and row i
// of lse within lse_bound(i); rows without a visible key must give lse exactly -inf.
template <class OutBound, class LseBound>
inline Errors compare_within(const Outputs& got, const Outputs& ref, OutBound out_bound, LseBound lse_bound) {
  Errors e;
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < ref.out.numel(); ++i) {
    const double want = ref.out.get(i), have = got.out.get(i);
    const double err = std::fabs(have - want);
    if (!(err <= out_bound(i, std::fabs(want)))) ++e.bad;
    e.max_out = std::isnan(err) ? INFINITY : std::max(e.max_out, err);
    num += (have - want) * (have - want);
    den += want * want;
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  for (std::int64_t i = 0; i < ref.lse.numel(); ++i) {
    const double want = ref.lse.get(i), have = got.lse.get(i);
    if (std::isinf(want) && want < 0) {
      if (!(std::isinf(have) && have < 0)) ++e.bad;
      continue;
    }
    const double err = std::fabs(have - want);
    if (!(err <= lse_bound(i))) ++e.bad;
    e.max_lse = std::isnan(err) ? INFINITY : std::max(e.max_lse, err);
  }
  return e;
}

// out within rel * |ref| + abs_bound, lse within 1e-3.
inline Errors compare(const Outputs& got, const Outputs& ref, double rel, double abs_bound) {
  return compare_within(
      got, ref, [&](std::int64_t, double want) { return rel * want + abs_bound; },
      [](std::int64_t) { return 1e-3; });
}

// The FP8 bound of docs/semantics.md, per element of `out` and per row of `lse`, in float64
// from the codes and descales (padded or varlen layout of `ref`). For each row, over its
// visible keys j (the mask rule of common/mask.hpp): s_j the reference score (softcap
// included), w_j = softmax weight, E_j = 2^-8 x scale x q_descale x k_descale x sum_c
// |q_c k_c| (the score's error bound; tanh of the softcap does not enlarge it),
// Ehat = ln sum_j w_j e^(E_j) (lse's error bound), f_j = e^(E_j + Ehat) (a weight's factor).
//   lse: Ehat + 1e-4 (fp32 rounding);
//   out: 2^-8 |ref| (bf16 out) + sum_j w_j (f_j - 1) |v_j - ref| (moved weights)
//        + (2^-4 + 2^-8) sum_j w_j f_j |v_j| (P in e4m3, and the P V sums' 13 bits; with
//          fast accumulation, O carried along the row by the tensor cores, 2^-8 becomes
//          (ceil(n / 32) + 8) x 2^-8 for n visible keys: each k32 step the row goes through,
//          up to 8 of them outside its visible keys in the blocks at its edges, keeps 13 bits
//          below the running sum)
//        + e^Ehat sum_j min(w_j e^(E_j), 2^-10 e^(max_j (s_j + E_j) - lse)) |v_j|
//          (P below 2^-6 in e4m3 subnormals: up to 2^-10 absolute, relative to the row max)
//        + 1e-3.
struct Fp8Bound {
  std::vector<double> out, lse;
  std::int64_t mismatches = 0;  // the loop's own out and lse against the reference's (indexing)
};

inline Fp8Bound fp8_bound(const Fp8Case& c, const Fp8Data& d, const Outputs& ref) {
  Fp8Bound bound;
  bound.out.assign(static_cast<std::size_t>(ref.out.numel()), 0.0);
  bound.lse.assign(static_cast<std::size_t>(ref.lse.numel()), 0.0);
  const std::vector<int> lq = lengths_q(c), lk = lengths_k(c);
  const int group = c.Hq / c.Hkv, D = c.D;
  const std::optional<float> case_scale = options_of(c).softmax_scale;  // exact P sets one
  const double scale = case_scale ? double(*case_scale) : 1.0 / std::sqrt(static_cast<double>(D));
  const int left = c.window_left, right = c.causal ? 0 : c.window_right;
  const auto descale = [&](const HostTensor& f, int b, int hk) {
    return static_cast<double>(f.numel() == 1 ? f.get(0) : f.get(std::int64_t{b} * c.Hkv + hk));
  };
  std::int64_t row_q = 0, row_k = 0;  // first row of sequence b
  std::int64_t total_q = 0;
  for (int n : lq) total_q += n;
  std::vector<double> s, e, acc_moved(D), acc_rel(D), acc_sub(D), acc_out(D);
  for (int b = 0; b < c.batch(); ++b) {
    const detail::WindowMask mask(lq[b], lk[b], left, right);
    for (int h = 0; h < c.Hq; ++h) {
      const int hk = h / group;
      const double sc = scale * descale(d.dq, b, hk) * descale(d.dk, b, hk);
      for (int i = 0; i < lq[b]; ++i) {
        const std::int64_t q0 = ((row_q + i) * c.Hq + h) * D;
        const std::int64_t lse_at = c.varlen() ? h * total_q + row_q + i : (std::int64_t{b} * c.Hq + h) * c.Nq + i;
        const std::int64_t j_begin = std::max<std::int64_t>(0, i + mask.lo);
        const std::int64_t j_end = std::min<std::int64_t>(lk[b], i + mask.hi + 1);
        if (j_begin >= j_end) {  // no visible key: lse -inf, out 0, checked exactly
          bound.mismatches += !std::isinf(ref.lse.get(lse_at));
          continue;
        }
        const std::size_t n = static_cast<std::size_t>(j_end - j_begin);
        s.assign(n, 0.0);
        e.assign(n, 0.0);
        double m = -INFINITY, m_err = -INFINITY;
        for (std::size_t t = 0; t < n; ++t) {
          const std::int64_t k0 = ((row_k + j_begin + std::int64_t(t)) * c.Hkv + hk) * D;
          double dot = 0, abs_sum = 0;
          for (int ch = 0; ch < D; ++ch) {
            const double prod = double(d.q8.get(q0 + ch)) * double(d.k8.get(k0 + ch));
            dot += prod;
            abs_sum += std::fabs(prod);
          }
          s[t] = dot * sc;
          if (c.softcap > 0) s[t] = c.softcap * std::tanh(s[t] / c.softcap);
          e[t] = 0x1p-8 * abs_sum * sc;
          m = std::max(m, s[t]);
          m_err = std::max(m_err, s[t] + e[t]);
        }
        double l = 0, z = 0;
        for (std::size_t t = 0; t < n; ++t) l += std::exp(s[t] - m);
        for (std::size_t t = 0; t < n; ++t) z += std::exp(s[t] - m) / l * std::exp(e[t]);
        const double lse = m + std::log(l), e_hat = std::log(z);
        bound.lse[static_cast<std::size_t>(lse_at)] = e_hat + 1e-4;
        bound.mismatches += !(std::fabs(lse - ref.lse.get(lse_at)) <= 1e-4 * (1 + std::fabs(lse)));
        std::fill(acc_moved.begin(), acc_moved.end(), 0.0);
        std::fill(acc_rel.begin(), acc_rel.end(), 0.0);
        std::fill(acc_sub.begin(), acc_sub.end(), 0.0);
        std::fill(acc_out.begin(), acc_out.end(), 0.0);
        for (std::size_t t = 0; t < n; ++t) {
          const double w = std::exp(s[t] - m) / l, f = std::exp(e[t] + e_hat);
          const double sub = std::min(w * std::exp(e[t]), 0x1p-10 * std::exp(m_err - lse));
          const std::int64_t v0 = ((row_k + j_begin + std::int64_t(t)) * c.Hkv + hk) * D;
          for (int ch = 0; ch < D; ++ch) {
            const double v = d.v32.get(v0 + ch), r = ref.out.get(q0 + ch);
            acc_moved[ch] += w * (f - 1) * std::fabs(v - r);
            acc_rel[ch] += w * f * std::fabs(v);
            acc_sub[ch] += sub * std::fabs(v);
            acc_out[ch] += w * v;
          }
        }
        const double pv_steps = c.fast_accum ? std::ceil(double(n) / 32) + 8 : 1;
        for (int ch = 0; ch < D; ++ch) {
          const double r = ref.out.get(q0 + ch);
          bound.out[static_cast<std::size_t>(q0 + ch)] = 0x1p-8 * std::fabs(r) + acc_moved[ch] +
                                                         (0x1p-4 + 0x1p-8 * pv_steps) * acc_rel[ch] +
                                                         std::exp(e_hat) * acc_sub[ch] + 1e-3;
          bound.mismatches += !(std::fabs(acc_out[ch] - r) <= 1e-5 * (1 + std::fabs(r)));
        }
      }
    }
    row_q += c.varlen() ? lq[b] : c.Nq;
    row_k += c.varlen() ? lk[b] : c.Nk;
  }
  return bound;
}

// out and lse against the reference within the FP8 bound; -inf rows exact.
inline Errors compare_fp8(const Outputs& got, const Outputs& ref, const Fp8Bound& bound) {
  EXPECT_EQ(bound.mismatches, 0) << "the bound's own softmax disagrees with the reference";
  return compare_within(
      got, ref, [&](std::int64_t i, double) { return bound.out[static_cast<std::size_t>(i)]; },
      [&](std::int64_t i) { return bound.lse[static_cast<std::size_t>(i)]; });
}

inline void check(const Fp8Case& c) {
  SCOPED_TRACE(describe(c));
  Fp8Data d = make_data(c);
  RunInfo info;
  const Outputs got = run_gpu(c, d, &info);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(info.backend, Backend::cuda_sm90);
  EXPECT_NE(std::string(info.kernel).find("sm90_fwd_fp8_e4m3_hdim"), std::string::npos) << info.kernel;
  EXPECT_EQ(std::string(info.kernel).find("_fastaccum") != std::string::npos, c.fast_accum)
      << info.kernel;
  EXPECT_EQ(info.num_splits, 1);
  const Outputs ref = reference(c, d);
  Errors e;
  // Exact P holds the sums exact only where each key block is summed apart (fast accumulation
  // rounds the running sum: the FP8 bound applies).
  if (c.inputs == Inputs::exact_p && !c.fast_accum) {
    e = compare(got, ref, 0x1p-8, 1e-3);
  } else {
    e = compare_fp8(got, ref, fp8_bound(c, d, ref));
  }
  EXPECT_EQ(e.bad, 0) << "max |out err| " << e.max_out << ", max |lse err| " << e.max_lse
                      << ", rel L2 " << e.rel_l2;
}

}  // namespace flashcpp::fp8_test

#endif  // FLASHCPP_TEST_WITH_CUDA
