// CUDA sm90a backward (TMA + wgmma main kernel between the sm80 pre- and post-pass) against
// the float64 reference backward, requested explicitly with Backend::cuda_sm90. The harness
// (same data, NaN-poisoned gradients, reference and error bounds as cuda_backward_test.cpp) is
// cuda_bwd_harness.hpp. Every test skips without a GPU, on a GPU that is not sm90, and in a
// build without the sm90a backward kernels.
// Lengths are chosen around the tiles (128 keys per CTA at d64/d128, 64 at d256, 64 query rows
// per iteration): 1, 77, 200 and 1000 are not multiples of either. d256 is the other layout
// (consumer warpgroups split the head dim, bwd_tile_table.hpp), so it gets every check the
// d64/d128 layout gets; d160 and d192 run zero-padded on it. Cases whose kernel a
// FLASHCPP_HEAD_DIMS / FLASHCPP_DTYPES subset lacks are skipped and listed (the harness's
// report_unbuilt_cases()); the GPU workflow builds them all.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "cuda_bwd_harness.hpp"
#include "cuda_test_harness.hpp"
#include "flashcpp/flashcpp.hpp"

#ifdef FLASHCPP_TEST_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashcpp {
namespace {

#ifdef FLASHCPP_TEST_WITH_CUDA

using namespace cuda_test;

// A case that requests Backend::cuda_sm90 and must run on it.
struct Sm90BwdCase : BwdCase {
  Sm90BwdCase() {
    backend = Backend::cuda_sm90;
    expect = Backend::cuda_sm90;
  }
};

// Why the sm90 backward suite cannot run here, or empty when it can: a 1 x 1 bf16 d64 call
// tells whether this build has the sm90a backward kernel and this GPU can run it.
std::string sm90_bwd_skip_reason() {
  if (const std::string why = not_sm90_reason(); !why.empty()) return why;
  try {
    BwdResult r;
    run_bwd_case(Sm90BwdCase{}, r);
    if (r.info.backend != Backend::cuda_sm90)
      return std::string("a bf16 d64 backward ran on ") + backend_name(r.info.backend);
  } catch (const Error& e) {
    return e.what();  // e.g. no backward kernel for d64 in this build
  }
  return "";
}

class CudaSm90Backward : public ::testing::Test {
 protected:
  void SetUp() override {
    static const std::string reason = sm90_bwd_skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
  void TearDown() override { report_unbuilt_cases(); }
};

TEST_F(CudaSm90Backward, ReportsBackendAndKernel) {
  Sm90BwdCase c;
  c.Nq = c.Nk = 64;
  const BwdResult r = check(c);  // d64 bf16: built, or the suite would have skipped
  EXPECT_NE(std::string(r.info.kernel).find("sm90_bwd_bf16_hdim64"), std::string::npos)
      << r.info.kernel;
  EXPECT_EQ(r.info.num_splits, 1);
  // d256 (and d160, d192 padded to it) runs the split-head-dim kernel with 64-key CTAs.
  for (int d : {256, 192, 160}) {
    c.D = d;
    const BwdResult r256 = check(c);
    if (!r256.not_built) {
      EXPECT_NE(std::string(r256.info.kernel).find("sm90_bwd_bf16_hdim256_64x64"),
                std::string::npos)
          << r256.info.kernel;
    }
  }
}

// The automatic backend runs the sm90 backward on Hopper unless FLASHCPP_DISABLE_SM90=1.
TEST_F(CudaSm90Backward, AutomaticBackendFollowsTheSwitch) {
  const char* env = std::getenv("FLASHCPP_DISABLE_SM90");
  const bool disabled = env != nullptr && std::string(env) == "1";
  Sm90BwdCase c;
  c.Nq = 77;
  c.Nk = 200;
  c.causal = true;
  c.backend = Backend::automatic;
  c.expect = disabled ? Backend::cuda_sm80 : Backend::cuda_sm90;
  check(c);
}

// Every head dim, causal or not, every pair of lengths from {1, 77, 200, 1000} with Nq != Nk
// both ways, plus 128 x 128 (exact tiles) and 113 x 203. B 2, 2 heads.
TEST_F(CudaSm90Backward, HeadDimsLengthsCausal) {
  for (int d : {64, 128, 256})
    for (auto [nq, nk] : {std::pair{1, 1}, {77, 77}, {200, 200}, {128, 128}, {1, 200},
                          {200, 1}, {77, 1000}, {1000, 77}, {113, 203}, {203, 113}})
      for (bool causal : {false, true}) {
        Sm90BwdCase c;
        c.D = d;
        c.B = 2;
        c.Hq = c.Hkv = 2;
        c.Nq = nq;
        c.Nk = nk;
        c.causal = causal;
        check(c);
      }
}

TEST_F(CudaSm90Backward, LongSequence) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Sm90BwdCase c;
      c.Nq = c.Nk = 1000;
      c.D = d;
      c.causal = causal;
      check(c);
    }
}

// Head dims below an instantiated one run zero-padded on it (d32 and d80 on hdim64/hdim128,
// d160 and d192 on hdim256).
TEST_F(CudaSm90Backward, PaddedHeadDims) {
  for (int d : {32, 80, 160, 192})
    for (bool causal : {false, true}) {
      Sm90BwdCase c;
      c.D = d;
      c.Nq = 150;
      c.Nk = 260;
      c.causal = causal;
      check(c);
    }
}

TEST_F(CudaSm90Backward, GqaAndMqa) { check_gqa_and_mqa(Sm90BwdCase{}); }

// check_gqa_and_mqa's cases (d64, d128) at d256: dK, dV summed over the group's heads in the
// split-head-dim registers, dQ's atomics per query head.
TEST_F(CudaSm90Backward, GqaAndMqaHeadDim256) {
  for (auto [hq, hkv] : {std::pair{8, 2}, {8, 1}, {4, 4}})
    for (bool causal : {false, true}) {
      Sm90BwdCase c;
      c.Hq = hq;
      c.Hkv = hkv;
      c.D = 256;
      c.Nq = 113;
      c.Nk = 203;
      c.causal = causal;
      check(c);
    }
  Sm90BwdCase c;  // many query blocks per head and several heads per kv head
  c.Hq = 4;
  c.Hkv = 1;
  c.D = 256;
  c.Nq = c.Nk = 1000;
  c.causal = true;
  check(c);
}

TEST_F(CudaSm90Backward, WindowAndSoftcap) {
  for (int d : {64, 128, 256})
    for (auto [wl, wr] : {std::pair{-1, -1}, {32, 0}, {17, 5}, {-1, 40}, {0, 0}, {150, 100}})
      for (float softcap : {0.f, 5.f}) {
        Sm90BwdCase c;
        c.Hq = 4;
        c.Hkv = 2;
        c.D = d;
        c.Nq = 150;
        c.Nk = 260;
        c.wl = wl;
        c.wr = wr;
        c.softcap = softcap;
        check(c);
      }
  for (int d : {128, 256}) {
    Sm90BwdCase c;
    c.Nq = 203;
    c.Nk = 113;
    c.D = d;
    c.causal = true;
    c.softcap = 30.f;
    check(c);
  }
}

TEST_F(CudaSm90Backward, BhsdStrides) {
  check_bhsd_strides(Sm90BwdCase{});  // d128
  for (bool causal : {false, true}) {
    Sm90BwdCase c;
    c.bhsd = true;
    c.B = 2;
    c.Hq = 4;
    c.Hkv = 2;
    c.Nq = 200;
    c.Nk = 333;
    c.D = 256;
    c.causal = causal;
    check(c);
  }
}

TEST_F(CudaSm90Backward, UnseenRowsAndKeysGiveZero) {
  for (int d : {64, 256}) {
    Sm90BwdCase c;
    c.D = d;
    check_unseen_rows_and_keys_give_zero(c);
  }
}

TEST_F(CudaSm90Backward, Fp16) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Sm90BwdCase c;
      c.dtype = DType::fp16;
      c.D = d;
      c.Hq = 4;
      c.Hkv = 2;
      c.Nq = 200;
      c.Nk = 77;
      c.causal = causal;
      check(c);
    }
}

TEST_F(CudaSm90Backward, WorkspaceTooSmallThrows) {
  check_workspace_too_small_throws(Sm90BwdCase{});
}

#else  // built without CUDA: the suite still compiles and says why it does nothing

TEST(CudaSm90Backward, NeedsCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace flashcpp
