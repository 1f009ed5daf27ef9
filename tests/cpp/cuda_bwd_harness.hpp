// The GPU backward test harness of cuda_backward_test.cpp (sm80) and
// cuda_sm90_backward_test.cpp: one backward problem (BwdCase) run on the GPU on poisoned
// gradients and on the float64 reference backward (Backend::cpu_reference on host copies of
// exactly the GPU's inputs: q, k, v, dout rounded to the dtype, out = the reference forward
// rounded to the dtype, lse from the reference), and the error bounds. BwdCase::backend is the
// backend the call requests, BwdCase::expect the one it must report. Everything here needs
// CUDA: in a build without it the header is empty.
#pragma once

#ifdef FLASHCPP_TEST_WITH_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_harness.hpp"
#include "flashcpp/flashcpp.hpp"

namespace flashcpp::cuda_test {

// Error bound: max |grad - ref| over the tensor, relative to max |ref| (floored at 0.1 so that
// gradients that are ~0 everywhere are held to an absolute bound). The kernel rounds P and dS
// to the input dtype before the products (as FlashAttention does) and rounds each gradient
// once at the end; everything else is fp32. bf16 (8 significant bits): 2^-9 relative per
// rounded factor, accumulated over up to 1000 rows with partial cancellation -> 2e-2.
// fp16 (11 bits): 8x tighter -> 5e-3.
inline double grad_bound(DType t) { return t == DType::bf16 ? 2e-2 : 5e-3; }

struct BwdCase {
  int B = 1, Nq = 1, Nk = 1, Hq = 1, Hkv = 1, D = 64;
  DType dtype = DType::bf16;
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0.f;
  bool bhsd = false;
  std::int64_t workspace_shortfall = 0;  // give this many bytes less than asked for
  std::uint64_t seed = 3;
  // The backend the call requests (AttentionOptions::backend), and the one it must report:
  // check() tests RunInfo's backend and that the kernel name starts "sm80_bwd_" or
  // "sm90_bwd_" accordingly.
  Backend backend = Backend::cuda_sm80;
  Backend expect = Backend::cuda_sm80;
};

inline std::string describe(const BwdCase& c) {
  return "B=" + std::to_string(c.B) + " Nq=" + std::to_string(c.Nq) + " Nk=" +
         std::to_string(c.Nk) + " H=" + std::to_string(c.Hq) + "/" + std::to_string(c.Hkv) +
         " D=" + std::to_string(c.D) + " " + dtype_name(c.dtype) +
         (c.causal ? " causal" : "") + " window=(" + std::to_string(c.wl) + "," +
         std::to_string(c.wr) + ") softcap=" + std::to_string(c.softcap) +
         (c.bhsd ? " bhsd" : " bshd") + " backend=" + backend_name(c.backend);
}

struct BwdResult {
  std::vector<float> dq, dk, dv;            // GPU, logical [B, N, H, D]
  std::vector<float> ref_dq, ref_dk, ref_dv;
  RunInfo info;
};

// Logical [B, N, H, D] -> memory offset in the case's layout.
inline std::int64_t mem_offset(const BwdCase& c, std::int64_t i, int n, int h) {
  const int d = int(i % c.D);
  i /= c.D;
  const int hh = int(i % h);
  i /= h;
  const int nn = int(i % n);
  const std::int64_t b = i / n;
  if (c.bhsd) return ((b * h + hh) * n + nn) * c.D + d;
  return ((b * n + nn) * h + hh) * c.D + d;
}

inline std::vector<std::int64_t> strides(const BwdCase& c, int n, int h) {
  const std::int64_t D = c.D;
  if (c.bhsd) return {h * n * D, D, n * D, 1};
  return {n * h * D, h * D, D, 1};
}

inline TensorView host_view(std::vector<float>& x, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> st(shape.size());
  std::int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= shape[i];
  }
  return make_view(x.data(), DType::fp32, shape, st, Device{});
}

inline void run_bwd_case(const BwdCase& c, BwdResult& r) {
  const std::int64_t nq = std::int64_t(c.B) * c.Nq * c.Hq * c.D;
  const std::int64_t nk = std::int64_t(c.B) * c.Nk * c.Hkv * c.D;
  const std::int64_t nl = std::int64_t(c.B) * c.Hq * c.Nq;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> q(nq), k(nk), v(nk), dout(nq), out(nq), lse(nl);
  for (auto* t : {&q, &k, &v, &dout})
    for (float& x : *t) x = test::round_to(c.dtype, normal(rng));

  AttentionOptions opt;
  opt.causal = c.causal;
  opt.window_left = c.wl;
  opt.window_right = c.wr;
  opt.softcap = c.softcap;
  AttentionOptions ropt = opt;
  ropt.backend = Backend::cpu_reference;
  opt.backend = c.backend;
  const std::vector<std::int64_t> sq{c.B, c.Nq, c.Hq, c.D}, sk{c.B, c.Nk, c.Hkv, c.D},
      sl{c.B, c.Hq, c.Nq};
  {
    TensorView rl = host_view(lse, sl);
    forward(host_view(q, sq), host_view(k, sk), host_view(v, sk), host_view(out, sq), &rl, ropt);
    for (float& x : out) x = test::round_to(c.dtype, x);
  }

  auto image = [&](const std::vector<float>& x, int n, int h) {
    std::vector<std::uint16_t> m(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) m[mem_offset(c, i, n, h)] = to_bits(c.dtype, x[i]);
    return m;
  };
  auto upload = [&](DeviceBuffer& dst, const std::vector<std::uint16_t>& img) {
    cuda_ok(cudaMemcpy(dst.ptr, img.data(), img.size() * 2, cudaMemcpyHostToDevice));
  };
  DeviceBuffer gq(nq * 2), gk(nk * 2), gv(nk * 2), gout(nq * 2), gdout(nq * 2),
      glse(std::max<std::int64_t>(nl, 1) * 4), gdq(nq * 2), gdk(nk * 2), gdv(nk * 2);
  upload(gq, image(q, c.Nq, c.Hq));
  upload(gk, image(k, c.Nk, c.Hkv));
  upload(gv, image(v, c.Nk, c.Hkv));
  upload(gout, image(out, c.Nq, c.Hq));
  upload(gdout, image(dout, c.Nq, c.Hq));
  cuda_ok(cudaMemcpy(glse.ptr, lse.data(), nl * 4, cudaMemcpyHostToDevice));
  cuda_ok(cudaMemset(gdq.ptr, 0xFF, nq * 2));  // NaN in fp16 and bf16
  cuda_ok(cudaMemset(gdk.ptr, 0xFF, nk * 2));
  cuda_ok(cudaMemset(gdv.ptr, 0xFF, nk * 2));

  const Device gpu = Device::cuda(0);
  const auto stq = strides(c, c.Nq, c.Hq), stk = strides(c, c.Nk, c.Hkv);
  const TensorView tq = make_view(gq.ptr, c.dtype, sq, stq, gpu);
  const TensorView tk = make_view(gk.ptr, c.dtype, sk, stk, gpu);
  const TensorView tv = make_view(gv.ptr, c.dtype, sk, stk, gpu);
  const TensorView tout = make_view(gout.ptr, c.dtype, sq, stq, gpu);
  const TensorView tdout = make_view(gdout.ptr, c.dtype, sq, stq, gpu);
  const TensorView tlse =
      make_view(glse.ptr, DType::fp32, sl, {std::int64_t(c.Hq) * c.Nq, c.Nq, 1}, gpu);
  const TensorView tdq = make_view(gdq.ptr, c.dtype, sq, stq, gpu);
  const TensorView tdk = make_view(gdk.ptr, c.dtype, sk, stk, gpu);
  const TensorView tdv = make_view(gdv.ptr, c.dtype, sk, stk, gpu);

  const std::size_t need = backward_workspace_size(tq, tk, tv, opt);
  const std::size_t give = need - std::size_t(c.workspace_shortfall);
  DeviceBuffer ws(std::max<std::size_t>(give, 1));
  r.info = backward(tq, tk, tv, tout, tdout, tlse, tdq, tdk, tdv, opt, nullptr,
                    Workspace{ws.ptr, give});
  cuda_ok(cudaDeviceSynchronize());

  auto download = [&](DeviceBuffer& src, std::int64_t count, int n, int h) {
    std::vector<std::uint16_t> img(count);
    cuda_ok(cudaMemcpy(img.data(), src.ptr, count * 2, cudaMemcpyDeviceToHost));
    std::vector<float> x(count);
    for (std::int64_t i = 0; i < count; ++i) x[i] = from_bits(c.dtype, img[mem_offset(c, i, n, h)]);
    return x;
  };
  r.dq = download(gdq, nq, c.Nq, c.Hq);
  r.dk = download(gdk, nk, c.Nk, c.Hkv);
  r.dv = download(gdv, nk, c.Nk, c.Hkv);

  r.ref_dq.assign(nq, 0.f);
  r.ref_dk.assign(nk, 0.f);
  r.ref_dv.assign(nk, 0.f);
  backward(host_view(q, sq), host_view(k, sk), host_view(v, sk), host_view(out, sq),
           host_view(dout, sq), host_view(lse, sl), host_view(r.ref_dq, sq),
           host_view(r.ref_dk, sk), host_view(r.ref_dv, sk), ropt);
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

inline BwdResult check(const BwdCase& c) {
  SCOPED_TRACE(describe(c));
  BwdResult r;
  run_bwd_case(c, r);
  EXPECT_EQ(r.info.backend, c.expect);
  const char* prefix = c.expect == Backend::cuda_sm90 ? "sm90_bwd_" : "sm80_bwd_";
  EXPECT_EQ(std::string(r.info.kernel).rfind(prefix, 0), 0u) << r.info.kernel;
  expect_grad_close("dq", c.dtype, r.dq, r.ref_dq);
  expect_grad_close("dk", c.dtype, r.dk, r.ref_dk);
  expect_grad_close("dv", c.dtype, r.dv, r.ref_dv);
  return r;
}

}  // namespace flashcpp::cuda_test

#endif  // FLASHCPP_TEST_WITH_CUDA
