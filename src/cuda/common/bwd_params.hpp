#pragma once
// What the backward kernels (sm80 and sm90a, with their pre- and post-passes) get: the
// validated call plus the host-folded scales and the workspace carve-up (the fp32 dq_accum
// region, then dsum and lse_log2, each in the layout of the backend that runs: sm80 per row,
// sm90 in whole query blocks), and the sm80 backward's tile table, read by the host (grid,
// kernel name) and the device code (kernel traits).
#include <cstdint>

#include "common/params.hpp"
#include "cuda/sm90/bwd_tile_table.hpp"

namespace flashcpp::detail::cuda {

// lse_log2 = lse * kLog2e: the backward kernels take exp2 of base-2 scores.
inline constexpr float kLog2e = 1.4426950408889634f;

struct BwdKernelParams {
  BackwardParams p;
  float scale_log2 = 0.f;        // exp2 takes s * scale_log2 - lse_log2 (softcap: tanh(.) * c * log2e)
  float softcap_in_scale = 0.f;  // softcap: tanh takes x * scale / c
  float* dq_accum = nullptr;     // fp32: sm80 [B, Hq, Nq, head_dim]; sm90 blocked (see
                                 // sm90/bwd_dq_convert.hpp). Unused when deterministic (the dq
                                 // kernel writes dq directly)
  float* dsum = nullptr;         // [B, Hq, Nq]: rowsum(dO * O) (sm90: blocked, bwd_prepass.hpp)
  float* lse_log2 = nullptr;     // [B, Hq, Nq]: lse * log2(e); +inf where lse = -inf (P = 0)
  bool vec8 = false;             // q/k/v/dout loads can move 8 elements (16 bytes) at a time
  int num_n_blocks = 0;          // sm90 main kernel: key blocks per (kv head, batch) in its grid
};

// One backward instantiation's tile: the main kernel's CTA owns block_n keys and walks the
// query blocks of block_m rows; the deterministic dq kernel's CTA owns block_m query rows and
// walks the key blocks.
struct BwdTile {
  int head_dim;  // the instantiated (padded) head dim
  int block_m;   // query rows per step (main) / per CTA (dq kernel)
  int block_n;   // keys per CTA (main) / per step (dq kernel)
  int warps;
};

// Shared memory (sm80/bwd_traits.cuh): Q, dO (block_m rows) and K, V (block_n rows) of
// head_dim + 8 elements, P and dS (block_m x block_n + 8, elements), S and dP (fp32).
// Every row fits the 163 KB per-block opt-in of an A100 (sm80), so the same kernels run on
// A100 and H100/H200 (227 KB): d128 120.5 KB, d192 152.5 KB; d256 with 64 query rows would
// need 184.5 KB (Hopper only), with 32 rows it needs 125.3 KB.
// Registers: dK and dV live in registers, block_n x head_dim each over 8 warps: 128 floats per
// thread at d256 (independent of block_m).
inline constexpr BwdTile kSm80BwdTiles[] = {
    {32, 64, 64, 8},  {64, 64, 64, 8},  {96, 64, 64, 8},
    {128, 64, 64, 8}, {192, 64, 64, 8}, {256, 32, 64, 8},
};

// The tile of the instantiation that serves `head_dim` (the smallest instantiated head dim
// >= head_dim); {0, ...} when none is large enough.
constexpr BwdTile sm80_bwd_tile(int head_dim) {
  for (const BwdTile& t : kSm80BwdTiles)
    if (t.head_dim >= head_dim) return t;
  return {0, 0, 0, 0};
}

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
  if (sm90.head_dim == 0 || p.is_varlen()) return plain;
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
  if (sm90.head_dim == 0 || p.is_varlen()) return plain;
  const std::int64_t blocks = (std::int64_t(p.seqlen_q) + sm90.block_m - 1) / sm90.block_m;
  const std::int64_t blocked = std::int64_t(p.batch) * p.heads_q * blocks * sm90.block_m;
  return blocked > plain ? blocked : plain;
}
// Bytes: the dq_accum region, then dsum and lse_log2.
inline std::uint64_t bwd_workspace_bytes(const ForwardParams& p, const Sm90BwdTile& sm90) {
  return std::uint64_t(bwd_dq_accum_floats(p, sm90) + 2 * bwd_stats_floats(p, sm90)) *
         sizeof(float);
}

}  // namespace flashcpp::detail::cuda
