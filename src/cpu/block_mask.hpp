#pragma once
// The visibility rule (common/mask.hpp) over the tiled CPU backend's arbitrary row and key
// ranges: which keys a block of rows can see, which rows see a block of keys, and whether a
// (rows x keys) block needs the element-wise mask at all. All of it rests on one fact of the
// rule: the first and the one-past-last visible key never decrease from one row to the next.
#include <cstdint>
#include <limits>

#include "common/mask.hpp"

namespace flashcpp::detail::cpu {

struct RowRange {
  std::int64_t begin;
  std::int64_t end;  // begin >= end: empty
};

class BlockMask {
 public:
  BlockMask(std::int64_t nq, std::int64_t nk, int window_left, int window_right)
      : nq_(nq), rule_(int(nq), int(nk), window_left, window_right) {}

  KeyRange keys(std::int64_t row) const { return rule_.keys(row); }

  // A range holding every key some row of [r0, r1) sees.
  KeyRange keys_of_rows(std::int64_t r0, std::int64_t r1) const {
    return {keys(r0).begin, keys(r1 - 1).end};
  }

  // The rows that see at least one key of [c0, c1).
  RowRange rows_of_keys(std::int64_t c0, std::int64_t c1) const {
    return {first_row([&](std::int64_t r) { return keys(r).end > c0; }),
            first_row([&](std::int64_t r) { return keys(r).begin >= c1; })};
  }

  // True when every row of [r0, r1) sees every key of [c0, c1): no mask needed.
  bool is_full(std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) const {
    return keys(r1 - 1).begin <= c0 && keys(r0).end >= c1;
  }

  // s[i * lds + j] = `hidden` (-inf for scores) where key c0 + j is not visible to row r0 + i.
  void apply(float* s, std::int64_t lds, std::int64_t r0, int rows, std::int64_t c0, int cols,
             float hidden = -std::numeric_limits<float>::infinity()) const {
    for (int i = 0; i < rows; ++i) {
      const KeyRange visible = keys(r0 + i);
      for (int j = 0; j < cols; ++j) {
        if (c0 + j < visible.begin || c0 + j >= visible.end) s[i * lds + j] = hidden;
      }
    }
  }

 private:
  // The first row in [0, nq) where a monotone (false ... true) predicate holds, else nq.
  template <class Predicate>
  std::int64_t first_row(Predicate holds) const {
    std::int64_t lo = 0, hi = nq_;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (holds(mid))
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  }

  std::int64_t nq_;
  WindowMask rule_;
};

}  // namespace flashcpp::detail::cpu
