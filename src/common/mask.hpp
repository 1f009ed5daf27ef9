#pragma once
// The visibility rule of the contract, shared by every backend:
// with o = Nk - Nq (bottom-right alignment), key j is visible to query i iff
//   i + o - left <= j <= i + o + right   (a bound of -1 is unbounded), and 0 <= j < Nk.
#include <cstdint>

#include "common/host_device.hpp"

namespace flashcpp::detail {

struct KeyRange {
  std::int64_t begin;  // first visible key
  std::int64_t end;    // one past the last visible key; begin >= end means none
};

FLASHCPP_HOST_DEVICE KeyRange visible_keys(std::int64_t row, std::int64_t seqlen_q,
                                           std::int64_t seqlen_k, int window_left,
                                           int window_right) {
  const std::int64_t diag = row + seqlen_k - seqlen_q;
  std::int64_t begin = window_left < 0 ? 0 : diag - window_left;
  std::int64_t end = window_right < 0 ? seqlen_k : diag + window_right + 1;
  if (begin < 0) begin = 0;
  if (end > seqlen_k) end = seqlen_k;
  return {begin, end};
}

}  // namespace flashcpp::detail
