// The block bounds of the one mask rule (src/common/mask.hpp) against brute
// force over every (row, key) pair of small problems: the backward's query-block range of a
// key block, its "no mask needed" test and its per-key query window; the forward's key-block
// range and unmasked band. Host code only: runs without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

#include "common/mask.hpp"

namespace flashcpp::detail::cuda {
namespace {

struct Shape {
  int sq, sk, left, right, bm, bn;
};

std::string name(const Shape& s) {
  return "Nq=" + std::to_string(s.sq) + " Nk=" + std::to_string(s.sk) + " window=(" +
         std::to_string(s.left) + "," + std::to_string(s.right) + ") blocks " +
         std::to_string(s.bm) + "x" + std::to_string(s.bn);
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

template <class F>
void for_each_shape(F&& f) {
  for (int sq : {1, 3, 8, 13, 32, 37})
    for (int sk : {1, 5, 8, 16, 29, 40})
      for (auto [l, r] : {std::pair{-1, -1}, {-1, 0}, {3, 0}, {0, 0}, {5, 2}, {-1, 4}, {2, -1},
                          {20, 7}})
        for (int bm : {4, 8})
          for (int bn : {8, 16}) f(Shape{sq, sk, l, r, bm, bn});
}

// The element test and the per-row key range against the contract's formula, written out here
// independently of the rule: i + o - left <= j <= i + o + right, o = Nk - Nq, 0 <= j < Nk.
TEST(MaskRule, ElementTestIsTheContract) {
  for_each_shape([](const Shape& s) {
    SCOPED_TRACE(name(s));
    const WindowMask mask(s.sq, s.sk, s.left, s.right);
    const int o = s.sk - s.sq;
    for (int i = 0; i < s.sq; ++i) {
      int first = s.sk, last = -1;
      for (int j = 0; j < s.sk + 3; ++j) {
        const bool expected = j < s.sk && (s.left < 0 || j >= i + o - s.left) &&
                              (s.right < 0 || j <= i + o + s.right);
        EXPECT_EQ(mask.visible(i, j), expected) << "query " << i << " key " << j;
        if (expected) {
          first = std::min(first, j);
          last = std::max(last, j);
        }
      }
      const KeyRange keys = mask.keys(i);
      if (last < 0) {
        EXPECT_GE(keys.begin, keys.end) << "query " << i;
      } else {
        EXPECT_EQ(keys.begin, first) << "query " << i;
        EXPECT_EQ(keys.end, last + 1) << "query " << i;
      }
    }
  });
}

TEST(MaskRule, BackwardQueryBlocksOfAKeyBlock) {
  for_each_shape([](const Shape& s) {
    SCOPED_TRACE(name(s));
    const WindowMask mask(s.sq, s.sk, s.left, s.right);
    for (int nb = 0; nb < ceil_div(s.sk, s.bn); ++nb) {
      const BlockRange range = mask.m_blocks(nb, s.bn, s.bm);
      for (int mb = 0; mb < ceil_div(s.sq, s.bm); ++mb) {
        bool any = false, all = true;
        for (int i = mb * s.bm; i < (mb + 1) * s.bm; ++i)
          for (int j = nb * s.bn; j < (nb + 1) * s.bn; ++j) {
            const bool v = i < s.sq && mask.visible(i, j);
            any = any || v;
            all = all && v;
          }
        EXPECT_EQ(any, mb >= range.begin && mb < range.end) << "n block " << nb << " m " << mb;
        EXPECT_EQ(all, mask.tile_unmasked(mb, s.bm, nb, s.bn)) << "n block " << nb << " m " << mb;
        for (int j = nb * s.bn; j < (nb + 1) * s.bn; ++j) {
          int first = 0, last = 0;
          mask.col_window(j, mb * s.bm, s.bm, first, last);
          for (int q = 0; q < s.bm; ++q) {
            const int i = mb * s.bm + q;
            EXPECT_EQ(q >= first && q <= last, i < s.sq && mask.visible(i, j))
                << "key " << j << " query " << i;
          }
        }
      }
    }
  });
}

TEST(MaskRule, ForwardKeyBlocksOfAQueryBlock) {
  for_each_shape([](const Shape& s) {
    SCOPED_TRACE(name(s));
    const WindowMask mask(s.sq, s.sk, s.left, s.right);
    for (int mb = 0; mb < ceil_div(s.sq, s.bm); ++mb) {
      const BlockRange range = mask.n_blocks(mb, s.bm, s.bn);
      const BlockRange unmasked = mask.unmasked_blocks(mb, s.bm, s.bn);
      for (int nb = 0; nb < ceil_div(s.sk, s.bn); ++nb) {
        bool any = false, all = true;
        for (int i = mb * s.bm; i < (mb + 1) * s.bm; ++i)
          for (int j = nb * s.bn; j < (nb + 1) * s.bn; ++j) {
            const bool v = mask.visible(i, j);  // rows past Nq count: conservative, as documented
            any = any || (i < s.sq && v);
            all = all && v;
          }
        EXPECT_EQ(any, nb >= range.begin && nb < range.end) << "m block " << mb << " n " << nb;
        if (nb >= unmasked.begin && nb < unmasked.end) {
          EXPECT_TRUE(all) << "m block " << mb << " n " << nb;
        }
      }
    }
  });
}

// The deterministic sm90a backward (src/cuda/sm90/bwd_dq_order.hpp) counts a query block's
// adders with n_blocks(m) while each key block walks m_blocks(n): the two must name the same
// (query block, key block) pairs, or a CTA would wait for a key block that never adds.
TEST(MaskRule, BackwardAndForwardBlockRangesAgree) {
  for_each_shape([](const Shape& s) {
    SCOPED_TRACE(name(s));
    const WindowMask mask(s.sq, s.sk, s.left, s.right);
    for (int nb = 0; nb < ceil_div(s.sk, s.bn); ++nb) {
      const BlockRange ms = mask.m_blocks(nb, s.bn, s.bm);
      for (int mb = 0; mb < ceil_div(s.sq, s.bm); ++mb) {
        const BlockRange ns = mask.n_blocks(mb, s.bm, s.bn);
        EXPECT_EQ(mb >= ms.begin && mb < ms.end, nb >= ns.begin && nb < ns.end)
            << "m block " << mb << " n block " << nb;
      }
    }
  });
}

}  // namespace
}  // namespace flashcpp::detail::cuda
