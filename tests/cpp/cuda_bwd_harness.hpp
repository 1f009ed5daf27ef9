// The GPU backward test harness of cuda_backward_test.cpp (sm80) and
// cuda_sm90_backward_test.cpp: one backward problem (BwdCase) run on the GPU on poisoned
// gradients and on the float64 reference backward (Backend::cpu_reference on host copies of
// exactly the GPU's inputs: q, k, v, dout rounded to the dtype, out = the reference forward
// rounded to the dtype, lse from the reference), repeated runs compared bit for bit, and the
// error bounds. BwdCase::backend is the
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
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_test_harness.hpp"
#include "flashcpp/flashcpp.hpp"
#include "unbuilt_cases.hpp"

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
  bool deterministic = false;
  // Varlen when non-empty: B = their size, tensors [total, H, D], lse [Hq, total_q].
  std::vector<int> seqlens_q, seqlens_k;
  std::int64_t workspace_shortfall = 0;  // give this many bytes less than asked for
  std::int64_t workspace_misalign = 0;   // start the workspace this many bytes past alignment
  std::uint64_t seed = 3;
  // The backend the call requests (AttentionOptions::backend), and the one it must report:
  // check() tests RunInfo's backend and that the kernel name starts "sm80_bwd_" or
  // "sm90_bwd_" accordingly.
  Backend backend = Backend::cuda_sm80;
  Backend expect = Backend::cuda_sm80;

  bool varlen() const { return !seqlens_q.empty(); }
};

inline std::string describe(const BwdCase& c) {
  std::string lengths = "Nq=" + std::to_string(c.Nq) + " Nk=" + std::to_string(c.Nk);
  if (c.varlen()) {
    lengths = "varlen q/k=";
    for (std::size_t b = 0; b < c.seqlens_q.size(); ++b)
      lengths += (b ? "," : "") + std::to_string(c.seqlens_q[b]) + "/" +
                 std::to_string(c.seqlens_k[b]);
  }
  return "B=" + std::to_string(c.B) + " " + lengths + " H=" + std::to_string(c.Hq) + "/" +
         std::to_string(c.Hkv) + " D=" + std::to_string(c.D) + " " + dtype_name(c.dtype) +
         (c.causal ? " causal" : "") + " window=(" + std::to_string(c.wl) + "," +
         std::to_string(c.wr) + ") softcap=" + std::to_string(c.softcap) +
         (c.bhsd ? " bhsd" : " bshd") + (c.deterministic ? " deterministic" : "") +
         " backend=" + backend_name(c.backend);
}

struct BwdResult {
  // The build has no kernel for the case (a FLASHCPP_HEAD_DIMS / FLASHCPP_DTYPES subset):
  // check() ran nothing, and the case is reported by report_unbuilt_cases().
  bool not_built = false;
  std::vector<float> dq, dk, dv;  // GPU (last run), logical [B, N, H, D] or [total, H, D]
  std::vector<float> ref_dq, ref_dk, ref_dv;
  std::vector<std::vector<std::uint16_t>> bits;  // per run: dq, dk, dv memory images, joined
  RunInfo info;
};

// A tensor's logical shape and its memory strides in the case's layout.
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

// q/k/v-like tensor with n rows per sequence (padded) or n rows in all (varlen), h heads.
inline MemLayout layout_of(const BwdCase& c, std::int64_t n, std::int64_t h) {
  const std::int64_t D = c.D;
  if (c.varlen()) return {{n, h, D}, {h * D, D, 1}};
  if (c.bhsd) return {{c.B, n, h, D}, {h * n * D, D, n * D, 1}};
  return {{c.B, n, h, D}, {n * h * D, h * D, D, 1}};
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

// Runs the case `repeats` times on the GPU (outputs poisoned before each run) and once on the
// float64 reference.
inline void run_bwd_case(const BwdCase& c, BwdResult& r, int repeats = 1) {
  const bool varlen = c.varlen();
  std::vector<int> cu_q{0}, cu_k{0};
  for (std::size_t b = 0; b < c.seqlens_q.size(); ++b) {
    cu_q.push_back(cu_q.back() + c.seqlens_q[b]);
    cu_k.push_back(cu_k.back() + c.seqlens_k[b]);
  }
  const int B = varlen ? int(c.seqlens_q.size()) : c.B;
  const int max_q = varlen ? *std::max_element(c.seqlens_q.begin(), c.seqlens_q.end()) : c.Nq;
  const int max_k = varlen ? *std::max_element(c.seqlens_k.begin(), c.seqlens_k.end()) : c.Nk;
  const MemLayout lq = layout_of(c, varlen ? cu_q.back() : c.Nq, c.Hq);
  const MemLayout lk = layout_of(c, varlen ? cu_k.back() : c.Nk, c.Hkv);
  const std::int64_t nq = lq.elements(), nk = lk.elements();
  const std::int64_t rows_q = varlen ? cu_q.back() : std::int64_t(B) * c.Nq;
  const std::int64_t nl = rows_q * c.Hq;
  const std::vector<std::int64_t> sl =
      varlen ? std::vector<std::int64_t>{c.Hq, rows_q} : std::vector<std::int64_t>{B, c.Hq, c.Nq};

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
  opt.deterministic = c.deterministic;
  AttentionOptions ropt = opt;
  ropt.backend = Backend::cpu_reference;
  opt.backend = c.backend;
  std::vector<int> hcu_q = cu_q, hcu_k = cu_k;
  const TensorView hcq = TensorView::contiguous(hcu_q.data(), DType::int32, {B + 1});
  const TensorView hck = TensorView::contiguous(hcu_k.data(), DType::int32, {B + 1});
  {
    TensorView rl = host_view(lse, sl);
    if (varlen)
      forward_varlen(host_view(q, lq.shape), host_view(k, lk.shape), host_view(v, lk.shape),
                     host_view(out, lq.shape), &rl, hcq, hck, max_q, max_k, ropt);
    else
      forward(host_view(q, lq.shape), host_view(k, lk.shape), host_view(v, lk.shape),
              host_view(out, lq.shape), &rl, ropt);
    for (float& x : out) x = test::round_to(c.dtype, x);
  }

  auto image = [&](const std::vector<float>& x, const MemLayout& l) {
    std::vector<std::uint16_t> m(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) m[l.offset(i)] = to_bits(c.dtype, x[i]);
    return m;
  };
  auto upload = [&](DeviceBuffer& dst, const std::vector<std::uint16_t>& img) {
    cuda_ok(cudaMemcpy(dst.ptr, img.data(), img.size() * 2, cudaMemcpyHostToDevice));
  };
  DeviceBuffer gq(nq * 2), gk(nk * 2), gv(nk * 2), gout(nq * 2), gdout(nq * 2),
      glse(std::max<std::int64_t>(nl, 1) * 4), gdq(nq * 2), gdk(nk * 2), gdv(nk * 2),
      gcu_q(cu_q.size() * 4), gcu_k(cu_k.size() * 4);
  upload(gq, image(q, lq));
  upload(gk, image(k, lk));
  upload(gv, image(v, lk));
  upload(gout, image(out, lq));
  upload(gdout, image(dout, lq));
  cuda_ok(cudaMemcpy(glse.ptr, lse.data(), nl * 4, cudaMemcpyHostToDevice));
  cuda_ok(cudaMemcpy(gcu_q.ptr, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice));
  cuda_ok(cudaMemcpy(gcu_k.ptr, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice));

  const Device gpu = Device::cuda(0);
  const TensorView tq = make_view(gq.ptr, c.dtype, lq.shape, lq.stride, gpu);
  const TensorView tk = make_view(gk.ptr, c.dtype, lk.shape, lk.stride, gpu);
  const TensorView tv = make_view(gv.ptr, c.dtype, lk.shape, lk.stride, gpu);
  const TensorView tout = make_view(gout.ptr, c.dtype, lq.shape, lq.stride, gpu);
  const TensorView tdout = make_view(gdout.ptr, c.dtype, lq.shape, lq.stride, gpu);
  const std::vector<std::int64_t> lse_stride =
      varlen ? std::vector<std::int64_t>{rows_q, 1}
             : std::vector<std::int64_t>{std::int64_t(c.Hq) * c.Nq, c.Nq, 1};
  const TensorView tlse = make_view(glse.ptr, DType::fp32, sl, lse_stride, gpu);
  const TensorView tdq = make_view(gdq.ptr, c.dtype, lq.shape, lq.stride, gpu);
  const TensorView tdk = make_view(gdk.ptr, c.dtype, lk.shape, lk.stride, gpu);
  const TensorView tdv = make_view(gdv.ptr, c.dtype, lk.shape, lk.stride, gpu);
  const TensorView tcu_q = make_view(gcu_q.ptr, DType::int32, {B + 1}, {1}, gpu);
  const TensorView tcu_k = make_view(gcu_k.ptr, DType::int32, {B + 1}, {1}, gpu);

  const std::size_t need =
      varlen ? backward_varlen_workspace_size(tq, tk, tv, tcu_q, tcu_k, max_q, max_k, opt)
             : backward_workspace_size(tq, tk, tv, opt);
  const std::size_t give = need - std::size_t(c.workspace_shortfall);
  DeviceBuffer ws_buffer(std::max<std::size_t>(give + c.workspace_misalign, 1));
  void* ws_ptr = static_cast<char*>(ws_buffer.ptr) + c.workspace_misalign;
  auto download = [&](DeviceBuffer& src, std::int64_t count) {
    std::vector<std::uint16_t> img(count);
    cuda_ok(cudaMemcpy(img.data(), src.ptr, count * 2, cudaMemcpyDeviceToHost));
    return img;
  };
  std::vector<std::uint16_t> img_dq, img_dk, img_dv;
  for (int rep = 0; rep < repeats; ++rep) {
    cuda_ok(cudaMemset(gdq.ptr, 0xFF, nq * 2));  // NaN in fp16 and bf16
    cuda_ok(cudaMemset(gdk.ptr, 0xFF, nk * 2));
    cuda_ok(cudaMemset(gdv.ptr, 0xFF, nk * 2));
    // The workspace is poisoned too: nothing may rely on it being zero.
    cuda_ok(cudaMemset(ws_ptr, 0xFF, give));
    const Workspace w{ws_ptr, give};
    r.info = varlen ? backward_varlen(tq, tk, tv, tout, tdout, tlse, tdq, tdk, tdv, tcu_q, tcu_k,
                                      max_q, max_k, opt, nullptr, w)
                    : backward(tq, tk, tv, tout, tdout, tlse, tdq, tdk, tdv, opt, nullptr, w);
    cuda_ok(cudaDeviceSynchronize());
    img_dq = download(gdq, nq);
    img_dk = download(gdk, nk);
    img_dv = download(gdv, nk);
    std::vector<std::uint16_t> joined = img_dq;
    joined.insert(joined.end(), img_dk.begin(), img_dk.end());
    joined.insert(joined.end(), img_dv.begin(), img_dv.end());
    r.bits.push_back(std::move(joined));
  }
  auto logical = [&](const std::vector<std::uint16_t>& img, const MemLayout& l) {
    std::vector<float> x(img.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = from_bits(c.dtype, img[l.offset(i)]);
    return x;
  };
  r.dq = logical(img_dq, lq);
  r.dk = logical(img_dk, lk);
  r.dv = logical(img_dv, lk);

  r.ref_dq.assign(nq, 0.f);
  r.ref_dk.assign(nk, 0.f);
  r.ref_dv.assign(nk, 0.f);
  if (varlen)
    backward_varlen(host_view(q, lq.shape), host_view(k, lk.shape), host_view(v, lk.shape),
                    host_view(out, lq.shape), host_view(dout, lq.shape), host_view(lse, sl),
                    host_view(r.ref_dq, lq.shape), host_view(r.ref_dk, lk.shape),
                    host_view(r.ref_dv, lk.shape), hcq, hck, max_q, max_k, ropt);
  else
    backward(host_view(q, lq.shape), host_view(k, lk.shape), host_view(v, lk.shape),
             host_view(out, lq.shape), host_view(dout, lq.shape), host_view(lse, sl),
             host_view(r.ref_dq, lq.shape), host_view(r.ref_dk, lk.shape),
             host_view(r.ref_dv, lk.shape), ropt);
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
  try {
    run_bwd_case(c, r, repeats);
  } catch (const Error& e) {
    if (!record_if_unbuilt(describe(c), e)) throw;
    r.not_built = true;
    return r;
  }
  EXPECT_EQ(r.info.backend, c.expect);
  const char* prefix = c.expect == Backend::cuda_sm90 ? "sm90_bwd_" : "sm80_bwd_";
  EXPECT_EQ(std::string(r.info.kernel).rfind(prefix, 0), 0u) << r.info.kernel;
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

// Checks both backward suites run on their own base case (which sets the backend requested
// and expected).

inline void check_gqa_and_mqa(const BwdCase& base) {
  for (auto [hq, hkv] : {std::pair{8, 2}, {8, 1}, {4, 4}})
    for (int d : {64, 128})
      for (bool causal : {false, true}) {
        BwdCase c = base;
        c.Hq = hq;
        c.Hkv = hkv;
        c.D = d;
        c.Nq = 113;
        c.Nk = 203;
        c.causal = causal;
        check(c);
      }
  BwdCase c = base;  // many query blocks per head and several heads per kv head
  c.Hq = 4;
  c.Hkv = 1;
  c.D = 128;
  c.Nq = c.Nk = 1000;
  c.causal = true;
  check(c);
}

inline void check_bhsd_strides(const BwdCase& base) {
  for (bool causal : {false, true}) {
    BwdCase c = base;
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

// Queries that see no key get dq = 0 and keys no query sees get dk = dv = 0, exactly; with
// Nk = 1000 and window (0, 0) whole key blocks see no query at all (CTAs that load nothing
// and only store zeros).
inline void check_unseen_rows_and_keys_give_zero(const BwdCase& base) {
  {
    BwdCase c = base;  // bottom-right causal: query i sees keys j <= i - 6; queries 0..5 none
    c.Nq = 10;
    c.Nk = 4;
    c.causal = true;
    const BwdResult r = check(c);
    for (int i = 0; !r.not_built && i < 6 * c.D; ++i) ASSERT_EQ(r.dq[i], 0.f) << "dq element " << i;
  }
  for (int nk : {10, 1000}) {
    BwdCase c = base;  // window (0, 0): query i sees key i + nk - 4 only
    c.Nq = 4;
    c.Nk = nk;
    c.wl = c.wr = 0;
    const BwdResult r = check(c);
    for (int i = 0; !r.not_built && i < (nk - 4) * c.D; ++i) {
      ASSERT_EQ(r.dk[i], 0.f) << "dk element " << i;
      ASSERT_EQ(r.dv[i], 0.f) << "dv element " << i;
    }
  }
}

// Padded and varlen calls given 4 bytes less workspace than asked for, or a workspace that
// starts 4 bytes past a 16-byte boundary, throw and name it.
inline void check_workspace_too_small_throws(const BwdCase& base) {
  for (bool varlen : {false, true})
    for (bool misaligned : {false, true}) {
      BwdCase c = base;
      c.Nq = c.Nk = 100;
      if (varlen) {
        c.seqlens_q = {100, 30};
        c.seqlens_k = {50, 100};
      }
      (misaligned ? c.workspace_misalign : c.workspace_shortfall) = 4;
      const char* expected =
          misaligned ? "workspace: data pointer is not 16-byte aligned" : "workspace: needs";
      BwdResult r;
      try {
        run_bwd_case(c, r);
        ADD_FAILURE() << "expected flashcpp::Error (" << describe(c) << ")";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      }
    }
}

}  // namespace flashcpp::cuda_test

#endif  // FLASHCPP_TEST_WITH_CUDA
