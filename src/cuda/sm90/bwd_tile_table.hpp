#pragma once
// The one tile table of the sm90a (TMA + wgmma, warp-specialised) backward main kernel, read by
// the host (grid, kernel name, which head dims get a TU) and by the device code (traits).
//
// A CTA owns block_n keys of one kv head and one producer warpgroup plus two consumer
// warpgroups (384 threads). Query rows stream through in blocks of block_m = 64. Two layouts:
//
// Split by keys (d64, d128): block_n = 128, each consumer warpgroup owns 64 keys and the whole
// head dim of their dK, dV (bwd_traits.hpp, bwd_mainloop.hpp).
// Per consumer thread the fp32 accumulators are dK and dV (D/2 floats each, kept for the whole
// CTA), S^T and dP^T (32 floats each, live together while dS is formed) and dQ (D/4 floats,
// once S^T and dP^T are converted; D/2 at d64, where the warpgroups take turns on dQ): at D = 128 the peak is 192 floats of the consumers' 240
// registers before any addressing, which is why the query block is 64 and not 128 (FA3 uses
// 64 x 128 at hdim128 for causal/softcap for the same reason).
// Shared memory: K, V (block_n x D each, loaded once), Q and dO (stages x block_m x D each)
// dS and an fp32 dQ stage per ring stage (stages x block_m x block_n, stages x block_m x D;
// none at d64, where dQ is reduced from registers): 97 KB at D = 64, 225 KB at D = 128 (2 stages;
// 3 at d64 measured no faster). Each ring stage also holds
// the block's lse_log2 and dsum (2 x block_m floats).
//
// Split by head dim (d256, split_d): full-D dK and dV per warpgroup would be 256 fp32
// registers per thread, so block_n = 64 keys are shared by both warpgroups and each owns half
// the head dim of dK, dV and dQ (64 floats each); S and dP are split by keys (32 each) and go
// through shared memory as P and dS (bwd_traits_split_d.hpp, bwd_mainloop_split_d.hpp).
// Shared memory: K, V 32 KB each, Q and dO 64 KB each (2 stages), P and dS 2 x 8 KB each
// (double-buffered): 224 KB. No room for an fp32 dQ stage: dQ is added from registers.
//
// One row per (D, Dv) pair, as in the forward table (fwd_tile_table.hpp): rows with D != Dv
// serve only calls with D != Dv and are built only when listed in FLASHCPP_HEAD_DIM_PAIRS.
// 192 x 128 (MLA prefill) is split by head dim too: split by keys, dK (96) + dV (64) + S^T and
// dP^T (32 each) would leave nothing of the 240 registers for dQ and addressing. Per consumer
// thread: dK 48, dV 32, dQ 48, S and dP 16 each. Each warpgroup owns 96 of dK's and dQ's 192
// columns, which is not a whole 128-byte swizzle atom (64 elements): Q and K use the 64-byte
// swizzle there (bwd_traits_split_d.hpp). Shared memory: K 24 KB, V 16 KB, Q 48 KB, dO 32 KB
// (2 stages), P and dS 32 KB: 153 KB.
// Host constexpr only: device code reads it at compile time.

#include "cuda/sm90/tile_for_head_dims.hpp"

namespace flashcpp::detail::cuda {

struct Sm90BwdTile {
  int head_dim;    // the instantiated (padded) head dim of Q and K (dQ, dK)
  int head_dim_v;  // the instantiated (padded) head dim of V and dO (dV)
  int block_m;     // query rows per main-loop iteration
  int block_n;   // keys per CTA (2 consumer warpgroups x 64)
  int stages;    // depth of the Q and of the dO shared-memory ring
  bool split_d;  // consumer warpgroups split the head dim (not the keys), see above
  // Split by keys only: the consumer warpgroups take turns on dQ = dS K, one whole query block
  // each (bwd_traits.hpp), reduced into dq_accum from registers (no fp32 dQ stage).
  bool dq_turns = false;
  // Split by keys only: each consumer warpgroup keeps its K and V rows in registers, as the A
  // operands of S^T = K Q^T and dP^T = V dO^T (register-sourced wgmma reads only Q and dO from
  // shared memory; see bwd_traits.hpp). D/8 + D/8 registers per thread: d64 only.
  bool kv_in_registers = false;
};

inline constexpr Sm90BwdTile kSm90BwdTiles[] = {
    {64, 64, 64, 128, 2, false, true, true},
    {128, 128, 64, 128, 2, false},
    {256, 256, 64, 64, 2, true},
    {192, 128, 64, 64, 2, true},
};

// The tile of the instantiation that serves a call of head dims (head_dim, head_dim_v)
// (tile_for_head_dims.hpp); {0,...} when none covers the call.
constexpr Sm90BwdTile sm90_bwd_tile(int head_dim, int head_dim_v) {
  return tile_for_head_dims(kSm90BwdTiles, head_dim, head_dim_v);
}
constexpr Sm90BwdTile sm90_bwd_tile(int head_dim) { return sm90_bwd_tile(head_dim, head_dim); }

// Tile payload in shared memory (the kernel adds a few mbarriers on top).
constexpr int sm90_bwd_smem_bytes(Sm90BwdTile t, int element_bytes) {
  const int kv_q_do = (t.block_n + t.stages * t.block_m) * (t.head_dim + t.head_dim_v);
  const int stats = 2 * t.stages * t.block_m * 4;
  if (t.split_d) return (kv_q_do + 2 * 2 * t.block_m * t.block_n) * element_bytes + stats;
  const int dq_stages = t.dq_turns ? 0 : t.stages;  // BwdTraits::kDqStages
  return (kv_q_do + t.stages * t.block_m * t.block_n) * element_bytes +
         dq_stages * t.block_m * t.head_dim * 4 + stats;
}

static_assert(sm90_bwd_smem_bytes(sm90_bwd_tile(64), 2) <= 227 * 1024);
static_assert(sm90_bwd_smem_bytes(sm90_bwd_tile(128), 2) <= 227 * 1024);
static_assert(sm90_bwd_smem_bytes(sm90_bwd_tile(256), 2) <= 227 * 1024);
static_assert(sm90_bwd_smem_bytes(sm90_bwd_tile(192, 128), 2) <= 227 * 1024);

}  // namespace flashcpp::detail::cuda
