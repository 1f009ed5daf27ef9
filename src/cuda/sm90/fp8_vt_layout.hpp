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
//
// After V^T, the NaN key bits [Hkv, W / 32] (32-bit words), written by the pre-pass too: bit
// c % 32 of word c / 32 of a kv head is set where V^T column c (a key, in its natural order,
// not the chunk order) holds a NaN, e4m3's only non-finite value. The forward reads the words
// of the key blocks its mask cuts (fwd_non_finite_v.hpp): a NaN v there must reach the rows
// that see its key only.
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

// The NaN key bits, right after V^T (a multiple of 32 x 64 bytes: aligned).
inline std::int64_t fp8_v_nan_key_bytes(const ForwardParams& p) {
  return std::int64_t(p.heads_kv) * fp8_vt_row_columns(p) / 8;
}

// The word of the NaN key bits that holds key 0 of the sequence that starts at V^T column
// seq_start (fp8_vt_seq_start) of kv head `head_kv`; key j of the sequence is bit j % 32 of the
// word j / 32 after it. (Ints, as the TMA coordinates of V^T: V^T holds 32 x Dv bytes per
// word of bits.)
FLASHCPP_HOST_DEVICE int fp8_v_nan_key_word(const ForwardParams& p, int head_kv, int seq_start) {
  return head_kv * int(fp8_vt_row_columns(p) / 32) + seq_start / 32;
}

}  // namespace flashcpp::detail::cuda::sm90
