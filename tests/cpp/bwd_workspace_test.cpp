// The backward workspace size (src/cuda/bwd_workspace.hpp): the sm80 layout's plain rows,
// the sm90 layout's whole 64-row query blocks of the padded head dim, and the larger of the two
// when this build has an sm90 backward for the head dim; with an sm90 backward also the
// deterministic kernel's counters (4 ints of tickets, one int per query block and head).
// Expectations are written out by hand (not by the same formula), so a wrong factor or
// rounding fails. Host code only: the header pulls in no CUDA, so this runs in the CPU build
// too.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/bwd_workspace.hpp"

namespace flashcpp::detail::cuda {
namespace {

ForwardParams shape(int batch, int heads_q, int heads_kv, int seqlen_q, int head_dim) {
  ForwardParams p;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = 3 * seqlen_q + 5;  // keys never enter the workspace
  p.head_dim = head_dim;
  p.head_dim_v = head_dim;
  return p;
}

// The tiles spelled out here rather than read from the table, so a table change that would
// alter the workspace shows up as a failure of this test, not a silent new expectation.
constexpr Sm90BwdTile kNone{0, 0, 0, 0, 0, false};
constexpr Sm90BwdTile kD128{128, 128, 64, 128, 2, false};
constexpr Sm90BwdTile kD256{256, 256, 64, 64, 2, true};

void expect_bytes(const ForwardParams& p, const Sm90BwdTile& t, std::int64_t dq,
                  std::int64_t stats, std::int64_t counters) {
  EXPECT_EQ(bwd_dq_accum_floats(p, t), dq);
  EXPECT_EQ(bwd_stats_floats(p, t), stats);
  EXPECT_EQ(bwd_counter_ints(p, t), counters);
  EXPECT_EQ(bwd_workspace_bytes(p, t), std::uint64_t(4 * (dq + 2 * stats + counters)));
}

TEST(BwdWorkspace, NoSm90TileIsThePlainLayout) {
  // B=2, Hq=3 (GQA over 1 kv head), Nq=100, D=96: 600 rows.
  const ForwardParams p = shape(2, 3, 1, 100, 96);
  expect_bytes(p, kNone, 57600, 600, 0);
}

TEST(BwdWorkspace, Sm90BlockedDominatesWhenRowsAndHeadDimArePadded) {
  // Nq=100 -> 2 blocks of 64 rows; D=96 runs the d128 instantiation.
  // Plain: 2*3*100*96 = 57600. Blocked: 2*3 * 128 rows * 128 = 98304; stats 2*3*128 = 768;
  // counters 4 + 2*3*2 = 16.
  const ForwardParams p = shape(2, 3, 1, 100, 96);
  expect_bytes(p, kD128, 98304, 768, 16);
}

TEST(BwdWorkspace, Sm90BlockedEqualsPlainWithoutPadding) {
  // Nq=128 is 2 whole blocks and D=128 is the instantiated dim: both layouts 2*3*128*128.
  const ForwardParams p = shape(2, 3, 3, 128, 128);
  expect_bytes(p, kD128, 98304, 768, 16);
  expect_bytes(p, kNone, 98304, 768, 0);
}

TEST(BwdWorkspace, Sm90SplitDPadsToTheD256Instantiation) {
  // D=160 runs the d256 (split_d) kernel: 1*2 heads * 128 rows * 256 = 65536 floats of dq_accum
  // against a plain 1*2*65*160 = 20800; stats 2*128 = 256 against 130; counters 4 + 2*2.
  const ForwardParams p = shape(1, 2, 2, 65, 160);
  expect_bytes(p, kD256, 65536, 256, 8);
}

TEST(BwdWorkspace, TheLargerLayoutWins) {
  // A hand-made tile narrower than the call (the table never hands one out): blocked
  // 1*1*128*64 = 8192 dq floats is below plain 1*1*128*96 = 12288, so plain is kept; the
  // counters follow the tile's blocks: 4 + 2.
  const ForwardParams p = shape(1, 1, 1, 128, 96);
  expect_bytes(p, Sm90BwdTile{64, 64, 64, 128, 2, false}, 12288, 128, 6);
}

TEST(BwdWorkspace, VarlenIsBlockedLikePadded) {
  // Varlen: B * Hq * max_seqlen_q rows, and with an sm90 tile whole blocks of max_seqlen_q
  // per (sequence, head): 2 * 3 * ceil(100 / 64) = 12 blocks of 64 rows (and 4 + 12 counters).
  const std::int32_t cu_seqlens[] = {0, 40, 100};  // only tested for non-null, never read
  ForwardParams p = shape(2, 3, 1, 100, 96);
  p.cu_seqlens_q = cu_seqlens;
  p.cu_seqlens_k = cu_seqlens;
  expect_bytes(p, kNone, 57600, 600, 0);
  expect_bytes(p, kD128, 12 * 64 * 128, 12 * 64, 16);
  expect_bytes(p, kD256, 12 * 64 * 256, 12 * 64, 16);
}

TEST(BwdWorkspace, TableTilesMatchTheSpelledOutOnes) {
  // The head dims above map to the tiles this test assumes.
  const Sm90BwdTile t96 = sm90_bwd_tile(96), t160 = sm90_bwd_tile(160);
  EXPECT_EQ(t96.head_dim, 128);
  EXPECT_EQ(t96.block_m, 64);
  EXPECT_EQ(t160.head_dim, 256);
  EXPECT_EQ(t160.block_m, 64);
  EXPECT_EQ(sm90_bwd_tile(257).head_dim, 0);
}

}  // namespace
}  // namespace flashcpp::detail::cuda
