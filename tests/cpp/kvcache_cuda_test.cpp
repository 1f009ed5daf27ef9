// attention_with_kvcache on a CUDA GPU (Backend::automatic) against the float64 oracle of
// kvcache_harness.hpp, on device copies of the same host tensors: contiguous and paged caches
// (page sizes 16, 64, 256, shuffled tables, NaN past the lengths and in unused pages), lengths
// from 0 to 65536, batches up to 64, appends, GQA 8:1 and MQA, Nnew 1/4/16, D 64 and 128 in
// bf16 and fp16, causal, lse, the workspace of plan_attention_with_kvcache, lengths beyond the
// capacity, and a CUDA graph replayed after the lengths and the block table changed on the
// device, prefill with a cache on the forward kernels (contiguous and paged, sm90a and sm80, a
// graph replay of a paged one); fp8_e4m3 caches with descales (bf16 queries). Skips without a GPU; in a build
// without CUDA it is one skipping test. Cases whose kernel a subset build lacks are reported
// as skipped (cuda_harness.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "cuda_harness.hpp"
#include "kvcache_harness.hpp"

namespace flashcpp {
namespace {

#ifdef FLASHCPP_TEST_WITH_CUDA

using cuda_test::cuda_ok;
using cuda_test::DeviceBuffer;
using test::KvCase;
using test::KvExpected;
using test::KvTensors;
using test::KvViews;

// Device copies of a case's tensors: their memory images, layout gaps included.
struct DeviceKv {
  DeviceBuffer q, k_cache, v_cache, cache_seqlens, out, block_table, k_new, v_new, lse;
  DeviceBuffer k_descale, v_descale;

  explicit DeviceKv(const KvTensors& t)
      : q(t.q.bytes()), k_cache(t.k_cache.bytes()), v_cache(t.v_cache.bytes()),
        cache_seqlens(t.cache_seqlens.bytes()), out(t.out.bytes()),
        block_table(t.block_table.bytes()), k_new(t.k_new.bytes()), v_new(t.v_new.bytes()),
        lse(t.lse.bytes()), k_descale(t.k_descale.bytes()), v_descale(t.v_descale.bytes()) {}

  std::vector<std::pair<DeviceBuffer*, test::HostTensor*>> pairs(KvTensors& t) {
    return {{&q, &t.q},         {&k_cache, &t.k_cache},         {&v_cache, &t.v_cache},
            {&out, &t.out},     {&cache_seqlens, &t.cache_seqlens}, {&block_table, &t.block_table},
            {&k_new, &t.k_new}, {&v_new, &t.v_new},             {&lse, &t.lse},
            {&k_descale, &t.k_descale}, {&v_descale, &t.v_descale}};
  }
  void upload(KvTensors& t) {
    for (auto [device, host] : pairs(t))
      if (host->bytes() > 0)
        cuda_ok(cudaMemcpy(device->ptr, host->data(), host->bytes(), cudaMemcpyHostToDevice));
    // A pageable copy may return before its DMA lands; work on other streams must see it.
    cuda_ok(cudaDeviceSynchronize());
  }
  // What a call writes: out, lse and the caches.
  void download(KvTensors& t) {
    for (auto [device, host] : pairs(t))
      if (host->bytes() > 0 && (host == &t.out || host == &t.lse || host == &t.k_cache ||
                                host == &t.v_cache))
        cuda_ok(cudaMemcpy(host->data(), device->ptr, host->bytes(), cudaMemcpyDeviceToHost));
  }
  // The host views of `t`, pointing at these buffers on device 0.
  KvViews views(KvTensors& t) {
    KvViews v = t.host_views();
    const std::pair<TensorView*, DeviceBuffer*> all[] = {
        {&v.q, &q},     {&v.k_cache, &k_cache},         {&v.v_cache, &v_cache},
        {&v.out, &out}, {&v.cache_seqlens, &cache_seqlens}, {&v.block_table, &block_table},
        {&v.k_new, &k_new}, {&v.v_new, &v_new},         {&v.lse, &lse},
        {&v.k_descale, &k_descale}, {&v.v_descale, &v_descale}};
    for (auto [view, buffer] : all) {
      if (view->data != nullptr) view->data = buffer->ptr;
      view->device = Device::cuda(0);
    }
    return v;
  }
};

KvCase gpu_case(std::vector<int> lengths, int nnew, int hq, int hkv, int d, DType dtype,
                int page_size) {
  KvCase c;
  c.lengths = std::move(lengths);
  c.nnew = nnew;
  c.heads_q = hq;
  c.heads_kv = hkv;
  c.head_dim = d;
  c.dtype = dtype;
  c.page_size = page_size;
  c.append = true;
  c.causal = true;
  c.backend = Backend::automatic;
  return c;
}

// The CUDA kernels' bounds (cuda_harness.hpp): out within out_bound(dtype) absolute, lse
// within kLseBound; rows that see no key exactly out = 0 and lse = -inf; the cache changed in
// the appended rows only.
void expect_gpu_result(const KvCase& c, const KvTensors& before, const KvTensors& got,
                       const KvExpected& e) {
  test::expect_empty_rows_exact(c, got, e);
  test::expect_cache_after(c, before, got.k_cache, got.v_cache);
  const std::vector<double> out = got.out.values();
  double max_out = 0, max_lse = 0;
  std::int64_t bad_out = 0, bad_lse = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double err = std::fabs(out[i] - e.out[i]);
    if (!(err <= cuda_test::out_bound(c.dtype))) ++bad_out;
    max_out = std::isnan(err) ? INFINITY : std::max(max_out, err);
  }
  if (c.with_lse) {
    const std::vector<double> lse = got.lse.values();
    for (std::size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(e.lse[i])) continue;  // exact -inf: checked above
      const double err = std::fabs(lse[i] - e.lse[i]);
      if (!(err <= cuda_test::kLseBound)) ++bad_lse;
      max_lse = std::isnan(err) ? INFINITY : std::max(max_lse, err);
    }
  }
  EXPECT_EQ(bad_out, 0) << "out elements beyond " << cuda_test::out_bound(c.dtype)
                        << "; max |err| " << max_out;
  EXPECT_EQ(bad_lse, 0) << "lse elements beyond " << cuda_test::kLseBound << "; max |err| "
                        << max_lse;
}

void expect_ran_on_gpu(const KvCase& c, const RunInfo& info, const KVCachePlan& plan) {
  if (c.backend == Backend::automatic)
    EXPECT_TRUE(info.backend == Backend::cuda_sm80 || info.backend == Backend::cuda_sm90)
        << backend_name(info.backend);
  else
    EXPECT_EQ(info.backend, c.backend);
  EXPECT_EQ(info.backend, plan.backend);
  EXPECT_EQ(info.num_splits, plan.num_splits);
}

// Plans and runs `views` on the default stream with the plan's workspace (poisoned), and
// waits. Returns false when this build lacks the case's kernel (recorded, not failed).
// `kernel_has`: a part of the name of the kernel the call must run.
bool run_gpu(const KvCase& c, const KvViews& views, const char* kernel_has = nullptr) {
  try {
    const KVCacheTensors tensors = views.tensors(c);
    const AttentionOptions options = views.options(c);
    const KVCachePlan plan = plan_attention_with_kvcache(tensors, options);
    DeviceBuffer workspace(std::max<std::size_t>(plan.workspace_bytes, 1));
    cuda_ok(cudaMemset(workspace.ptr, 0xFF, plan.workspace_bytes));
    const RunInfo info = attention_with_kvcache(tensors, options, nullptr,
                                                {workspace.ptr, plan.workspace_bytes});
    cuda_ok(cudaDeviceSynchronize());
    expect_ran_on_gpu(c, info, plan);
    if (kernel_has != nullptr) {
      EXPECT_NE(std::string(info.kernel).find(kernel_has), std::string::npos) << info.kernel;
    }
    return true;
  } catch (const Error& e) {
    if (!cuda_test::record_if_unbuilt(test::kv_case_name(c), e)) throw;
    return false;
  }
}

// One case end to end: host tensors, oracle, device run, checks.
void check_gpu(const KvCase& c, const char* kernel_has = nullptr) {
  SCOPED_TRACE(test::kv_case_name(c));
  auto rng = test::test_rng();
  KvTensors t(c, rng);
  const KvTensors before = t;
  const KvExpected e = test::kv_oracle(c, t);
  DeviceKv device(t);
  device.upload(t);
  if (!run_gpu(c, device.views(t), kernel_has)) return;
  device.download(t);
  expect_gpu_result(c, before, t, e);
}

class KvCacheCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU";
  }
  void TearDown() override { cuda_test::report_unbuilt_cases(); }
};

// Whether this build holds the sm90a D 192 / Dv 128 pair kernels (tests/cpp/CMakeLists.txt).
#ifdef FLASHCPP_TEST_PAIR_192X128
constexpr bool kPair192x128Built = true;
#else
constexpr bool kPair192x128Built = false;
#endif

// Why the automatic backend does not take the sm90a kernels here (empty when it does): not a
// Hopper GPU, or FLASHCPP_DISABLE_SM90=1, which sends every call to the sm80 kernels.
std::string automatic_not_sm90_reason() {
  const char* env = std::getenv("FLASHCPP_DISABLE_SM90");
  if (env != nullptr && std::string(env) == "1") return "FLASHCPP_DISABLE_SM90=1";
  return cuda_test::not_sm90_reason();
}

TEST_F(KvCacheCuda, ContiguousCache) {
  // Decode, GQA 8:1, no append (the token's key is already in the cache), a zero length.
  KvCase decode = gpu_case({0, 1, 300, 1000}, 1, 32, 4, 128, DType::bf16, 0);
  decode.append = false;
  check_gpu(decode);
  // MQA, appending 4 tokens; fp16 d64.
  check_gpu(gpu_case({0, 129, 777}, 4, 16, 1, 64, DType::fp16, 0));
  // Speculative verification: 16 new tokens, bf16 d64.
  check_gpu(gpu_case({5, 0, 1000}, 16, 32, 4, 64, DType::bf16, 0));
}

TEST_F(KvCacheCuda, PagedCache) {
  // Lengths on and around page boundaries, zero lengths, shuffled tables, NaN unused pages.
  check_gpu(gpu_case({0, 15, 16, 17, 500}, 16, 32, 4, 128, DType::bf16, 16));
  check_gpu(gpu_case({64, 0, 63, 2000, 65}, 1, 16, 1, 64, DType::fp16, 64));
  check_gpu(gpu_case({0, 255, 256, 3000}, 4, 32, 4, 128, DType::fp16, 256));
  check_gpu(gpu_case({1, 300, 0}, 4, 8, 1, 64, DType::bf16, 256));
  // Without appends, and without lse.
  KvCase plain = gpu_case({100, 0, 1500}, 4, 32, 4, 128, DType::bf16, 64);
  plain.append = false;
  plain.with_lse = false;
  check_gpu(plain);
}

TEST_F(KvCacheCuda, EveryPageSize) {
  // The other powers of two, and sizes that are not: a multiple of 8 (rows of a thread share a
  // page: one lookup) and one that is not (every row looks up its own page).
  check_gpu(gpu_case({31, 0, 33, 700}, 1, 32, 4, 128, DType::bf16, 32));
  check_gpu(gpu_case({127, 128, 129, 1000}, 4, 32, 8, 64, DType::fp16, 128));
  check_gpu(gpu_case({23, 24, 25, 600}, 4, 32, 4, 128, DType::bf16, 24));
  check_gpu(gpu_case({11, 12, 0, 13, 500}, 1, 16, 2, 128, DType::bf16, 12));
  check_gpu(gpu_case({7, 300}, 2, 8, 1, 64, DType::fp16, 7));
}

// D != Dv: the decode kernel of the larger head dim, K zero-filled past D and V past Dv.
TEST_F(KvCacheCuda, ValueHeadDimDiffers) {
  KvCase narrow_v = gpu_case({0, 100, 700}, 1, 32, 8, 128, DType::bf16, 0);
  narrow_v.head_dim_v = 64;
  check_gpu(narrow_v);
  KvCase wide_v = gpu_case({3, 64, 500}, 4, 16, 4, 64, DType::fp16, 16);
  wide_v.head_dim_v = 128;
  check_gpu(wide_v);
}

TEST_F(KvCacheCuda, Masks) {
  // No mask: the new tokens see every key, later new tokens included.
  KvCase full = gpu_case({40, 0, 700}, 16, 32, 4, 128, DType::bf16, 16);
  full.causal = false;
  check_gpu(full);
  // A sliding window with causal, and softcap.
  KvCase window = gpu_case({1000, 3, 0}, 4, 16, 2, 64, DType::fp16, 64);
  window.window_left = 128;
  check_gpu(window);
  KvCase capped = gpu_case({513, 0, 77}, 4, 32, 4, 128, DType::bf16, 0);
  capped.softcap = 30.0f;
  check_gpu(capped);
}

// Prefill with a cache (64 new tokens or more): the forward kernels run the call over the
// cache's per-sequence lengths (ForwardParams::seqused_k), the sm90a kernel on Hopper and the
// sm80 one when asked; a paged cache the paged sm90a kernel. NaN past the lengths, a zero
// length, appends or not.
TEST_F(KvCacheCuda, PrefillRunsTheForwardKernels) {
  // Chunked prefill with appends: GQA 4:1, bf16 d128, causal.
  const bool hopper = automatic_not_sm90_reason().empty();
  check_gpu(gpu_case({0, 100, 1000}, 200, 16, 4, 128, DType::bf16, 0),
            hopper ? "sm90_fwd" : "sm80_fwd");
  // No append (the new keys are in the cache already), a causal window, fp16 d64, MQA.
  KvCase window = gpu_case({64, 0, 300, 1}, 64, 8, 1, 64, DType::fp16, 0);
  window.append = false;
  window.window_left = 50;
  check_gpu(window, "_fwd_");
  // No mask, softcap, no lse, one sequence; and the sm80 forward asked for explicitly.
  KvCase full = gpu_case({777}, 130, 8, 2, 128, DType::bf16, 0);
  full.causal = false;
  full.softcap = 20.0f;
  full.with_lse = false;
  check_gpu(full, "_fwd_");
  // D != Dv (MLA chunked prefill, D 192 / Dv 128): the sm90a pair kernel on Hopper when the
  // build has it (the GPU workflow builds 192x128), the decode kernel otherwise.
  KvCase mla = gpu_case({0, 100, 700}, 96, 16, 2, 192, DType::bf16, 0);
  mla.head_dim_v = 128;
  check_gpu(mla, hopper && kPair192x128Built ? "sm90_fwd_bf16_hdim192x128" : "decode");
  KvCase sm80 = gpu_case({5, 400, 0}, 96, 16, 2, 64, DType::bf16, 0);
  sm80.backend = Backend::cuda_sm80;
  check_gpu(sm80, "sm80_fwd");
  // A paged cache: the paged sm90a forward on Hopper (whatever its tile: the name's end, not
  // the 128x128_s2 of the default table, so tile-variant builds pass), the paged sm80 forward
  // elsewhere.
  check_gpu(gpu_case({70, 0, 500}, 80, 16, 4, 128, DType::bf16, 64),
            hopper ? "_ws_paged" : "sm80_fwd_bf16_hdim128_");
}

// Chunked prefill into a paged cache on the forward kernels: page sizes 16, 64, 256 and 48 (a
// multiple of 16 that is not a power of two) on the paged sm90a forward on Hopper (the paged
// sm80 forward elsewhere), shuffled tables, NaN in unused pages, past the lengths and (-1) in
// the unused table slots; appends or not, causal, window, softcap, no mask, GQA and MQA, zero
// lengths, B > 1 with different lengths, lengths on and around page and key-block boundaries,
// d256 (80-key blocks), D != Dv, a split call. Pages that hold no whole 16-row box (24 keys)
// run the paged sm80 forward.
TEST_F(KvCacheCuda, PagedPrefillOnTheForwardKernels) {
  const bool hopper = automatic_not_sm90_reason().empty();
  const char* paged = hopper ? "_ws_paged" : "w_paged";
  KvCase p16 = gpu_case({0, 15, 16, 17, 300}, 64, 16, 4, 128, DType::bf16, 16);
  p16.invalid_unused_slots = true;
  check_gpu(p16, paged);
  check_gpu(gpu_case({127, 0, 128, 129, 1000}, 100, 8, 1, 128, DType::fp16, 64), paged);
  KvCase p256 = gpu_case({255, 256, 0, 700}, 130, 16, 2, 128, DType::bf16, 256);
  p256.append = false;
  check_gpu(p256, paged);
  KvCase p48 = gpu_case({47, 48, 49, 500, 0}, 64, 8, 2, 128, DType::bf16, 48);
  p48.invalid_unused_slots = true;
  check_gpu(p48, paged);
  // Masks and options: a causal window, softcap without a mask and without lse, d64.
  KvCase window = gpu_case({600, 3, 0, 200}, 96, 16, 4, 64, DType::fp16, 16);
  window.window_left = 100;
  check_gpu(window, paged);
  KvCase capped = gpu_case({333, 0, 64}, 70, 8, 8, 128, DType::bf16, 64);
  capped.causal = false;
  capped.softcap = 25.0f;
  capped.with_lse = false;
  check_gpu(capped, paged);
  // d256: key blocks of 80 rows, so 64-key pages change inside a block.
  check_gpu(gpu_case({100, 0, 400}, 72, 8, 2, 256, DType::bf16, 64), paged);
  // D != Dv (MLA chunked prefill into a paged cache): the paged sm90a pair kernel on Hopper
  // when the build has it, the decode kernel otherwise (the sm80 forward takes D == Dv only).
  KvCase mla = gpu_case({0, 100, 700}, 96, 16, 2, 192, DType::bf16, 64);
  mla.head_dim_v = 128;
  check_gpu(mla, hopper && kPair192x128Built ? "sm90_fwd_bf16_hdim192x128_128x128_s2_ws_paged"
                                      : "decode");
  // One long sequence and few query tiles: the heuristic splits the key blocks.
  check_gpu(gpu_case({6000}, 64, 8, 1, 128, DType::bf16, 256),
            hopper ? "_ws_paged_splitkv" : "w_paged_splitkv");
  // Pages of 24 keys (no whole 16-row box): the paged sm80 forward, on Hopper too.
  check_gpu(gpu_case({23, 24, 500}, 64, 8, 2, 128, DType::bf16, 24), "w_paged");
}

// The paged sm80 forward asked for: a block-table lookup per row, so any page size (7, 16,
// 100, 256), NaN in unused pages and (-1) unused table slots, masks, softcap, GQA/MQA, zero
// lengths, appends or not, a split call.
TEST_F(KvCacheCuda, PagedPrefillOnTheSm80Forward) {
  auto sm80 = [](KvCase c) {
    c.backend = Backend::cuda_sm80;
    return c;
  };
  KvCase p16 = sm80(gpu_case({0, 15, 16, 17, 300}, 64, 16, 4, 128, DType::bf16, 16));
  p16.invalid_unused_slots = true;
  check_gpu(p16, "sm80_fwd_bf16_hdim128_128x64_4w_paged");
  KvCase p7 = sm80(gpu_case({6, 7, 0, 250}, 70, 8, 1, 64, DType::fp16, 7));
  p7.window_left = 40;
  check_gpu(p7, "w_paged");
  KvCase p100 = sm80(gpu_case({99, 100, 101, 0}, 90, 8, 2, 128, DType::bf16, 100));
  p100.append = false;
  p100.causal = false;
  p100.softcap = 15.0f;
  check_gpu(p100, "w_paged");
  check_gpu(sm80(gpu_case({5000}, 64, 4, 1, 128, DType::bf16, 256)), "w_paged_splitkv");
}

// On Hopper a split call of 2 to 8 splits merges them inside a thread-block cluster (no
// combine kernel): the heuristic's 16 splits at B = 1 become 8; forced counts, contiguous and
// paged, fp16/bf16 and an fp8 cache, softcap, speculative rows, lse; 9 or more forced splits
// keep the combine kernel.
TEST_F(KvCacheCuda, HopperSplitsMergeInACluster) {
  if (!automatic_not_sm90_reason().empty()) GTEST_SKIP() << automatic_not_sm90_reason();
  check_gpu(gpu_case({4097}, 1, 32, 8, 128, DType::bf16, 0), "_cluster8");
  check_gpu(gpu_case({0, 63, 64, 1000, 4097}, 1, 32, 8, 128, DType::bf16, 0));
  for (int splits : {2, 5, 8}) {
    KvCase c = gpu_case({1, 700, 0, 2049}, 1, 16, 2, 128, DType::bf16, splits == 5 ? 16 : 0);
    c.num_splits = splits;
    check_gpu(c, ("_cluster" + std::to_string(splits)).c_str());
  }
  KvCase spec = gpu_case({300, 5000}, 4, 32, 8, 64, DType::fp16, 64);
  spec.softcap = 30.0f;
  spec.num_splits = 7;
  check_gpu(spec, "_cluster7");
  KvCase fp8 = gpu_case({3000, 17}, 1, 32, 8, 128, DType::bf16, 0);
  fp8.fp8_cache = true;
  fp8.num_splits = 8;
  check_gpu(fp8, "_cluster8");
  KvCase many = gpu_case({17, 9000}, 2, 32, 4, 128, DType::bf16, 0);
  many.num_splits = 9;
  check_gpu(many, "sm80_decode");
}

// An explicit sm80 request runs there, also on Hopper.
TEST_F(KvCacheCuda, ExplicitSm80) {
  KvCase c = gpu_case({0, 70, 900}, 4, 32, 4, 128, DType::bf16, 64);
  c.backend = Backend::cuda_sm80;
  check_gpu(c);
}

// Forced split counts: uneven shares, and more splits than some sequences have key blocks
// (those splits see no key and the combine gives them weight 0).
TEST_F(KvCacheCuda, ForcedSplits) {
  for (int splits : {2, 7, 40}) {
    KvCase c = gpu_case({0, 5, 300, 4000}, 1, 32, 8, 128, DType::bf16, splits == 7 ? 16 : 0);
    c.num_splits = splits;
    check_gpu(c);
  }
}

// One long sequence: 65535 cached keys plus the new token fill a 65536-key paged cache.
TEST_F(KvCacheCuda, LongSequence) {
  KvCase c = gpu_case({65535}, 1, 16, 2, 128, DType::bf16, 256);
  c.capacity = 65536;
  check_gpu(c);
}

// 64 sequences of random lengths (every eighth empty), decode with appends.
TEST_F(KvCacheCuda, LargeBatch) {
  auto rng = test::test_rng();
  std::vector<int> lengths(64);
  for (int b = 0; b < 64; ++b) lengths[b] = b % 8 == 0 ? 0 : static_cast<int>(rng() % 400);
  check_gpu(gpu_case(lengths, 1, 32, 4, 128, DType::bf16, 16));
  check_gpu(gpu_case(lengths, 4, 16, 1, 64, DType::fp16, 0));
}

// On the GPU a length beyond the capacity is clamped to it (kvcache.hpp): the result is that
// of a full cache.
TEST_F(KvCacheCuda, LengthsBeyondCapacityAreClamped) {
  for (int page_size : {0, 64}) {
    KvCase c = gpu_case({256, 256}, 4, 16, 2, 128, DType::bf16, page_size);
    c.append = false;
    c.capacity = 256;
    SCOPED_TRACE(test::kv_case_name(c));
    auto rng = test::test_rng();
    KvTensors t(c, rng);
    const KvTensors before = t;
    const KvExpected e = test::kv_oracle(c, t);
    DeviceKv device(t);
    device.upload(t);
    const std::vector<std::int32_t> beyond{300, 257};
    cuda_ok(cudaMemcpy(device.cache_seqlens.ptr, beyond.data(), 8, cudaMemcpyHostToDevice));
    if (!run_gpu(c, device.views(t))) continue;
    device.download(t);
    expect_gpu_result(c, before, t, e);
  }
}

// fp8_e4m3 caches (bf16 q, k_new, v_new, out): the oracle dequantises the cached codes with the
// descales and quantises the appended rows as the contract says; the cache must hold exactly
// e4m3(x / descale) in the appended rows and be unchanged elsewhere (NaN codes past the lengths).
KvCase fp8_case(std::vector<int> lengths, int nnew, int hq, int hkv, int d, int page_size,
                int descales) {
  KvCase c = gpu_case(std::move(lengths), nnew, hq, hkv, d, DType::bf16, page_size);
  c.fp8_cache = true;
  c.descales = descales;
  return c;
}

TEST_F(KvCacheCuda, Fp8Cache) {
  // Decode, GQA 8:1, descales per (sequence, kv head), a zero length; D 64, 128, 256.
  check_gpu(fp8_case({0, 1, 300, 1000}, 1, 32, 4, 128, 0, 2));
  check_gpu(fp8_case({5, 0, 777}, 4, 16, 1, 64, 0, 1));
  check_gpu(fp8_case({129, 0, 600}, 1, 16, 2, 256, 0, 2));
  // Paged: page sizes 16, 64, 256 and one that is not a power of two; no descales.
  check_gpu(fp8_case({0, 15, 16, 17, 500}, 16, 32, 4, 128, 16, 2));
  check_gpu(fp8_case({64, 0, 63, 2000, 65}, 1, 16, 1, 64, 64, 0));
  check_gpu(fp8_case({0, 255, 256, 3000}, 4, 32, 4, 256, 256, 1));
  check_gpu(fp8_case({23, 24, 25, 600}, 4, 32, 4, 128, 24, 2));
  // Without appends and without lse.
  KvCase plain = fp8_case({100, 0, 1500}, 4, 32, 4, 128, 64, 2);
  plain.append = false;
  plain.with_lse = false;
  check_gpu(plain);
}

TEST_F(KvCacheCuda, Fp8CacheOptions) {
  // No mask, a window, softcap (the descales scale the scores before the cap).
  KvCase full = fp8_case({40, 0, 700}, 16, 32, 4, 128, 16, 2);
  full.causal = false;
  check_gpu(full);
  KvCase window = fp8_case({1000, 3, 0}, 4, 16, 2, 64, 64, 1);
  window.window_left = 128;
  check_gpu(window);
  KvCase capped = fp8_case({513, 0, 77}, 4, 32, 4, 128, 0, 2);
  capped.softcap = 30.0f;
  check_gpu(capped);
  // D != Dv: both zero-filled to the larger head dim.
  KvCase narrow_v = fp8_case({0, 100, 700}, 1, 32, 8, 128, 0, 2);
  narrow_v.head_dim_v = 64;
  check_gpu(narrow_v);
  // Forced splits (the combine sees descaled partial outputs), and the explicit sm80 backend.
  for (int splits : {2, 7}) {
    KvCase c = fp8_case({0, 5, 300, 4000}, 1, 32, 8, 128, splits == 7 ? 16 : 0, 2);
    c.num_splits = splits;
    check_gpu(c);
  }
  KvCase sm80 = fp8_case({0, 70, 900}, 4, 32, 4, 128, 64, 1);
  sm80.backend = Backend::cuda_sm80;
  check_gpu(sm80);
  // 64 sequences of random lengths, one long sequence.
  auto rng = test::test_rng();
  std::vector<int> lengths(64);
  for (int b = 0; b < 64; ++b) lengths[b] = b % 8 == 0 ? 0 : static_cast<int>(rng() % 400);
  check_gpu(fp8_case(lengths, 1, 32, 4, 128, 16, 2));
  KvCase long_seq = fp8_case({65535}, 1, 16, 2, 128, 256, 2);
  long_seq.capacity = 65536;
  check_gpu(long_seq);
}

// An fp8 cache's products run in f16, q scaled by a power of two per CTA so its largest
// finite |q| fits (decode_fp8_fragments.hpp): queries 2^20 times larger or smaller than usual
// (f16 alone would overflow or lose them to subnormals), and the heads of one group 2^12 apart,
// must come out within the bf16 bound, contiguous and paged.
TEST_F(KvCacheCuda, Fp8CacheQueryRange) {
  for (int range : {20, -20, 0}) {
    KvCase c = fp8_case({0, 300, 2000}, 4, 32, 4, 128, range == 0 ? 16 : 0, 2);
    c.scale = static_cast<float>(1.0 / std::sqrt(128.0)) * std::ldexp(1.0f, -range);
    SCOPED_TRACE("q times 2^" + std::to_string(range) + ", " + test::kv_case_name(c));
    auto rng = test::test_rng();
    KvTensors t(c, rng);
    const std::vector<double> q = t.q.values();
    for (std::int64_t i = 0; i < t.q.numel(); ++i) {
      const int head = static_cast<int>(i / c.head_dim % c.heads_q);
      const int e = range != 0 ? range : 12 * (head % 2) - 6;
      t.q.set(i, std::ldexp(static_cast<float>(q[i]), e));  // exact: a power of two
    }
    const KvTensors before = t;
    const KvExpected e = test::kv_oracle(c, t);
    DeviceKv device(t);
    device.upload(t);
    if (!run_gpu(c, device.views(t))) continue;
    device.download(t);
    expect_gpu_result(c, before, t, e);
  }
}

// What the GPU refuses for an fp8 cache, with a clear error: fp16 queries, and head dims that
// are not multiples of 16 (a contiguous cache's rows are then not 16-byte aligned, which the
// stride check reports first).
TEST_F(KvCacheCuda, Fp8CacheRefusals) {
  KvCase fp16 = fp8_case({10}, 1, 8, 2, 128, 0, 0);
  fp16.dtype = DType::fp16;
  KvCase d72 = fp8_case({10}, 1, 8, 2, 72, 0, 0);
  for (const auto& [c, message] :
       {std::pair{fp16, "fp8_e4m3 cache takes q, k_new, v_new and out in bf16"},
        {d72, "k_cache: stride of dimension 2 is 72 elements"}}) {
    auto rng = test::test_rng();
    KvTensors t(c, rng);
    DeviceKv device(t);
    device.upload(t);
    const KvViews views = device.views(t);
    try {
      plan_attention_with_kvcache(views.tensors(c), views.options(c));
      ADD_FAILURE() << test::kv_case_name(c) << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

// A call captured in a CUDA graph replays with new lengths, block table and cache contents
// (copied to the device outside the capture): the replay gives the new lengths' result.
// fp8: the descales are device memory too, and the replay reads their new values.
// nnew: 1 (decode) or 64 and more (prefill on the paged forward kernels, whose name has
// `kernel_has`).
void check_graph_replay(bool fp8, int nnew = 1, const char* kernel_has = nullptr) {
  KvCase first = gpu_case({100, 0, 513, 64}, nnew, 32, 4, 128, DType::bf16, 64);
  first.capacity = nnew > 1 ? 1152 : 1024;
  first.fp8_cache = fp8;
  first.descales = fp8 ? 2 : 0;
  KvCase second = first;
  second.lengths = {700, 3, 0, 1000};
  auto rng = test::test_rng();
  KvTensors a(first, rng), b(second, rng);
  ASSERT_EQ(a.k_cache.bytes(), b.k_cache.bytes());
  ASSERT_EQ(a.block_table.bytes(), b.block_table.bytes());
  const KvTensors a_before = a, b_before = b;
  const KvExpected a_expected = test::kv_oracle(first, a);
  const KvExpected b_expected = test::kv_oracle(second, b);

  DeviceKv device(a);
  device.upload(a);
  const KvViews views = device.views(a);
  const KVCacheTensors tensors = views.tensors(first);
  const AttentionOptions options = views.options(first);
  KVCachePlan plan;
  try {
    plan = plan_attention_with_kvcache(tensors, options);
  } catch (const Error& e) {
    if (!cuda_test::record_if_unbuilt(test::kv_case_name(first), e)) throw;
    return;
  }
  DeviceBuffer workspace(std::max<std::size_t>(plan.workspace_bytes, 1));
  const Workspace w{workspace.ptr, plan.workspace_bytes};
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // An eager run first: whatever a first call sets up happens outside the capture.
  attention_with_kvcache(tensors, options, stream, w);
  cuda_ok(cudaStreamSynchronize(stream));
  device.download(a);
  expect_gpu_result(first, a_before, a, a_expected);

  // Global mode: any allocation or synchronisation inside the call breaks the capture.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  RunInfo info;
  try {
    info = attention_with_kvcache(tensors, options, stream, w);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    throw;
  }
  cuda_ok(cudaStreamEndCapture(stream, &graph));
  cuda_ok(cudaGraphInstantiateWithFlags(&exec, graph, 0));
  expect_ran_on_gpu(first, info, plan);
  if (kernel_has != nullptr) {
    EXPECT_NE(std::string(info.kernel).find(kernel_has), std::string::npos) << info.kernel;
  }

  device.upload(b);  // new lengths, pages, cache, queries and new tokens; NaN outputs
  cuda_ok(cudaGraphLaunch(exec, stream));
  cuda_ok(cudaStreamSynchronize(stream));
  device.download(b);
  {
    SCOPED_TRACE("replay with " + test::kv_case_name(second));
    expect_gpu_result(second, b_before, b, b_expected);
  }
  cuda_ok(cudaGraphExecDestroy(exec));
  cuda_ok(cudaGraphDestroy(graph));
  cuda_ok(cudaStreamDestroy(stream));
}

// Two decode calls back to back on one stream, the second taking the first's output as its
// queries, ten rounds with both outputs poisoned (NaN) before each. On Hopper a decode kernel
// starts as a programmatic dependent of the kernel ahead, which lets its dependents start as
// soon as its own CTAs have: the second call reads NaN queries unless it waits for the first.
void check_chained_calls(const KvCase& c) {
  SCOPED_TRACE(test::kv_case_name(c));
  ASSERT_FALSE(c.append);
  ASSERT_EQ(c.dv(), c.head_dim);
  auto rng = test::test_rng();
  KvTensors t(c, rng);
  const KvTensors before = t;
  DeviceKv device(t);
  device.upload(t);
  const KvViews views = device.views(t);
  const KVCacheTensors first = views.tensors(c);
  const AttentionOptions options = views.options(c);
  DeviceBuffer out2(t.out.bytes()), lse2(std::max<std::size_t>(t.lse.bytes(), 1));
  KVCacheTensors second = first;
  second.q = first.out;  // q and out of one case share shape and layout when Dv == D
  second.out.data = out2.ptr;
  TensorView second_lse;  // the first call's lse stays where the check reads it
  if (first.lse != nullptr) {
    second_lse = *first.lse;
    second_lse.data = lse2.ptr;
    second.lse = &second_lse;
  }
  KVCachePlan plan;
  try {
    plan = plan_attention_with_kvcache(first, options);
  } catch (const Error& e) {
    if (!cuda_test::record_if_unbuilt(test::kv_case_name(c), e)) throw;
    return;
  }
  DeviceBuffer workspace(std::max<std::size_t>(plan.workspace_bytes, 1));
  const Workspace w{workspace.ptr, plan.workspace_bytes};
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int round = 0; round < 10; ++round) {
    cuda_ok(cudaMemsetAsync(first.out.data, 0xFF, t.out.bytes(), stream));
    cuda_ok(cudaMemsetAsync(out2.ptr, 0xFF, t.out.bytes(), stream));
    attention_with_kvcache(first, options, stream, w);
    const RunInfo info = attention_with_kvcache(second, options, stream, w);
    if (round == 0) expect_ran_on_gpu(c, info, plan);
  }
  cuda_ok(cudaStreamSynchronize(stream));
  cuda_ok(cudaStreamDestroy(stream));
  device.download(t);
  expect_gpu_result(c, before, t, test::kv_oracle(c, before));
  // The second call's oracle: the same case with the first call's output as q.
  KvTensors chained = before;
  for (std::int64_t i = 0; i < chained.q.numel(); ++i) chained.q.set(i, t.out.get(i));
  const KvExpected expected = test::kv_oracle(c, chained);
  const KvTensors chained_before = chained;
  cuda_ok(cudaMemcpy(chained.out.data(), out2.ptr, chained.out.bytes(), cudaMemcpyDeviceToHost));
  if (c.with_lse)
    cuda_ok(cudaMemcpy(chained.lse.data(), lse2.ptr, chained.lse.bytes(), cudaMemcpyDeviceToHost));
  SCOPED_TRACE("the second call");
  expect_gpu_result(c, chained_before, chained, expected);
}

TEST_F(KvCacheCuda, ChainedCallsWaitForTheKernelAhead) {
  for (bool fp8 : {false, true}) {
    // Split (merged in clusters on Hopper) and unsplit (B 32 x Hkv 8 CTAs fill the GPU).
    for (const auto& [lengths, page] : {std::pair<std::vector<int>, int>{{3000, 2500, 4000, 1}, 0},
                                        {std::vector<int>(32, 700), 0},
                                        {{3000, 0, 4000, 900}, 64}}) {
      KvCase c = gpu_case(lengths, 1, 32, 8, 128, DType::bf16, page);
      c.append = false;
      c.fp8_cache = fp8;
      c.descales = fp8 ? 2 : 0;
      check_chained_calls(c);
    }
  }
}

TEST_F(KvCacheCuda, GraphReplaysWithNewLengths) { check_graph_replay(false); }
TEST_F(KvCacheCuda, Fp8CacheGraphReplaysWithNewLengthsAndDescales) { check_graph_replay(true); }
TEST_F(KvCacheCuda, PagedPrefillGraphReplaysWithNewLengths) {
  check_graph_replay(false, 80, "_fwd_");
}

#else  // built without CUDA: the suite still compiles and says why it does nothing

TEST(KvCacheCuda, NeedsCuda) { cuda_test::skip_built_without_cuda(); }

#endif

}  // namespace
}  // namespace flashcpp
