// The order of the deterministic sm90a backward (src/cuda/sm90/bwd_dq_order.hpp): the ticket
// order of its tile scheduler must hand out every (key block, kv head, batch) once and, within
// a (kv head, batch), the key blocks from the last down (a CTA only ever waits for key blocks
// above its own, so those must hold smaller tickets, or CTAs could wait on CTAs that never get
// an SM); and the group of pairs the tickets interleave. Host code only: runs without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/sm90/bwd_tile_scheduler.hpp"

namespace flashcpp::detail::cuda::sm90 {
namespace {

TEST(BwdTicketOrder, EveryTileOnceKeyBlocksFromTheLastDown) {
  for (int n_blocks : {1, 2, 3, 7})
    for (int heads_kv : {1, 2, 3})
      for (int batch : {1, 2, 5}) {
        const int pairs = heads_kv * batch;
        for (int group = 1; group <= pairs; ++group) {
          SCOPED_TRACE("n_blocks " + std::to_string(n_blocks) + " heads_kv " +
                       std::to_string(heads_kv) + " batch " + std::to_string(batch) +
                       " group " + std::to_string(group));
          std::map<std::tuple<int, int, int>, unsigned> ticket_of;
          std::vector<std::vector<unsigned>> tickets_of_pair(pairs);
          const unsigned total = unsigned(n_blocks * pairs);
          for (unsigned t = 0; t < total; ++t) {
            const BwdTileCoord c = ordered_key_block_tile(n_blocks, heads_kv, batch, group, t);
            ASSERT_TRUE(c.n_block >= 0 && c.n_block < n_blocks) << "ticket " << t;
            ASSERT_TRUE(c.head_kv >= 0 && c.head_kv < heads_kv) << "ticket " << t;
            ASSERT_TRUE(c.batch >= 0 && c.batch < batch) << "ticket " << t;
            const bool fresh =
                ticket_of.emplace(std::tuple{c.n_block, c.head_kv, c.batch}, t).second;
            ASSERT_TRUE(fresh) << "ticket " << t << " repeats a tile";
            tickets_of_pair[c.batch * heads_kv + c.head_kv].push_back(t);
          }
          for (int pair = 0; pair < pairs; ++pair) {
            // Tickets were visited in increasing order: the pair's key blocks must come out
            // n_blocks - 1, ..., 0, each a group's worth of tickets after the one above it.
            const std::vector<unsigned>& ts = tickets_of_pair[pair];
            ASSERT_EQ(int(ts.size()), n_blocks);
            const int first_pair = pair / group * group;
            const int in_group = std::min(group, pairs - first_pair);
            for (int i = 0; i < n_blocks; ++i) {
              const BwdTileCoord c =
                  ordered_key_block_tile(n_blocks, heads_kv, batch, group, ts[i]);
              EXPECT_EQ(c.n_block, n_blocks - 1 - i) << "pair " << pair;
              if (i > 0) {
                EXPECT_EQ(ts[i] - ts[i - 1], unsigned(in_group)) << "pair " << pair;
              }
            }
          }
        }
      }
}

TEST(BwdTicketOrder, HeadGroupSpacesKeyBlocksByTwoBlocksOfTheGpu) {
  // ceil(2 * sm_count / walk), walk = (Hq / Hkv) x query blocks of 64 rows; at most the pairs.
  // 16 heads, N 1k: walk 16, ceil(264 / 16) = 17 of 256 pairs.
  EXPECT_EQ(ticket_head_group(16, 16, 16, 1024, 64, 132), 17);
  // N 16k, B 1: walk 256 -> 2.
  EXPECT_EQ(ticket_head_group(16, 16, 1, 16384, 64, 132), 2);
  // N 32k: walk 512 -> 1.
  EXPECT_EQ(ticket_head_group(16, 16, 1, 32768, 64, 132), 1);
  // GQA 32 / 8, N 4k (+ 1 row: 65 blocks): walk 4 * 65 = 260 -> ceil(264 / 260) = 2.
  EXPECT_EQ(ticket_head_group(32, 8, 2, 4097, 64, 132), 2);
  // Few pairs: the group is all of them.
  EXPECT_EQ(ticket_head_group(4, 2, 1, 128, 64, 132), 2);
  EXPECT_EQ(ticket_head_group(4, 1, 1, 128, 64, 132), 1);
  // No query blocks: one pair at a time (nothing waits).
  EXPECT_EQ(ticket_head_group(8, 8, 4, 0, 64, 132), 1);
}

TEST(BwdTicketOrder, HeadGroupKeepsThePairsWithinAThirdOfL2) {
  constexpr std::int64_t kL2 = 50 << 20;  // an H100's
  // A pair's Q, dO (2 bytes) and dq_accum (4 bytes) rows: 8 bytes per head dim element.
  EXPECT_EQ(ticket_pair_bytes(8, 8, 16384, 256, 2), std::int64_t(16384) * 256 * 8);
  EXPECT_EQ(ticket_pair_bytes(32, 8, 4096, 128, 2), std::int64_t(4) * 4096 * 128 * 8);
  const auto group = [&](int hq, int hkv, int b, int n, int d) {
    return ticket_head_group(hq, hkv, b, n, 64, 132, ticket_pair_bytes(hq, hkv, n, d, 2), kL2);
  };
  // d256, B 1, 8 heads, N 16k: 32 MB a pair; the lag rule's 2 -> 1.
  EXPECT_EQ(group(8, 8, 1, 16384, 256), 1);
  // N 8k, B 2: 16 MB; 3 -> 1. N 4k, B 4: 8 MB; 5 -> 2.
  EXPECT_EQ(group(8, 8, 2, 8192, 256), 1);
  EXPECT_EQ(group(8, 8, 4, 4096, 256), 2);
  // d64, N 16k, 32 heads: 8 MB; the lag rule's 2 fits.
  EXPECT_EQ(group(32, 32, 1, 16384, 64), 2);
  // Short sequences: d128, N 1k, 1 MB a pair: 16 fit, the lag rule's ceil(264 / 16) = 17 -> 16;
  // d64, N 512: 256 KB a pair, the lag rule's ceil(264 / 8) = 33 stays.
  EXPECT_EQ(group(16, 16, 16, 1024, 128), 16);
  EXPECT_EQ(group(16, 16, 32, 512, 64), 33);
  // A pair larger than the share: still one pair at a time. No L2 size known: no cap.
  EXPECT_EQ(group(8, 8, 1, 65536, 256), 1);
  EXPECT_EQ(ticket_head_group(8, 8, 4, 4096, 64, 132, ticket_pair_bytes(8, 8, 4096, 256, 2), 0),
            5);
}

}  // namespace
}  // namespace flashcpp::detail::cuda::sm90
