// Every invalid argument of attention_with_kvcache raises flashcpp::Error naming it, before any
// work (validate_kvcache in src/api/validate.cpp): one test per rule, asserting the exact text.
// On the CPU the lengths and the block table are host memory, so their values are checked too.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "flashcpp/flashcpp.hpp"

namespace flashcpp {
namespace {

constexpr int kB = 2, kNew = 3, kHq = 4, kHkv = 2, kD = 64;
constexpr int kPages = 6, kPageSize = 8, kMaxPages = 3;  // capacity 24 keys

// A valid paged call with appends on small CPU tensors; the tests break one argument at a time.
// Sequence 0 holds 5 keys (8 after the append: page 4), sequence 1 holds 14 (17: pages 0, 5, 2).
struct KvCall {
  std::vector<float> storage = std::vector<float>(1 << 16, 0.25f);  // backs every float view
  std::vector<std::int32_t> lengths{5, 14, 0, 0};
  std::vector<std::int32_t> table{4, -1, -1, 0, 5, 2, 0, 0, 0};
  TensorView q, k_cache, v_cache, cache_seqlens, out, block_table, k_new, v_new, lse;
  bool paged = true, append = true, with_lse = true;
  AttentionOptions options;

  KvCall() {
    float* base = storage.data();
    q = TensorView::contiguous(base, DType::fp32, {kB, kNew, kHq, kD});
    k_cache = TensorView::contiguous(base + 2048, DType::fp32, {kPages, kPageSize, kHkv, kD});
    v_cache = TensorView::contiguous(base + 8192, DType::fp32, {kPages, kPageSize, kHkv, kD});
    out = TensorView::contiguous(base + 16384, DType::fp32, {kB, kNew, kHq, kD});
    lse = TensorView::contiguous(base + 18432, DType::fp32, {kB, kHq, kNew});
    k_new = TensorView::contiguous(base + 20480, DType::fp32, {kB, kNew, kHkv, kD});
    v_new = TensorView::contiguous(base + 22528, DType::fp32, {kB, kNew, kHkv, kD});
    cache_seqlens = TensorView::contiguous(lengths.data(), DType::int32, {kB});
    block_table = TensorView::contiguous(table.data(), DType::int32, {kB, kMaxPages});
    options.backend = Backend::cpu;
  }

  // The builders below break a valid call in one place and chain on a fresh one, so that each
  // check reads as one expression: KvCall().retyped(&KvCall::q, DType::int32).run().

  // A contiguous cache [B, 24, Hkv, D] instead (same memory).
  KvCall& contiguous() {
    paged = false;
    return caches({kB, kPages * kPageSize / kB, kHkv, kD});
  }

  // A view of the same memory with another shape.
  KvCall& reshaped(TensorView KvCall::*view, std::initializer_list<std::int64_t> shape) {
    TensorView& t = this->*view;
    t = TensorView::contiguous(t.data, t.dtype, shape, t.device);
    return *this;
  }
  // Both caches, which must agree with each other.
  KvCall& caches(std::initializer_list<std::int64_t> shape) {
    return reshaped(&KvCall::k_cache, shape).reshaped(&KvCall::v_cache, shape);
  }
  KvCall& retyped(TensorView KvCall::*view, DType dtype) {
    (this->*view).dtype = dtype;
    return *this;
  }
  // cache_seqlens[seq] = keys, and block_table[seq][slot] = p.
  KvCall& length(int seq, std::int32_t keys) {
    lengths[seq] = keys;
    return *this;
  }
  KvCall& page(int seq, int slot, std::int32_t p) {
    table[seq * kMaxPages + slot] = p;
    return *this;
  }

  KVCacheTensors tensors() const {
    KVCacheTensors t{q, k_cache, v_cache, cache_seqlens, out};
    if (paged) t.block_table = &block_table;
    if (append) {
      t.k_new = &k_new;
      t.v_new = &v_new;
    }
    if (with_lse) t.lse = &lse;
    return t;
  }

  std::string run() const { return run_call(tensors(), options); }
  std::string plan() const { return plan_call(tensors(), options); }

  static std::string run_call(const KVCacheTensors& t, const AttentionOptions& o) {
    return error_of([&] { attention_with_kvcache(t, o); });
  }
  static std::string plan_call(const KVCacheTensors& t, const AttentionOptions& o) {
    return error_of([&] { plan_attention_with_kvcache(t, o); });
  }
  // The message of the flashcpp::Error a call throws, or "no error".
  template <typename Call>
  static std::string error_of(Call&& call) {
    try {
      call();
      return "no error";
    } catch (const Error& e) {
      return e.what();
    }
  }
};

TEST(KvCacheErrors, ValidCallsPass) {
  KvCall paged;
  EXPECT_EQ(paged.run(), "no error");
  EXPECT_EQ(paged.plan(), "no error");
  EXPECT_EQ(KvCall().contiguous().run(), "no error");
  KvCall plain;  // no appends, no lse
  plain.append = plain.with_lse = false;
  EXPECT_EQ(plain.run(), "no error");
}

// ---- lengths and pages ---------------------------------------------------------------------------

TEST(KvCacheErrors, BlockTableInt64) {
  KvCall c;
  c.retyped(&KvCall::block_table, DType::int64);
  EXPECT_EQ(c.run(), "block_table: expected dtype int32, got int64");
  EXPECT_EQ(c.plan(), "block_table: expected dtype int32, got int64");
}

TEST(KvCacheErrors, BlockTableEntryOutOfRange) {
  EXPECT_EQ(KvCall().page(1, 1, kPages).run(),
            "block_table[1][1]: page 6 is outside the cache's 6 pages");
  EXPECT_EQ(KvCall().page(0, 0, -1).run(),
            "block_table[0][0]: page -1 is outside the cache's 6 pages");
  // Slots past a sequence's keys are never read: -1 there is fine (sequence 0's slots 1 and 2).
}

TEST(KvCacheErrors, BlockTableShape) {
  EXPECT_EQ(KvCall().reshaped(&KvCall::block_table, {3, kMaxPages}).run(),
            "block_table: expected batch size 2 (same as q) in dimension 0, got 3 (shape [3, 3])");
  EXPECT_EQ(KvCall().reshaped(&KvCall::block_table, {kB * kMaxPages}).run(),
            "block_table: expected 2 dimensions [B, max_pages_per_seq], got 1");
  KvCall strided;
  strided.block_table = TensorView::strided(strided.table.data(), DType::int32, {kB, 2}, {4, 2});
  EXPECT_EQ(strided.run(), "block_table: the page dimension must be contiguous, got stride 2");
}

TEST(KvCacheErrors, LengthsAboveCapacity) {
  EXPECT_EQ(KvCall().length(1, 22).run(),  // + 3 new tokens = 25 > 24
            "k_new: sequence 1 would hold 25 keys (cache_seqlens[1] = 22 plus the new tokens), "
            "more than the cache's capacity of 24");
  KvCall no_append;
  no_append.append = false;
  EXPECT_EQ(no_append.length(0, 25).run(),
            "cache_seqlens: sequence 0 would hold 25 keys (cache_seqlens[0] = 25), more than the "
            "cache's capacity of 24");
  EXPECT_EQ(KvCall().contiguous().length(1, 24).run(),
            "k_new: sequence 1 would hold 27 keys (cache_seqlens[1] = 24 plus the new tokens), "
            "more than the cache's capacity of 24");
  // More new tokens than the cache holds at all.
  EXPECT_EQ(KvCall().contiguous().caches({kB, 2, kHkv, kD}).run(),
            "k_new: 3 new tokens do not fit in the cache's capacity of 2 keys");
}

TEST(KvCacheErrors, NegativeLength) {
  EXPECT_EQ(KvCall().length(1, -1).run(), "cache_seqlens[1]: must be >= 0, got -1");
}

TEST(KvCacheErrors, CacheSeqlensShapeAndDtype) {
  EXPECT_EQ(KvCall().reshaped(&KvCall::cache_seqlens, {3}).run(),
            "cache_seqlens: expected batch size 2 (same as q) in dimension 0, got 3 (shape [3])");
  EXPECT_EQ(KvCall().retyped(&KvCall::cache_seqlens, DType::fp32).run(),
            "cache_seqlens: expected dtype int32, got fp32");
  EXPECT_EQ(KvCall().retyped(&KvCall::cache_seqlens, DType::int64).run(),
            "cache_seqlens: expected dtype int32, got int64");
  KvCall device;
  device.cache_seqlens.device = Device::cuda(0);
  EXPECT_EQ(device.run(), "cache_seqlens is on cuda:0 but q is on cpu");
}

// ---- new tokens ----------------------------------------------------------------------------------

TEST(KvCacheErrors, KNewWithoutVNew) {
  KvCall c;
  KVCacheTensors t = c.tensors();
  t.v_new = nullptr;
  EXPECT_EQ(KvCall::run_call(t, c.options), "k_new and v_new must be given together");
  t = c.tensors();
  t.k_new = nullptr;
  EXPECT_EQ(KvCall::plan_call(t, c.options), "k_new and v_new must be given together");
}

TEST(KvCacheErrors, NewTokensShape) {
  EXPECT_EQ(KvCall().reshaped(&KvCall::k_new, {kB, 2, kHkv, kD}).run(),
            "k_new: expected new tokens 3 (same as q) in dimension 1, got 2 (shape [2, 2, 2, 64])");
  EXPECT_EQ(KvCall().reshaped(&KvCall::v_new, {kB, kNew, 1, kD}).run(),
            "v_new: expected kv heads 2 (same as k_cache) in dimension 2, got 1 (shape [2, 3, 1, 64])");
  EXPECT_EQ(KvCall().reshaped(&KvCall::v_new, {kB, kNew, kHkv, 32}).run(),
            "v_new: expected head dim 64 (same as v_cache) in dimension 3, got 32 (shape [2, 3, 2, 32])");
  EXPECT_EQ(KvCall().reshaped(&KvCall::k_new, {kB, kNew, kHkv * kD}).run(),
            "k_new: expected 4 dimensions [B, Nnew, Hkv, D], got 3");
}

TEST(KvCacheErrors, NewTokensDtype) {
  EXPECT_EQ(KvCall().retyped(&KvCall::k_new, DType::bf16).run(),
            "k_new: expected dtype fp32 (same as q), got bf16");
  EXPECT_EQ(KvCall().retyped(&KvCall::v_new, DType::fp16).run(),
            "v_new: expected dtype fp32 (same as q), got fp16");
}

// ---- q, the caches, out, lse ---------------------------------------------------------------------

TEST(KvCacheErrors, Ranks) {
  EXPECT_EQ(KvCall().reshaped(&KvCall::q, {kB * kNew, kHq, kD}).run(),
            "q: expected 4 dimensions [B, Nnew, Hq, D], got 3");
  EXPECT_EQ(KvCall().reshaped(&KvCall::k_cache, {kPages * kPageSize, kHkv, kD}).run(),
            "k_cache: expected 4 dimensions [num_pages, page_size, Hkv, D], got 3");
  EXPECT_EQ(KvCall().contiguous().reshaped(&KvCall::v_cache, {kB, 24, kHkv * kD}).run(),
            "v_cache: expected 4 dimensions [B, Nmax, Hkv, Dv], got 3");
  EXPECT_EQ(KvCall().reshaped(&KvCall::out, {kB, kNew, kHq}).run(),
            "out: expected 4 dimensions [B, Nnew, Hq, Dv], got 3");
}

TEST(KvCacheErrors, CacheShapes) {
  EXPECT_EQ(KvCall().reshaped(&KvCall::v_cache, {kPages, 4, kHkv, kD}).run(),
            "v_cache: expected page size 8 (same as k_cache) in dimension 1, got 4 (shape [6, 4, 2, 64])");
  EXPECT_EQ(KvCall().reshaped(&KvCall::v_cache, {5, kPageSize, kHkv, kD}).run(),
            "v_cache: expected pages 6 (same as k_cache) in dimension 0, got 5 (shape [5, 8, 2, 64])");
  EXPECT_EQ(KvCall().contiguous().reshaped(&KvCall::k_cache, {3, 16, kHkv, kD}).run(),
            "k_cache: expected batch size 2 (same as q) in dimension 0, got 3 (shape [3, 16, 2, 64])");
  EXPECT_EQ(KvCall().reshaped(&KvCall::k_cache, {kPages, kPageSize, kHkv, 32}).run(),
            "k_cache: expected head dim 64 (same as q) in dimension 3, got 32 (shape [6, 8, 2, 32])");
  EXPECT_EQ(KvCall().caches({kPages, kPageSize, 3, kD}).run(),
            "num_heads_q (4) must be a multiple of num_heads_kv (3)");
  EXPECT_EQ(KvCall().caches({kPages, 0, kHkv, kD}).run(),
            "k_cache: page size must be positive, got 0");
}

TEST(KvCacheErrors, OutShape) {
  EXPECT_EQ(KvCall().reshaped(&KvCall::out, {kB, kNew, kHq, 32}).run(),
            "out: expected head dim 64 (same as v_cache) in dimension 3, got 32 (shape [2, 3, 4, 32])");
  EXPECT_EQ(KvCall().reshaped(&KvCall::out, {kB, 1, kHq, kD}).run(),
            "out: expected new tokens 3 (same as q) in dimension 1, got 1 (shape [2, 1, 4, 64])");
}

TEST(KvCacheErrors, Dtypes) {
  EXPECT_EQ(KvCall().retyped(&KvCall::k_cache, DType::bf16).run(),
            "k_cache: expected dtype fp32 (same as q), got bf16");
  EXPECT_EQ(KvCall().retyped(&KvCall::v_cache, DType::fp16).run(),
            "v_cache: expected dtype fp32 (same as q), got fp16");
  EXPECT_EQ(KvCall().retyped(&KvCall::out, DType::bf16).run(),
            "out: expected dtype fp32 (same as q), got bf16");
  EXPECT_EQ(KvCall().retyped(&KvCall::q, DType::int32).run(),
            "q: dtype int32 is not supported (supported: fp32, fp16, bf16, fp8_e4m3)");
}

TEST(KvCacheErrors, LseShapeAndDtype) {
  EXPECT_EQ(KvCall().reshaped(&KvCall::lse, {kB, kHq, 2}).run(),
            "lse: expected new tokens 3 (same as q) in dimension 2, got 2 (shape [2, 4, 2])");
  EXPECT_EQ(KvCall().reshaped(&KvCall::lse, {kB, 2, kNew}).run(),
            "lse: expected query heads 4 (same as q) in dimension 1, got 2 (shape [2, 2, 3])");
  EXPECT_EQ(KvCall().reshaped(&KvCall::lse, {kB, kHq * kNew}).run(),
            "lse: expected 3 dimensions [B, Hq, Nnew], got 2");
  EXPECT_EQ(KvCall().retyped(&KvCall::lse, DType::bf16).run(),
            "lse: expected dtype fp32, got bf16");
}

// An invalid call writes nothing, even when only the last sequence's pages are wrong.
TEST(KvCacheErrors, NothingWrittenOnError) {
  KvCall c;
  std::fill(c.storage.begin(), c.storage.begin() + 20480, std::numeric_limits<float>::quiet_NaN());
  c.page(1, 2, 99);  // sequence 1's third page
  EXPECT_EQ(c.run(), "block_table[1][2]: page 99 is outside the cache's 6 pages");
  for (int i = 0; i < 20480; ++i) ASSERT_TRUE(std::isnan(c.storage[i])) << i;
}

// Another thread rewrites a length and a page while calls run: the library must validate and
// use its own copies of both (before, the kernel re-read the caller's arrays, so a length
// changed after validation made it read past the cache). Every call either succeeds or names
// the argument it refused.
TEST(KvCacheErrors, LengthsAndPagesChangedDuringTheCall) {
  KvCall c;
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::atomic_ref<std::int32_t> length(c.lengths[1]);
    std::atomic_ref<std::int32_t> page(c.table[1 * kMaxPages + 2]);
    for (std::uint64_t n = 0; !stop.load(std::memory_order_relaxed); ++n) {
      length.store(n % 2 ? 14 : 1 << 30, std::memory_order_relaxed);
      page.store(n % 3 ? 2 : 1 << 30, std::memory_order_relaxed);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  std::string verdict = "ok";
  for (int i = 0; i < 200; ++i) {
    const std::string e = c.run();
    if (e != "no error" && e.find("k_new: sequence 1") == std::string::npos &&
        e.find("block_table[1][2]") == std::string::npos)
      verdict = e;
  }
  stop = true;
  writer.join();
  EXPECT_EQ(verdict, "ok");
}

}  // namespace
}  // namespace flashcpp
