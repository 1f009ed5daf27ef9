// The sm80 forward's tile table and its choice rule (src/cuda/sm80/fwd_tile_table.hpp): every
// head dim has a row for each Ampere/Ada shared-memory budget, the choice always fits the
// budget it is given, and the row names that FLASHCPP_SM80_FWD_TILE_D<d> takes find their rows.
// Host code only: runs without a GPU.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "cuda/sm80/fwd_tile_table.hpp"

namespace flashcpp::detail::cuda {
namespace {

constexpr int kKB = 1024;

std::string chosen_name(int head_dim, int budget, Sm80FwdShape shape = {}) {
  const int i = sm80_fwd_tile_index(head_dim, budget, shape);
  return i < 0 ? "none" : sm80_fwd_tile_name(kSm80FwdTiles[i]);
}

TEST(Sm80FwdTileTable, ChoiceFitsEveryBudgetAndShape) {
  for (const Sm80FwdTile& t : kSm80FwdTiles)
    for (int budget_kb : {99, 100, 163, 227, 228})
      for (int n : {1, 64, 100, 512, 1024, 2048, 4096, 8192, 32768})
        for (bool causal : {false, true}) {
          SCOPED_TRACE("head dim " + std::to_string(t.head_dim) + ", " +
                       std::to_string(budget_kb) + " KB, N " + std::to_string(n) +
                       (causal ? ", causal" : ""));
          const int i = sm80_fwd_tile_index(t.head_dim, budget_kb * kKB, {n, n, causal});
          ASSERT_GE(i, 0);
          EXPECT_EQ(kSm80FwdTiles[i].head_dim, t.head_dim);
          EXPECT_LE(sm80_fwd_smem_bytes(kSm80FwdTiles[i]), budget_kb * kKB);
        }
}

// The d256 rule (measured on an H100; fwd_tile_table.hpp): causal up to N = 2k on 64x64 with
// 4 warps where two of its CTAs fit (not at A100's 163 KB), the rest on the one-buffer 128x64
// with 8 warps; sm86/sm89 (99 KB) get 64x64 whatever the shape; none below the smallest row.
TEST(Sm80FwdTileTable, D256Rule) {
  for (int n : {1, 512, 1024, 2048}) {
    EXPECT_EQ(chosen_name(256, 227 * kKB, {n, n, true}), "64x64_4w") << n;
    EXPECT_EQ(chosen_name(256, 227 * kKB, {n, n, false}), "128x64_8w") << n;
    EXPECT_EQ(chosen_name(256, 163 * kKB, {n, n, true}), "128x64_8w") << n;
  }
  for (int n : {2049, 4096, 16384}) {
    EXPECT_EQ(chosen_name(256, 227 * kKB, {n, n, true}), "128x64_8w") << n;
    EXPECT_EQ(chosen_name(256, 227 * kKB, {n, n, false}), "128x64_8w") << n;
  }
  // Causal with more keys than 2k: the long rows decide.
  EXPECT_EQ(chosen_name(256, 227 * kKB, {1024, 8192, true}), "128x64_8w");
  for (bool causal : {false, true})
    for (int n : {512, 4096}) {
      EXPECT_EQ(chosen_name(256, 163 * kKB, {n, n, causal}), "128x64_8w");
      EXPECT_EQ(chosen_name(256, 99 * kKB, {n, n, causal}), "64x64_4w");
      EXPECT_EQ(chosen_name(256, 95 * kKB, {n, n, causal}), "none");
    }
}

// The other head dims: the largest row that fits.
TEST(Sm80FwdTileTable, FirstRowThatFits) {
  EXPECT_EQ(chosen_name(192, 227 * kKB, {4096, 4096, false}), "128x64_8w_kv2");
  EXPECT_EQ(chosen_name(192, 163 * kKB, {4096, 4096, true}), "128x64_8w_kv2");
  EXPECT_EQ(chosen_name(192, 99 * kKB, {4096, 4096, false}), "128x64_8w");
  EXPECT_EQ(chosen_name(128, 227 * kKB, {1024, 1024, true}), "128x64_4w");
  EXPECT_EQ(chosen_name(64, 99 * kKB, {1024, 1024, false}), "128x128_4w");
}

TEST(Sm80FwdTileTable, NamesFindTheirRows) {
  for (int i = 0; i < kSm80FwdTileCount; ++i) {
    const Sm80FwdTile& t = kSm80FwdTiles[i];
    EXPECT_EQ(sm80_fwd_tile_index_named(t.head_dim, sm80_fwd_tile_name(t)), i);
    EXPECT_EQ(sm80_fwd_head_dim(t.head_dim), t.head_dim);
  }
  std::set<std::string> names;
  for (const Sm80FwdTile& t : kSm80FwdTiles)
    EXPECT_TRUE(names.insert(std::to_string(t.head_dim) + "/" + sm80_fwd_tile_name(t)).second);
  EXPECT_EQ(sm80_fwd_tile_index_named(256, "64x64_4w"), sm80_fwd_row(256, 64, 64, 4, 1));
  EXPECT_EQ(sm80_fwd_tile_index_named(256, "128x64_8w_kv2"), sm80_fwd_row(256, 128, 64, 8, 2));
#ifdef FLASHCPP_SM80_FWD_PAIRS
  EXPECT_EQ(sm80_fwd_tile_index_named(256, "128x64_8w_kv2_pairs"), sm80_fwd_tile_index_nth(256, 0));
#else
  EXPECT_EQ(sm80_fwd_tile_index_named(256, "128x64_8w_kv2_pairs"), -1);
#endif
  EXPECT_EQ(sm80_fwd_tile_index_named(128, "64x64_4w"), -1);  // a d256 row only
  EXPECT_EQ(sm80_fwd_tile_index_named(256, "64x64"), -1);
  EXPECT_EQ(sm80_fwd_tile_index_named(256, ""), -1);
}

TEST(Sm80FwdTileTable, PaddedHeadDims) {
  EXPECT_EQ(sm80_fwd_head_dim(1), 32);
  EXPECT_EQ(sm80_fwd_head_dim(80), 96);
  EXPECT_EQ(sm80_fwd_head_dim(160), 192);
  EXPECT_EQ(sm80_fwd_head_dim(256), 256);
  EXPECT_EQ(sm80_fwd_head_dim(257), 0);
}

}  // namespace
}  // namespace flashcpp::detail::cuda
