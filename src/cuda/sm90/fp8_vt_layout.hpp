#pragma once
// Where the FP8 forward's pre-pass puts V^T in the workspace (fwd_fp8_vt_prepass.cuh), read by
// the planner (its size), the pre-pass (writes) and the kernel's V TMA descriptor (reads).
//
// V^T is [Hkv, Dv, W] bytes: for each kv head and value column one row of W keys, keys
// contiguous (the K-major B operand of the e4m3 P V wgmma), each 32-key chunk in the order of
// fp8_pv_order.hpp. Sequence b (varlen: its keys; padded: batch entry b) starts at
// round_up(first_row, 32) + kGap * b, where first_row is its first key row in the packed (or
// flattened padded) k: so its chunks are counted from its own first key, and every sequence's
// keys are followed by at least 128 >= kBlockN zero columns (the pre-pass writes them): the last
// key block of a sequence, which reaches up to kBlockN - 1 columns past its end, reads zeros
// there, never the next sequence's values (a NaN there would reach O as 0 * NaN).
#include <cstdint>

#include "common/host_device.hpp"
#include "common/params.hpp"

namespace flashcpp::detail::cuda::sm90 {

inline constexpr int kFp8VtGap = 192;  // >= 128 (the largest kBlockN) + 2 x 31 (the roundings)

FLASHCPP_HOST_DEVICE std::int64_t fp8_vt_seq_start(std::int64_t first_row, int b) {
  return (first_row + 31) / 32 * 32 + std::int64_t(kFp8VtGap) * b;
}

// The columns a sequence owns: its keys rounded up to whole chunks plus the zero gap.
FLASHCPP_HOST_DEVICE std::int64_t fp8_vt_seq_columns(int seqlen_k) {
  return (std::int64_t(seqlen_k) + 31) / 32 * 32 + (kFp8VtGap - 64);
}

// W: the columns of one V^T row (a multiple of 32, so every row starts 16-byte aligned).
FLASHCPP_HOST_DEVICE std::int64_t fp8_vt_row_columns(const ForwardParams& p) {
  const std::int64_t rows = p.is_varlen() ? p.total_rows_k : std::int64_t(p.batch) * p.seqlen_k;
  return (rows + 31) / 32 * 32 + std::int64_t(kFp8VtGap) * (p.batch + 1);
}

inline std::int64_t fp8_vt_bytes(const ForwardParams& p) {
  return std::int64_t(p.heads_kv) * p.head_dim_v * fp8_vt_row_columns(p);
}

}  // namespace flashcpp::detail::cuda::sm90
