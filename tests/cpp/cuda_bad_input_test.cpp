// Issue 23 on CUDA tensors: the bad-input rows of bad_input_test.cpp that validation refuses
// (checked before any device access, so they need a CUDA build but no GPU), NaN in keys and
// values a row does not see (forward and backward, sm80 and sm90a), and device-side varlen
// offsets that contradict max_seqlen and the tensors' sizes: the kernels clamp them and write
// nothing outside the buffers they were given (docs/semantics.md, "Device-side lengths").
// Run the GPU ones under compute-sanitizer too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cuda_harness.hpp"
#include "flashcpp/flashcpp.hpp"

namespace flashcpp {
namespace {

using namespace cuda_test;

#ifndef FLASHCPP_TEST_WITH_CUDA

TEST(CudaBadInput, NeedsCuda) { skip_built_without_cuda(); }

#else

std::string error_of(const std::function<void()>& call) {
  try {
    call();
    return "no error";
  } catch (const Error& e) {
    return e.what();
  }
}

// ---- validation, no device access ----------------------------------------------------------

// Views of a valid bf16 call on made-up, aligned device addresses (never dereferenced).
struct FakeCall {
  TensorView q, k, v, out, lse, dout, dq, dk, dv;
  AttentionOptions options;

  FakeCall() {
    const auto at = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
    const Device gpu = Device::cuda(0);
    q = TensorView::contiguous(at(0x100000), DType::bf16, {1, 32, 2, 64}, gpu);
    k = TensorView::contiguous(at(0x200000), DType::bf16, {1, 32, 2, 64}, gpu);
    v = TensorView::contiguous(at(0x300000), DType::bf16, {1, 32, 2, 64}, gpu);
    out = TensorView::contiguous(at(0x400000), DType::bf16, {1, 32, 2, 64}, gpu);
    lse = TensorView::contiguous(at(0x500000), DType::fp32, {1, 2, 32}, gpu);
    dout = TensorView::contiguous(at(0x600000), DType::bf16, {1, 32, 2, 64}, gpu);
    dq = TensorView::contiguous(at(0x700000), DType::bf16, {1, 32, 2, 64}, gpu);
    dk = TensorView::contiguous(at(0x800000), DType::bf16, {1, 32, 2, 64}, gpu);
    dv = TensorView::contiguous(at(0x900000), DType::bf16, {1, 32, 2, 64}, gpu);
  }
  std::string forward() {
    return error_of([&] { flashcpp::forward(q, k, v, out, &lse, options); });
  }
  std::string backward() {
    return error_of([&] { flashcpp::backward(q, k, v, out, dout, lse, dq, dk, dv, options); });
  }
};

constexpr const char* kOverlap =
    " in memory (outputs may not share memory with inputs or other outputs)";

TEST(CudaBadInput, OverlappingOutputsRefused) {
  FakeCall a;
  a.out = a.k;
  EXPECT_EQ(a.forward(), std::string("out: overlaps k") + kOverlap);
  FakeCall b;
  b.lse.data = b.out.data;
  EXPECT_EQ(b.forward(), std::string("lse: overlaps out") + kOverlap);
  FakeCall c;
  c.dv = c.dk;
  EXPECT_EQ(c.backward(), std::string("dv: overlaps dk") + kOverlap);
  FakeCall d;
  d.out.stride[1] = 0;
  EXPECT_EQ(d.forward(), "out: several elements share one memory location (stride 0 or "
                         "overlapping strides); an output must not overlap itself");
}

TEST(CudaBadInput, CountsAboveInt32Refused) {
  FakeCall c;
  for (TensorView* t : {&c.q, &c.out}) t->shape[2] = (std::int64_t{1} << 32) + 4;
  c.lse.shape[1] = (std::int64_t{1} << 32) + 4;
  EXPECT_EQ(c.forward(), "q: 4294967300 query heads exceed 2^31 - 1");
}

TEST(CudaBadInput, NonFiniteOptionRatioRefused) {
  FakeCall c;
  c.options.softcap = 1e-40f;
  EXPECT_EQ(c.forward(), "softcap: softmax_scale / softcap (0.125 / 9.99995e-41) must be finite");
}

TEST(CudaBadInput, MisalignedDeviceOffsetsRefused) {
  FakeCall c;
  for (TensorView* t : {&c.q, &c.k, &c.v, &c.out})
    *t = TensorView::contiguous(t->data, DType::bf16, {32, 2, 64}, Device::cuda(0));
  c.lse = TensorView::contiguous(c.lse.data, DType::fp32, {2, 32}, Device::cuda(0));
  const TensorView cu_q = TensorView::contiguous(reinterpret_cast<void*>(0xa00002), DType::int32,
                                                 {2}, Device::cuda(0));
  const TensorView cu_k = TensorView::contiguous(reinterpret_cast<void*>(0xb00000), DType::int32,
                                                 {2}, Device::cuda(0));
  EXPECT_EQ(error_of([&] {
              flashcpp::forward_varlen(c.q, c.k, c.v, c.out, &c.lse, cu_q, cu_k, 32, 32,
                                       c.options);
            }),
            "cu_seqlens_q: data pointer is not 4-byte aligned");
}

// ---- device buffers with a guard band -------------------------------------------------------

constexpr std::size_t kGuardBytes = 1 << 16;
constexpr unsigned char kGuardByte = 0x5a;

// `bytes` of device memory followed by a guard band filled with kGuardByte; intact() tells
// whether anything was written past the end.
struct GuardedBuffer {
  std::size_t bytes;
  DeviceBuffer memory;
  explicit GuardedBuffer(std::size_t n) : bytes(n), memory(n + kGuardBytes) {
    cuda_ok(cudaMemset(memory.ptr, kGuardByte, n + kGuardBytes));
  }
  bool intact() const {
    const auto all = download<unsigned char>(memory, std::int64_t(bytes + kGuardBytes));
    for (std::size_t i = bytes; i < all.size(); ++i)
      if (all[i] != kGuardByte) return false;
    return true;
  }
};

// ---- NaN at hidden keys ---------------------------------------------------------------------

// B 1, N 300, 2 heads, d128 bf16, window (4, 4): rows >= 14 of head 0 see none of keys 0..9,
// which hold NaN (or `value`, e.g. Inf) in k or v. Those rows (and the keys >= 18 they see, for
// dk and dv) must come out finite, and head 1 entirely. Every key block of this window is one
// the mask cuts through.
struct HiddenNanCase {
  static constexpr int kN = 300, kH = 2, kD = 128;
  DType dtype = DType::bf16;
  std::vector<float> q, k, v, dout;
  MemLayout layout{{1, kN, kH, kD}, {kN * kH * kD, kH * kD, kD, 1}};
  MemLayout lse_layout{{1, kH, kN}, {kH * kN, kN, 1}};

  explicit HiddenNanCase(bool nan_in_v, float value = NAN) {
    q.resize(layout.elements());
    k.resize(q.size());
    v.resize(q.size());
    dout.resize(q.size());
    fill_rounded(dtype, 23, {&q, &k, &v, &dout});
    std::vector<float>& poisoned = nan_in_v ? v : k;
    for (int j = 0; j < 10; ++j)
      for (int d = 0; d < kD; ++d) poisoned[(j * kH + 0) * kD + d] = value;
  }
  float at(const std::vector<float>& x, int row, int head, int d) const {
    return x[(std::int64_t(row) * kH + head) * kD + d];
  }
  // The first non-finite element among the rows that must be finite, or "finite".
  std::string check(const std::vector<float>& x, int first_clean_row, const char* name) const {
    for (int row = 0; row < kN; ++row)
      for (int head = 0; head < kH; ++head) {
        if (head == 0 && row < first_clean_row) continue;
        for (int d = 0; d < kD; ++d)
          if (!std::isfinite(at(x, row, head, d)))
            return std::string(name) + " row " + std::to_string(row) + " head " +
                   std::to_string(head) + " is " + std::to_string(at(x, row, head, d));
      }
    return "finite";
  }
};

// Runs forward (and backward when `grads`) of `c` on `backend`; returns the verdicts.
std::string run_hidden_nan(const HiddenNanCase& c, Backend backend, bool grads,
                           bool deterministic = false) {
  const std::size_t bytes = c.q.size() * 2, lse_bytes = c.lse_layout.elements() * 4;
  DeviceBuffer q(bytes), k(bytes), v(bytes), out(bytes), dout(bytes), dq(bytes), dk(bytes),
      dv(bytes), lse(lse_bytes);
  upload(q, image(c.dtype, c.q, c.layout));
  upload(k, image(c.dtype, c.k, c.layout));
  upload(v, image(c.dtype, c.v, c.layout));
  upload(dout, image(c.dtype, c.dout, c.layout));
  AttentionOptions o;
  o.backend = backend;
  o.window_left = o.window_right = 4;
  o.deterministic = deterministic;
  const TensorView lse_view = device_view(lse, DType::fp32, c.lse_layout);
  const auto view = [&](DeviceBuffer& b) { return device_view(b, c.dtype, c.layout); };
  forward(view(q), view(k), view(v), view(out), &lse_view, o);
  std::string verdict =
      c.check(logical(c.dtype, download<std::uint16_t>(out, c.q.size()), c.layout), 14, "out");
  if (!grads) return verdict;
  const std::size_t workspace_bytes = backward_workspace_size(view(q), view(k), view(v), o);
  DeviceBuffer workspace(workspace_bytes);
  backward(view(q), view(k), view(v), view(out), view(dout), lse_view, view(dq), view(dk),
           view(dv), o, nullptr, {workspace.ptr, workspace_bytes});
  const auto grad = [&](DeviceBuffer& b) {
    return logical(c.dtype, download<std::uint16_t>(b, c.q.size()), c.layout);
  };
  return verdict + ", " + c.check(grad(dq), 14, "dq") + ", " + c.check(grad(dk), 18, "dk") +
         ", " + c.check(grad(dv), 18, "dv");
}

class CudaHiddenKeys : public BackendSuite<backward_skip_reason> {};
INSTANTIATE_TEST_SUITE_P(, CudaHiddenKeys, kGpuBackends, backend_suffix);

TEST_P(CudaHiddenKeys, NanKeysForward) {
  EXPECT_EQ(run_hidden_nan(HiddenNanCase(false), GetParam(), false), "finite");
}

// Seen failing on an H100 before the fix: the prefill kernels multiplied a NaN V at a hidden
// key of a block the mask cuts through by P = 0 in O += P V (and, backward, a NaN K by dS = 0
// in dQ = dS K, and a NaN dP by P = 0 in dS = P (dP - dsum)), so rows >= 14 of that block came
// out NaN. The forward kernels now zero such V chunks (sm90a: a scan by the producer
// warpgroup; sm80: a test and a vote in the masked steps; both fwd_non_finite_v.hpp) and make
// the rows that do see them NaN; the backward kernels zero NaN K chunks and non-finite Q and dO chunks
// of the cut blocks and keep dS = 0 at their hidden pairs (bwd_non_finite.hpp).

TEST_P(CudaHiddenKeys, NanValuesForward) {
  EXPECT_EQ(run_hidden_nan(HiddenNanCase(true), GetParam(), false), "finite");
  EXPECT_EQ(run_hidden_nan(HiddenNanCase(true, INFINITY), GetParam(), false), "finite") << "+Inf";
  EXPECT_EQ(run_hidden_nan(HiddenNanCase(true, -INFINITY), GetParam(), false), "finite")
      << "-Inf";
}

// One non-finite element of v at a key that rows 16..24 of head 0 see (key 20, column 5), in a
// block the mask cuts: zeroing it for the hidden pairs must not hide it from those rows. They
// get NaN or Inf in column 5 at least (the kernels that zero the chunk make the whole row NaN);
// every other row stays finite.
TEST_P(CudaHiddenKeys, NonFiniteValueAtAVisibleKey) {
  constexpr int kN = HiddenNanCase::kN, kH = HiddenNanCase::kH, kD = HiddenNanCase::kD;
  for (const float value : {float(NAN), float(INFINITY)}) {
    SCOPED_TRACE(value);
    HiddenNanCase c(true);
    c.v = c.dout;  // finite
    c.v[(20 * kH + 0) * kD + 5] = value;
    AttentionOptions o;
    o.backend = GetParam();
    o.window_left = o.window_right = 4;
    const std::size_t bytes = c.q.size() * 2;
    DeviceBuffer q(bytes), k(bytes), v(bytes), out(bytes);
    upload(q, image(c.dtype, c.q, c.layout));
    upload(k, image(c.dtype, c.k, c.layout));
    upload(v, image(c.dtype, c.v, c.layout));
    const auto view = [&](DeviceBuffer& b) { return device_view(b, c.dtype, c.layout); };
    forward(view(q), view(k), view(v), view(out), nullptr, o);
    const std::vector<float> x =
        logical(c.dtype, download<std::uint16_t>(out, c.q.size()), c.layout);
    std::string verdict = "as expected";
    for (int row = 0; row < kN; ++row)
      for (int head = 0; head < kH; ++head) {
        const bool sees = head == 0 && row >= 16 && row <= 24;
        if (sees && std::isfinite(c.at(x, row, head, 5)) && verdict == "as expected")
          verdict = "row " + std::to_string(row) + " column 5 is finite";
        for (int d = 0; d < kD && !sees; ++d)
          if (!std::isfinite(c.at(x, row, head, d)) && verdict == "as expected")
            verdict = "row " + std::to_string(row) + " head " + std::to_string(head) +
                      " is not finite";
      }
    EXPECT_EQ(verdict, "as expected");
  }
}

// Seen failing on an H100 before the fix, for Inf: the backward zeroed NaN k chunks only, so
// dQ = dS K multiplied a hidden pair's dS = 0 by an Inf k (docs/semantics.md).
TEST_P(CudaHiddenKeys, NanKeysBackward) {
  for (const float value : {float(NAN), float(INFINITY), -float(INFINITY)}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(run_hidden_nan(HiddenNanCase(false, value), GetParam(), true),
              "finite, finite, finite, finite");
    EXPECT_EQ(run_hidden_nan(HiddenNanCase(false, value), GetParam(), true, true),
              "finite, finite, finite, finite")
        << "deterministic";
  }
}

TEST_P(CudaHiddenKeys, NanValuesBackward) {
  for (const float value : {float(NAN), float(INFINITY), -float(INFINITY)}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(run_hidden_nan(HiddenNanCase(true, value), GetParam(), true),
              "finite, finite, finite, finite");
    EXPECT_EQ(run_hidden_nan(HiddenNanCase(true, value), GetParam(), true, true),
              "finite, finite, finite, finite")
        << "deterministic";
  }
}

// GQA 2:1 (4 query heads on 2 kv heads), bf16 d128, N 300, window (4, 4): rows 0..9 of one
// tensor hold `value`: k or v of kv head 0, or q or dout of query head 1 (on kv head 0). Only
// the rows that see those keys (query rows 0..13 of heads 0 and 1) and the keys those rows see
// (keys 0..17), or the keys the poisoned query rows see (keys 0..13 of kv head 0), may come
// out non-finite.
std::string run_hidden_rows_gqa(char tensor, float value, Backend backend, bool deterministic) {
  constexpr int kN = 300, kHq = 4, kHkv = 2, kD = 128;
  const MemLayout q_layout{{1, kN, kHq, kD}, {kN * kHq * kD, kHq * kD, kD, 1}};
  const MemLayout kv_layout{{1, kN, kHkv, kD}, {kN * kHkv * kD, kHkv * kD, kD, 1}};
  const MemLayout lse_layout{{1, kHq, kN}, {kHq * kN, kN, 1}};
  std::vector<float> q(q_layout.elements()), k(kv_layout.elements()), v(k.size()),
      dout(q.size());
  fill_rounded(DType::bf16, 29, {&q, &k, &v, &dout});
  const bool query_side = tensor == 'q' || tensor == 'o';
  std::vector<float>& poisoned =
      tensor == 'k' ? k : tensor == 'v' ? v : tensor == 'q' ? q : dout;
  const int heads = query_side ? kHq : kHkv, head = query_side ? 1 : 0;
  for (int row = 0; row < 10; ++row)
    for (int d = 0; d < kD; ++d) poisoned[(std::int64_t(row) * heads + head) * kD + d] = value;
  const std::size_t q_bytes = q.size() * 2, kv_bytes = k.size() * 2;
  DeviceBuffer dq_in(q_bytes), dk_in(kv_bytes), dv_in(kv_bytes), ddout(q_bytes), out(q_bytes),
      dq(q_bytes), dk(kv_bytes), dv(kv_bytes), lse(kHq * kN * 4);
  upload(dq_in, image(DType::bf16, q, q_layout));
  upload(dk_in, image(DType::bf16, k, kv_layout));
  upload(dv_in, image(DType::bf16, v, kv_layout));
  upload(ddout, image(DType::bf16, dout, q_layout));
  AttentionOptions o;
  o.backend = backend;
  o.window_left = o.window_right = 4;
  o.deterministic = deterministic;
  const auto qv = [&](DeviceBuffer& b) { return device_view(b, DType::bf16, q_layout); };
  const auto kvv = [&](DeviceBuffer& b) { return device_view(b, DType::bf16, kv_layout); };
  const TensorView lse_view = device_view(lse, DType::fp32, lse_layout);
  forward(qv(dq_in), kvv(dk_in), kvv(dv_in), qv(out), &lse_view, o);
  const std::size_t ws = backward_workspace_size(qv(dq_in), kvv(dk_in), kvv(dv_in), o);
  DeviceBuffer workspace(ws);
  backward(qv(dq_in), kvv(dk_in), kvv(dv_in), qv(out), qv(ddout), lse_view, qv(dq), kvv(dk),
           kvv(dv), o, nullptr, {workspace.ptr, ws});
  // Poisoned keys are seen by query rows 0..13, which see keys 0..17; poisoned query rows see
  // keys 0..13.
  const int dirty_rows = query_side ? 10 : 14, dirty_keys = query_side ? 14 : 18;
  const auto first_non_finite = [&](DeviceBuffer& b, const MemLayout& layout, int nheads,
                                    int dirty, bool per_query_head,
                                    const char* name) -> std::string {
    const std::vector<float> x =
        logical(DType::bf16, download<std::uint16_t>(b, std::int64_t(layout.elements())), layout);
    for (int row = 0; row < kN; ++row)
      for (int h = 0; h < nheads; ++h) {
        // The dirty rows of the heads on kv head 0 (query heads 0, 1, or only the poisoned
        // one 1 for q and dout) may be anything.
        const bool on_poisoned_head =
            per_query_head ? (query_side ? h == 1 : h / 2 == 0) : h == 0;
        if (on_poisoned_head && row < dirty) continue;
        for (int d = 0; d < kD; ++d)
          if (!std::isfinite(x[(std::int64_t(row) * nheads + h) * kD + d]))
            return std::string(name) + " row " + std::to_string(row) + " head " +
                   std::to_string(h);
      }
    return "finite";
  };
  return first_non_finite(out, q_layout, kHq, dirty_rows, true, "out") + ", " +
         first_non_finite(dq, q_layout, kHq, dirty_rows, true, "dq") + ", " +
         first_non_finite(dk, kv_layout, kHkv, dirty_keys, false, "dk") + ", " +
         first_non_finite(dv, kv_layout, kHkv, dirty_keys, false, "dv");
}

TEST_P(CudaHiddenKeys, GqaNonFiniteRowsBackward) {
  for (const bool deterministic : {false, true})
    for (const char tensor : {'k', 'v', 'q', 'o'})
      for (const float value : {float(NAN), float(INFINITY)}) {
        SCOPED_TRACE(std::string(1, tensor) + " " + std::to_string(value) +
                     (deterministic ? ", deterministic" : ""));
        EXPECT_EQ(run_hidden_rows_gqa(tensor, value, GetParam(), deterministic),
                  "finite, finite, finite, finite");
      }
}

// Varlen, bf16 d128, 2 heads, three packed sequences of 100, 150 and 70 rows (q and k alike):
// the middle one's k and v are NaN. The first sequence's last key block reaches into the
// middle one's rows (the sm90a kernels load whole 128-row blocks from the packed tensor), yet
// sequences 0 and 2 must come out finite, forward and backward: keys past a sequence's end
// are not its keys.
TEST_P(CudaHiddenKeys, NanInTheNextVarlenSequence) {
  constexpr int kRows = 320, kH = 2, kD = 128;
  const int cu[] = {0, 100, 250, 320};
  const MemLayout rows{{kRows, kH, kD}, {kH * kD, kD, 1}};
  const MemLayout lse_rows{{kH, kRows}, {kRows, 1}};
  std::vector<float> q(rows.elements()), k(q.size()), v(q.size()), dout(q.size());
  fill_rounded(DType::bf16, 31, {&q, &k, &v, &dout});
  for (std::int64_t i = std::int64_t(cu[1]) * kH * kD; i < std::int64_t(cu[2]) * kH * kD; ++i)
    k[i] = v[i] = NAN;
  const std::size_t bytes = q.size() * 2;
  DeviceBuffer dq_in(bytes), dk_in(bytes), dv_in(bytes), ddout(bytes), out(bytes), dq(bytes),
      dk(bytes), dv(bytes), lse(kH * kRows * 4), cu_q(16), cu_k(16);
  upload(dq_in, image(DType::bf16, q, rows));
  upload(dk_in, image(DType::bf16, k, rows));
  upload(dv_in, image(DType::bf16, v, rows));
  upload(ddout, image(DType::bf16, dout, rows));
  upload(cu_q, std::vector<std::int32_t>(cu, cu + 4));
  upload(cu_k, std::vector<std::int32_t>(cu, cu + 4));
  const auto view = [&](DeviceBuffer& b) { return device_view(b, DType::bf16, rows); };
  const TensorView cq = device_view(cu_q, DType::int32, {{4}, {1}});
  const TensorView ck = device_view(cu_k, DType::int32, {{4}, {1}});
  const TensorView lse_view = device_view(lse, DType::fp32, lse_rows);
  AttentionOptions o;
  o.backend = GetParam();
  o.num_splits = 1;
  forward_varlen(view(dq_in), view(dk_in), view(dv_in), view(out), &lse_view, cq, ck, 150, 150,
                 o);
  const std::size_t ws = backward_varlen_workspace_size(view(dq_in), view(dk_in), view(dv_in),
                                                        cq, ck, 150, 150, o);
  DeviceBuffer workspace(ws);
  backward_varlen(view(dq_in), view(dk_in), view(dv_in), view(out), view(ddout), lse_view,
                  view(dq), view(dk), view(dv), cq, ck, 150, 150, o, nullptr,
                  {workspace.ptr, ws});
  const auto first_non_finite = [&](DeviceBuffer& b, const char* name) -> std::string {
    const std::vector<float> x = logical(DType::bf16, download<std::uint16_t>(b, q.size()), rows);
    for (int row = 0; row < kRows; ++row) {
      if (row >= cu[1] && row < cu[2]) continue;
      for (int i = 0; i < kH * kD; ++i)
        if (!std::isfinite(x[std::int64_t(row) * kH * kD + i]))
          return std::string(name) + " row " + std::to_string(row);
    }
    return "finite";
  };
  EXPECT_EQ(first_non_finite(out, "out"), "finite");
  EXPECT_EQ(first_non_finite(dq, "dq"), "finite");
  EXPECT_EQ(first_non_finite(dk, "dk"), "finite");
  EXPECT_EQ(first_non_finite(dv, "dv"), "finite");
}

// ---- NaN scores and NaN rows of q or dout ------------------------------------------------------

// bf16 d128, 2 heads, 200 rows, causal: one padded sequence (B = 1), or varlen with two packed
// sequences of 90 and 110 rows (q and k alike, so causal is top-left inside each). Chosen
// (row, head) pairs of q, k or dout are NaN. A NaN q row, or a visible NaN key, makes its
// row's scores NaN: out and lse NaN. In the backward a row with NaN q or dout (or a NaN score)
// gives NaN dq and NaN dk, dv at the keys it sees, and nothing to the keys it does not see.
struct NanRowsCase {
  static constexpr int kN = 200, kH = 2, kD = 128, kSplitRow = 90;
  bool varlen = false;
  std::vector<std::pair<int, int>> nan_q, nan_k, nan_v, nan_dout;  // (row, head)
  float v_value = NAN;  // what the nan_v rows hold (NaN or +-Inf)
  float q_dout_value = NAN;  // what the nan_q and nan_dout rows hold (NaN or Inf)
  // Rows of q that are -Inf in every element, over a k of positive elements only: every score
  // of such a row is -Inf (all weights 0).
  std::vector<std::pair<int, int>> minus_inf_q;

  int sequence_begin(int row) const { return varlen && row >= kSplitRow ? kSplitRow : 0; }
  bool sees(int i, int j) const { return sequence_begin(i) == sequence_begin(j) && j <= i; }
  static bool has(const std::vector<std::pair<int, int>>& rows, int row, int head) {
    for (const auto& [r, h] : rows)
      if (r == row && h == head) return true;
    return false;
  }
  // Row i of `head` has a NaN score.
  bool nan_scores(int i, int head) const {
    if (has(nan_q, i, head)) return true;
    for (const auto& [j, h] : nan_k)
      if (h == head && sees(i, j)) return true;
    return false;
  }
  // Row i of `head` has a non-finite out: a NaN score, or a visible non-finite v row.
  bool nan_out(int i, int head) const {
    if (nan_scores(i, head)) return true;
    for (const auto& [j, h] : nan_v)
      if (h == head && sees(i, j)) return true;
    return false;
  }
  bool nan_gradient_row(int i, int head) const {
    return nan_scores(i, head) || has(nan_dout, i, head);
  }
  // Key j of `head`: some row with a NaN gradient sees it.
  bool nan_key(int j, int head) const {
    for (int i = 0; i < kN; ++i)
      if (sees(i, j) && nan_gradient_row(i, head)) return true;
    return false;
  }
};

struct NanRowsResult {
  std::vector<float> out, lse, dq, dk, dv;  // logical [row][head][d] and [head][row]
};

NanRowsResult run_nan_rows(const NanRowsCase& c, Backend backend, int num_splits, bool grads,
                           bool deterministic) {
  constexpr int kN = NanRowsCase::kN, kH = NanRowsCase::kH, kD = NanRowsCase::kD;
  const MemLayout rows = c.varlen ? MemLayout{{kN, kH, kD}, {kH * kD, kD, 1}}
                                  : MemLayout{{1, kN, kH, kD}, {kN * kH * kD, kH * kD, kD, 1}};
  const MemLayout lse_rows = c.varlen ? MemLayout{{kH, kN}, {kN, 1}}
                                      : MemLayout{{1, kH, kN}, {kH * kN, kN, 1}};
  std::vector<float> q(rows.elements()), k(q.size()), v(q.size()), dout(q.size());
  fill_rounded(DType::bf16, 41, {&q, &k, &v, &dout});
  const auto poison = [&](std::vector<float>& x, const std::vector<std::pair<int, int>>& at,
                          float value) {
    for (const auto& [row, head] : at)
      for (int d = 0; d < kD; ++d) x[(std::int64_t(row) * kH + head) * kD + d] = value;
  };
  poison(q, c.nan_q, c.q_dout_value);
  if (!c.minus_inf_q.empty()) {
    for (float& x : k) x = std::fabs(x) + 0.125f;
    poison(q, c.minus_inf_q, -INFINITY);
  }
  poison(k, c.nan_k, NAN);
  poison(v, c.nan_v, c.v_value);
  poison(dout, c.nan_dout, c.q_dout_value);
  const std::size_t bytes = q.size() * 2;
  DeviceBuffer dq_in(bytes), dk_in(bytes), dv_in(bytes), ddout(bytes), out(bytes), dq(bytes),
      dk(bytes), dv(bytes), lse(kH * kN * 4), cu_q(12), cu_k(12);
  upload(dq_in, image(DType::bf16, q, rows));
  upload(dk_in, image(DType::bf16, k, rows));
  upload(dv_in, image(DType::bf16, v, rows));
  upload(ddout, image(DType::bf16, dout, rows));
  const std::vector<std::int32_t> cu = {0, NanRowsCase::kSplitRow, kN};
  upload(cu_q, cu);
  upload(cu_k, cu);
  const auto view = [&](DeviceBuffer& b) { return device_view(b, DType::bf16, rows); };
  const TensorView cq = device_view(cu_q, DType::int32, {{3}, {1}});
  const TensorView ck = device_view(cu_k, DType::int32, {{3}, {1}});
  const TensorView lse_view = device_view(lse, DType::fp32, lse_rows);
  AttentionOptions o;
  o.backend = backend;
  o.causal = true;
  o.num_splits = num_splits;
  o.deterministic = deterministic;
  const int max_len = kN - NanRowsCase::kSplitRow;
  const std::size_t fwd_ws =
      c.varlen ? forward_varlen_workspace_size(view(dq_in), view(dk_in), view(dv_in), cq, ck,
                                               max_len, max_len, o)
               : forward_workspace_size(view(dq_in), view(dk_in), view(dv_in), o);
  DeviceBuffer fwd_workspace(fwd_ws);
  if (c.varlen)
    forward_varlen(view(dq_in), view(dk_in), view(dv_in), view(out), &lse_view, cq, ck, max_len,
                   max_len, o, nullptr, {fwd_workspace.ptr, fwd_ws});
  else
    forward(view(dq_in), view(dk_in), view(dv_in), view(out), &lse_view, o, nullptr,
            {fwd_workspace.ptr, fwd_ws});
  const auto values = [&](DeviceBuffer& b) {
    return logical(DType::bf16, download<std::uint16_t>(b, q.size()), rows);
  };
  NanRowsResult r;
  r.out = values(out);
  r.lse = download<float>(lse, kH * kN);
  if (!grads) return r;
  const std::size_t bwd_ws =
      c.varlen ? backward_varlen_workspace_size(view(dq_in), view(dk_in), view(dv_in), cq, ck,
                                                max_len, max_len, o)
               : backward_workspace_size(view(dq_in), view(dk_in), view(dv_in), o);
  DeviceBuffer bwd_workspace(bwd_ws);
  if (c.varlen)
    backward_varlen(view(dq_in), view(dk_in), view(dv_in), view(out), view(ddout), lse_view,
                    view(dq), view(dk), view(dv), cq, ck, max_len, max_len, o, nullptr,
                    {bwd_workspace.ptr, bwd_ws});
  else
    backward(view(dq_in), view(dk_in), view(dv_in), view(out), view(ddout), lse_view, view(dq),
             view(dk), view(dv), o, nullptr, {bwd_workspace.ptr, bwd_ws});
  r.dq = values(dq);
  r.dk = values(dk);
  r.dv = values(dv);
  return r;
}

// The first (row, head) of `x` ([row][head][d]) whose elements are not all non-finite where
// `nan(row, head)` says they should be, or not all finite elsewhere; "as expected" if none.
std::string first_unexpected(const std::vector<float>& x, const char* name,
                             const std::function<bool(int, int)>& nan) {
  constexpr int kH = NanRowsCase::kH, kD = NanRowsCase::kD;
  for (int row = 0; row < NanRowsCase::kN; ++row)
    for (int head = 0; head < kH; ++head) {
      const bool want_nan = nan(row, head);
      for (int d = 0; d < kD; ++d)
        if (bool(std::isfinite(x[(std::int64_t(row) * kH + head) * kD + d])) == want_nan)
          return std::string(name) + " row " + std::to_string(row) + " head " +
                 std::to_string(head) + (want_nan ? " is finite" : " is not finite");
    }
  return "as expected";
}

std::string first_unexpected_lse(const std::vector<float>& lse, const NanRowsCase& c) {
  for (int head = 0; head < NanRowsCase::kH; ++head)
    for (int row = 0; row < NanRowsCase::kN; ++row) {
      const float x = lse[std::int64_t(head) * NanRowsCase::kN + row];
      const bool want_nan = c.nan_scores(row, head);
      if (want_nan ? !std::isnan(x) : !std::isfinite(x))
        return "lse row " + std::to_string(row) + " head " + std::to_string(head) + " is " +
               std::to_string(x);
    }
  return "as expected";
}

std::string check_forward(const NanRowsCase& c, const NanRowsResult& r) {
  return first_unexpected(r.out, "out", [&](int i, int h) { return c.nan_out(i, h); }) +
         ", " + first_unexpected_lse(r.lse, c);
}

class CudaNanRows : public BackendSuite<backward_skip_reason> {};
INSTANTIATE_TEST_SUITE_P(, CudaNanRows, kGpuBackends, backend_suffix);

// Before: the CUDA kernels took a NaN row sum for "no visible key", so these rows came out
// with out = 0 and lse = -inf.
TEST_P(CudaNanRows, RowsThatSeeANanScoreAreNan) {
  for (const bool varlen : {false, true}) {
    NanRowsCase c;
    c.varlen = varlen;
    c.nan_q = {{50, 0}};    // row 50 of head 0
    c.nan_k = {{120, 1}};   // seen by rows 120.. of head 1 (both layouts)
    // Split-KV partials go through the combine.
    for (const int splits : {1, 3}) {
      SCOPED_TRACE(std::string(varlen ? "varlen" : "padded") + ", splits " +
                   std::to_string(splits));
      EXPECT_EQ(check_forward(c, run_nan_rows(c, GetParam(), splits, false, false)),
                "as expected, as expected");
    }
  }
}

// A row whose every score is -Inf has all weights 0: out = 0 and lse = -inf, like a row that
// sees no key, whether those scores lie in the blocks the mask cuts (row 50, in its query
// tile's diagonal block only) or also in blocks it does not cut (rows 150 and 199); the other
// rows stay finite. Seen failing on sm80 before the fix: NaN from -inf - (-inf) in the
// exponent of the uncut blocks.
TEST_P(CudaNanRows, RowsWhoseScoresAreAllMinusInfGiveZero) {
  for (const bool varlen : {false, true}) {
    NanRowsCase c;
    c.varlen = varlen;
    c.minus_inf_q = {{50, 0}, {150, 1}, {199, 0}};
    for (const int splits : {1, 3}) {
      SCOPED_TRACE(std::string(varlen ? "varlen" : "padded") + ", splits " +
                   std::to_string(splits));
      const NanRowsResult r = run_nan_rows(c, GetParam(), splits, false, false);
      constexpr int kH = NanRowsCase::kH, kN = NanRowsCase::kN, kD = NanRowsCase::kD;
      for (int row = 0; row < kN; ++row)
        for (int head = 0; head < kH; ++head) {
          const bool zero = NanRowsCase::has(c.minus_inf_q, row, head);
          const float lse = r.lse[std::int64_t(head) * kN + row];
          if (zero)
            EXPECT_EQ(lse, -INFINITY) << "lse row " << row << " head " << head;
          else
            EXPECT_TRUE(std::isfinite(lse)) << "lse row " << row << " head " << head;
          for (int d = 0; d < kD; ++d) {
            const float x = r.out[(std::int64_t(row) * kH + head) * kD + d];
            if (zero ? x != 0.f : !std::isfinite(x)) {
              ADD_FAILURE() << "out row " << row << " head " << head << " is " << x;
              break;
            }
          }
        }
    }
  }
}

// Causal: v rows that only later rows see, in the diagonal blocks (padded: key 150 of head 0,
// hidden from rows 128..149 of that block; varlen: key 100, the second sequence's 11th, hidden
// from its rows 90..99 and from the whole first sequence). Only the rows that see them get a
// non-finite out (their whole row, where a kernel zeroes the chunk); lse stays finite.
TEST_P(CudaNanRows, NonFiniteValuesReachOnlyTheRowsThatSeeThem) {
  for (const bool varlen : {false, true})
    for (const float value : {float(NAN), float(INFINITY), -float(INFINITY)}) {
      NanRowsCase c;
      c.varlen = varlen;
      c.nan_v = {{varlen ? 100 : 150, 0}, {170, 1}};
      c.v_value = value;
      for (const int splits : {1, 3}) {
        SCOPED_TRACE(std::string(varlen ? "varlen" : "padded") + ", v " + std::to_string(value) +
                     ", splits " + std::to_string(splits));
        EXPECT_EQ(check_forward(c, run_nan_rows(c, GetParam(), splits, false, false)),
                  "as expected, as expected");
      }
    }
}

// Seen failing on an H100 before the fix: in the blocks the mask cuts through, dK += dS^T Q and
// dV += P^T dO multiplied the hidden pairs' dS = 0 and P = 0 by a NaN row of q or dout, so keys
// that row does not see (here keys 151.. of head 0 and 61.. of head 1) got NaN gradients.
TEST_P(CudaNanRows, NanRowsOfQAndDoutReachOnlyTheKeysTheySee) {
  for (const bool varlen : {false, true})
    for (const bool deterministic : {false, true})
      for (const float value : {float(NAN), float(INFINITY)}) {
        NanRowsCase c;
        c.varlen = varlen;
        c.q_dout_value = value;
        c.nan_q = {{150, 0}};    // sees keys 0..150 (padded) or 90..150 (varlen)
        c.nan_dout = {{60, 1}};  // sees keys 0..60 either way
        SCOPED_TRACE(std::string(varlen ? "varlen" : "padded") +
                     (deterministic ? ", deterministic" : "") + ", " + std::to_string(value));
        const NanRowsResult r = run_nan_rows(c, GetParam(), 1, true, deterministic);
        EXPECT_EQ(check_forward(c, r), "as expected, as expected");
        const auto nan_row = [&](int i, int h) { return c.nan_gradient_row(i, h); };
        const auto nan_key = [&](int j, int h) { return c.nan_key(j, h); };
        EXPECT_EQ(first_unexpected(r.dq, "dq", nan_row), "as expected");
        EXPECT_EQ(first_unexpected(r.dk, "dk", nan_key), "as expected");
        EXPECT_EQ(first_unexpected(r.dv, "dv", nan_key), "as expected");
      }
}

// KV-cache decode (sm80 decode kernel), bf16 d128, GQA 2:1, 16 new tokens against 300 cached
// keys (capacity 320, NaN past the length), window (8, 0): token t sees keys t + 276 ..
// t + 284. v of key 286 is NaN (seen by tokens 2..10), k of key 296 too (seen by 12..15).
// Tokens 2..10 get NaN out (lse finite), 12..15 NaN out and lse, 0, 1 and 11 stay finite.
// Before: 0, 1 and 11 met the NaN v with P = 0 in a block the mask cuts, and 12..15 came out
// as rows without a visible key (out 0, lse -inf).
TEST(CudaNanKvCache, NanAtVisibleAndHiddenKeys) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU";
  constexpr int kNew = 16, kCap = 320, kLen = 300, kHq = 2, kHkv = 1, kD = 128;
  const MemLayout q_rows{{1, kNew, kHq, kD}, {kNew * kHq * kD, kHq * kD, kD, 1}};
  const MemLayout cache_rows{{1, kCap, kHkv, kD}, {kCap * kHkv * kD, kHkv * kD, kD, 1}};
  const MemLayout lse_rows{{1, kHq, kNew}, {kHq * kNew, kNew, 1}};
  std::vector<float> q(q_rows.elements()), k(cache_rows.elements()), v(k.size());
  fill_rounded(DType::bf16, 43, {&q, &k, &v});
  for (int d = 0; d < kD; ++d) {
    v[286 * kD + d] = NAN;
    k[296 * kD + d] = NAN;
    for (int j = kLen; j < kCap; ++j) k[j * kD + d] = v[j * kD + d] = NAN;  // past the length
  }
  DeviceBuffer dq(q.size() * 2), dk(k.size() * 2), dv(v.size() * 2), out(q.size() * 2),
      lse(kHq * kNew * 4), lens(4);
  upload(dq, image(DType::bf16, q, q_rows));
  upload(dk, image(DType::bf16, k, cache_rows));
  upload(dv, image(DType::bf16, v, cache_rows));
  upload(lens, std::vector<std::int32_t>{kLen});
  const TensorView lse_view = device_view(lse, DType::fp32, lse_rows);
  KVCacheTensors t;
  t.q = device_view(dq, DType::bf16, q_rows);
  t.k_cache = device_view(dk, DType::bf16, cache_rows);
  t.v_cache = device_view(dv, DType::bf16, cache_rows);
  t.cache_seqlens = device_view(lens, DType::int32, {{1}, {1}});
  t.out = device_view(out, DType::bf16, q_rows);
  t.lse = &lse_view;
  AttentionOptions o;
  o.window_left = 8;
  o.window_right = 0;
  const KVCachePlan plan = plan_attention_with_kvcache(t, o);
  DeviceBuffer workspace(std::max<std::size_t>(plan.workspace_bytes, 1));
  attention_with_kvcache(t, o, nullptr, {workspace.ptr, plan.workspace_bytes});
  const std::vector<float> got =
      logical(DType::bf16, download<std::uint16_t>(out, q.size()), q_rows);
  const std::vector<float> got_lse = download<float>(lse, kHq * kNew);
  std::string verdict = "as expected";
  for (int t_new = 0; t_new < kNew && verdict == "as expected"; ++t_new)
    for (int h = 0; h < kHq; ++h) {
      const bool nan_out = (t_new >= 2 && t_new <= 10) || t_new >= 12;
      const bool nan_lse = t_new >= 12;
      for (int d = 0; d < kD; ++d)
        if (bool(std::isfinite(got[(t_new * kHq + h) * kD + d])) == nan_out)
          verdict = "out token " + std::to_string(t_new) + " head " + std::to_string(h) +
                    (nan_out ? " is finite" : " is not finite");
      const float l = got_lse[h * kNew + t_new];
      if (nan_lse ? !std::isnan(l) : !std::isfinite(l))
        verdict = "lse token " + std::to_string(t_new) + " head " + std::to_string(h) + " is " +
                  std::to_string(l);
    }
  EXPECT_EQ(verdict, "as expected") << "kernel " << plan.kernel;
}

// ---- device-side lengths ---------------------------------------------------------------------

// Varlen bf16 d128, 64 packed rows each of q and k, max_seqlen 32, but the device offsets say
// sequence 0 holds 100 queries and sequence 1 starts past the tensors' end. Every output and
// the workspaces sit in guarded buffers: the kernels must clamp and write nothing past them.
class CudaDeviceLengths : public BackendSuite<forward_skip_reason> {};
INSTANTIATE_TEST_SUITE_P(, CudaDeviceLengths, kGpuBackends, backend_suffix);

void run_with_bad_offsets(Backend backend, int num_splits, bool deterministic) {
  constexpr int kRows = 64, kMax = 32, kD = 128;
  const MemLayout rows{{kRows, 1, kD}, {kD, kD, 1}};
  const MemLayout lse_rows{{1, kRows}, {kRows, 1}};
  std::vector<float> x(rows.elements());
  fill_rounded(DType::bf16, 7, {&x});
  const std::size_t bytes = x.size() * 2, lse_bytes = kRows * 4;
  DeviceBuffer q(bytes), k(bytes), v(bytes), dout(bytes), cu_q(12), cu_k(12);
  for (DeviceBuffer* b : {&q, &k, &v, &dout}) upload(*b, image(DType::bf16, x, rows));
  upload(cu_q, std::vector<std::int32_t>{0, 100, 200});
  upload(cu_k, std::vector<std::int32_t>{0, 50, 1000});
  GuardedBuffer out(bytes), lse(lse_bytes), dq(bytes), dk(bytes), dv(bytes);
  const auto view = [&](void* p) { return make_view(p, DType::bf16, rows, Device::cuda(0)); };
  const TensorView cq = make_view(cu_q.ptr, DType::int32, {{3}, {1}}, Device::cuda(0));
  const TensorView ck = make_view(cu_k.ptr, DType::int32, {{3}, {1}}, Device::cuda(0));
  const TensorView lse_view = make_view(lse.memory.ptr, DType::fp32, lse_rows, Device::cuda(0));
  AttentionOptions o;
  o.backend = backend;
  o.num_splits = num_splits;
  o.deterministic = deterministic;

  const std::size_t fwd_ws = forward_varlen_workspace_size(view(q.ptr), view(k.ptr), view(v.ptr),
                                                           cq, ck, kMax, kMax, o);
  GuardedBuffer fwd_workspace(fwd_ws);
  forward_varlen(view(q.ptr), view(k.ptr), view(v.ptr), view(out.memory.ptr), &lse_view, cq, ck,
                 kMax, kMax, o, nullptr, {fwd_workspace.memory.ptr, fwd_ws});
  const std::size_t bwd_ws = backward_varlen_workspace_size(view(q.ptr), view(k.ptr),
                                                            view(v.ptr), cq, ck, kMax, kMax, o);
  GuardedBuffer bwd_workspace(bwd_ws);
  backward_varlen(view(q.ptr), view(k.ptr), view(v.ptr), view(out.memory.ptr), view(dout.ptr),
                  lse_view, view(dq.memory.ptr), view(dk.memory.ptr), view(dv.memory.ptr), cq,
                  ck, kMax, kMax, o, nullptr, {bwd_workspace.memory.ptr, bwd_ws});
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const struct {
    const GuardedBuffer& buffer;
    const char* name;
  } guarded[] = {{out, "out"}, {lse, "lse"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"},
                 {fwd_workspace, "forward workspace"}, {bwd_workspace, "backward workspace"}};
  for (const auto& g : guarded) EXPECT_TRUE(g.buffer.intact()) << "written past " << g.name;
}

TEST_P(CudaDeviceLengths, OffsetsPastTheBoundsStayInsideTheBuffers) {
  run_with_bad_offsets(GetParam(), 1, false);
}

TEST_P(CudaDeviceLengths, SplitKvAndDeterministicStayInsideTheBuffers) {
  run_with_bad_offsets(GetParam(), 2, true);
}

#endif  // FLASHCPP_TEST_WITH_CUDA

}  // namespace
}  // namespace flashcpp
