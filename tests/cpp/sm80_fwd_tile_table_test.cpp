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

// The rows each GPU class gets at D 256 (long sequences): H100/H200 two K/V buffers, A100 one,
// sm86/sm89 FA2's 64x64 with 4 warps; and none below the smallest row.
TEST(Sm80FwdTileTable, D256RowPerGpuClass) {
  const Sm80FwdShape long_rows{8192, 8192, false};
  EXPECT_EQ(chosen_name(256, 227 * kKB, long_rows), "128x64_8w_kv2");
  EXPECT_EQ(chosen_name(256, 163 * kKB, long_rows), "128x64_8w");
  EXPECT_EQ(chosen_name(256, 99 * kKB, long_rows), "64x64_4w");
  EXPECT_EQ(chosen_name(192, 99 * kKB, long_rows), "128x64_8w");
  EXPECT_EQ(chosen_name(256, 63 * kKB, long_rows), "none");
  EXPECT_EQ(chosen_name(128, 227 * kKB, long_rows), "128x64_4w");
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
  EXPECT_EQ(sm80_fwd_tile_index_named(256, "64x64_4w"), sm80_fwd_tile_index_nth(256, 2));
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
