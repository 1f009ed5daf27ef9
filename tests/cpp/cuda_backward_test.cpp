// CUDA sm80 backward (dq, dk, dv) against the float64 reference backward (Backend::cpu_reference
// on host copies of exactly the GPU's inputs: q, k, v, dout rounded to the dtype, out = the
// reference forward rounded to the dtype, lse from the reference). Gradients are poisoned with
// NaN before every run. Every test skips when no GPU is present (CI has none).
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

namespace flashcpp {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU: the cuda backward tests need one"

#ifdef FLASHCPP_TEST_WITH_CUDA

using namespace cuda_test;

// Error bound: max |grad - ref| over the tensor, relative to max |ref| (floored at 0.1 so that
// gradients that are ~0 everywhere are held to an absolute bound). The kernel rounds P and dS
// to the input dtype before the products (as FlashAttention does) and rounds each gradient
// once at the end; everything else is fp32. bf16 (8 significant bits): 2^-9 relative per
// rounded factor, accumulated over up to 1000 rows with partial cancellation -> 2e-2.
// fp16 (11 bits): 8x tighter -> 5e-3.
double grad_bound(DType t) { return t == DType::bf16 ? 2e-2 : 5e-3; }

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
  std::uint64_t seed = 3;

  bool varlen() const { return !seqlens_q.empty(); }
};

std::string describe(const BwdCase& c) {
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
         (c.bhsd ? " bhsd" : " bshd") + (c.deterministic ? " deterministic" : "");
}

struct BwdResult {
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
MemLayout layout_of(const BwdCase& c, std::int64_t n, std::int64_t h) {
  const std::int64_t D = c.D;
  if (c.varlen()) return {{n, h, D}, {h * D, D, 1}};
  if (c.bhsd) return {{c.B, n, h, D}, {h * n * D, D, n * D, 1}};
  return {{c.B, n, h, D}, {n * h * D, h * D, D, 1}};
}

TensorView host_view(std::vector<float>& x, const std::vector<std::int64_t>& shape) {
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
void run_bwd_case(const BwdCase& c, BwdResult& r, int repeats = 1) {
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
  opt.backend = Backend::cuda_sm80;
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
  DeviceBuffer ws(std::max<std::size_t>(give, 1));
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
    cuda_ok(cudaMemset(ws.ptr, 0xFF, give));
    const Workspace w{ws.ptr, give};
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

void expect_grad_close(const char* name, DType t, const std::vector<float>& x,
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
// than one run, that every run gave the same bits.
BwdResult check(const BwdCase& c, int repeats = 1) {
  SCOPED_TRACE(describe(c));
  BwdResult r;
  run_bwd_case(c, r, repeats);
  EXPECT_EQ(r.info.backend, Backend::cuda_sm80);
  EXPECT_EQ(std::string(r.info.kernel).rfind("sm80_bwd_", 0), 0u) << r.info.kernel;
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

class CudaBackward : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
};

TEST_F(CudaBackward, HeadDimsDtypesLengths) {
  for (DType t : {DType::bf16, DType::fp16})
    for (int d : {64, 128})
      for (auto [nq, nk] : {std::pair{1, 1}, {17, 17}, {113, 203}, {203, 113}, {128, 128}})
        for (bool causal : {false, true}) {
          BwdCase c;
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

TEST_F(CudaBackward, LongSequence) {
  for (bool causal : {false, true}) {
    BwdCase c;
    c.Nq = c.Nk = 1000;
    c.D = 64;
    c.causal = causal;
    check(c);
  }
}

TEST_F(CudaBackward, WindowAndSoftcap) {
  for (auto [wl, wr] : {std::pair{-1, -1}, {32, 0}, {17, 5}, {-1, 40}, {0, 0}})
    for (float softcap : {0.f, 5.f}) {
      BwdCase c;
      c.Hq = c.Hkv = 2;
      c.Nq = 150;
      c.Nk = 260;
      c.wl = wl;
      c.wr = wr;
      c.softcap = softcap;
      check(c);
    }
  BwdCase c;
  c.dtype = DType::fp16;
  c.Nq = 203;
  c.Nk = 113;
  c.D = 128;
  c.causal = true;
  c.softcap = 30.f;
  check(c);
}

TEST_F(CudaBackward, GqaAndMqa) {
  for (auto [hq, hkv] : {std::pair{8, 2}, {8, 1}})
    for (int d : {64, 128})
      for (bool causal : {false, true}) {
        BwdCase c;
        c.Hq = hq;
        c.Hkv = hkv;
        c.D = d;
        c.Nq = 113;
        c.Nk = 203;
        c.causal = causal;
        check(c);
      }
}

TEST_F(CudaBackward, BhsdStrides) {
  for (bool causal : {false, true}) {
    BwdCase c;
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

// Queries that see no key get dq = 0 and keys no query sees get dk = dv = 0, exactly.
TEST_F(CudaBackward, UnseenRowsAndKeysGiveZero) {
  {
    BwdCase c;  // bottom-right causal: query i sees keys j <= i - 6; queries 0..5 see none
    c.Nq = 10;
    c.Nk = 4;
    c.causal = true;
    const BwdResult r = check(c);
    for (int i = 0; i < 6 * c.D; ++i) ASSERT_EQ(r.dq[i], 0.f) << "dq element " << i;
  }
  {
    BwdCase c;  // window (0, 0): query i sees key i + 6 only; keys 0..5 unseen
    c.Nq = 4;
    c.Nk = 10;
    c.wl = c.wr = 0;
    const BwdResult r = check(c);
    for (int i = 0; i < 6 * c.D; ++i) {
      ASSERT_EQ(r.dk[i], 0.f) << "dk element " << i;
      ASSERT_EQ(r.dv[i], 0.f) << "dv element " << i;
    }
  }
}

TEST_F(CudaBackward, WorkspaceTooSmallThrows) {
  for (bool varlen : {false, true}) {
    BwdCase c;
    c.Nq = c.Nk = 100;
    if (varlen) {
      c.seqlens_q = {100, 30};
      c.seqlens_k = {50, 100};
    }
    c.workspace_shortfall = 4;
    BwdResult r;
    try {
      run_bwd_case(c, r);
      ADD_FAILURE() << "expected flashcpp::Error (" << describe(c) << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("workspace: needs"), std::string::npos) << e.what();
    }
  }
}

// deterministic = true: five runs give the same bits and the right gradients. dQ then comes
// from the dq kernel (no atomics); the shapes include many key blocks adding into the same dQ
// rows (64 queries x 4096 keys: 64 key-block CTAs per row in the atomic path), GQA (dK, dV
// summed over 4 query heads), causal, d256 and varlen.
TEST_F(CudaBackward, DeterministicBitwiseAndCorrect) {
  constexpr int kRuns = 5;
  for (bool causal : {false, true}) {
    BwdCase c;  // GQA 8/2
    c.deterministic = true;
    c.B = 2;
    c.Hq = 8;
    c.Hkv = 2;
    c.Nq = 113;
    c.Nk = 203;
    c.D = 128;
    c.causal = causal;
    check(c, kRuns);
  }
  for (bool causal : {false, true}) {
    BwdCase c;  // many key blocks per dQ row
    c.deterministic = true;
    c.Hq = 2;
    c.Hkv = 1;
    c.Nq = 64;
    c.Nk = 4096;
    c.causal = causal;
    check(c, kRuns);
  }
  {
    BwdCase c;  // d256 (32-row query blocks), fp16, window + softcap
    c.deterministic = true;
    c.dtype = DType::fp16;
    c.Hq = 4;
    c.Hkv = 2;
    c.Nq = 150;
    c.Nk = 300;
    c.D = 256;
    c.wl = 100;
    c.wr = 20;
    c.softcap = 5.f;
    check(c, kRuns);
  }
  {
    BwdCase c;  // varlen with an empty query and an empty key sequence, causal, GQA
    c.deterministic = true;
    c.seqlens_q = {17, 0, 130, 1, 64};
    c.seqlens_k = {40, 5, 130, 0, 300};
    c.Hq = 4;
    c.Hkv = 2;
    c.causal = true;
    check(c, kRuns);
  }
  {
    BwdCase c;  // bhsd strides, queries that see no key (dq exactly 0)
    c.deterministic = true;
    c.bhsd = true;
    c.Hq = c.Hkv = 2;
    c.Nq = 100;
    c.Nk = 40;
    c.causal = true;  // bottom-right: queries 0..59 see no key
    const BwdResult r = check(c, kRuns);
    for (int i = 0; i < 60 * c.Hq * c.D; ++i) ASSERT_EQ(r.dq[i], 0.f) << "dq element " << i;
  }
}

// Varlen (cu_seqlens): sequences of different lengths, one with no queries (its keys get
// dk = dv = 0) and one with no keys (its queries get dq = 0), sequences spanning several key
// and query blocks, Nq != Nk per sequence; causal or not, GQA and MHA, both dtypes.
TEST_F(CudaBackward, VarlenWithEmptySequences) {
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> lengths = {
      {{17, 0, 130, 1, 64}, {40, 5, 130, 0, 300}},
      {{300, 65, 0, 129}, {257, 700, 64, 1}},
  };
  for (const auto& [lq, lk] : lengths)
    for (bool causal : {false, true})
      for (auto [hq, hkv, d, t] : {std::tuple{4, 1, 64, DType::bf16}, {2, 2, 128, DType::fp16}}) {
        BwdCase c;
        c.seqlens_q = lq;
        c.seqlens_k = lk;
        c.Hq = hq;
        c.Hkv = hkv;
        c.D = d;
        c.dtype = t;
        c.causal = causal;
        const BwdResult r = check(c);
        if (lq[1] == 0 && lk[1] > 0) {  // sequence 1 has keys but no queries
          const std::int64_t k0 = std::int64_t(lk[0]) * c.Hkv * c.D;
          for (std::int64_t i = k0; i < k0 + std::int64_t(lk[1]) * c.Hkv * c.D; ++i) {
            ASSERT_EQ(r.dk[i], 0.f) << "dk element " << i;
            ASSERT_EQ(r.dv[i], 0.f) << "dv element " << i;
          }
        }
      }
  BwdCase c;  // window and softcap
  c.seqlens_q = {150, 7, 90};
  c.seqlens_k = {260, 200, 33};
  c.Hq = c.Hkv = 2;
  c.wl = 17;
  c.wr = 5;
  c.softcap = 5.f;
  check(c);
}

// Head dims beyond 128 (d192: 64-row query blocks, 152.5 KB of shared memory; d256: 32-row
// blocks, 125.3 KB) and head dims that run zero-padded in a larger instantiation (96 in the
// d96 one or, without it, the next larger; 160 in d192 or d256), Nq != Nk both ways.
TEST_F(CudaBackward, LargeAndPaddedHeadDims) {
  for (DType t : {DType::bf16, DType::fp16})
    for (int d : {96, 160, 192, 256})
      for (auto [nq, nk] : {std::pair{1, 1}, {113, 203}, {203, 113}})
        for (bool causal : {false, true}) {
          BwdCase c;
          c.dtype = t;
          c.D = d;
          c.B = 2;
          c.Hq = c.Hkv = 2;
          c.Nq = nq;
          c.Nk = nk;
          c.causal = causal;
          check(c);
        }
  for (int d : {192, 256}) {
    BwdCase c;  // GQA, window, softcap, bhsd at the large head dims
    c.D = d;
    c.Hq = 8;
    c.Hkv = 2;
    c.Nq = 150;
    c.Nk = 260;
    c.wl = 32;
    c.wr = 0;
    c.softcap = 30.f;
    c.bhsd = true;
    check(c);
  }
  BwdCase c;  // a long d256 sequence: many query blocks per key block
  c.D = 256;
  c.Nq = c.Nk = 1000;
  c.causal = true;
  check(c);
}

#else  // built without CUDA: the suite still compiles and says why it does nothing

TEST(CudaBackward, NeedsCuda) {
  SKIP_WITHOUT_GPU();
  FAIL() << "cuda_available() is true in a build without CUDA";
}

#endif

}  // namespace
}  // namespace flashcpp
