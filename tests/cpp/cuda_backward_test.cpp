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
  BwdCase c;
  c.Nq = c.Nk = 100;
  c.workspace_shortfall = 4;
  BwdResult r;
  try {
    run_bwd_case(c, r);
    FAIL() << "expected flashcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace: needs"), std::string::npos) << e.what();
  }
}

#else  // built without CUDA: the suite still compiles and says why it does nothing

TEST(CudaBackward, NeedsCuda) {
  SKIP_WITHOUT_GPU();
  FAIL() << "cuda_available() is true in a build without CUDA";
}

#endif

}  // namespace
}  // namespace flashcpp
