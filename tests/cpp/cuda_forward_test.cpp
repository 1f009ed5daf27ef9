// CUDA sm80 forward against the float64 reference (Backend::cpu_reference on host copies of
// the same rounded inputs), with Backend::cuda_sm80 requested (on Hopper the automatic backend
// takes the sm90 kernels, tested in cuda_sm90_forward_test.cpp). Every test skips when no GPU is present
// (CI has none). The harness and the checks shared with cuda_sm90_forward_test.cpp are in
// cuda_test_harness.hpp. Cases whose kernel a FLASHCPP_HEAD_DIMS / FLASHCPP_DTYPES subset lacks
// are skipped and listed (report_unbuilt_cases()); the GPU workflow builds them all.
#include <gtest/gtest.h>

#include <string>

#include "cuda_test_harness.hpp"
#include "flashcpp/flashcpp.hpp"

namespace flashcpp {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU: the cuda forward tests need one"

#ifdef FLASHCPP_TEST_WITH_CUDA

using namespace cuda_test;

class CudaForward : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override { report_unbuilt_cases(); }
};

TEST_F(CudaForward, ReportsBackendAndKernel) {
  check_reports_backend_and_kernel(Case{}, "hdim64");
}

TEST_F(CudaForward, EveryHeadDimAndDtype) { check_every_head_dim_and_dtype(Case{}); }

TEST_F(CudaForward, SequenceLengths) {
  check_sequence_lengths(Case{}, 128, {{1, 1}, {17, 17}, {113, 203}, {203, 113}, {128, 128},
                                       {1000, 1000}, {1, 300}, {300, 1}});
}

TEST_F(CudaForward, WindowSoftcapGqaMqa) { check_window_softcap_gqa_mqa(Case{}); }

TEST_F(CudaForward, BhsdStrides) { check_bhsd_strides(Case{}); }

TEST_F(CudaForward, VarlenWithEmptySequence) { check_varlen_with_empty_sequence(Case{}); }

TEST_F(CudaForward, RowsWithoutVisibleKeysGiveZeroAndMinusInf) {
  check_rows_without_visible_keys(Case{});
}

TEST_F(CudaForward, SplitKvForced) {
  for (bool causal : {false, true}) {
    Case c;
    c.causal = causal;
    const Result r = check_split_kv_forced(c);
    if (!r.not_built) {
      EXPECT_NE(std::string(r.info.kernel).find("splitkv"), std::string::npos);
    }
  }
  Case c;
  c.seqlens_q = {3, 0, 70};
  c.seqlens_k = {500, 7, 1};
  c.Hq = 2;
  c.num_splits = 3;
  check(c);
}

TEST_F(CudaForward, SplitKvForcedWithoutWorkspaceThrows) {
  Case c;
  c.Nq = 1;
  c.Nk = 4096;
  c.num_splits = 3;
  c.give_workspace = false;
  Result r;
  try {
    run_case(c, r);
    FAIL() << "expected flashcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace: needs"), std::string::npos) << e.what();
  }
}

TEST_F(CudaForward, SplitKvHeuristicDecode) {
  Case c = decode_case(Case{});
  const Result r = check(c);
  if (r.not_built) return;
  EXPECT_GT(r.info.num_splits, 1) << "decode shape should split";
  c.give_workspace = false;  // no workspace: same answer, unsplit
  const Result r2 = check(c);
  EXPECT_EQ(r2.info.num_splits, 1);
}

TEST_F(CudaForward, RepeatedRunsBitwiseIdentical) {
  for (int splits : {0, 4}) {
    Case c;
    c.num_splits = splits;
    check_repeated_runs_bitwise_identical(c, 96);
  }
}

// Element offsets that wrap in int32 would read batch 0 or fault.
TEST_F(CudaForward, OffsetsBeyond2To31Elements) {
  check_offsets_beyond_2to31_elements(Backend::cuda_sm80, Backend::cuda_sm80);
}

#else  // built without CUDA: the suite still compiles and says why it does nothing

TEST(CudaForward, NeedsCuda) {
  SKIP_WITHOUT_GPU();
  FAIL() << "cuda_available() is true in a build without CUDA";
}

#endif

}  // namespace
}  // namespace flashcpp
