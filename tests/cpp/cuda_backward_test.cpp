// CUDA backward (dq, dk, dv) against the float64 reference backward, once per GPU backend,
// requested explicitly: CudaBackward's tests run on both (names end /sm80 and /sm90),
// CudaBackwardSm80's and CudaBackwardSm90's on the one they name. The sm90a backward is a TMA +
// wgmma main kernel between the sm80 pre- and post-pass; its d64/d128 layout has 128 keys per
// CTA, d256 is the other layout (consumer warpgroups split the head dim, 64 keys per CTA,
// bwd_tile_table.hpp), so sm90 sweeps visit each, and d160, d192 run zero-padded on d256.
// D != Dv runs on sm90a only, on the (D, Dv) pair instantiations (192x128 here).
// Every test skips without a GPU (CI has none), and the sm90 ones on a GPU that is not sm90 or
// in a build without the sm90a backward kernels. The harness is cuda_harness.hpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_harness.hpp"
#include "flashcpp/flashcpp.hpp"

namespace flashcpp {
namespace {

using namespace cuda_test;

#ifdef FLASHCPP_TEST_WITH_CUDA

class CudaBackward : public BackendSuite<backward_skip_reason> {
 protected:
  // A case that requests the backend under test and must run on it.
  BwdCase base() const {
    BwdCase c;
    c.backend = c.expect = GetParam();
    return c;
  }
};
class CudaBackwardSm80 : public CudaBackward {};
class CudaBackwardSm90 : public CudaBackward {};

INSTANTIATE_TEST_SUITE_P(, CudaBackward, kGpuBackends, backend_suffix);
INSTANTIATE_TEST_SUITE_P(, CudaBackwardSm80, ::testing::Values(Backend::cuda_sm80),
                         backend_suffix);
INSTANTIATE_TEST_SUITE_P(, CudaBackwardSm90, ::testing::Values(Backend::cuda_sm90),
                         backend_suffix);

// GQA, MQA and MHA at each head dim of `dims`, causal or not, Nq 113, Nk 203; then many query
// blocks per head and several heads per kv head at head dim `long_d`.
void check_gqa_and_mqa(const BwdCase& base, std::initializer_list<int> dims, int long_d) {
  for (auto [hq, hkv] : {std::pair{8, 2}, {8, 1}, {4, 4}})
    for (int d : dims)
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
  BwdCase c = base;
  c.Hq = 4;
  c.Hkv = 1;
  c.D = long_d;
  c.Nq = c.Nk = 1000;
  c.causal = true;
  check(c);
}

// Queries that see no key get dq = 0 and keys no query sees get dk = dv = 0, exactly; with
// Nk = 1000 and window (0, 0) whole key blocks see no query at all (CTAs that load nothing
// and only store zeros).
void check_unseen_rows_and_keys_give_zero(const BwdCase& base) {
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

// ---- both backends ------------------------------------------------------------------------------

// B 2, 2 heads, causal or not, Nq != Nk both ways. sm90 at each layout's head dims, with every
// pair of lengths from {1, 77, 200, 1000} (multiples of neither its 64-row query iterations
// nor its key blocks), plus 128 x 128 (exact tiles) and 113 x 203; its fp16 cases are in Fp16.
TEST_P(CudaBackward, HeadDimsDtypesLengths) {
  const Lengths lengths = per_backend(
      Lengths{{1, 1}, {17, 17}, {113, 203}, {203, 113}, {128, 128}},
      Lengths{{1, 1}, {77, 77}, {200, 200}, {128, 128}, {1, 200}, {200, 1}, {77, 1000},
              {1000, 77}, {113, 203}, {203, 113}});
  check_sweep(base(), per_backend(std::vector{DType::bf16, DType::fp16}, std::vector{DType::bf16}),
              per_backend(std::vector{64, 128}, std::vector{64, 128, 256}), lengths);
}

TEST_P(CudaBackward, LongSequence) {
  for (int d : per_backend(std::vector{64}, std::vector{64, 128, 256}))
    for (bool causal : {false, true}) {
      BwdCase c = base();
      c.Nq = c.Nk = 1000;
      c.D = d;
      c.causal = causal;
      check(c);
    }
}

// Windows x softcap 0 or 5 (Nq 150, Nk 260; sm80: 2 heads, d64; sm90: 4/2 heads at each
// layout's head dims, and a window wider than a key block), then causal with Nq > Nk and
// softcap 30 (sm80: fp16 d128; sm90: bf16 d128 and d256).
TEST_P(CudaBackward, WindowAndSoftcap) {
  std::vector<std::pair<int, int>> windows = {{-1, -1}, {32, 0}, {17, 5}, {-1, 40}, {0, 0}};
  if (sm90()) windows.push_back({150, 100});
  for (int d : per_backend(std::vector{64}, std::vector{64, 128, 256}))
    for (auto [wl, wr] : windows)
      for (float softcap : {0.f, 5.f}) {
        BwdCase c = base();
        c.Hq = per_backend(2, 4);
        c.Hkv = 2;
        c.D = d;
        c.Nq = 150;
        c.Nk = 260;
        c.wl = wl;
        c.wr = wr;
        c.softcap = softcap;
        check(c);
      }
  for (int d : per_backend(std::vector{128}, std::vector{128, 256})) {
    BwdCase c = base();
    c.dtype = per_backend(DType::fp16, DType::bf16);
    c.Nq = 203;
    c.Nk = 113;
    c.D = d;
    c.causal = true;
    c.softcap = 30.f;
    check(c);
  }
}

TEST_P(CudaBackward, GqaAndMqa) { check_gqa_and_mqa(base(), {64, 128}, 128); }

TEST_P(CudaBackward, BhsdStrides) {
  for (int d : per_backend(std::vector{128}, std::vector{128, 256})) check_bhsd_strides(base(), d);
}

TEST_P(CudaBackward, UnseenRowsAndKeysGiveZero) {
  for (int d : per_backend(std::vector{64}, std::vector{64, 256})) {
    BwdCase c = base();
    c.D = d;
    check_unseen_rows_and_keys_give_zero(c);
  }
}

// Padded and varlen calls given 4 bytes less workspace than asked for, or a workspace that
// starts 4 bytes past a 16-byte boundary, throw and name it.
TEST_P(CudaBackward, WorkspaceTooSmallThrows) {
  for (bool varlen : {false, true})
    for (bool misaligned : {false, true}) {
      BwdCase c = base();
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
        run_case(c, r);
        ADD_FAILURE() << "expected flashcpp::Error (" << describe(c) << ")";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      }
    }
}

// ---- deterministic ------------------------------------------------------------------------------

// deterministic = true: five runs give the same bits and the right gradients, and RunInfo names
// a "_deterministic" kernel of the backend under test. sm80: dQ from the dq kernel (no
// atomics); sm90: the key-block CTAs add dQ in a fixed order (sm90/bwd_dq_order.hpp). The
// shapes include many key blocks adding into the same dQ rows (64 queries x 4096 keys: 32 or
// 64 key-block CTAs per row), GQA (dK, dV summed over 4 query heads), causal, d256 (window +
// softcap) and varlen with empty sequences (key blocks that add nothing).
TEST_P(CudaBackward, DeterministicBitwiseAndCorrect) {
  constexpr int kRuns = 5;
  for (bool causal : {false, true}) {
    BwdCase c = base();  // GQA 8/2
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
    BwdCase c = base();  // many key blocks per dQ row
    c.deterministic = true;
    c.Hq = 2;
    c.Hkv = 1;
    c.Nq = 64;
    c.Nk = 4096;
    c.causal = causal;
    check(c, kRuns);
  }
  {
    BwdCase c = base();  // d256 (sm80: 32-row query blocks; sm90: split_d), fp16, window + softcap
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
    BwdCase c = base();  // varlen with an empty query and an empty key sequence, causal, GQA
    c.deterministic = true;
    c.seqlens_q = {17, 0, 130, 1, 64};
    c.seqlens_k = {40, 5, 130, 0, 300};
    c.Hq = 4;
    c.Hkv = 2;
    c.causal = true;
    check(c, kRuns);
  }
  {
    BwdCase c = base();  // bhsd strides, queries that see no key (dq exactly 0)
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

// The sm90a deterministic backward with other work on the GPU (BwdCase::busy_gpu), so that
// its CTAs reach the dQ reductions in another order each run: every head dim layout (d64 float4
// reductions by turns, d128 bulk reductions, d256 split_d), windows, causal, softcap, GQA;
// shapes whose tickets interleave several (kv head, batch) pairs, with a partial last group
// (28/7 heads, B 2, N 512: groups of 8 or 9 of the 14 pairs on an H100); varlen.
TEST_P(CudaBackwardSm90, DeterministicUnderLoad) {
  constexpr int kRuns = 6;
  for (int d : {64, 128, 256})
    for (auto [causal, wl, wr, softcap] : {std::tuple{false, -1, -1, 0.f}, {true, -1, -1, 0.f},
                                           {false, 100, 7, 0.f}, {true, -1, -1, 30.f}}) {
      BwdCase c = base();
      c.deterministic = true;
      c.busy_gpu = true;
      c.B = 2;
      c.Hq = 4;
      c.Hkv = 2;
      c.Nq = 300;
      c.Nk = 700;
      c.D = d;
      c.causal = causal;
      c.wl = wl;
      c.wr = wr;
      c.softcap = softcap;
      check(c, kRuns);
    }
  for (bool causal : {false, true}) {
    BwdCase c = base();  // ticket groups of several pairs, the last one partial
    c.deterministic = true;
    c.busy_gpu = true;
    c.B = 2;
    c.Hq = 28;
    c.Hkv = 7;
    c.Nq = c.Nk = 512;
    c.D = 128;
    c.causal = causal;
    check(c, kRuns);
  }
  for (int d : {64, 128, 256}) {
    BwdCase c = base();  // varlen
    c.deterministic = true;
    c.busy_gpu = true;
    make_varlen_mixed(c, d, kVarlenMasks[1]);
    check(c, kRuns);
  }
}

// ---- varlen, sm80 head dims beyond 128 ----------------------------------------------------------

// Varlen (cu_seqlens): sequences of different lengths, one with no queries (its keys get
// dk = dv = 0) and one with no keys (its queries get dq = 0), sequences spanning several key
// and query blocks, Nq != Nk per sequence; causal or not, GQA and MHA, both dtypes.
TEST_P(CudaBackward, VarlenWithEmptySequences) {
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> lengths = {
      {{17, 0, 130, 1, 64}, {40, 5, 130, 0, 300}},
      {{300, 65, 0, 129}, {257, 700, 64, 1}},
  };
  for (const auto& [lq, lk] : lengths)
    for (bool causal : {false, true})
      for (auto [hq, hkv, d, t] : {std::tuple{4, 1, 64, DType::bf16}, {2, 2, 128, DType::fp16}}) {
        BwdCase c = base();
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
  BwdCase c = base();  // window and softcap
  c.seqlens_q = {150, 7, 90};
  c.seqlens_k = {260, 200, 33};
  c.Hq = c.Hkv = 2;
  c.wl = 17;
  c.wr = 5;
  c.softcap = 5.f;
  check(c);
}

// The varlen sweep (make_varlen_mixed) at each sm90 head dim and d96 (zero-padded to 128).
TEST_P(CudaBackward, VarlenMixedLengths) {
  for (int d : {64, 96, 128, 256})
    for (const MaskCase& m : kVarlenMasks) {
      BwdCase c = base();
      make_varlen_mixed(c, d, m);
      check(c);
    }
}

// Head dims beyond 128 (d192 and d256: 64-key CTAs, sm80/bwd_tile_table.hpp) and head dims
// that run zero-padded in a larger instantiation (96 in the d96 one or, without it, the next
// larger; 160 in d192 or d256), Nq != Nk both ways.
TEST_P(CudaBackwardSm80, LargeAndPaddedHeadDims) {
  check_sweep(base(), {DType::bf16, DType::fp16}, {96, 160, 192, 256},
              {{1, 1}, {113, 203}, {203, 113}});
  for (int d : {192, 256}) {
    BwdCase c = base();  // GQA, window, softcap, bhsd at the large head dims
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
  BwdCase c = base();  // a long d256 sequence: many query blocks per key block
  c.D = 256;
  c.Nq = c.Nk = 1000;
  c.causal = true;
  check(c);
}

// Every tile row of the main kernel (sm80/bwd_tile_table.hpp): each instantiated head dim,
// causal or not, lengths that cut query and key blocks of every row's sizes (1, 113, 203, 257,
// 300), GQA 4/2, both dtypes. Run as is on an H100 it covers the largest rows; the ctest
// entries cuda_backward_sm80_smem163 and cuda_backward_sm80_smem99 run it again with
// FLASHCPP_SM80_SMEM_BUDGET=163 (the A100 rows) and =99 (the sm86 / sm89 rows).
TEST_P(CudaBackwardSm80, EveryTileRow) {
  for (int d : {32, 64, 96, 128, 192, 256})
    for (auto [nq, nk] : Lengths{{1, 1}, {113, 203}, {257, 300}, {300, 129}})
      for (bool causal : {false, true}) {
        BwdCase c = base();
        c.dtype = d == 96 || d == 192 ? DType::fp16 : DType::bf16;
        c.D = d;
        c.Hq = 4;
        c.Hkv = 2;
        c.Nq = nq;
        c.Nk = nk;
        c.causal = causal;
        check(c);
      }
}

// The main kernel's tile follows the shared-memory budget: on a GPU with at least 160 KB per
// block, d128 takes the 64x128 row with two Q and two dO buffers; FLASHCPP_SM80_SMEM_BUDGET=99
// (or a 99 KB GPU) gives the 64x64 row with two Q buffers and one dO buffer. The kernel name
// says which ran.
TEST_P(CudaBackwardSm80, TileFollowsSmemBudget) {
  int device = 0, optin = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
            cudaSuccess);
  const char* env = std::getenv("FLASHCPP_SM80_SMEM_BUDGET");
  int budget = optin;
  if (env != nullptr && *env != '\0' && std::atoi(env) * 1024 < budget) budget = std::atoi(env) * 1024;
  BwdCase c = base();
  c.D = 128;
  c.Nq = c.Nk = 200;
  const BwdResult r = check(c);
  if (r.not_built) return;
  const std::string kernel = r.info.kernel;
  const char* expected =
      budget >= 160 * 1024 ? "_hdim128_64x128_8w_q2do2" : "_hdim128_64x64_8w_q2do1";
  EXPECT_NE(kernel.find(expected), std::string::npos) << kernel << " (budget " << budget << " B)";
}

// ---- sm90 ---------------------------------------------------------------------------------------

TEST_P(CudaBackwardSm90, ReportsBackendAndKernel) {
  BwdCase c = base();
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
  // Deterministic calls run the sm90a kernel too, named so.
  c.D = 64;
  c.deterministic = true;
  const BwdResult det = check(c);
  EXPECT_NE(std::string(det.info.kernel).find("sm90_bwd_bf16_hdim64_64x128_s2_ws_deterministic"),
            std::string::npos)
      << det.info.kernel;
}

// The automatic backend runs the sm90 backward on Hopper unless FLASHCPP_DISABLE_SM90=1.
TEST_P(CudaBackwardSm90, AutomaticBackendFollowsTheSwitch) {
  const char* env = std::getenv("FLASHCPP_DISABLE_SM90");
  const bool disabled = env != nullptr && std::string(env) == "1";
  BwdCase c = base();
  c.Nq = 77;
  c.Nk = 200;
  c.causal = true;
  c.backend = Backend::automatic;
  c.expect = disabled ? Backend::cuda_sm80 : Backend::cuda_sm90;
  check(c);
  c.deterministic = true;  // deterministic calls alike
  check(c, 2);
}

// Head dims below an instantiated one run zero-padded on it (d32 and d80 on hdim64/hdim128,
// d160 and d192 on hdim256).
TEST_P(CudaBackwardSm90, PaddedHeadDims) {
  for (int d : {32, 80, 160, 192})
    for (bool causal : {false, true}) {
      BwdCase c = base();
      c.D = d;
      c.Nq = 150;
      c.Nk = 260;
      c.causal = causal;
      check(c);
    }
}

// GqaAndMqa's cases at d256: dK, dV summed over the group's heads in the split-head-dim
// registers, dQ's atomics per query head.
TEST_P(CudaBackwardSm90, GqaAndMqaHeadDim256) { check_gqa_and_mqa(base(), {256}, 256); }

TEST_P(CudaBackwardSm90, Fp16) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      BwdCase c = base();
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

// ---- D != Dv ------------------------------------------------------------------------------------


// D != Dv (DeepSeek-style MLA prefill: D 192, Dv 128) on the 192x128 instantiation (split by
// head dim, Q and K in the 64-byte swizzle): dq and dk [.., 192], dv [.., 128]. bf16 and
// fp16, causal or not, lengths across the 64-row and 64-key blocks, GQA/MQA (dK, dV summed
// over the group), windows and softcap.
TEST_P(CudaBackwardSm90, HeadDimPair192x128) {
  for (DType t : {DType::bf16, DType::fp16})
    for (auto [nq, nk] : Lengths{{113, 203}, {203, 113}, {64, 64}, {1, 300}})
      for (bool causal : {false, true}) {
        BwdCase c = pair_case(base(), 192, 128);
        c.dtype = t;
        c.B = 2;
        c.Hq = c.Hkv = 2;
        c.Nq = nq;
        c.Nk = nk;
        c.causal = causal;
        expect_pair_kernel("bwd", c, check(c), "192x128");
      }
  for (auto [hq, hkv] : {std::pair{8, 2}, {8, 1}})
    for (bool causal : {false, true}) {
      BwdCase c = pair_case(base(), 192, 128);
      c.Hq = hq;
      c.Hkv = hkv;
      c.Nq = 300;
      c.Nk = 520;
      c.causal = causal;
      check(c);
    }
  for (auto [wl, wr] : {std::pair{17, 5}, {150, 100}})
    for (float softcap : {0.f, 30.f}) {
      BwdCase c = pair_case(base(), 192, 128);
      c.Hq = 4;
      c.Hkv = 2;
      c.Nq = 150;
      c.Nk = 260;
      c.wl = wl;
      c.wr = wr;
      c.softcap = softcap;
      check(c);
    }
  BwdCase c = pair_case(base(), 192, 128);
  c.Hq = 4;
  c.Hkv = 1;
  c.Nq = c.Nk = 1000;
  c.causal = true;
  check(c);
}

// D != Dv, the rest: varlen, [B, H, N, D] strides, smaller pairs zero-padded onto 192x128
// (small enough for compute-sanitizer).
TEST_P(CudaBackwardSm90, HeadDimPairVarlenPaddingStrides) {
  for (const MaskCase& m : kVarlenMasks) {
    BwdCase c = pair_case(base(), 192, 128);
    make_varlen_mixed(c, 192, m);
    expect_pair_kernel("bwd", c, check(c), "192x128");
  }
  check_bhsd_strides(pair_case(base(), 192, 128), 192);
  for (auto [d, dv] : {std::pair{160, 96}, {136, 64}, {128, 120}}) {
    BwdCase c = pair_case(base(), d, dv);
    c.Nq = 150;
    c.Nk = 260;
    c.Hq = 4;
    c.Hkv = 2;
    c.causal = true;
    expect_pair_kernel("bwd", c, check(c), "192x128");
  }
}

// The sm80 backward has no D != Dv kernel: the call is refused with an error that names both
// head dims and the sm90a backward that takes them.
TEST_P(CudaBackwardSm80, HeadDimPairIsRefused) {
  BwdCase c = base();
  c.D = 192;
  c.Dv = 128;
  c.Nq = c.Nk = 64;
  const std::string what = error_of<BwdResult>(c);
  EXPECT_NE(what.find("head_dim_v 128"), std::string::npos) << what;
  EXPECT_NE(what.find("sm90a"), std::string::npos) << what;
}

#else  // built without CUDA: the suite still compiles and says why it does nothing

class CudaBackward : public ::testing::TestWithParam<Backend> {};
INSTANTIATE_TEST_SUITE_P(, CudaBackward, kGpuBackends, backend_suffix);

TEST_P(CudaBackward, NeedsCuda) { skip_built_without_cuda(); }

#endif

}  // namespace
}  // namespace flashcpp
