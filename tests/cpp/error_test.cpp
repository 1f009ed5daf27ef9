// Every invalid input of the contract raises flashcpp::Error with the message of
// src/api/validate.cpp, before any work: one test per rule, asserting the exact text.
// CUDA-device views are validated before any device access, so their tests need no GPU; in a
// build without CUDA they get the "built without CUDA" error instead (FLASHCPP_TEST_WITH_CUDA).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace flashcpp::test {
namespace {

constexpr int kB = 2, kNq = 5, kNk = 7, kHq = 4, kHkv = 2, kD = 64;

// A valid forward/backward call on small CPU tensors, with views the tests break one at a time.
struct Call {
  std::vector<float> storage = std::vector<float>(1 << 16, 0.25f);  // backs every view
  TensorView q, k, v, out, lse, dout, dq, dk, dv;
  AttentionOptions options;

  explicit Call(DType dtype = DType::fp32) {
    auto* base = storage.data();
    // Disjoint 16-byte aligned slices; contents are irrelevant for validation.
    q = TensorView::contiguous(base, dtype, {kB, kNq, kHq, kD});
    k = TensorView::contiguous(base + 8192, dtype, {kB, kNk, kHkv, kD});
    v = TensorView::contiguous(base + 16384, dtype, {kB, kNk, kHkv, kD});
    out = TensorView::contiguous(base + 24576, dtype, {kB, kNq, kHq, kD});
    lse = TensorView::contiguous(base + 32768, DType::fp32, {kB, kHq, kNq});
    dout = TensorView::contiguous(base + 36864, dtype, {kB, kNq, kHq, kD});
    dq = TensorView::contiguous(base + 45056, dtype, {kB, kNq, kHq, kD});
    dk = TensorView::contiguous(base + 53248, dtype, {kB, kNk, kHkv, kD});
    dv = TensorView::contiguous(base + 57344, dtype, {kB, kNk, kHkv, kD});
    options.backend = Backend::cpu;
  }

  // Re-strides a view as contiguous for a new shape (same data).
  static void reshape(TensorView& t, std::initializer_list<std::int64_t> shape) {
    t = TensorView::contiguous(t.data, t.dtype, shape, t.device);
  }

  void on_cuda(int index = 0) {
    for (TensorView* t : {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv}) t->device = Device::cuda(index);
    options.backend = Backend::automatic;
  }

  std::string forward(bool with_lse = true) {
    try {
      flashcpp::forward(q, k, v, out, with_lse ? &lse : nullptr, options);
      return "no error";
    } catch (const Error& e) {
      return e.what();
    }
  }
  std::string backward() {
    try {
      flashcpp::backward(q, k, v, out, dout, lse, dq, dk, dv, options);
      return "no error";
    } catch (const Error& e) {
      return e.what();
    }
  }
};

// A valid varlen call: 3 sequences, q lengths {5, 0, 7}, k lengths {4, 3, 5}.
struct VarlenCall {
  std::vector<float> storage = std::vector<float>(1 << 15, 0.25f);
  std::vector<std::int32_t> cu_q_data{0, 5, 5, 12};
  std::vector<std::int32_t> cu_k_data{0, 4, 7, 12};
  TensorView q, k, v, out, lse, cu_q, cu_k;
  int max_q = 7, max_k = 5;
  AttentionOptions options;

  VarlenCall() {
    auto* base = storage.data();
    q = TensorView::contiguous(base, DType::fp32, {12, kHq, kD});
    k = TensorView::contiguous(base + 4096, DType::fp32, {12, kHkv, kD});
    v = TensorView::contiguous(base + 8192, DType::fp32, {12, kHkv, kD});
    out = TensorView::contiguous(base + 12288, DType::fp32, {12, kHq, kD});
    lse = TensorView::contiguous(base + 16384, DType::fp32, {kHq, 12});
    cu_q = TensorView::contiguous(cu_q_data.data(), DType::int32, {4});
    cu_k = TensorView::contiguous(cu_k_data.data(), DType::int32, {4});
    options.backend = Backend::cpu;
  }

  std::string forward() {
    cu_q.data = cu_q_data.data();  // the tests may have replaced the vectors
    cu_k.data = cu_k_data.data();
    try {
      flashcpp::forward_varlen(q, k, v, out, &lse, cu_q, cu_k, max_q, max_k, options);
      return "no error";
    } catch (const Error& e) {
      return e.what();
    }
  }
};

// ---- rank, dtype, device ----------------------------------------------------------------------

TEST(Errors, WrongRank) {
  Call c;
  Call::reshape(c.q, {kB * kNq, kHq, kD});
  EXPECT_EQ(c.forward(), "q: expected 4 dimensions [B, Nq, Hq, D], got 3");
  Call d;
  Call::reshape(d.k, {kB * kNk, kHkv, kD});
  EXPECT_EQ(d.forward(), "k: expected 4 dimensions [B, Nk, Hkv, D], got 3");
  Call e;
  Call::reshape(e.v, {kB, kNk * kHkv * kD});
  EXPECT_EQ(e.forward(), "v: expected 4 dimensions [B, Nk, Hkv, Dv], got 2");
  Call f;
  Call::reshape(f.out, {kB, kNq, kHq});
  EXPECT_EQ(f.forward(), "out: expected 4 dimensions [B, Nq, Hq, Dv], got 3");
  Call g;
  Call::reshape(g.lse, {kB, kHq * kNq});
  EXPECT_EQ(g.forward(), "lse: expected 3 dimensions [B, Hq, Nq], got 2");
}

TEST(Errors, DtypeMismatch) {
  Call k(DType::bf16);
  k.k.dtype = DType::fp16;
  EXPECT_EQ(k.forward(), "k: expected dtype bf16 (same as q), got fp16");
  Call v(DType::bf16);
  v.v.dtype = DType::fp32;
  EXPECT_EQ(v.forward(), "v: expected dtype bf16 (same as q), got fp32");
  Call out(DType::fp16);
  out.out.dtype = DType::bf16;
  EXPECT_EQ(out.forward(), "out: expected dtype fp16 (same as q), got bf16");
}

TEST(Errors, Int32InputsAreRejected) {
  Call c;
  for (TensorView* t : {&c.q, &c.k, &c.v, &c.out}) t->dtype = DType::int32;
  EXPECT_EQ(c.forward(), "q: dtype int32 is not supported (supported: fp32, fp16, bf16, fp8_e4m3)");
}

TEST(Errors, LseDtype) {
  Call c(DType::bf16);
  c.lse.dtype = DType::bf16;
  EXPECT_EQ(c.forward(), "lse: expected dtype fp32, got bf16");
}

TEST(Errors, DeviceMismatch) {
  Call k;
  k.k.device = Device::cuda(0);
  EXPECT_EQ(k.forward(), "k is on cuda:0 but q is on cpu");
  Call out;
  out.out.device = Device::cuda(1);
  EXPECT_EQ(out.forward(), "out is on cuda:1 but q is on cpu");
  Call lse;
  lse.lse.device = Device::cuda(0);
  EXPECT_EQ(lse.forward(), "lse is on cuda:0 but q is on cpu");
}

// ---- shapes -------------------------------------------------------------------------------------

TEST(Errors, BatchMismatch) {
  Call k;
  Call::reshape(k.k, {3, kNk, kHkv, kD});
  EXPECT_EQ(k.forward(), "k: expected batch size 2 (same as q) in dimension 0, got 3 "
                         "(shape [3, 7, 2, 64])");
  Call v;
  Call::reshape(v.v, {1, kNk, kHkv, kD});
  EXPECT_EQ(v.forward(), "v: expected batch size 2 (same as q) in dimension 0, got 1 "
                         "(shape [1, 7, 2, 64])");
  Call out;
  Call::reshape(out.out, {1, kNq, kHq, kD});
  EXPECT_EQ(out.forward(), "out: expected batch size 2 (same as q) in dimension 0, got 1 "
                           "(shape [1, 5, 4, 64])");
  Call lse;
  Call::reshape(lse.lse, {3, kHq, kNq});
  EXPECT_EQ(lse.forward(), "lse: expected batch size 2 (same as q) in dimension 0, got 3 "
                           "(shape [3, 4, 5])");
}

TEST(Errors, KeyAndQueryCountMismatch) {
  Call v;
  Call::reshape(v.v, {kB, 6, kHkv, kD});
  EXPECT_EQ(v.forward(), "v: expected keys 7 (same as k) in dimension 1, got 6 "
                         "(shape [2, 6, 2, 64])");
  Call out;
  Call::reshape(out.out, {kB, 6, kHq, kD});
  EXPECT_EQ(out.forward(), "out: expected queries 5 (same as q) in dimension 1, got 6 "
                           "(shape [2, 6, 4, 64])");
  Call lse;
  Call::reshape(lse.lse, {kB, kHq, 6});
  EXPECT_EQ(lse.forward(), "lse: expected queries 5 (same as q) in dimension 2, got 6 "
                           "(shape [2, 4, 6])");
}

TEST(Errors, HeadDimMismatch) {
  Call k;
  Call::reshape(k.k, {kB, kNk, kHkv, 32});
  EXPECT_EQ(k.forward(), "k: expected head dim 64 (same as q) in dimension 3, got 32 "
                         "(shape [2, 7, 2, 32])");
  Call out;
  Call::reshape(out.out, {kB, kNq, kHq, 32});
  EXPECT_EQ(out.forward(), "out: expected head dim 64 (same as v) in dimension 3, got 32 "
                           "(shape [2, 5, 4, 32])");
}

TEST(Errors, HeadCountMismatch) {
  Call v;
  Call::reshape(v.v, {kB, kNk, 1, kD});
  EXPECT_EQ(v.forward(), "v: expected kv heads 2 (same as k) in dimension 2, got 1 "
                         "(shape [2, 7, 1, 64])");
  Call out;
  Call::reshape(out.out, {kB, kNq, 2, kD});
  EXPECT_EQ(out.forward(), "out: expected query heads 4 (same as q) in dimension 2, got 2 "
                           "(shape [2, 5, 2, 64])");
  Call lse;
  Call::reshape(lse.lse, {kB, 2, kNq});
  EXPECT_EQ(lse.forward(), "lse: expected query heads 4 (same as q) in dimension 1, got 2 "
                           "(shape [2, 2, 5])");
}

TEST(Errors, HeadDimUnsupported) {
  for (int d : {100, 264, 4}) {
    Call c;
    for (TensorView* t : {&c.q, &c.k, &c.v, &c.out})
      Call::reshape(*t, {t->shape[0], t->shape[1], t->shape[2], d});
    EXPECT_EQ(c.forward(), "q: head dim " + std::to_string(d) +
                               " is not supported (supported: multiples of 8 up to 256)");
  }
}

TEST(Errors, ValueHeadDimUnsupported) {
  Call c;
  Call::reshape(c.v, {kB, kNk, kHkv, 100});
  Call::reshape(c.out, {kB, kNq, kHq, 100});
  EXPECT_EQ(c.forward(), "v: head dim 100 is not supported (supported: multiples of 8 up to 256)");
}

TEST(Errors, HeadsNotAMultiple) {
  Call c;
  Call::reshape(c.q, {1, kNq, 12, kD});
  Call::reshape(c.k, {1, kNk, 5, kD});
  Call::reshape(c.v, {1, kNk, 5, kD});
  Call::reshape(c.out, {1, kNq, 12, kD});
  Call::reshape(c.lse, {1, 12, kNq});
  EXPECT_EQ(c.forward(), "num_heads_q (12) must be a multiple of num_heads_kv (5)");
}

TEST(Errors, ZeroKvHeads) {
  Call c;
  Call::reshape(c.k, {kB, kNk, 0, kD});
  Call::reshape(c.v, {kB, kNk, 0, kD});
  EXPECT_EQ(c.forward(), "k: number of kv heads must be positive, got 0");
}

// ---- memory ------------------------------------------------------------------------------------

TEST(Errors, LastDimensionStride) {
  Call c;
  c.k.stride[3] = 2;
  EXPECT_EQ(c.forward(), "k: last dimension must have stride 1, got 2");
}

TEST(Errors, NegativeStride) {
  Call c;
  c.q.stride[1] = -256;
  EXPECT_EQ(c.forward(), "q: stride of dimension 1 is negative (-256)");
}

TEST(Errors, NegativeSize) {
  Call c;
  c.v.shape[1] = -7;
  EXPECT_EQ(c.forward(), "v: dimension 1 has negative size -7");
}

TEST(Errors, NullDataPointer) {
  Call q;
  q.q.data = nullptr;
  EXPECT_EQ(q.forward(), "q: data pointer is null");
  Call lse;
  lse.lse.data = nullptr;
  EXPECT_EQ(lse.forward(), "lse: data pointer is null");
}

TEST(Errors, MisalignedPointerOnCpu) {
  Call f;
  f.out.data = reinterpret_cast<char*>(f.out.data) + 2;
  EXPECT_EQ(f.forward(), "out: data pointer is not 4-byte aligned");
  Call h(DType::bf16);
  h.v.data = reinterpret_cast<char*>(h.v.data) + 1;
  EXPECT_EQ(h.forward(), "v: data pointer is not 2-byte aligned");
}

// CUDA-device views with host pointers: validation never dereferences them.
TEST(Errors, MisalignedPointerOnCuda) {
  Call c(DType::bf16);
  c.on_cuda();
  c.out.data = reinterpret_cast<char*>(c.out.data) + 8;  // 2-byte aligned, not 16
#ifdef FLASHCPP_TEST_WITH_CUDA
  EXPECT_EQ(c.forward(), "out: data pointer is not 16-byte aligned");
  Call s(DType::bf16);
  s.on_cuda();
  s.k = TensorView::strided(s.k.data, DType::bf16, {kB, kNk, kHkv, kD},
                            {kNk * kHkv * 68, kHkv * 68, 68, 1}, Device::cuda(0));
  EXPECT_EQ(s.forward(), "k: stride of dimension 2 is 68 elements; the cuda backend needs a "
                         "multiple of 8 (16 bytes)");
#else
  EXPECT_EQ(c.forward(),
            "q is on cuda:0 but flashcpp was built without CUDA (configure with -DFLASHCPP_CUDA=ON)");
#endif
}

TEST(Errors, Fp32OnCuda) {
  Call c(DType::fp32);
  c.on_cuda();
#ifdef FLASHCPP_TEST_WITH_CUDA
  // With `automatic` as well as an explicit CUDA backend: the rule follows the device.
  EXPECT_EQ(c.forward(), "q: dtype fp32 is not supported by the cuda backend (supported: fp16, bf16)");
  c.options.backend = Backend::cuda_sm80;
  EXPECT_EQ(c.forward(), "q: dtype fp32 is not supported by the cuda backend (supported: fp16, bf16)");
#else
  EXPECT_EQ(c.forward(),
            "q is on cuda:0 but flashcpp was built without CUDA (configure with -DFLASHCPP_CUDA=ON)");
#endif
}

TEST(Errors, CudaDeviceIndexMismatch) {
  Call c(DType::bf16);
  c.on_cuda(0);
  c.v.device = Device::cuda(1);
#ifdef FLASHCPP_TEST_WITH_CUDA
  EXPECT_EQ(c.forward(), "v is on cuda:1 but q is on cuda:0");
#else
  EXPECT_EQ(c.forward(),
            "q is on cuda:0 but flashcpp was built without CUDA (configure with -DFLASHCPP_CUDA=ON)");
#endif
}

// ---- backend choice ------------------------------------------------------------------------------

TEST(Errors, BackendDeviceMismatch) {
  Call c(DType::bf16);
  c.options.backend = Backend::cuda_sm80;
  EXPECT_EQ(c.forward(), "q is on cpu but the cuda_sm80 backend was selected");
  c.options.backend = Backend::cuda_sm90;
  EXPECT_EQ(c.forward(), "q is on cpu but the cuda_sm90 backend was selected");
  Call g(DType::bf16);
  g.on_cuda();
  g.options.backend = Backend::cpu;
  EXPECT_EQ(g.forward(), "q is on cuda:0 but the cpu backend was selected");
  g.options.backend = Backend::cpu_reference;
  EXPECT_EQ(g.forward(), "q is on cuda:0 but the cpu_reference backend was selected");
}

TEST(Errors, SelectBackend) {
  Call c;
  EXPECT_EQ(select_backend(c.q), Backend::cpu);
  AttentionOptions o;
  o.backend = Backend::cpu_reference;
  EXPECT_EQ(select_backend(c.q, o), Backend::cpu_reference);
  o.backend = Backend::cuda_sm80;
  try {
    select_backend(c.q, o);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "q is on cpu but the cuda_sm80 backend was selected");
  }
  EXPECT_EQ(forward_workspace_size(c.q, c.k, c.v), 0u);
  EXPECT_EQ(backward_workspace_size(c.q, c.k, c.v), 0u);
}

// ---- options ---------------------------------------------------------------------------------------

TEST(Errors, Softcap) {
  Call c;
  c.options.softcap = -1.0f;
  EXPECT_EQ(c.forward(), "softcap: must be >= 0 (0 turns it off), got -1");
  c.options.softcap = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(c.forward(), "softcap: must be >= 0 (0 turns it off), got nan");
}

TEST(Errors, SoftmaxScale) {
  Call c;
  c.options.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(c.forward(), "softmax_scale: must be finite, got nan");
  c.options.softmax_scale = std::numeric_limits<float>::infinity();
  EXPECT_EQ(c.forward(), "softmax_scale: must be finite, got inf");
}

TEST(Errors, Window) {
  Call c;
  c.options.window_left = -2;
  EXPECT_EQ(c.forward(), "window_left: must be -1 (unbounded) or >= 0, got -2");
  Call d;
  d.options.window_right = -5;
  EXPECT_EQ(d.forward(), "window_right: must be -1 (unbounded) or >= 0, got -5");
}

TEST(Errors, NumSplits) {
  Call c;
  c.options.num_splits = -1;
  EXPECT_EQ(c.forward(), "num_splits: must be >= 0 (0 chooses automatically), got -1");
}

// An invalid call writes nothing: validation comes before any work.
TEST(Errors, NothingWrittenOnError) {
  Call c;
  std::fill(c.storage.begin(), c.storage.end(), std::numeric_limits<float>::quiet_NaN());
  c.options.softcap = -1.0f;
  EXPECT_NE(c.forward(), "no error");
  c.options.softcap = 0.0f;
  Call::reshape(c.dq, {1, 1, 1, 8});
  EXPECT_NE(c.backward(), "no error");
  for (float x : c.storage) ASSERT_TRUE(std::isnan(x));
}

// ---- varlen ----------------------------------------------------------------------------------------

TEST(Errors, VarlenCuSeqlensDtype) {
  VarlenCall c;
  c.cu_q.dtype = DType::fp32;
  EXPECT_EQ(c.forward(), "cu_seqlens_q: expected dtype int32, got fp32");
}

TEST(Errors, VarlenCuSeqlensRank) {
  VarlenCall c;
  c.cu_k = TensorView::contiguous(c.cu_k_data.data(), DType::int32, {2, 2});
  EXPECT_EQ(c.forward(), "cu_seqlens_k: expected 1 dimension [B + 1], got 2");
}

TEST(Errors, VarlenCuSeqlensLengthMismatch) {
  VarlenCall c;
  c.cu_k_data = {0, 4, 7, 9, 12};
  c.cu_k = TensorView::contiguous(c.cu_k_data.data(), DType::int32, {5});
  EXPECT_EQ(c.forward(), "cu_seqlens_k: expected 4 elements (same as cu_seqlens_q), got 5");
}

TEST(Errors, VarlenCuSeqlensNotDecreasing) {
  VarlenCall c;
  c.cu_q_data = {0, 5, 3, 12};
  EXPECT_EQ(c.forward(), "cu_seqlens_q: must be non-decreasing, but [2] = 3 < [1] = 5");
}

TEST(Errors, VarlenCuSeqlensFirstOffset) {
  VarlenCall c;
  c.cu_k_data[0] = 1;
  EXPECT_EQ(c.forward(), "cu_seqlens_k[0]: expected 0, got 1");
}

TEST(Errors, VarlenMaxSeqlenTooSmall) {
  VarlenCall c;
  c.max_q = 6;
  EXPECT_EQ(c.forward(), "max_seqlen_q (6) is smaller than sequence 2 of cu_seqlens_q (length 7)");
  VarlenCall d;
  d.max_k = -1;
  EXPECT_EQ(d.forward(), "max_seqlen_k: must be >= 0, got -1");
}

TEST(Errors, VarlenLastOffsetTooLarge) {
  VarlenCall c;
  c.cu_k_data[3] = 14;
  c.max_k = 7;
  EXPECT_EQ(c.forward(), "cu_seqlens_k: last offset 14 exceeds the 12 rows of its tensor");
}

TEST(Errors, VarlenShapes) {
  VarlenCall r;
  r.q = TensorView::contiguous(r.q.data, DType::fp32, {1, 12, kHq, kD});
  EXPECT_EQ(r.forward(), "q: expected 3 dimensions [total_q, Hq, D], got 4");
  VarlenCall o;
  o.out = TensorView::contiguous(o.out.data, DType::fp32, {11, kHq, kD});
  EXPECT_EQ(o.forward(), "out: expected total queries 12 (same as q) in dimension 0, got 11 "
                         "(shape [11, 4, 64])");
  VarlenCall v;
  v.v = TensorView::contiguous(v.v.data, DType::fp32, {10, kHkv, kD});
  EXPECT_EQ(v.forward(), "v: expected total keys 12 (same as k) in dimension 0, got 10 "
                         "(shape [10, 2, 64])");
  VarlenCall l;
  l.lse = TensorView::contiguous(l.lse.data, DType::fp32, {1, kHq, 12});
  EXPECT_EQ(l.forward(), "lse: expected 2 dimensions [Hq, total_q], got 3");
}

TEST(Errors, VarlenCuSeqlensDevice) {
  VarlenCall c;
  c.cu_q.device = Device::cuda(0);
  EXPECT_EQ(c.forward(), "cu_seqlens_q is on cuda:0 but q is on cpu");
}

// A zero-length batch (cu_seqlens = {0}) and all-empty sequences are valid no-ops.
TEST(Errors, VarlenEmptyIsValid) {
  VarlenCall c;
  c.cu_q_data = {0};
  c.cu_k_data = {0};
  c.cu_q = TensorView::contiguous(c.cu_q_data.data(), DType::int32, {1});
  c.cu_k = TensorView::contiguous(c.cu_k_data.data(), DType::int32, {1});
  c.q = TensorView::contiguous(nullptr, DType::fp32, {0, kHq, kD});
  c.k = TensorView::contiguous(nullptr, DType::fp32, {0, kHkv, kD});
  c.v = TensorView::contiguous(nullptr, DType::fp32, {0, kHkv, kD});
  c.out = TensorView::contiguous(nullptr, DType::fp32, {0, kHq, kD});
  c.lse = TensorView::contiguous(nullptr, DType::fp32, {kHq, 0});
  c.max_q = c.max_k = 0;
  EXPECT_EQ(c.forward(), "no error");
}

// ---- backward ----------------------------------------------------------------------------------------

TEST(Errors, BackwardGradShape) {
  Call q;
  Call::reshape(q.dq, {kB, kNq, kHq, 32});
  EXPECT_EQ(q.backward(), "dq: expected shape [2, 5, 4, 64] (same as q), got [2, 5, 4, 32]");
  Call k;
  Call::reshape(k.dk, {kB, kNk + 1, kHkv, kD});
  EXPECT_EQ(k.backward(), "dk: expected shape [2, 7, 2, 64] (same as k), got [2, 8, 2, 64]");
  Call v;
  Call::reshape(v.dv, {kB, kNk, 1, kD});
  EXPECT_EQ(v.backward(), "dv: expected shape [2, 7, 2, 64] (same as v), got [2, 7, 1, 64]");
  Call o;
  Call::reshape(o.dout, {1, kNq, kHq, kD});
  EXPECT_EQ(o.backward(), "dout: expected shape [2, 5, 4, 64] (same as out), got [1, 5, 4, 64]");
  Call r;
  Call::reshape(r.dq, {kB * kNq, kHq, kD});
  EXPECT_EQ(r.backward(), "dq: expected 4 dimensions (same as q), got 3");
}

TEST(Errors, BackwardGradDtype) {
  Call k(DType::bf16);
  k.dk.dtype = DType::fp16;
  EXPECT_EQ(k.backward(), "dk: expected dtype bf16 (same as q), got fp16");
  Call o(DType::fp16);
  o.dout.dtype = DType::fp32;
  EXPECT_EQ(o.backward(), "dout: expected dtype fp16 (same as q), got fp32");
}

TEST(Errors, BackwardGradMemory) {
  Call d;
  d.dv.device = Device::cuda(0);
  EXPECT_EQ(d.backward(), "dv is on cuda:0 but q is on cpu");
  Call n;
  n.dq.data = nullptr;
  EXPECT_EQ(n.backward(), "dq: data pointer is null");
}

// The backward needs the forward's lse; an unset view is caught like any other bad argument.
TEST(Errors, BackwardNeedsLse) {
  Call c;
  c.lse = TensorView{};
  EXPECT_EQ(c.backward(), "lse: expected 3 dimensions [B, Hq, Nq], got 0");
  Call f;
  Call::reshape(f.k, {kB, kNk, 3, kD});
  EXPECT_EQ(f.backward(), "v: expected kv heads 3 (same as k) in dimension 2, got 2 "
                          "(shape [2, 7, 2, 64])");
}

// ---- with a GPU ----------------------------------------------------------------------------------

// CUDA views are valid input for select_backend; with a GPU it names a CUDA backend.
TEST(CudaDispatch, SelectBackendNamesCudaKernels) {
  if (!has_cuda()) GTEST_SKIP() << "no usable GPU (or flashcpp built without CUDA)";
  Call c(DType::bf16);
  c.on_cuda();
  Call::reshape(c.q, {kB, kNq, kHq, 128});
  c.q.device = Device::cuda(0);
  const Backend b = select_backend(c.q);
  EXPECT_TRUE(b == Backend::cuda_sm80 || b == Backend::cuda_sm90) << backend_name(b);
}

}  // namespace
}  // namespace flashcpp::test
