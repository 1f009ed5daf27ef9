#pragma once
// Size and carve-up of the backward's workspace: the fp32 dq_accum region, then dsum and
// lse_log2, then (sm90 layout only) the deterministic kernel's int counters. The workspace
// query does not know which backend will run, so the sizes cover both layouts: sm80 per row,
// sm90 in whole query blocks of the instantiation that would run.
// Host only.
#include <cstdint>

#include "common/params.hpp"
#include "cuda/sm90/bwd_tile_table.hpp"

namespace flashcpp::detail::cuda {

// Workspace rows are (b, h, i) with i < seqlen_q; for varlen seqlen_q is max_seqlen_q, so the
// workspace is B * Hq * max_seqlen_q rows: an upper bound of Hq * total_q that needs only what
// the workspace query knows (ForwardParams carries no total_q).
inline std::int64_t bwd_rows(const ForwardParams& p) {
  return std::int64_t(p.batch) * p.heads_q * p.seqlen_q;
}
// Floats of the dq_accum region: the sm80 layout's rows x head_dim or, when this build's sm90
// backward covers the head dim (`sm90`: the tile of the instantiation that would run, {0, ...}
// when none), the larger of that and the sm90 blocked layout (whole query blocks of the
// instantiation's padded head dim). The workspace query does not know which backend will run.
inline std::int64_t bwd_dq_accum_floats(const ForwardParams& p, const Sm90BwdTile& sm90) {
  const std::int64_t plain = bwd_rows(p) * p.head_dim;
  if (sm90.head_dim == 0) return plain;
  const std::int64_t blocks = (std::int64_t(p.seqlen_q) + sm90.block_m - 1) / sm90.block_m;
  const std::int64_t blocked =
      std::int64_t(p.batch) * p.heads_q * blocks * sm90.block_m * sm90.head_dim;
  return blocked > plain ? blocked : plain;
}
// Floats of each of the dsum and lse_log2 arrays: one per row, or per row of whole sm90 query
// blocks (the sm90 layout pads every (batch, head) to whole blocks, so the kernel's producer
// copies a block's statistics with one bulk copy) when this build's sm90 backward covers the
// call.
inline std::int64_t bwd_stats_floats(const ForwardParams& p, const Sm90BwdTile& sm90) {
  const std::int64_t plain = bwd_rows(p);
  if (sm90.head_dim == 0) return plain;
  const std::int64_t blocks = (std::int64_t(p.seqlen_q) + sm90.block_m - 1) / sm90.block_m;
  const std::int64_t blocked = std::int64_t(p.batch) * p.heads_q * blocks * sm90.block_m;
  return blocked > plain ? blocked : plain;
}
// Ints of the sm90 deterministic backward's counters (sm90/bwd_dq_order.hpp), 0 without an
// sm90 tile: kBwdTicketInts for the CTA tickets (16 bytes), then one arrival counter per
// dq_accum block. Always reserved, like the sm90 layout: the workspace query does not know
// whether the call will be deterministic, and they are one int per block_m x head_dim floats.
inline constexpr std::int64_t kBwdTicketInts = 4;
inline std::int64_t bwd_counter_ints(const ForwardParams& p, const Sm90BwdTile& sm90) {
  if (sm90.head_dim == 0) return 0;
  const std::int64_t blocks = (std::int64_t(p.seqlen_q) + sm90.block_m - 1) / sm90.block_m;
  return kBwdTicketInts + std::int64_t(p.batch) * p.heads_q * blocks;
}
// Bytes: the dq_accum region, then dsum and lse_log2, then the counters.
inline std::uint64_t bwd_workspace_bytes(const ForwardParams& p, const Sm90BwdTile& sm90) {
  return std::uint64_t(bwd_dq_accum_floats(p, sm90) + 2 * bwd_stats_floats(p, sm90)) *
             sizeof(float) +
         std::uint64_t(bwd_counter_ints(p, sm90)) * sizeof(std::int32_t);
}

}  // namespace flashcpp::detail::cuda
