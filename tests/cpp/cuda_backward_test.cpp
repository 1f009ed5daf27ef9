// CUDA sm80 backward (dq, dk, dv) against the float64 reference backward, requested explicitly
// with Backend::cuda_sm80 (the harness, shared with the sm90 backward's tests, is
// cuda_bwd_harness.hpp). Every test skips when no GPU is present (CI has none).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_bwd_harness.hpp"
#include "cuda_test_harness.hpp"
#include "flashcpp/flashcpp.hpp"

namespace flashcpp {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU: the cuda backward tests need one"

#ifdef FLASHCPP_TEST_WITH_CUDA

using namespace cuda_test;

class CudaBackward : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override { report_unbuilt_cases(); }
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

TEST_F(CudaBackward, GqaAndMqa) { check_gqa_and_mqa(BwdCase{}); }

TEST_F(CudaBackward, BhsdStrides) { check_bhsd_strides(BwdCase{}); }

TEST_F(CudaBackward, UnseenRowsAndKeysGiveZero) { check_unseen_rows_and_keys_give_zero(BwdCase{}); }

TEST_F(CudaBackward, WorkspaceTooSmallThrows) { check_workspace_too_small_throws(BwdCase{}); }

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
    for (int i = 0; !r.not_built && i < 60 * c.Hq * c.D; ++i)
      ASSERT_EQ(r.dq[i], 0.f) << "dq element " << i;
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
        if (!r.not_built && lq[1] == 0 && lk[1] > 0) {  // sequence 1: keys, no queries
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
