#pragma once
// The one visibility rule of every backend (docs/semantics.md), bottom-right aligned: with
// o = Nk - Nq, key j is visible to query i iff
//   i + o - left <= j <= i + o + right   (a bound of -1 is unbounded), and 0 <= j < Nk.
// None, causal (-1, 0) and sliding window are this one rule with different bounds. WindowMask
// states it once, as lo <= j - i <= hi, and lifts it to blocks: which key blocks a query tile
// visits and which of them need no element mask (forward), which query blocks a key block
// meets (backward), and the element test itself. The CPU backend (cpu/block_mask.hpp), the
// float64 reference and both CUDA paths all read it.
// Keeping the bounds run-time values (instead of a template parameter per mask kind) keeps
// one kernel per (dtype, head dim) TU: the masked iterations are the few blocks on the band's
// edges and the last partial block, the unmasked ones carry no mask code at all, so the
// run-time bounds cost nothing in the hot loop.
#include <cstdint>

#include "common/host_device.hpp"

namespace flashcpp::detail {

struct KeyRange {
  std::int64_t begin;  // first visible key
  std::int64_t end;    // one past the last visible key; begin >= end means none
};

struct BlockRange {
  int begin;  // first key block
  int end;    // one past the last key block; begin >= end: nothing visible
};

FLASHCPP_HOST_DEVICE std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

struct WindowMask {
  int seqlen_q, seqlen_k;
  // Visible iff lo <= j - i <= hi; unbounded sides are clamped to +-2^31-ish so that an int
  // difference j - i (both < 2^31) compares correctly.
  std::int64_t lo, hi;

  FLASHCPP_HOST_DEVICE WindowMask(int sq, int sk, int left, int right) : seqlen_q(sq), seqlen_k(sk) {
    const std::int64_t o = std::int64_t(sk) - sq;
    lo = left < 0 ? -(std::int64_t(1) << 40) : o - left;
    hi = right < 0 ? (std::int64_t(1) << 40) : o + right;
  }

  // Key blocks that any row of query tile m_block (rows [m0, m0 + BM) clipped to seqlen_q)
  // can see: [first, last] visible keys of the union, clipped to [0, seqlen_k).
  FLASHCPP_HOST_DEVICE BlockRange n_blocks(int m_block, int block_m, int block_n) const {
    const std::int64_t m0 = std::int64_t(m_block) * block_m;
    std::int64_t m_last = m0 + block_m - 1;
    if (m_last > seqlen_q - 1) m_last = seqlen_q - 1;
    std::int64_t k_begin = m0 + lo, k_end = m_last + hi + 1;
    if (k_begin < 0) k_begin = 0;
    if (k_end > seqlen_k) k_end = seqlen_k;
    if (k_begin >= k_end) return {0, 0};
    return {int(k_begin / block_n), int((k_end + block_n - 1) / block_n)};
  }

  // Key blocks visible in full to every row of the tile (rows past seqlen_q included, which
  // is conservative and harmless) and inside seqlen_k: these run without any mask.
  FLASHCPP_HOST_DEVICE BlockRange unmasked_blocks(int m_block, int block_m, int block_n) const {
    const std::int64_t m0 = std::int64_t(m_block) * block_m;
    const std::int64_t m_last = m0 + block_m - 1;
    // Block n is unmasked iff n*BN >= m_last + lo  and  n*BN + BN - 1 <= m0 + hi
    // and n*BN + BN <= seqlen_k.
    std::int64_t begin = floor_div(m_last + lo + block_n - 1, block_n);
    std::int64_t end = floor_div(m0 + hi + 1, block_n);
    const std::int64_t full = seqlen_k / block_n;
    if (begin < 0) begin = 0;
    if (end > full) end = full;
    if (begin > end) begin = end;
    return {int(begin), int(end)};
  }

  // Query blocks with a row that sees some key of key block n_block (keys [n0, n0 + block_n)
  // clipped to seqlen_k): rows [n0 - hi, n_last - lo] clipped to [0, seqlen_q). The loop
  // bounds of the backward, which walks query blocks for a fixed key block.
  FLASHCPP_HOST_DEVICE BlockRange m_blocks(int n_block, int block_n, int block_m) const {
    const std::int64_t n0 = std::int64_t(n_block) * block_n;
    std::int64_t n_last = n0 + block_n - 1;
    if (n_last > seqlen_k - 1) n_last = seqlen_k - 1;
    std::int64_t i_begin = n0 - hi, i_end = n_last - lo + 1;
    if (i_begin < 0) i_begin = 0;
    if (i_end > seqlen_q) i_end = seqlen_q;
    if (i_begin >= i_end) return {0, 0};
    return {int(i_begin / block_m), int((i_end + block_m - 1) / block_m)};
  }

  // The queries of query block [m0, m0 + block_m) that see key `col`, as block-relative
  // bounds [first, last] clipped to [-1, block_m] (first > last: none; also when the key is
  // past seqlen_k). The backward's mask: the int64 work is once per key row, each element is
  // then two int compares.
  FLASHCPP_HOST_DEVICE void col_window(int col, int m0, int block_m, int& first, int& last) const {
    std::int64_t f = std::int64_t(col) - hi, l = std::int64_t(col) - lo;
    if (f < 0) f = 0;
    if (l > seqlen_q - 1) l = seqlen_q - 1;
    if (col >= seqlen_k) l = -1;
    f -= m0;
    l -= m0;
    first = int(f < -1 ? -1 : f > block_m ? block_m : f);
    last = int(l < -1 ? -1 : l > block_m ? block_m : l);
  }

  // True when every (row, key) pair of the tile rows [m0, m0 + block_m) x keys
  // [n0, n0 + block_n) is visible: both inside their sequences and the tile inside the band.
  FLASHCPP_HOST_DEVICE bool tile_unmasked(int m_block, int block_m, int n_block,
                                          int block_n) const {
    const std::int64_t m0 = std::int64_t(m_block) * block_m;
    const std::int64_t n0 = std::int64_t(n_block) * block_n;
    return m0 + block_m <= seqlen_q && n0 + block_n <= seqlen_k &&
           n0 - (m0 + block_m - 1) >= lo && n0 + block_n - 1 - m0 <= hi;
  }

  // The keys `row` sees, [begin, end) (begin >= end: none): the CPU backend's row loop.
  FLASHCPP_HOST_DEVICE KeyRange keys(std::int64_t row) const {
    std::int64_t begin = row + lo, end = row + hi + 1;
    if (begin < 0) begin = 0;
    if (end > seqlen_k) end = seqlen_k;
    return {begin, end};
  }

  FLASHCPP_HOST_DEVICE bool visible(int row, int col) const {
    const std::int64_t d = std::int64_t(col) - row;
    return col < seqlen_k && d >= lo && d <= hi;
  }

  // The keys of key block [n0, n0 + block_n) that `row` sees, as block-relative bounds
  // [first, last] clipped to [-1, block_n] (first > last: none). The int64 work is once per
  // row; each element is then two int compares (the per-element visible() in the sm80 loop
  // cost 64-bit compares and predicate packing for every element).
  FLASHCPP_HOST_DEVICE void row_window(int row, int n0, int block_n, int& first, int& last) const {
    std::int64_t f = std::int64_t(row) + lo, l = std::int64_t(row) + hi;
    if (f < 0) f = 0;
    if (l > seqlen_k - 1) l = seqlen_k - 1;
    f -= n0;
    l -= n0;
    first = int(f < -1 ? -1 : f > block_n ? block_n : f);
    last = int(l < -1 ? -1 : l > block_n ? block_n : l);
  }
};

}  // namespace flashcpp::detail
