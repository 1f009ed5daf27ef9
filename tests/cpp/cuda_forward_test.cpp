// CUDA forward against the float64 reference (Backend::cpu_reference on host copies of the
// same rounded inputs), once per GPU backend, requested explicitly: CudaForward's tests run on
// both (names end /sm80 and /sm90), CudaForwardSm80's and CudaForwardSm90's on the one they
// name. On Hopper the automatic backend takes the sm90a kernels (TMA + wgmma,
// warp-specialised); those do not cover split-KV yet, which must fall back to the sm80
// kernels and say so in RunInfo. Every test skips without a GPU (CI has none), and the
// sm90 ones on a GPU that is not sm90 or in a build without the sm90a kernels. The harness is
// cuda_harness.hpp; the GPU workflow builds every kernel, so it skips no case. A subset that
// has an sm80-only head dim (32, 96, 192) but not the sm90 one above it (64, 128, 256) still
// fails on sm90: those cases run on sm80 instead, which is a fallback, not a missing kernel.
// D != Dv runs on sm90a only, on the (D, Dv) pair instantiations (192x128 here); sm80 refuses it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/sm80/fwd_tile_table.hpp"
#ifdef FLASHCPP_TEST_WITH_CUDA
#include "cuda/sm90/fwd_tile_table.hpp"  // reads the configure-time tile switches
#endif
#include "cuda_harness.hpp"
#include "flashcpp/flashcpp.hpp"

namespace flashcpp {
namespace {

using namespace cuda_test;

#ifdef FLASHCPP_TEST_WITH_CUDA

class CudaForward : public BackendSuite<forward_skip_reason> {
 protected:
  // A case that requests the backend under test and must run on it. On sm90 it is unsplit
  // (num_splits 1) unless a test asks otherwise: the sm90 split-KV tests set their own.
  FwdCase base() const {
    FwdCase c;
    c.backend = c.expect = GetParam();
    if (sm90()) c.num_splits = 1;
    return c;
  }
};
class CudaForwardSm80 : public CudaForward {};
class CudaForwardSm90 : public CudaForward {};

INSTANTIATE_TEST_SUITE_P(, CudaForward, kGpuBackends, backend_suffix);
INSTANTIATE_TEST_SUITE_P(, CudaForwardSm80, ::testing::Values(Backend::cuda_sm80),
                         backend_suffix);
INSTANTIATE_TEST_SUITE_P(, CudaForwardSm90, ::testing::Values(Backend::cuda_sm90),
                         backend_suffix);

// Split-KV forced to 3 splits: B 2, 4/2 heads, Nq 77, Nk 1000, head dim d. Returns the result.
FwdResult check_split_kv_forced(FwdCase c, int d = 128) {
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 2;
  c.Nq = 77;
  c.Nk = 1000;
  c.D = d;
  c.num_splits = 3;
  const FwdResult r = check(c);
  if (!r.not_built) {
    EXPECT_EQ(r.info.num_splits, 3);
  }
  return r;
}

// A decode shape the split heuristic splits: one query row, 8192 keys, 2 heads, d128.
FwdCase decode_case(FwdCase c) {
  c.Hq = c.Hkv = 2;
  c.Nq = 1;
  c.Nk = 8192;
  c.D = 128;
  return c;
}

// ---- both backends ------------------------------------------------------------------------------

// A 64 x 64, d64 call reports the backend, one of its kernels, and no split.
TEST_P(CudaForward, ReportsBackendAndKernel) {
  FwdCase c = base();
  c.Nq = c.Nk = 64;
  FwdResult r;
  run_built_case(c, r);
  if (r.not_built) return;
  EXPECT_EQ(r.info.backend, c.expect);
  // The smallest built head dim that covers 64 runs it: hdim64 unless the build left d64 out.
  const std::string kernel = r.info.kernel;
  const std::string prefix = per_backend(std::string("hdim"), std::string("sm90_fwd_bf16_hdim"));
  const std::size_t at = kernel.find(prefix);
  ASSERT_NE(at, std::string::npos) << kernel;
  EXPECT_GE(std::atoi(kernel.c_str() + at + prefix.size()), 64) << kernel;
  EXPECT_EQ(r.info.num_splits, 1);
}

// bf16 and fp16, every head dim, causal or not: B 2, 2 heads, Nq 113, Nk 203.
TEST_P(CudaForward, EveryHeadDimAndDtype) {
  check_sweep(base(), {DType::bf16, DType::fp16}, {32, 64, 80, 96, 128, 192, 256}, {{113, 203}});
}

// Lengths around and across the tile sizes, Nq != Nk both ways, causal or not, 2 heads. sm90
// (128 rows; 128 or 80 keys per tile) also gets lengths across a tile edge and long enough
// for the K/V rings to wrap many times, at each of its instantiated head dims.
TEST_P(CudaForward, SequenceLengths) {
  Lengths lengths = {{1, 1},       {17, 17},     {113, 203}, {203, 113},
                     {128, 128},   {1000, 1000}, {1, 300},   {300, 1}};
  if (sm90()) lengths.insert(lengths.end(), {{129, 257}, {700, 2100}});
  for (int d : per_backend(std::vector{128}, std::vector{64, 128, 256}))
    for (auto [nq, nk] : lengths)
      for (bool causal : {false, true}) {
        FwdCase c = base();
        c.Nq = nq;
        c.Nk = nk;
        c.D = d;
        c.Hq = 2;
        c.Hkv = 2;
        c.causal = causal;
        check(c);
      }
}

// GQA, MQA and MHA heads x windows x softcap 0 or 5: Nq 150, Nk 260, d64.
TEST_P(CudaForward, WindowSoftcapGqaMqa) {
  for (auto [hq, hkv] : {std::pair{8, 1}, {8, 8}, {16, 2}})
    for (auto [wl, wr] : {std::pair{-1, -1}, {32, 0}, {17, 5}, {-1, 40}, {0, 0}})
      for (float softcap : {0.f, 5.f}) {
        FwdCase c = base();
        c.Hq = hq;
        c.Hkv = hkv;
        c.Nq = 150;
        c.Nk = 260;
        c.D = 64;
        c.wl = wl;
        c.wr = wr;
        c.softcap = softcap;
        check(c);
      }
  if (!sm90()) return;
  // Longer sequences: windows wider and narrower than a key block, so query tiles see masked
  // blocks on both sides of an unmasked band, or only masked blocks.
  for (auto [wl, wr] : {std::pair{300, 100}, {5, 5}, {130, 0}}) {
    FwdCase c = base();
    c.Nq = 900;
    c.Nk = 1100;
    c.D = 128;
    c.Hq = 2;
    c.Hkv = 1;
    c.wl = wl;
    c.wr = wr;
    check(c);
  }
}

TEST_P(CudaForward, BhsdStrides) { check_bhsd_strides(base(), 128); }

// Varlen with an empty query and an empty key sequence, 4/1 heads, d64, causal or not.
TEST_P(CudaForward, VarlenWithEmptySequence) {
  for (bool causal : {false, true}) {
    FwdCase c = base();
    c.seqlens_q = {17, 0, 130, 1, 64};
    c.seqlens_k = {40, 5, 130, 0, 300};
    c.Hq = 4;
    c.Hkv = 1;
    c.D = 64;
    c.causal = causal;
    check(c);
  }
}

// The varlen sweep (make_varlen_mixed) at each sm90 head dim and d96 (zero-padded to 128),
// with the workspace the call asks for (sm90a: the dynamic tile deal).
TEST_P(CudaForward, VarlenMixedLengths) {
  for (int d : {64, 96, 128, 256})
    for (const MaskCase& m : kVarlenMasks) {
      FwdCase c = base();
      make_varlen_mixed(c, d, m);
      check(c);
    }
}

// The same lengths without a workspace: sm90a deals the varlen tiles statically then.
TEST_P(CudaForward, VarlenWithoutWorkspace) {
  for (const MaskCase& m : {kVarlenMasks[0], kVarlenMasks[1]}) {
    FwdCase c = base();
    c.give_workspace = false;
    make_varlen_mixed(c, 128, m);
    check(c);
  }
}

TEST_P(CudaForward, RowsWithoutVisibleKeysGiveZeroAndMinusInf) {
  FwdCase c = base();
  c.Nq = 10;
  c.Nk = 4;
  c.causal = true;  // bottom-right: row i sees j <= i - 6, rows 0..5 see nothing
  c.D = 64;
  const FwdResult r = check(c);
  for (int i = 0; !r.not_built && i < 6; ++i) {
    EXPECT_TRUE(std::isinf(r.lse[i]) && r.lse[i] < 0) << "row " << i << " lse " << r.lse[i];
    for (int d = 0; d < c.D; ++d) EXPECT_EQ(r.out[i * c.D + d], 0.f) << "row " << i;
  }
}

// Causal, B 2, 4 heads, Nq 300, Nk 700: one run and three in a row give the same bits. sm80
// at d96, split by the heuristic and in 4; sm90 unsplit and in 4 at each instantiated head dim.
// An unbuilt case is recorded once and compares nothing.
TEST_P(CudaForward, RepeatedRunsBitwiseIdentical) {
  for (int splits : per_backend(std::vector{0, 4}, std::vector{1, 4}))
    for (int d : per_backend(std::vector{96}, std::vector{64, 128, 256})) {
      FwdCase c = base();
      c.num_splits = splits;
      c.B = 2;
      c.Hq = 4;
      c.Nq = 300;
      c.Nk = 700;
      c.D = d;
      c.causal = true;
      FwdResult a, b;
      run_built_case(c, a);
      if (a.not_built) continue;
      run_case(c, b, 3);
      EXPECT_EQ(a.out_bits, b.out_bits) << describe(c);
      EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0) << describe(c);
    }
}

// K/V batch 1 starts 2^31 + 64 elements after batch 0 (one 4 GiB buffer holds both, aliased
// as K and V): element offsets that wrap in int32 would read batch 0 or fault, and sm90's TMA
// descriptor's batch stride must carry the full 64-bit offset. Skips when 4 GiB cannot be
// allocated.
TEST_P(CudaForward, OffsetsBeyond2To31Elements) {
  const int B = 2, Nq = 64, Nk = 200, H = 2, D = 64;
  const std::int64_t batch_stride = (std::int64_t(1) << 31) + 64;
  const std::int64_t kv_elems = batch_stride + std::int64_t(Nk) * H * D;
  DeviceBuffer kv(kv_elems * 2);
  if (!kv.ptr) GTEST_SKIP() << "could not allocate 4 GiB";
  const DType t = DType::bf16;
  std::vector<float> q(std::int64_t(B) * Nq * H * D), k(std::int64_t(B) * Nk * H * D);
  fill_rounded(t, 7, {&q, &k});
  std::vector<std::uint16_t> qb(q.size()), kb(k.size());
  for (std::size_t i = 0; i < q.size(); ++i) qb[i] = to_bits(t, q[i]);
  for (std::size_t i = 0; i < k.size(); ++i) kb[i] = to_bits(t, k[i]);
  const std::int64_t per_batch = std::int64_t(Nk) * H * D;
  cuda_ok(cudaMemcpy(kv.ptr, kb.data(), per_batch * 2, cudaMemcpyHostToDevice));
  cuda_ok(cudaMemcpy(static_cast<std::uint16_t*>(kv.ptr) + batch_stride, kb.data() + per_batch,
                     per_batch * 2, cudaMemcpyHostToDevice));
  DeviceBuffer dq(q.size() * 2), dout(q.size() * 2);
  upload(dq, qb);
  cuda_ok(cudaMemset(dout.ptr, 0xFF, q.size() * 2));
  const Device gpu = Device::cuda(0);
  const TensorView tq = TensorView::contiguous(dq.ptr, t, {B, Nq, H, D}, gpu);
  const TensorView tkv =
      TensorView::strided(kv.ptr, t, {B, Nk, H, D}, {batch_stride, H * D, D, 1}, gpu);
  const TensorView tout = TensorView::contiguous(dout.ptr, t, {B, Nq, H, D}, gpu);
  AttentionOptions opt;
  opt.backend = GetParam();
  const RunInfo info = forward(tq, tkv, tkv, tout, nullptr, opt);
  cuda_ok(cudaDeviceSynchronize());
  EXPECT_EQ(info.backend, GetParam());
  const std::vector<std::uint16_t> ob = download<std::uint16_t>(dout, q.size());

  std::vector<float> ref(q.size());
  AttentionOptions ropt;
  ropt.backend = Backend::cpu_reference;
  forward(TensorView::contiguous(q.data(), DType::fp32, {B, Nq, H, D}),
          TensorView::contiguous(k.data(), DType::fp32, {B, Nk, H, D}),
          TensorView::contiguous(k.data(), DType::fp32, {B, Nk, H, D}),
          TensorView::contiguous(ref.data(), DType::fp32, {B, Nq, H, D}), nullptr, ropt);
  double max_err = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(double(from_bits(t, ob[i])) - ref[i]);
    max_err = e != e ? INFINITY : std::max(max_err, e);
  }
  EXPECT_LE(max_err, out_bound(t));
}

// ---- sm80: split-KV ----------------------------------------------------------------------------

TEST_P(CudaForwardSm80, SplitKvForced) {
  for (bool causal : {false, true}) {
    FwdCase c = base();
    c.causal = causal;
    const FwdResult r = check_split_kv_forced(c);
    if (!r.not_built) {
      EXPECT_NE(std::string(r.info.kernel).find("splitkv"), std::string::npos);
    }
  }
  FwdCase c = base();
  c.seqlens_q = {3, 0, 70};
  c.seqlens_k = {500, 7, 1};
  c.Hq = 2;
  c.num_splits = 3;
  check(c);
}

TEST_P(CudaForwardSm80, SplitKvForcedWithoutWorkspaceThrows) {
  FwdCase c = base();
  c.Nq = 1;
  c.Nk = 4096;
  c.num_splits = 3;
  c.give_workspace = false;
  const std::string what = error_of<FwdResult>(c);
  EXPECT_NE(what.find("workspace: needs"), std::string::npos) << what;
}

TEST_P(CudaForwardSm80, SplitKvHeuristicDecode) {
  FwdCase c = decode_case(base());
  const FwdResult r = check(c);
  if (r.not_built) return;
  EXPECT_GT(r.info.num_splits, 1) << "decode shape should split";
  c.give_workspace = false;  // no workspace: same answer, unsplit
  const FwdResult r2 = check(c);
  EXPECT_EQ(r2.info.num_splits, 1);
}

// ---- sm80: tile rows --------------------------------------------------------------------------

// Sets FLASHCPP_SM80_FWD_TILE_D<d> for the scope and puts back what was there (the GPU runs
// force a row for the whole suite this way: each row's correctness run).
class ScopedTileOverride {
 public:
  ScopedTileOverride(int head_dim, const std::string& name)
      : var_("FLASHCPP_SM80_FWD_TILE_D" + std::to_string(head_dim)) {
    if (const char* old = std::getenv(var_.c_str())) old_ = old, had_ = true;
    setenv(var_.c_str(), name.c_str(), 1);
  }
  ~ScopedTileOverride() {
    if (had_)
      setenv(var_.c_str(), old_.c_str(), 1);
    else
      unsetenv(var_.c_str());
  }

 private:
  std::string var_, old_;
  bool had_ = false;
};

// The shared memory per block the sm80 tile choice may use (the device's opt-in limit or
// FLASHCPP_SM80_SMEM_BUDGET in KB, the smaller).
int sm80_budget_bytes() {
  int device = 0, optin = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
            cudaSuccess);
  const char* env = std::getenv("FLASHCPP_SM80_SMEM_BUDGET");
  if (env != nullptr && *env != '\0' && std::atoi(env) * 1024 < optin) return std::atoi(env) * 1024;
  return optin;
}

// Every row of the head dims that have several (fwd_tile_table.hpp: d192, d256), forced by
// name, where the budget holds it: lengths across its query and key blocks (1, 63-65, 113,
// 129, 203, 257, 300, 1000), causal or not, a window with softcap and GQA, varlen, forced
// splits; the kernel name says which row ran.
TEST_P(CudaForwardSm80, EveryTileRow) {
  const int budget = sm80_budget_bytes();
  for (int i = 0; i < detail::cuda::kSm80FwdTileCount; ++i) {
    const detail::cuda::Sm80FwdTile& t = detail::cuda::kSm80FwdTiles[i];
    if (detail::cuda::sm80_fwd_tile_index_nth(t.head_dim, 1) < 0) continue;  // a single row
    const std::string name = detail::cuda::sm80_fwd_tile_name(t);
    if (detail::cuda::sm80_fwd_smem_bytes(t) > budget) {
      std::printf("[ skipped  ] d%d %s: %d B of shared memory, budget %d B\n", t.head_dim,
                  name.c_str(), detail::cuda::sm80_fwd_smem_bytes(t), budget);
      continue;
    }
    SCOPED_TRACE("tile d" + std::to_string(t.head_dim) + " " + name);
    const ScopedTileOverride force(t.head_dim, name);
    const DType dtype = t.head_dim == 192 ? DType::fp16 : DType::bf16;
    {  // a build without this head dim runs a larger one's kernel, whose rows these are not
      FwdCase probe = base();
      probe.dtype = dtype;
      probe.D = t.head_dim;
      probe.Nq = probe.Nk = 64;
      probe.num_splits = 1;
      FwdResult r;
      run_built_case(probe, r);
      if (r.not_built) continue;
      const std::string kernel = r.info.kernel;
      if (kernel.find("_hdim" + std::to_string(t.head_dim) + "_") == std::string::npos) {
        std::printf("[ skipped  ] d%d %s: head dim not built (%s ran)\n", t.head_dim,
                    name.c_str(), kernel.c_str());
        continue;
      }
    }
    const auto expect_row = [&](const FwdResult& r, const FwdCase& c) {
      if (r.not_built) return;
      const std::string expected = std::string("sm80_fwd_") +
                                   (c.dtype == DType::bf16 ? "bf16" : "fp16") + "_hdim" +
                                   std::to_string(t.head_dim) + "_" + name +
                                   (r.info.num_splits > 1 ? "_splitkv" : "");
      EXPECT_EQ(std::string(r.info.kernel), expected);
    };
    for (auto [nq, nk] : Lengths{{1, 1}, {65, 63}, {113, 203}, {257, 300}, {300, 129}, {1000, 1000}})
      for (bool causal : {false, true}) {
        FwdCase c = base();
        c.dtype = dtype;
        c.D = t.head_dim;
        c.Hq = c.Hkv = 2;
        c.Nq = nq;
        c.Nk = nk;
        c.causal = causal;
        c.num_splits = 1;
        expect_row(check(c), c);
      }
    FwdCase w = base();
    w.dtype = dtype;
    w.D = t.head_dim;
    w.Hq = 4;
    w.Hkv = 2;
    w.Nq = 150;
    w.Nk = 260;
    w.wl = 17;
    w.wr = 5;
    w.softcap = 5.f;
    w.num_splits = 1;
    expect_row(check(w), w);
    FwdCase v = base();
    v.dtype = dtype;
    make_varlen_mixed(v, t.head_dim, kVarlenMasks[1]);
    v.num_splits = 1;
    expect_row(check(v), v);
    FwdCase split = base();
    split.dtype = dtype;
    split.causal = true;
    expect_row(check_split_kv_forced(split, t.head_dim), split);
  }
}

// A row name the head dim does not have is an error that names the variable and the rows.
TEST_P(CudaForwardSm80, UnknownTileOverrideIsRefused) {
  const ScopedTileOverride force(256, "96x64_4w");
  FwdCase c = base();
  c.D = 256;
  c.Nq = c.Nk = 64;
  const std::string what = error_of<FwdResult>(c);
  if (what.find("in this build") != std::string::npos) GTEST_SKIP() << what;
  EXPECT_NE(what.find("FLASHCPP_SM80_FWD_TILE_D256"), std::string::npos) << what;
  EXPECT_NE(what.find("64x64_4w"), std::string::npos) << what;
}

// ---- sm90 ---------------------------------------------------------------------------------------

// The automatic backend picks sm90 on Hopper unless FLASHCPP_DISABLE_SM90=1.
TEST_P(CudaForwardSm90, AutomaticBackendFollowsTheSwitch) {
  TensorView q = TensorView::contiguous(nullptr, DType::bf16, {1, 128, 1, 128}, Device::cuda(0));
  const char* env = std::getenv("FLASHCPP_DISABLE_SM90");
  const bool disabled = env != nullptr && std::string(env) == "1";
  EXPECT_EQ(select_backend(q), disabled ? Backend::cuda_sm80 : Backend::cuda_sm90);
}

// The kernel is persistent (one CTA per SM walking its units of work): more tiles than SMs
// make every CTA carry its pipelines, Q barriers and O buffer from tile to tile, with
// ping-pong (d <= 128) and without (d256); causal units pair query tiles m and M - 1 - m
// (M = 5 leaves a hole in the middle pair), and tiles without a visible key (bottom-right
// causal with Nq > Nk) sit between tiles with work.
TEST_P(CudaForwardSm90, PersistentCtasWalkManyTiles) {
  for (int d : {64, 128, 256}) {
    for (bool causal : {false, true}) {
      FwdCase c = base();
      c.B = 3;
      c.Hq = 16;
      c.Hkv = 4;
      c.Nq = c.Nk = 700;  // 6 query tiles x 48 heads x batches = 288 tiles
      c.D = d;
      c.causal = causal;
      check(c);
    }
    FwdCase c = base();
    c.B = 2;
    c.Hq = 32;
    c.Hkv = 8;
    c.Nq = 1000;
    c.Nk = 300;  // query tiles 0-4 see no key at all
    c.D = d;
    c.causal = true;
    check(c);
    c.Nq = c.Nk = 600;  // M = 5 query tiles: pairs (4, 0), (3, 1) and (2, hole)
    check(c);
  }
}

// d256 padded calls with few keys run the 64-key short-call tile, the others the standard one
// (sm90_fwd_short_call: up to 1024 keys under a mask, 512 without), both correct on both sides
// of each bound, with a query tile that sees no key and a ragged last key block.
TEST_P(CudaForwardSm90, ShortCallTileAtD256) {
  struct Row {
    int nq, nk;
    bool causal;
    bool short_tile;
  };
  for (const Row& row : {Row{512, 512, false, true}, Row{513, 513, false, false},
                         Row{1024, 1024, true, true}, Row{1025, 1025, true, false},
                         Row{700, 300, true, true}, Row{77, 1030, false, false}}) {
    SCOPED_TRACE("nq " + std::to_string(row.nq) + " nk " + std::to_string(row.nk) +
                 (row.causal ? " causal" : ""));
    FwdCase c = base();
    c.D = 256;
    c.Hq = 4;
    c.Hkv = 2;
    c.Nq = row.nq;
    c.Nk = row.nk;
    c.causal = row.causal;
    c.num_splits = 1;
    const FwdResult r = check(c);
    if (r.not_built) GTEST_SKIP() << "no sm90a d256 forward in this build";
    const std::string kernel = r.info.kernel;
    if (kernel.find("_hdim256_") == std::string::npos) GTEST_SKIP() << kernel << " ran";
    EXPECT_EQ(kernel.find("_128x64_") != std::string::npos, row.short_tile) << kernel;
  }
}

// d64 unsplit calls without a cache or a local window with more than 2048 queries and keys
// (the longest sequence, varlen) and a wave of tiles run the long-call tile (192 x 96 unless
// a configure switch changed it; none: every call the table's), the others the 128-row table
// tile, each correct on both sides of the bound: ragged last query and key tiles, causal,
// softcap, fp16, GQA, varlen with short sequences beside the long one, and split, windowed and
// few-tile calls (the table tile, whatever the lengths).
TEST_P(CudaForwardSm90, LongCallTileAtD64) {
  struct Row {
    int nq, nk;
    bool causal;
    bool varlen;
    int splits;
    bool long_tile;
    int window_left = -1, window_right = -1;
    float softcap = 0.f;
    DType dtype = DType::bf16;
    int heads = 16;  // 11-12 query tiles of 192 rows a head: 176-192, a wave on 132 SMs
  };
  for (const Row& row : {Row{2048, 2048, false, false, 1, false},
                         Row{2049, 2049, false, false, 1, true},
                         Row{2100, 2500, true, false, 1, true},
                         Row{2049, 2048, true, false, 1, false},
                         Row{300, 4000, false, false, 1, false},
                         Row{2049, 2049, false, false, 2, false},
                         Row{2300, 2200, true, true, 1, true},
                         Row{2000, 2200, false, true, 1, false},
                         Row{2300, 2300, false, false, 1, false, 300, 0},
                         Row{2300, 2300, false, false, 1, false, -1, 40},
                         Row{2100, 2200, true, false, 1, true, -1, -1, 30.f},
                         Row{2100, 2200, false, false, 1, false, -1, -1, 0.f, DType::bf16, 2},
                         Row{2100, 2200, false, false, 1, true, -1, -1, 0.f, DType::fp16}}) {
    SCOPED_TRACE("nq " + std::to_string(row.nq) + " nk " + std::to_string(row.nk) +
                 (row.causal ? " causal" : "") + (row.varlen ? " varlen" : "") + " splits " +
                 std::to_string(row.splits) + " window (" + std::to_string(row.window_left) +
                 ", " + std::to_string(row.window_right) + ") softcap " +
                 std::to_string(row.softcap) + " heads " + std::to_string(row.heads) +
                 (row.dtype == DType::fp16 ? " fp16" : ""));
    FwdCase c = base();
    c.D = 64;
    c.Hq = row.heads;
    c.Hkv = row.heads / 2;
    c.dtype = row.dtype;
    c.causal = row.causal;
    c.wl = row.window_left;
    c.wr = row.window_right;
    c.softcap = row.softcap;
    c.num_splits = row.splits;
    if (row.varlen) {
      c.seqlens_q = {row.nq, 1, 129, 0};
      c.seqlens_k = {row.nk, 300, 77, 5};
    } else {
      c.B = 1;
      c.Nq = row.nq;
      c.Nk = row.nk;
    }
    const FwdResult r = check(c);
    // (fp16 comes last: a build without it skips there, after the bf16 rows ran)
    if (r.not_built) GTEST_SKIP() << "no sm90a d64 forward in this build";
    const std::string kernel = r.info.kernel;
    if (kernel.find("_hdim64_") == std::string::npos) GTEST_SKIP() << kernel << " ran";
    const detail::cuda::Sm90FwdTile table = detail::cuda::sm90_fwd_tile(64);
    const detail::cuda::Sm90FwdTile tile = row.long_tile && table.long_block_m > 0
                                               ? detail::cuda::sm90_fwd_long_tile(table)
                                               : table;
    const std::string name = "_" + std::to_string(tile.block_m) + "x" +
                             std::to_string(tile.block_n) + "_";
    EXPECT_NE(kernel.find(name), std::string::npos) << kernel << " (expected " << name << ")";
  }
}

// A mode of extent 1 is never stepped, so its stride may be anything (here an odd batch
// stride of a single-batch view, which no TMA descriptor could hold): the call still runs on
// sm90 and matches the contiguous views bit for bit.
TEST_P(CudaForwardSm90, StrideOfAnExtentOneModeIsIgnored) {
  constexpr std::int64_t N = 200, H = 2, D = 64, n = N * H * D;
  std::vector<std::uint16_t> host(3 * n);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (std::uint16_t& x : host) x = to_bits(DType::bf16, normal(rng));
  DeviceBuffer qkv(host.size() * 2), out_a(n * 2), out_b(n * 2);
  ASSERT_NE(qkv.ptr, nullptr);
  ASSERT_NE(out_a.ptr, nullptr);
  ASSERT_NE(out_b.ptr, nullptr);
  upload(qkv, host);
  cuda_ok(cudaMemset(out_a.ptr, 0xff, n * 2));
  cuda_ok(cudaMemset(out_b.ptr, 0x7f, n * 2));
  auto* base = static_cast<std::uint16_t*>(qkv.ptr);
  const Device gpu = Device::cuda(0);
  auto packed = [&](void* p) { return TensorView::contiguous(p, DType::bf16, {1, N, H, D}, gpu); };
  auto odd = [&](void* p) {
    return TensorView::strided(p, DType::bf16, {1, N, H, D}, {n + 3, H * D, D, 1}, gpu);
  };
  AttentionOptions opt;
  opt.backend = Backend::cuda_sm90;
  opt.causal = true;
  const RunInfo a = forward(packed(base), packed(base + n), packed(base + 2 * n),
                            packed(out_a.ptr), nullptr, opt);
  const RunInfo b =
      forward(odd(base), odd(base + n), odd(base + 2 * n), odd(out_b.ptr), nullptr, opt);
  cuda_ok(cudaDeviceSynchronize());
  EXPECT_EQ(a.backend, Backend::cuda_sm90);
  EXPECT_EQ(b.backend, Backend::cuda_sm90);
  const std::vector<std::uint16_t> ha = download<std::uint16_t>(out_a, n);
  const std::vector<std::uint16_t> hb = download<std::uint16_t>(out_b, n);
  EXPECT_EQ(ha, hb);
  EXPECT_NE(ha[0], 0xffff);  // the kernel wrote (NaN poison gone)
}

// sm90 split-KV: forced splits (3 and 7, uneven shares, splits that see no key of a causal
// tile), padded and varlen, every instantiated head dim (d256 stores from registers), masks;
// the heuristic splits a grid of few query tiles, and without a workspace the call runs unsplit.
TEST_P(CudaForwardSm90, SplitKv) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      FwdCase c = base();
      c.causal = causal;
      const FwdResult r = check_split_kv_forced(c, d);
      if (!r.not_built) {
        EXPECT_NE(std::string(r.info.kernel).find("sm90_fwd"), std::string::npos);
        EXPECT_NE(std::string(r.info.kernel).find("splitkv"), std::string::npos);
      }
    }
  FwdCase v = base();
  v.seqlens_q = {3, 0, 130, 70};
  v.seqlens_k = {500, 7, 1, 900};
  v.Hq = 4;
  v.Hkv = 2;
  v.D = 128;
  v.num_splits = 7;
  v.wl = 100;
  check(v);
  v.wl = -1;
  v.causal = true;
  check(v);

  FwdCase h = base();
  h.num_splits = 0;
  h.Hq = h.Hkv = 2;
  h.Nq = 256;
  h.Nk = 8192;
  h.D = 128;
  const FwdResult r = check(h);
  if (!r.not_built) {
    EXPECT_GT(r.info.num_splits, 1) << "2 heads x 2 query tiles should split";
  }
  h.give_workspace = false;  // same answer, unsplit
  const FwdResult r2 = check(h);
  if (!r2.not_built) {
    EXPECT_EQ(r2.info.num_splits, 1);
  }
}

// A decode shape (one query row) the heuristic splits runs split on sm90a too.
TEST_P(CudaForwardSm90, DecodeShapeSplits) {
  FwdCase d = decode_case(base());
  d.num_splits = 0;
  const FwdResult r = check(d);
  if (!r.not_built) {
    EXPECT_GT(r.info.num_splits, 1);
  }
}

// ---- D != Dv ------------------------------------------------------------------------------------


// D != Dv (DeepSeek-style MLA prefill: D 192, Dv 128) on the 192x128 instantiation: bf16 and
// fp16, causal or not, lengths across the tile edges and long enough for the K/V rings to
// wrap; GQA/MQA with windows and softcap.
TEST_P(CudaForwardSm90, HeadDimPair192x128) {
  for (DType t : {DType::bf16, DType::fp16})
    for (auto [nq, nk] : Lengths{{113, 203}, {129, 257}, {700, 2100}, {1, 300}, {300, 1}})
      for (bool causal : {false, true}) {
        FwdCase c = pair_case(base(), 192, 128);
        c.dtype = t;
        c.B = 2;
        c.Hq = c.Hkv = 2;
        c.Nq = nq;
        c.Nk = nk;
        c.causal = causal;
        expect_pair_kernel("fwd", c, check(c), "192x128");
      }
  for (auto [hq, hkv] : {std::pair{8, 1}, {16, 2}})
    for (auto [wl, wr] : {std::pair{-1, -1}, {100, 7}, {17, 5}})
      for (float softcap : {0.f, 30.f}) {
        FwdCase c = pair_case(base(), 192, 128);
        c.Hq = hq;
        c.Hkv = hkv;
        c.Nq = 300;
        c.Nk = 520;
        c.wl = wl;
        c.wr = wr;
        c.softcap = softcap;
        check(c);
      }
}

// D != Dv, the rest: varlen, split-KV, smaller pairs zero-padded onto 192x128, [B, H, N, D]
// strides, and repeated runs bitwise identical (small enough for compute-sanitizer).
TEST_P(CudaForwardSm90, HeadDimPairVarlenSplitPaddingStrides) {
  for (const MaskCase& m : kVarlenMasks) {
    FwdCase c = pair_case(base(), 192, 128);
    make_varlen_mixed(c, 192, m);
    expect_pair_kernel("fwd", c, check(c), "192x128");
  }
  for (bool causal : {false, true}) {
    FwdCase c = pair_case(base(), 192, 128);
    c.causal = causal;
    const FwdResult r = check_split_kv_forced(c, 192);
    expect_pair_kernel("fwd", c, r, "192x128");
    if (!r.not_built) {
      EXPECT_NE(std::string(r.info.kernel).find("splitkv"), std::string::npos);
    }
  }
  // Smaller pairs run zero-padded on the 192x128 instantiation (TMA fills the columns).
  for (auto [d, dv] : {std::pair{160, 96}, {136, 64}, {192, 64}, {128, 120}}) {
    FwdCase c = pair_case(base(), d, dv);
    c.Nq = 200;
    c.Nk = 333;
    c.Hq = 4;
    c.Hkv = 2;
    c.causal = true;
    expect_pair_kernel("fwd", c, check(c), "192x128");
  }
  FwdCase c = pair_case(base(), 192, 128);
  check_bhsd_strides(c, 192);
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 1;
  c.Nq = 300;
  c.Nk = 700;
  c.causal = true;
  FwdResult a, b;
  run_built_case(c, a);
  if (a.not_built) return;
  run_case(c, b, 3);
  EXPECT_EQ(a.out_bits, b.out_bits);
}

// The sm80 forward has no D != Dv kernel: the call is refused with an error that names both head
// dims and the sm90a forward that takes them.
TEST_P(CudaForwardSm80, HeadDimPairIsRefused) {
  FwdCase c = base();
  c.D = 192;
  c.Dv = 128;
  c.Nq = c.Nk = 64;
  const std::string what = error_of<FwdResult>(c);
  EXPECT_NE(what.find("head_dim_v 128"), std::string::npos) << what;
  EXPECT_NE(what.find("sm90a"), std::string::npos) << what;
}

#else  // built without CUDA: the suite still compiles and says why it does nothing

class CudaForward : public ::testing::TestWithParam<Backend> {};
INSTANTIATE_TEST_SUITE_P(, CudaForward, kGpuBackends, backend_suffix);

TEST_P(CudaForward, NeedsCuda) { skip_built_without_cuda(); }

#endif

}  // namespace
}  // namespace flashcpp
