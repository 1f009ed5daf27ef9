// The GPU test harness of cuda_forward_test.cpp and cuda_backward_test.cpp: one attention
// problem (FwdCase, BwdCase) run on the GPU on NaN-poisoned outputs and on the float64
// reference (Backend::cpu_reference on host copies of exactly the GPU's inputs), the error
// bounds and checks, and the fixture that runs a suite once per GPU backend. Cases whose kernel
// a subset build lacks (FLASHCPP_CUDA_ARCHS / FLASHCPP_DTYPES / FLASHCPP_HEAD_DIMS) are recorded,
// not failed: the test then reports itself skipped and lists them; a full build records nothing.
// All but the first block needs CUDA: in a build without it that is all the header holds.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "flashcpp/flashcpp.hpp"

namespace flashcpp {
// gtest prints a suite's parameter with this ("cuda_sm80") instead of a byte dump.
inline void PrintTo(Backend b, std::ostream* os) { *os << backend_name(b); }
}  // namespace flashcpp

namespace flashcpp::cuda_test {

// The suites run once per GPU backend: their test names end /sm80 or /sm90.
inline const auto kGpuBackends = ::testing::Values(Backend::cuda_sm80, Backend::cuda_sm90);
inline std::string backend_suffix(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::cuda_sm90 ? "sm90" : "sm80";
}

// The one test of a suite in a build without CUDA: it skips, saying why.
inline void skip_built_without_cuda() {
  if (!cuda_available()) GTEST_SKIP() << "built without CUDA";
  FAIL() << "cuda_available() is true in a build without CUDA";
}

}  // namespace flashcpp::cuda_test

#ifdef FLASHCPP_TEST_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "common/half.hpp"
#include "test_util.hpp"

namespace flashcpp::cuda_test {

// ---- subset builds ------------------------------------------------------------------------------

// The cases recorded since the last report_unbuilt_cases(), described with their error.
inline std::vector<std::string>& unbuilt_cases() {
  static std::vector<std::string> cases;
  return cases;
}

// True (and the case recorded) when `e` is the dispatch's "no ... kernel ... in this build"
// error; any other error is the caller's to rethrow, so it still fails the test.
inline bool record_if_unbuilt(const std::string& what, const Error& e) {
  if (std::string(e.what()).find("in this build") == std::string::npos) return false;
  unbuilt_cases().push_back(what + ": " + e.what());
  return true;
}

// Called from TearDown: a test some of whose cases need kernels this build lacks is reported
// as skipped (listing them) when the cases that ran all passed (a failure outranks the skip in
// GoogleTest's result).
inline void report_unbuilt_cases() {
  std::vector<std::string>& cases = unbuilt_cases();
  if (cases.empty()) return;
  std::string list;
  for (const std::string& c : cases) list += "\n  " + c;
  const std::size_t n = cases.size();
  cases.clear();
  GTEST_SKIP() << n << " case(s) need kernels not in this build:" << list;
}

// ---- one suite, every backend -------------------------------------------------------------------

// A suite run once per backend (GetParam()). WhyNot(backend) says why device 0 or this build
// cannot run that backend's tests (empty when it can); it is worked out once per backend.
template <std::string (*WhyNot)(Backend)>
class BackendSuite : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    static std::map<Backend, std::string> why_not;
    const auto [it, fresh] = why_not.try_emplace(GetParam());
    if (fresh) it->second = WhyNot(GetParam());
    if (!it->second.empty()) GTEST_SKIP() << it->second;
  }
  void TearDown() override { report_unbuilt_cases(); }

  bool sm90() const { return GetParam() == Backend::cuda_sm90; }
  // What a test uses on the backend under test, where the two backends' grids differ.
  template <class T>
  T per_backend(T on_sm80, T on_sm90) const {
    return sm90() ? on_sm90 : on_sm80;
  }
};

using Lengths = std::vector<std::pair<int, int>>;  // {Nq, Nk} pairs

// ---- device memory and host images --------------------------------------------------------------

inline void cuda_ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// Why device 0 (there is one) cannot run sm90a kernels, or empty when it can.
inline std::string not_sm90_reason() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "cudaGetDeviceProperties failed";
  if (prop.major != 9 || prop.minor != 0)
    return std::string("device 0 (") + prop.name + ") is not sm90";
  return "";
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) {
    if (bytes && cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { if (ptr) cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

template <class T>
void upload(DeviceBuffer& dst, const std::vector<T>& src) {
  cuda_ok(cudaMemcpy(dst.ptr, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}

template <class T>
std::vector<T> download(const DeviceBuffer& src, std::int64_t count) {
  std::vector<T> host(count);
  cuda_ok(cudaMemcpy(host.data(), src.ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

inline std::uint16_t to_bits(DType t, float x) {
  return t == DType::bf16 ? detail::float_to_bf16(x) : detail::float_to_fp16(x);
}
inline float from_bits(DType t, std::uint16_t b) {
  return t == DType::bf16 ? detail::bf16_to_float(b) : detail::fp16_to_float(b);
}

// A tensor's logical shape and its memory strides (elements).
struct MemLayout {
  std::vector<std::int64_t> shape, stride;
  std::int64_t elements() const {
    std::int64_t n = 1;
    for (std::int64_t s : shape) n *= s;
    return n;
  }
  // Logical (row-major) index -> memory offset.
  std::int64_t offset(std::int64_t i) const {
    std::int64_t off = 0;
    for (int d = int(shape.size()) - 1; d >= 0; --d) {
      off += (i % shape[d]) * stride[d];
      i /= shape[d];
    }
    return off;
  }
};

inline TensorView make_view(void* data, DType t, const MemLayout& l, Device dev) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.rank = int(l.shape.size());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[i] = l.shape[i];
    v.stride[i] = l.stride[i];
  }
  v.device = dev;
  return v;
}

inline TensorView device_view(const DeviceBuffer& b, DType t, const MemLayout& l) {
  return make_view(b.ptr, t, l, Device::cuda(0));
}

// A dense row-major fp32 host tensor of `shape` over `x`.
inline TensorView host_view(std::vector<float>& x, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> st(shape.size());
  std::int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= shape[i];
  }
  return make_view(x.data(), DType::fp32, {shape, st}, Device{});
}

// Logical values -> memory image in layout `l`, and back.
inline std::vector<std::uint16_t> image(DType t, const std::vector<float>& x, const MemLayout& l) {
  std::vector<std::uint16_t> m(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) m[l.offset(i)] = to_bits(t, x[i]);
  return m;
}
inline std::vector<float> logical(DType t, const std::vector<std::uint16_t>& m, const MemLayout& l) {
  std::vector<float> x(m.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = from_bits(t, m[l.offset(i)]);
  return x;
}

// ---- one attention problem ----------------------------------------------------------------------

// What both passes' cases hold. Logical tensors are [B, N, H, D]; bhsd stores them as
// [B, H, N, D]. Varlen when seqlens_q is non-empty: then B = seqlens_q.size(), tensors are
// [total, H, D] and lse [Hq, total_q].
struct CaseBase {
  int B = 1, Nq = 1, Nk = 1, Hq = 1, Hkv = 1, D = 64;
  int Dv = 0;  // head dim of v, out, dout, dv; 0: same as D
  DType dtype = DType::bf16;
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0.f;
  bool bhsd = false;
  std::vector<int> seqlens_q, seqlens_k;
  // The backend the call requests (AttentionOptions::backend), and the one it must report:
  // RunInfo's backend, and a kernel name that starts "sm80_" or "sm90_" accordingly.
  Backend backend = Backend::cuda_sm80;
  Backend expect = Backend::cuda_sm80;

  bool varlen() const { return !seqlens_q.empty(); }
  int dv() const { return Dv > 0 ? Dv : D; }
};

// The varlen sweep of both passes: lengths around the tile sizes (1, 79-81, 127-129, 255-257,
// one long sequence), keys longer and shorter than queries, GQA 4/2, at head dim d with one of
// kVarlenMasks. Sequences end mid-tile, so tiles reach into their neighbours' rows.
struct MaskCase {
  bool causal;
  int wl, wr;
  float softcap;
};
inline constexpr MaskCase kVarlenMasks[] = {
    {false, -1, -1, 0.f}, {true, -1, -1, 0.f}, {false, 100, 7, 0.f}, {true, -1, -1, 30.f}};
inline void make_varlen_mixed(CaseBase& c, int d, const MaskCase& m) {
  c.seqlens_q = {1, 129, 80, 700, 127, 255, 0, 81};
  c.seqlens_k = {1, 128, 300, 900, 79, 257, 13, 81};
  c.Hq = 4;
  c.Hkv = 2;
  c.D = d;
  c.causal = m.causal;
  c.wl = m.wl;
  c.wr = m.wr;
  c.softcap = m.softcap;
}

inline std::string describe(const CaseBase& c) {
  std::string lengths = "Nq=" + std::to_string(c.Nq) + " Nk=" + std::to_string(c.Nk);
  if (c.varlen()) {
    lengths = "varlen q/k=";
    for (std::size_t b = 0; b < c.seqlens_q.size(); ++b)
      lengths += (b ? "," : "") + std::to_string(c.seqlens_q[b]) + "/" +
                 std::to_string(c.seqlens_k[b]);
  }
  return "B=" + std::to_string(c.B) + " " + lengths + " H=" + std::to_string(c.Hq) + "/" +
         std::to_string(c.Hkv) + " D=" + std::to_string(c.D) +
         (c.dv() != c.D ? " Dv=" + std::to_string(c.dv()) : "") + " " + dtype_name(c.dtype) +
         (c.causal ? " causal" : "") + " window=(" + std::to_string(c.wl) + "," +
         std::to_string(c.wr) + ") softcap=" + std::to_string(c.softcap) +
         (c.bhsd ? " bhsd" : " bshd") + " backend=" + backend_name(c.backend);
}

// The sizes and memory layouts of a case's tensors.
struct Geometry {
  bool varlen = false;
  int B = 0, max_q = 0, max_k = 0;
  std::vector<int> cu_q{0}, cu_k{0};  // sequence offsets (varlen), {0} otherwise
  MemLayout q, k, lse;                // q, dq / k, dk / lse (dense)
  MemLayout v, o;                     // v, dv / out, dout: as k / q with Dv columns
};

inline Geometry geometry_of(const CaseBase& c) {
  Geometry g;
  for (std::size_t b = 0; b < c.seqlens_q.size(); ++b) {
    g.cu_q.push_back(g.cu_q.back() + c.seqlens_q[b]);
    g.cu_k.push_back(g.cu_k.back() + c.seqlens_k[b]);
  }
  const bool varlen = g.varlen = c.varlen();
  g.B = varlen ? int(c.seqlens_q.size()) : c.B;
  g.max_q = varlen ? *std::max_element(c.seqlens_q.begin(), c.seqlens_q.end()) : c.Nq;
  g.max_k = varlen ? *std::max_element(c.seqlens_k.begin(), c.seqlens_k.end()) : c.Nk;
  // n rows per sequence (padded) or n rows in all (varlen), h heads.
  auto layout = [&](std::int64_t n, std::int64_t h, std::int64_t D) -> MemLayout {
    if (varlen) return {{n, h, D}, {h * D, D, 1}};
    if (c.bhsd) return {{g.B, n, h, D}, {h * n * D, D, n * D, 1}};
    return {{g.B, n, h, D}, {n * h * D, h * D, D, 1}};
  };
  g.q = layout(varlen ? g.cu_q.back() : c.Nq, c.Hq, c.D);
  g.k = layout(varlen ? g.cu_k.back() : c.Nk, c.Hkv, c.D);
  g.o = layout(varlen ? g.cu_q.back() : c.Nq, c.Hq, c.dv());
  g.v = layout(varlen ? g.cu_k.back() : c.Nk, c.Hkv, c.dv());
  const std::int64_t rows_q = varlen ? g.cu_q.back() : std::int64_t(g.B) * c.Nq;
  g.lse = varlen ? MemLayout{{c.Hq, rows_q}, {rows_q, 1}}
                 : MemLayout{{g.B, c.Hq, c.Nq}, {std::int64_t(c.Hq) * c.Nq, c.Nq, 1}};
  return g;
}

// Random normal values from `seed`, rounded to the dtype, into each of `tensors` in turn: the
// GPU gets their dtype bits, the reference exactly these as fp32.
inline void fill_rounded(DType t, std::uint64_t seed, std::initializer_list<std::vector<float>*> tensors) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (std::vector<float>* x : tensors)
    for (float& e : *x) e = test::round_to(t, normal(rng));
}

inline AttentionOptions options_of(const CaseBase& c) {
  AttentionOptions opt;
  opt.causal = c.causal;
  opt.window_left = c.wl;
  opt.window_right = c.wr;
  opt.softcap = c.softcap;
  opt.backend = c.backend;
  return opt;
}

// The reference forward of `opt` (run on Backend::cpu_reference, unsplit) on host fp32 q, k, v
// in logical order; writes out and lse, also logical.
inline void reference_forward(const Geometry& g, AttentionOptions opt, std::vector<float>& q,
                              std::vector<float>& k, std::vector<float>& v,
                              std::vector<float>& out, std::vector<float>& lse) {
  opt.backend = Backend::cpu_reference;
  opt.num_splits = 0;
  TensorView rl = host_view(lse, g.lse.shape);
  const TensorView rq = host_view(q, g.q.shape), rk = host_view(k, g.k.shape),
                   rv = host_view(v, g.v.shape), ro = host_view(out, g.o.shape);
  if (g.varlen) {
    std::vector<int> cq = g.cu_q, ck = g.cu_k;
    const TensorView hcq = TensorView::contiguous(cq.data(), DType::int32, {g.B + 1});
    const TensorView hck = TensorView::contiguous(ck.data(), DType::int32, {g.B + 1});
    forward_varlen(rq, rk, rv, ro, &rl, hcq, hck, g.max_q, g.max_k, opt);
  } else {
    forward(rq, rk, rv, ro, &rl, opt);
  }
}

// RunInfo names the expected backend and a kernel of it for `pass` ("fwd_" or "bwd_").
inline void expect_ran_on(const CaseBase& c, const RunInfo& info, const std::string& pass) {
  EXPECT_EQ(info.backend, c.expect);
  const std::string prefix = (c.expect == Backend::cuda_sm90 ? "sm90_" : "sm80_") + pass;
  EXPECT_EQ(std::string(info.kernel).rfind(prefix, 0), 0u) << info.kernel;
}

// run_case, except that a case whose kernel this build lacks is recorded for
// report_unbuilt_cases() and sets r.not_built instead of failing; other errors still throw.
template <class C, class R>
void run_built_case(const C& c, R& r, int repeats = 1) {
  try {
    run_case(c, r, repeats);
  } catch (const Error& e) {
    if (!record_if_unbuilt(describe(c), e)) throw;
    r.not_built = true;
  }
}

// [B, H, N, D] strides, causal or not: B 2, 4/2 heads, Nq 200, Nk 333, head dim d.
template <class C>
void check_bhsd_strides(const C& base, int d) {
  for (bool causal : {false, true}) {
    C c = base;
    c.bhsd = true;
    c.B = 2;
    c.Hq = 4;
    c.Hkv = 2;
    c.Nq = 200;
    c.Nk = 333;
    c.D = d;
    c.causal = causal;
    check(c);
  }
}

// Each dtype x head dim x {Nq, Nk} of the lists, causal or not: B 2, 2 heads.
template <class C>
void check_sweep(const C& base, const std::vector<DType>& dtypes, const std::vector<int>& dims,
                 const Lengths& lengths) {
  for (DType t : dtypes)
    for (int d : dims)
      for (auto [nq, nk] : lengths)
        for (bool causal : {false, true}) {
          C c = base;
          c.dtype = t;
          c.D = d;
          c.B = 2;
          c.Hq = c.Hkv = 2;
          c.Nq = nq;
          c.Nk = nk;
          c.causal = causal;
          check(c);
        }
}

// ---- forward ------------------------------------------------------------------------------------

struct FwdCase : CaseBase {
  int num_splits = 0;
  bool give_workspace = true;
  std::uint64_t seed = 1;
};

inline std::string describe(const FwdCase& c) {
  return describe(static_cast<const CaseBase&>(c)) + " splits=" + std::to_string(c.num_splits);
}

struct FwdResult {
  bool not_built = false;  // no kernel for the case in this build: nothing ran, fields empty
  std::vector<float> out, lse;        // kernel, logical order
  std::vector<float> ref_out, ref_lse;
  std::vector<std::uint16_t> out_bits;  // raw, logical order, for determinism checks
  RunInfo info;
};

// Runs the case `repeats` times on the GPU (outputs poisoned before each run) and once on the
// reference; fills `r` from the last run.
inline void run_case(const FwdCase& c, FwdResult& r, int repeats = 1) {
  const Geometry g = geometry_of(c);
  const std::int64_t nq = g.q.elements(), nk = g.k.elements(), nl = g.lse.elements();
  const std::int64_t nv = g.v.elements(), no = g.o.elements();
  std::vector<float> q(nq), k(nk), v(nv);
  fill_rounded(c.dtype, c.seed, {&q, &k, &v});

  DeviceBuffer dq(nq * 2), dk(nk * 2), dv(nv * 2), dout(no * 2),
      dlse(std::max<std::int64_t>(nl, 1) * 4), dcu_q(g.cu_q.size() * 4),
      dcu_k(g.cu_k.size() * 4);
  upload(dq, image(c.dtype, q, g.q));
  upload(dk, image(c.dtype, k, g.k));
  upload(dv, image(c.dtype, v, g.v));
  upload(dcu_q, g.cu_q);
  upload(dcu_k, g.cu_k);

  AttentionOptions opt = options_of(c);
  opt.num_splits = c.num_splits;
  const TensorView tq = device_view(dq, c.dtype, g.q), tk = device_view(dk, c.dtype, g.k),
                   tv = device_view(dv, c.dtype, g.v), tout = device_view(dout, c.dtype, g.o);
  const TensorView tlse = device_view(dlse, DType::fp32, g.lse);
  const MemLayout cu{{g.B + 1}, {1}};
  const TensorView tcu_q = device_view(dcu_q, DType::int32, cu);
  const TensorView tcu_k = device_view(dcu_k, DType::int32, cu);

  std::size_t ws_bytes = 0;
  if (c.give_workspace)
    ws_bytes = c.varlen() ? forward_varlen_workspace_size(tq, tk, tv, tcu_q, tcu_k, g.max_q,
                                                          g.max_k, opt)
                          : forward_workspace_size(tq, tk, tv, opt);
  DeviceBuffer ws(ws_bytes);

  for (int rep = 0; rep < repeats; ++rep) {
    // Poison: 0xFF.. is NaN in fp16, bf16 and fp32, so any element not written shows up.
    cuda_ok(cudaMemset(dout.ptr, 0xFF, no * 2));
    cuda_ok(cudaMemset(dlse.ptr, 0xFF, nl * 4));
    const Workspace w{ws.ptr, ws_bytes};
    r.info = c.varlen() ? forward_varlen(tq, tk, tv, tout, &tlse, tcu_q, tcu_k, g.max_q,
                                         g.max_k, opt, nullptr, w)
                        : forward(tq, tk, tv, tout, &tlse, opt, nullptr, w);
    cuda_ok(cudaDeviceSynchronize());
    const std::vector<std::uint16_t> img = download<std::uint16_t>(dout, no);
    r.out_bits.resize(no);
    for (std::int64_t i = 0; i < no; ++i) r.out_bits[i] = img[g.o.offset(i)];
  }
  r.out.resize(no);
  for (std::int64_t i = 0; i < no; ++i) r.out[i] = from_bits(c.dtype, r.out_bits[i]);
  r.lse = download<float>(dlse, nl);

  r.ref_out.assign(no, 0.f);
  r.ref_lse.assign(nl, 0.f);
  reference_forward(g, opt, q, k, v, r.ref_out, r.ref_lse);
}

// Error bounds against the float64 reference, unit-variance inputs:
//  out: the kernel rounds P to the input dtype before P V (as FlashAttention does) and rounds
//  O to it at the end. bf16 has 8 significant bits: |O| up to ~3 rounds by up to ~0.008, plus
//  P rounding (2^-9 relative per weight) -> 2e-2. fp16 has 11 bits -> 4e-3.
//  lse: computed in fp32 from exactly the reference's inputs; the only error is fp32
//  accumulation of the dot products and sums -> 1e-3 absolute (observed ~1e-5).
inline double out_bound(DType t) { return t == DType::bf16 ? 2e-2 : 4e-3; }
constexpr double kLseBound = 1e-3;

inline void expect_close(const FwdCase& c, const FwdResult& r) {
  SCOPED_TRACE(describe(c));
  expect_ran_on(c, r.info, "fwd_");
  double max_out = 0, max_lse = 0;
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < r.out.size(); ++i) {
    const double e = std::fabs(double(r.out[i]) - r.ref_out[i]);
    if (!(e <= out_bound(c.dtype))) ++bad;
    if (e > max_out || e != e) max_out = e != e ? INFINITY : e;
  }
  for (std::size_t i = 0; i < r.lse.size(); ++i) {
    if (std::isinf(r.ref_lse[i]) && r.ref_lse[i] < 0) {
      if (!(std::isinf(r.lse[i]) && r.lse[i] < 0)) ++bad;
      continue;
    }
    const double e = std::fabs(double(r.lse[i]) - r.ref_lse[i]);
    if (!(e <= kLseBound)) ++bad;
    if (e > max_lse || e != e) max_lse = e != e ? INFINITY : e;
  }
  EXPECT_EQ(bad, 0) << "max |out err| " << max_out << ", max |lse err| " << max_lse;
}

// run_built_case then, when it ran, expect_close; returns the result for further checks, which
// must skip a result with not_built set.
inline FwdResult check(const FwdCase& c) {
  FwdResult r;
  run_built_case(c, r);
  if (!r.not_built) expect_close(c, r);
  return r;
}

// Why the forward tests of `backend` cannot run here, or empty when they can: sm90 needs an
// sm90 GPU and this build's sm90a forward kernels.
inline std::string forward_skip_reason(Backend backend) {
  if (!cuda_available()) return "no CUDA GPU";
  if (backend != Backend::cuda_sm90) return "";
  if (const std::string why = not_sm90_reason(); !why.empty()) return why;
  const TensorView q =
      TensorView::contiguous(nullptr, DType::bf16, {1, 1, 1, 64}, Device::cuda(0));
  AttentionOptions opt;
  opt.backend = Backend::cuda_sm90;
  try {
    (void)select_backend(q, opt);
  } catch (const Error& e) {
    return e.what();  // e.g. no sm90a kernel in this build
  }
  return "";
}

// ---- backward -----------------------------------------------------------------------------------

// Error bound: max |grad - ref| over the tensor, relative to max |ref| (floored at 0.1 so that
// gradients that are ~0 everywhere are held to an absolute bound). The kernel rounds P and dS
// to the input dtype before the products (as FlashAttention does) and rounds each gradient
// once at the end; everything else is fp32. bf16 (8 significant bits): 2^-9 relative per
// rounded factor, accumulated over up to 1000 rows with partial cancellation -> 2e-2.
// fp16 (11 bits): 8x tighter -> 5e-3.
inline double grad_bound(DType t) { return t == DType::bf16 ? 2e-2 : 5e-3; }

struct BwdCase : CaseBase {
  bool deterministic = false;
  // Keep the GPU busy while each run after the first runs: a memset of a different size per
  // run on a second (non-blocking) stream, so the backward's CTAs get SMs at other times and
  // finish in another order than in the first run.
  bool busy_gpu = false;
  std::int64_t workspace_shortfall = 0;  // give this many bytes less than asked for
  std::int64_t workspace_misalign = 0;   // start the workspace this many bytes past alignment
  std::uint64_t seed = 3;
};

inline std::string describe(const BwdCase& c) {
  return describe(static_cast<const CaseBase&>(c)) + (c.deterministic ? " deterministic" : "");
}

struct BwdResult {
  bool not_built = false;  // no kernel for the case in this build: nothing ran, fields empty
  std::vector<float> dq, dk, dv;  // GPU (last run), logical order
  std::vector<float> ref_dq, ref_dk, ref_dv;
  std::vector<std::vector<std::uint16_t>> bits;  // per run: dq, dk, dv memory images, joined
  RunInfo info;
};

// Runs the case `repeats` times on the GPU (gradients and workspace poisoned before each run)
// and once on the reference, on exactly the GPU's inputs: q, k, v, dout rounded to the dtype,
// out = the reference forward rounded to the dtype, lse from the reference.
inline void run_case(const BwdCase& c, BwdResult& r, int repeats = 1) {
  const Geometry g = geometry_of(c);
  const std::int64_t nq = g.q.elements(), nk = g.k.elements(), nl = g.lse.elements();
  const std::int64_t nv = g.v.elements(), no = g.o.elements();
  std::vector<float> q(nq), k(nk), v(nv), dout(no), out(no), lse(nl);
  fill_rounded(c.dtype, c.seed, {&q, &k, &v, &dout});
  AttentionOptions opt = options_of(c);
  opt.deterministic = c.deterministic;
  reference_forward(g, opt, q, k, v, out, lse);
  for (float& x : out) x = test::round_to(c.dtype, x);

  DeviceBuffer gq(nq * 2), gk(nk * 2), gv(nv * 2), gout(no * 2), gdout(no * 2),
      glse(std::max<std::int64_t>(nl, 1) * 4), gdq(nq * 2), gdk(nk * 2), gdv(nv * 2),
      gcu_q(g.cu_q.size() * 4), gcu_k(g.cu_k.size() * 4);
  upload(gq, image(c.dtype, q, g.q));
  upload(gk, image(c.dtype, k, g.k));
  upload(gv, image(c.dtype, v, g.v));
  upload(gout, image(c.dtype, out, g.o));
  upload(gdout, image(c.dtype, dout, g.o));
  upload(glse, lse);
  upload(gcu_q, g.cu_q);
  upload(gcu_k, g.cu_k);

  const TensorView tq = device_view(gq, c.dtype, g.q), tk = device_view(gk, c.dtype, g.k),
                   tv = device_view(gv, c.dtype, g.v), tout = device_view(gout, c.dtype, g.o),
                   tdout = device_view(gdout, c.dtype, g.o),
                   tlse = device_view(glse, DType::fp32, g.lse),
                   tdq = device_view(gdq, c.dtype, g.q), tdk = device_view(gdk, c.dtype, g.k),
                   tdv = device_view(gdv, c.dtype, g.v);
  const MemLayout cu{{g.B + 1}, {1}};
  const TensorView tcu_q = device_view(gcu_q, DType::int32, cu);
  const TensorView tcu_k = device_view(gcu_k, DType::int32, cu);

  const std::size_t need =
      c.varlen() ? backward_varlen_workspace_size(tq, tk, tv, tcu_q, tcu_k, g.max_q, g.max_k, opt)
                 : backward_workspace_size(tq, tk, tv, opt);
  const std::size_t give = need - std::size_t(c.workspace_shortfall);
  DeviceBuffer ws_buffer(std::max<std::size_t>(give + c.workspace_misalign, 1));
  void* ws_ptr = static_cast<char*>(ws_buffer.ptr) + c.workspace_misalign;
  std::vector<std::uint16_t> img_dq, img_dk, img_dv;
  constexpr std::size_t kBusyBytes = std::size_t(256) << 20;
  DeviceBuffer busy(c.busy_gpu ? kBusyBytes : 0);
  cudaStream_t side = nullptr;
  if (c.busy_gpu) cuda_ok(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  for (int rep = 0; rep < repeats; ++rep) {
    cuda_ok(cudaMemset(gdq.ptr, 0xFF, nq * 2));  // NaN in fp16 and bf16
    cuda_ok(cudaMemset(gdk.ptr, 0xFF, nk * 2));
    cuda_ok(cudaMemset(gdv.ptr, 0xFF, nv * 2));
    // The workspace is poisoned too: nothing may rely on it being zero.
    cuda_ok(cudaMemset(ws_ptr, 0xFF, give));
    if (c.busy_gpu && rep > 0) {
      cuda_ok(cudaDeviceSynchronize());  // the poison is written before the side work starts
      cuda_ok(cudaMemsetAsync(busy.ptr, rep, kBusyBytes >> (rep % 4), side));
    }
    const Workspace w{ws_ptr, give};
    r.info = c.varlen() ? backward_varlen(tq, tk, tv, tout, tdout, tlse, tdq, tdk, tdv, tcu_q,
                                          tcu_k, g.max_q, g.max_k, opt, nullptr, w)
                        : backward(tq, tk, tv, tout, tdout, tlse, tdq, tdk, tdv, opt, nullptr, w);
    cuda_ok(cudaDeviceSynchronize());
    img_dq = download<std::uint16_t>(gdq, nq);
    img_dk = download<std::uint16_t>(gdk, nk);
    img_dv = download<std::uint16_t>(gdv, nv);
    std::vector<std::uint16_t> joined = img_dq;
    joined.insert(joined.end(), img_dk.begin(), img_dk.end());
    joined.insert(joined.end(), img_dv.begin(), img_dv.end());
    r.bits.push_back(std::move(joined));
  }
  if (side != nullptr) cuda_ok(cudaStreamDestroy(side));
  r.dq = logical(c.dtype, img_dq, g.q);
  r.dk = logical(c.dtype, img_dk, g.k);
  r.dv = logical(c.dtype, img_dv, g.v);

  r.ref_dq.assign(nq, 0.f);
  r.ref_dk.assign(nk, 0.f);
  r.ref_dv.assign(nv, 0.f);
  AttentionOptions ropt = opt;
  ropt.backend = Backend::cpu_reference;
  const TensorView rq = host_view(q, g.q.shape), rk = host_view(k, g.k.shape),
                   rv = host_view(v, g.v.shape), ro = host_view(out, g.o.shape),
                   rdo = host_view(dout, g.o.shape), rl = host_view(lse, g.lse.shape),
                   rdq = host_view(r.ref_dq, g.q.shape), rdk = host_view(r.ref_dk, g.k.shape),
                   rdv = host_view(r.ref_dv, g.v.shape);
  if (c.varlen()) {
    std::vector<int> cq = g.cu_q, ck = g.cu_k;
    const TensorView hcq = TensorView::contiguous(cq.data(), DType::int32, {g.B + 1});
    const TensorView hck = TensorView::contiguous(ck.data(), DType::int32, {g.B + 1});
    backward_varlen(rq, rk, rv, ro, rdo, rl, rdq, rdk, rdv, hcq, hck, g.max_q, g.max_k, ropt);
  } else {
    backward(rq, rk, rv, ro, rdo, rl, rdq, rdk, rdv, ropt);
  }
}

inline void expect_grad_close(const char* name, DType t, const std::vector<float>& x,
                              const std::vector<float>& ref) {
  double max_ref = 0, max_err = 0;
  std::int64_t non_finite = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    max_ref = std::max(max_ref, double(std::fabs(ref[i])));
    if (!std::isfinite(x[i])) {
      ++non_finite;
      continue;
    }
    max_err = std::max(max_err, std::fabs(double(x[i]) - ref[i]));
  }
  const double rel = max_err / std::max(max_ref, 0.1);
  EXPECT_EQ(non_finite, 0) << name << ": non-finite elements";
  EXPECT_LE(rel, grad_bound(t)) << name << ": max |err| " << max_err << ", max |ref| " << max_ref;
}

// Runs the case `repeats` times, checks the last run against the reference and, with more
// than one run, that every run gave the same bits. A case whose kernel this build lacks is
// recorded for report_unbuilt_cases() and returned with not_built set, unchecked.
inline BwdResult check(const BwdCase& c, int repeats = 1) {
  SCOPED_TRACE(describe(c));
  BwdResult r;
  run_built_case(c, r, repeats);
  if (r.not_built) return r;
  expect_ran_on(c, r.info, "bwd_");
  EXPECT_EQ(std::string(r.info.kernel).find("_deterministic") != std::string::npos,
            c.deterministic)
      << r.info.kernel;
  expect_grad_close("dq", c.dtype, r.dq, r.ref_dq);
  expect_grad_close("dk", c.dtype, r.dk, r.ref_dk);
  expect_grad_close("dv", c.dtype, r.dv, r.ref_dv);
  for (std::size_t i = 1; i < r.bits.size(); ++i)
    EXPECT_TRUE(r.bits[i] == r.bits[0]) << "run " << i << " differs from run 0 in some bit";
  return r;
}

// The message of the flashcpp::Error that running case `c` must raise (a test failure and ""
// when it runs instead): for the tests of refused calls.
template <class Result, class Case>
std::string error_of(const Case& c) {
  Result r;
  try {
    run_case(c, r);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected flashcpp::Error";
  return "";
}

// Why the backward tests of `backend` cannot run here, or empty when they can: for sm90, a
// 1 x 1 bf16 d64 call tells whether this build has the sm90a backward kernel and this GPU
// can run it.
inline std::string backward_skip_reason(Backend backend) {
  if (!cuda_available()) return "no CUDA GPU";
  if (backend != Backend::cuda_sm90) return "";
  if (const std::string why = not_sm90_reason(); !why.empty()) return why;
  try {
    BwdCase c;
    c.backend = c.expect = Backend::cuda_sm90;
    BwdResult r;
    run_case(c, r);
    if (r.info.backend != Backend::cuda_sm90)
      return std::string("a bf16 d64 backward ran on ") + backend_name(r.info.backend);
  } catch (const Error& e) {
    return e.what();  // e.g. no backward kernel for d64 in this build
  }
  return "";
}

// ---- D != Dv: shared by the forward and backward suites ----

// `c` with head dims D = d and Dv = dv.
template <class Case>
Case pair_case(Case c, int d, int dv) {
  c.D = d;
  c.Dv = dv;
  return c;
}

// The kernel a D != Dv case must report: the sm90a `pass` ("fwd", "bwd") of its dtype and the
// pair, e.g. "sm90_fwd_bf16_hdim192x128_...".
template <class Case, class Result>
void expect_pair_kernel(const char* pass, const Case& c, const Result& r, const std::string& pair) {
  if (r.not_built) return;
  const std::string prefix =
      std::string("sm90_") + pass + "_" + dtype_name(c.dtype) + "_hdim" + pair + "_";
  EXPECT_EQ(std::string(r.info.kernel).rfind(prefix, 0), 0u) << describe(c) << ": " << r.info.kernel;
}

}  // namespace flashcpp::cuda_test

#endif  // FLASHCPP_TEST_WITH_CUDA
