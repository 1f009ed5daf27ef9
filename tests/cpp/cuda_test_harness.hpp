// The GPU test harness of cuda_forward_test.cpp (sm80) and cuda_sm90_forward_test.cpp: one
// attention problem (Case) run on the GPU on poisoned outputs and on the float64 reference
// (Backend::cpu_reference on host copies of the same rounded inputs), the error bounds, and the
// checks both suites make. Case::backend is the backend the call requests, Case::expect the one
// it must report. Cases whose kernel a subset build lacks are recorded, not failed
// (unbuilt_cases.hpp). Everything here needs CUDA: in a build without it the header is empty.
#pragma once

#ifdef FLASHCPP_TEST_WITH_CUDA

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/half.hpp"
#include "flashcpp/flashcpp.hpp"
#include "test_util.hpp"
#include "unbuilt_cases.hpp"

namespace flashcpp::cuda_test {

inline void cuda_ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// Why device 0 cannot run the sm90a suites (no GPU, or not sm90), or empty when it can.
inline std::string not_sm90_reason() {
  if (!cuda_available()) return "no CUDA GPU";
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

inline std::uint16_t to_bits(DType t, float x) {
  return t == DType::bf16 ? detail::float_to_bf16(x) : detail::float_to_fp16(x);
}
inline float from_bits(DType t, std::uint16_t b) {
  return t == DType::bf16 ? detail::bf16_to_float(b) : detail::fp16_to_float(b);
}

// One attention problem. Logical tensors are [B, N, H, D]; bhsd stores them as [B, H, N, D].
// Varlen when seqlens_q is non-empty (then B = seqlens_q.size(), tensors [total, H, D]).
struct Case {
  int B = 1, Nq = 1, Nk = 1, Hq = 1, Hkv = 1, D = 64;
  DType dtype = DType::bf16;
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0.f;
  bool bhsd = false;
  int num_splits = 0;
  bool give_workspace = true;
  std::vector<int> seqlens_q, seqlens_k;
  std::uint64_t seed = 1;
  // The backend the call requests (AttentionOptions::backend), and the one it must report:
  // expect_close checks RunInfo's backend and that the kernel's name starts "sm80_fwd_" or
  // "sm90_fwd_" accordingly.
  Backend backend = Backend::cuda_sm80;
  Backend expect = Backend::cuda_sm80;
};

inline std::string describe(const Case& c) {
  return "B=" + std::to_string(c.B) + " Nq=" + std::to_string(c.Nq) + " Nk=" +
         std::to_string(c.Nk) + " H=" + std::to_string(c.Hq) + "/" + std::to_string(c.Hkv) +
         " D=" + std::to_string(c.D) + " " + dtype_name(c.dtype) + (c.causal ? " causal" : "") +
         " window=(" + std::to_string(c.wl) + "," + std::to_string(c.wr) + ") softcap=" +
         std::to_string(c.softcap) + (c.bhsd ? " bhsd" : " bshd") +
         " splits=" + std::to_string(c.num_splits) + (c.seqlens_q.empty() ? "" : " varlen");
}

struct Result {
  // The build has no kernel for the case (a FLASHCPP_HEAD_DIMS / FLASHCPP_DTYPES /
  // FLASHCPP_CUDA_ARCHS subset): nothing ran, the fields below are empty, and the case is
  // reported by report_unbuilt_cases().
  bool not_built = false;
  std::vector<float> out, lse;        // kernel, logical order
  std::vector<float> ref_out, ref_lse;
  std::vector<std::uint16_t> out_bits;  // raw, for determinism checks
  RunInfo info;
};

// Strides in elements of a logical [B, N, H, D] tensor (or [total, H, D] when varlen).
inline std::vector<std::int64_t> strides_of(const Case& c, std::int64_t n, std::int64_t h,
                                            std::int64_t d, bool varlen) {
  if (varlen) return {h * d, d, 1};
  if (c.bhsd) return {h * n * d, d, n * d, 1};
  return {n * h * d, h * d, d, 1};
}

inline TensorView make_view(void* data, DType t, const std::vector<std::int64_t>& shape,
                            const std::vector<std::int64_t>& stride, Device dev) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.rank = int(shape.size());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[i] = shape[i];
    v.stride[i] = stride[i];
  }
  v.device = dev;
  return v;
}

// Runs the case on the GPU and on the reference; fills `r`.
inline void run_case(const Case& c, Result& r, int repeats = 1) {
  const bool varlen = !c.seqlens_q.empty();
  std::vector<int> cu_q{0}, cu_k{0};
  for (std::size_t b = 0; b < c.seqlens_q.size(); ++b) {
    cu_q.push_back(cu_q.back() + c.seqlens_q[b]);
    cu_k.push_back(cu_k.back() + c.seqlens_k[b]);
  }
  const int B = varlen ? int(c.seqlens_q.size()) : c.B;
  const std::int64_t rows_q = varlen ? cu_q.back() : std::int64_t(c.B) * c.Nq;
  const std::int64_t rows_k = varlen ? cu_k.back() : std::int64_t(c.B) * c.Nk;
  const int max_q = varlen ? *std::max_element(c.seqlens_q.begin(), c.seqlens_q.end()) : c.Nq;
  const int max_k = varlen ? *std::max_element(c.seqlens_k.begin(), c.seqlens_k.end()) : c.Nk;
  auto shape = [&](std::int64_t n, int h, int d) -> std::vector<std::int64_t> {
    if (varlen) return {n, h, d};
    return {B, n, h, d};
  };
  const std::vector<std::int64_t> sq = shape(varlen ? rows_q : c.Nq, c.Hq, c.D);
  const std::vector<std::int64_t> sk = shape(varlen ? rows_k : c.Nk, c.Hkv, c.D);
  const std::vector<std::int64_t> stq = strides_of(c, c.Nq, c.Hq, c.D, varlen);
  const std::vector<std::int64_t> stk = strides_of(c, c.Nk, c.Hkv, c.D, varlen);

  // Random normal values rounded to the dtype; the reference gets exactly these as fp32.
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const std::int64_t nq = rows_q * c.Hq * c.D, nk = rows_k * c.Hkv * c.D;
  std::vector<float> q(nq), k(nk), v(nk);
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = test::round_to(c.dtype, normal(rng));
  // Memory images in the test layout; logical index -> memory offset (same strides for all).
  auto offset = [&](std::int64_t i, const std::vector<std::int64_t>& shp,
                    const std::vector<std::int64_t>& st) {
    std::int64_t off = 0;
    for (int d = int(shp.size()) - 1; d >= 0; --d) {
      off += (i % shp[d]) * st[d];
      i /= shp[d];
    }
    return off;
  };
  auto image = [&](const std::vector<float>& x, const std::vector<std::int64_t>& shp,
                   const std::vector<std::int64_t>& st) {
    std::vector<std::uint16_t> m(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) m[offset(i, shp, st)] = to_bits(c.dtype, x[i]);
    return m;
  };
  const auto q_img = image(q, sq, stq), k_img = image(k, sk, stk), v_img = image(v, sk, stk);

  const Device gpu = Device::cuda(0);
  DeviceBuffer dq(nq * 2), dk(nk * 2), dv(nk * 2), dout(nq * 2),
      dlse(std::max<std::int64_t>(rows_q * c.Hq, 1) * 4);
  DeviceBuffer dcu_q(cu_q.size() * 4), dcu_k(cu_k.size() * 4);
  cuda_ok(cudaMemcpy(dq.ptr, q_img.data(), nq * 2, cudaMemcpyHostToDevice));
  cuda_ok(cudaMemcpy(dk.ptr, k_img.data(), nk * 2, cudaMemcpyHostToDevice));
  cuda_ok(cudaMemcpy(dv.ptr, v_img.data(), nk * 2, cudaMemcpyHostToDevice));
  cuda_ok(cudaMemcpy(dcu_q.ptr, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice));
  cuda_ok(cudaMemcpy(dcu_k.ptr, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice));

  AttentionOptions opt;
  opt.causal = c.causal;
  opt.window_left = c.wl;
  opt.window_right = c.wr;
  opt.softcap = c.softcap;
  opt.num_splits = c.num_splits;
  opt.backend = c.backend;
  const TensorView tq = make_view(dq.ptr, c.dtype, sq, stq, gpu);
  const TensorView tk = make_view(dk.ptr, c.dtype, sk, stk, gpu);
  const TensorView tv = make_view(dv.ptr, c.dtype, sk, stk, gpu);
  const TensorView tout = make_view(dout.ptr, c.dtype, sq, stq, gpu);
  const std::vector<std::int64_t> lse_shape =
      varlen ? std::vector<std::int64_t>{c.Hq, rows_q} : std::vector<std::int64_t>{B, c.Hq, c.Nq};
  const std::vector<std::int64_t> lse_stride =
      varlen ? std::vector<std::int64_t>{rows_q, 1}
             : std::vector<std::int64_t>{std::int64_t(c.Hq) * c.Nq, c.Nq, 1};
  const TensorView tlse = make_view(dlse.ptr, DType::fp32, lse_shape, lse_stride, gpu);
  const TensorView tcu_q = make_view(dcu_q.ptr, DType::int32, {B + 1}, {1}, gpu);
  const TensorView tcu_k = make_view(dcu_k.ptr, DType::int32, {B + 1}, {1}, gpu);

  std::size_t ws_bytes = 0;
  if (c.give_workspace && !varlen) ws_bytes = forward_workspace_size(tq, tk, tv, opt);
  if (c.give_workspace && varlen && c.num_splits > 1)
    ws_bytes = std::size_t(c.num_splits) * B * c.Hq * max_q * (c.D + 1) * 4;
  DeviceBuffer ws(ws_bytes);

  for (int rep = 0; rep < repeats; ++rep) {
    // Poison: 0xFF.. is NaN in fp16, bf16 and fp32, so any element not written shows up.
    cuda_ok(cudaMemset(dout.ptr, 0xFF, nq * 2));
    cuda_ok(cudaMemset(dlse.ptr, 0xFF, rows_q * c.Hq * 4));
    const Workspace w{ws.ptr, ws_bytes};
    r.info = varlen ? forward_varlen(tq, tk, tv, tout, &tlse, tcu_q, tcu_k, max_q, max_k, opt,
                                     nullptr, w)
                    : forward(tq, tk, tv, tout, &tlse, opt, nullptr, w);
    cuda_ok(cudaDeviceSynchronize());
    std::vector<std::uint16_t> img(nq);
    cuda_ok(cudaMemcpy(img.data(), dout.ptr, nq * 2, cudaMemcpyDeviceToHost));
    r.out_bits.resize(nq);
    for (std::int64_t i = 0; i < nq; ++i) r.out_bits[i] = img[offset(i, sq, stq)];
  }
  r.out.resize(nq);
  for (std::int64_t i = 0; i < nq; ++i) r.out[i] = from_bits(c.dtype, r.out_bits[i]);
  r.lse.resize(rows_q * c.Hq);
  cuda_ok(cudaMemcpy(r.lse.data(), dlse.ptr, r.lse.size() * 4, cudaMemcpyDeviceToHost));

  // Reference on dense fp32 host copies ([B, N, H, D] / [total, H, D], lse [B, H, N] / [H, total]).
  r.ref_out.assign(nq, 0.f);
  r.ref_lse.assign(rows_q * c.Hq, 0.f);
  AttentionOptions ropt = opt;
  ropt.backend = Backend::cpu_reference;
  ropt.num_splits = 0;
  auto host = [&](std::vector<float>& x, const std::vector<std::int64_t>& shp) {
    TensorView t;
    t.data = x.data();
    t.dtype = DType::fp32;
    t.rank = int(shp.size());
    std::int64_t s = 1;
    for (int i = t.rank - 1; i >= 0; --i) {
      t.shape[i] = shp[i];
      t.stride[i] = s;
      s *= shp[i];
    }
    return t;
  };
  TensorView rq = host(q, sq), rk = host(k, sk), rv = host(v, sk), ro = host(r.ref_out, sq),
             rl = host(r.ref_lse, lse_shape);
  if (varlen) {
    std::vector<int> cq = cu_q, ck = cu_k;
    TensorView hcq = TensorView::contiguous(cq.data(), DType::int32, {B + 1});
    TensorView hck = TensorView::contiguous(ck.data(), DType::int32, {B + 1});
    forward_varlen(rq, rk, rv, ro, &rl, hcq, hck, max_q, max_k, ropt);
  } else {
    forward(rq, rk, rv, ro, &rl, ropt);
  }
}

// Error bounds against the float64 reference, unit-variance inputs:
//  out: the kernel rounds P to the input dtype before P V (as FlashAttention does) and rounds
//  O to it at the end. bf16 has 8 significant bits: |O| up to ~3 rounds by up to ~0.008, plus
//  P rounding (2^-9 relative per weight) -> 2e-2. fp16 has 11 bits -> 4e-3.
//  lse: computed in fp32 from exactly the reference's inputs; the only error is fp32
//  accumulation of the dot products and sums -> 1e-3 absolute (observed ~1e-5).
inline double out_bound(DType t) { return t == DType::bf16 ? 2e-2 : 4e-3; }
constexpr double kLseBound = 1e-3;

inline void expect_close(const Case& c, const Result& r) {
  SCOPED_TRACE(describe(c));
  EXPECT_EQ(r.info.backend, c.expect);
  const char* prefix = c.expect == Backend::cuda_sm90 ? "sm90_fwd_" : "sm80_fwd_";
  EXPECT_EQ(std::string(r.info.kernel).rfind(prefix, 0), 0u) << r.info.kernel;
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

// run_case, except that a case whose kernel this build lacks is recorded for
// report_unbuilt_cases() and sets r.not_built instead of failing; other errors still throw.
inline void run_built_case(const Case& c, Result& r, int repeats = 1) {
  try {
    run_case(c, r, repeats);
  } catch (const Error& e) {
    if (!record_if_unbuilt(describe(c), e)) throw;
    r.not_built = true;
  }
}

// run_built_case then, when it ran, expect_close; returns the result for further checks, which
// must skip a result with not_built set.
inline Result check(const Case& c) {
  Result r;
  run_built_case(c, r);
  if (!r.not_built) expect_close(c, r);
  return r;
}

// ---- checks both suites make, on top of a base case (backend, expect, num_splits) ----------

// A 64 x 64, d64 call reports the expected backend, a kernel whose name holds `kernel_part`,
// and no split.
inline void check_reports_backend_and_kernel(Case c, const char* kernel_part) {
  c.Nq = c.Nk = 64;
  Result r;
  run_built_case(c, r);
  if (r.not_built) return;
  EXPECT_EQ(r.info.backend, c.expect);
  EXPECT_NE(std::string(r.info.kernel).find(kernel_part), std::string::npos) << r.info.kernel;
  EXPECT_EQ(r.info.num_splits, 1);
}

// bf16 and fp16, every head dim, causal or not: B 2, 2 heads, Nq 113, Nk 203.
inline void check_every_head_dim_and_dtype(const Case& base) {
  for (DType t : {DType::bf16, DType::fp16})
    for (int d : {32, 64, 80, 96, 128, 192, 256})
      for (bool causal : {false, true}) {
        Case c = base;
        c.dtype = t;
        c.D = d;
        c.B = 2;
        c.Hq = c.Hkv = 2;
        c.Nq = 113;
        c.Nk = 203;
        c.causal = causal;
        check(c);
      }
}

// Each {Nq, Nk} of `lengths`, causal or not, at head dim d with 2 heads.
inline void check_sequence_lengths(const Case& base, int d,
                                   std::initializer_list<std::pair<int, int>> lengths) {
  for (auto [nq, nk] : lengths)
    for (bool causal : {false, true}) {
      Case c = base;
      c.Nq = nq;
      c.Nk = nk;
      c.D = d;
      c.Hq = 2;
      c.Hkv = 2;
      c.causal = causal;
      check(c);
    }
}

// GQA, MQA and MHA heads x windows x softcap 0 or 5: Nq 150, Nk 260, d64.
inline void check_window_softcap_gqa_mqa(const Case& base) {
  for (auto [hq, hkv] : {std::pair{8, 1}, {8, 8}, {16, 2}})
    for (auto [wl, wr] : {std::pair{-1, -1}, {32, 0}, {17, 5}, {-1, 40}, {0, 0}})
      for (float softcap : {0.f, 5.f}) {
        Case c = base;
        c.Hq = hq;
        c.Hkv = hkv;
        c.Nq = 150;
        c.Nk = 260;
        c.D = 64;
        c.wl = wl;
        c.wr = wr;
        c.softcap = softcap;
        check(c);
      }
}

// [B, H, N, D] strides, causal or not: B 2, 4/2 heads, Nq 200, Nk 333, d128.
inline void check_bhsd_strides(const Case& base) {
  for (bool causal : {false, true}) {
    Case c = base;
    c.bhsd = true;
    c.B = 2;
    c.Hq = 4;
    c.Hkv = 2;
    c.Nq = 200;
    c.Nk = 333;
    c.D = 128;
    c.causal = causal;
    check(c);
  }
}

// Varlen with an empty query and an empty key sequence, 4/1 heads, d64, causal or not.
inline void check_varlen_with_empty_sequence(const Case& base) {
  for (bool causal : {false, true}) {
    Case c = base;
    c.seqlens_q = {17, 0, 130, 1, 64};
    c.seqlens_k = {40, 5, 130, 0, 300};
    c.Hq = 4;
    c.Hkv = 1;
    c.D = 64;
    c.causal = causal;
    check(c);
  }
}

inline void check_rows_without_visible_keys(Case c) {
  c.Nq = 10;
  c.Nk = 4;
  c.causal = true;  // bottom-right: row i sees j <= i - 6, rows 0..5 see nothing
  c.D = 64;
  const Result r = check(c);
  for (int i = 0; !r.not_built && i < 6; ++i) {
    EXPECT_TRUE(std::isinf(r.lse[i]) && r.lse[i] < 0) << "row " << i << " lse " << r.lse[i];
    for (int d = 0; d < c.D; ++d) EXPECT_EQ(r.out[i * c.D + d], 0.f) << "row " << i;
  }
}

// Split-KV forced to 3 splits: B 2, 4/2 heads, Nq 77, Nk 1000, d128. Returns the result.
inline Result check_split_kv_forced(Case c) {
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 2;
  c.Nq = 77;
  c.Nk = 1000;
  c.D = 128;
  c.num_splits = 3;
  const Result r = check(c);
  if (!r.not_built) {
    EXPECT_EQ(r.info.num_splits, 3);
  }
  return r;
}

// A decode shape the split heuristic splits: one query row, 8192 keys, 2 heads, d128.
inline Case decode_case(Case c) {
  c.Hq = c.Hkv = 2;
  c.Nq = 1;
  c.Nk = 8192;
  c.D = 128;
  return c;
}

// Causal, B 2, 4 heads, Nq 300, Nk 700 at head dim d: one run and three in a row give the same
// bits. An unbuilt case is recorded once and compares nothing.
inline void check_repeated_runs_bitwise_identical(Case c, int d) {
  c.B = 2;
  c.Hq = 4;
  c.Nq = 300;
  c.Nk = 700;
  c.D = d;
  c.causal = true;
  Result a, b;
  run_built_case(c, a);
  if (a.not_built) return;
  run_case(c, b, 3);
  EXPECT_EQ(a.out_bits, b.out_bits) << describe(c);
  EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0) << describe(c);
}

// K/V batch 1 starts 2^31 + 64 elements after batch 0 (one 4 GiB buffer holds both, aliased
// as K and V). Requests `backend`, expects `expect`; skips when 4 GiB cannot be allocated.
inline void check_offsets_beyond_2to31_elements(Backend backend, Backend expect) {
  const int B = 2, Nq = 64, Nk = 200, H = 2, D = 64;
  const std::int64_t batch_stride = (std::int64_t(1) << 31) + 64;
  const std::int64_t kv_elems = batch_stride + std::int64_t(Nk) * H * D;
  DeviceBuffer kv(kv_elems * 2);
  if (!kv.ptr) GTEST_SKIP() << "could not allocate 4 GiB";
  const DType t = DType::bf16;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> q(std::int64_t(B) * Nq * H * D), k(std::int64_t(B) * Nk * H * D);
  for (auto* x : {&q, &k})
    for (float& e : *x) e = test::round_to(t, normal(rng));
  std::vector<std::uint16_t> qb(q.size()), kb(k.size());
  for (std::size_t i = 0; i < q.size(); ++i) qb[i] = to_bits(t, q[i]);
  for (std::size_t i = 0; i < k.size(); ++i) kb[i] = to_bits(t, k[i]);
  const std::int64_t per_batch = std::int64_t(Nk) * H * D;
  cuda_ok(cudaMemcpy(kv.ptr, kb.data(), per_batch * 2, cudaMemcpyHostToDevice));
  cuda_ok(cudaMemcpy(static_cast<std::uint16_t*>(kv.ptr) + batch_stride, kb.data() + per_batch,
                     per_batch * 2, cudaMemcpyHostToDevice));
  DeviceBuffer dq(q.size() * 2), dout(q.size() * 2);
  cuda_ok(cudaMemcpy(dq.ptr, qb.data(), q.size() * 2, cudaMemcpyHostToDevice));
  cuda_ok(cudaMemset(dout.ptr, 0xFF, q.size() * 2));
  const Device gpu = Device::cuda(0);
  const TensorView tq = TensorView::contiguous(dq.ptr, t, {B, Nq, H, D}, gpu);
  const TensorView tkv =
      TensorView::strided(kv.ptr, t, {B, Nk, H, D}, {batch_stride, H * D, D, 1}, gpu);
  const TensorView tout = TensorView::contiguous(dout.ptr, t, {B, Nq, H, D}, gpu);
  AttentionOptions opt;
  opt.backend = backend;
  const RunInfo info = forward(tq, tkv, tkv, tout, nullptr, opt);
  cuda_ok(cudaDeviceSynchronize());
  EXPECT_EQ(info.backend, expect);
  std::vector<std::uint16_t> ob(q.size());
  cuda_ok(cudaMemcpy(ob.data(), dout.ptr, ob.size() * 2, cudaMemcpyDeviceToHost));

  std::vector<float> ref(q.size());
  AttentionOptions ropt;
  ropt.backend = Backend::cpu_reference;
  forward(TensorView::contiguous(q.data(), DType::fp32, {B, Nq, H, D}),
          TensorView::contiguous(k.data(), DType::fp32, {B, Nk, H, D}),
          TensorView::contiguous(k.data(), DType::fp32, {B, Nk, H, D}),
          TensorView::contiguous(ref.data(), DType::fp32, {B, Nq, H, D}), nullptr, ropt);
  double max_err = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(double(from_bits(t, ob[i])) - ref[i]);
    max_err = e != e ? INFINITY : std::max(max_err, e);
  }
  EXPECT_LE(max_err, out_bound(t));
}

}  // namespace flashcpp::cuda_test

#endif  // FLASHCPP_TEST_WITH_CUDA
