#pragma once
// The one tile table of the sm80 (mma.sync) forward: read by the host (the tile choice, grid
// size, split count, shared memory, kernel name) and by the device code (kernel traits). Shapes
// follow the FlashAttention-2 design for 4-warp/8-warp CTAs: each warp owns whole query rows,
// with the key block shrinking as the head dim grows so that the S and O accumulators fit in
// registers without spilling (acc_o is kBlockM*D/threads floats/thread).
// Host constexpr only: device code reads it at compile time (kernel traits); no CUDA include,
// so the CPU tests check the table and the choice rule.
#include <string>

namespace flashcpp::detail::cuda {

struct Sm80FwdTile {
  int head_dim;  // the instantiated (padded) head dim
  int block_m;   // query rows per CTA
  int block_n;   // keys per main-loop iteration
  int warps;     // warps per CTA; each warp owns block_m / warps rows
  int kv_stages; // K/V shared-memory buffers: 1, or 2 (loads of block n+1 during block n)
};

// Rows of one head dim are consecutive and go largest shared memory first: the default choice
// is the first row that fits the device's per-block budget (227 KB on H100/H200, 163 KB on
// A100, 99 KB on sm86/sm89; FLASHCPP_SM80_SMEM_BUDGET forces a smaller one), and
// FLASHCPP_SM80_FWD_TILE_D<d> names any row of head dim d (A/B runs; fwd_dispatch.hpp).
inline constexpr Sm80FwdTile kSm80FwdTiles[] = {
    // d32..d128: 128x64, 4 warps: acc_s (64 floats/thread) plus acc_o (up to 128 at d128)
    // stay in the 255-register budget.
    // d64: 128x128 (FA2's choice; acc_s 128 + acc_o 64 floats): 330 TFLOP/s against 308 for
    // 128x64 on an H200 (B=4, N=4096, non-causal; 295 vs 284 causal), 36 B of spills on sm_90.
    // (Before the separate masked/unmasked loops it spilled 716 B and ran at 86 TFLOP/s.)
    // One K/V buffer up to d128: two CTAs per SM already overlap one CTA's loads with the
    // other's products, and two buffers cost registers (d128: spills 40 -> 204 B) and speed
    // (H200, non-causal / causal: d128 354 / 308 with one, 344 / 297 with two; d64 321 / 288
    // with one, 326 / 282 with two).
    {32, 128, 64, 4, 1},   // 48 KB
    {64, 128, 128, 4, 1},  // 48 KB
    {96, 128, 64, 4, 1},   // 48 KB
    {128, 128, 64, 4, 1},  // 64 KB
    // d192/d256: 8 warps so acc_o stays at 96/128 floats per thread. One CTA of 8 warps per
    // SM: with a single K/V buffer all warps of the SM waited for the V load together; two
    // buffers give the loads a whole block to land: d256 316 / 270 TFLOP/s against 307 / 263
    // with one (H200, N=4096, non-causal / causal). The one-buffer rows fit A100 (d256) and
    // sm86/sm89 (d192).
    {192, 128, 64, 8, 2},  // 144 KB
    {192, 128, 64, 8, 1},  // 96 KB
    {256, 128, 64, 8, 2},  // 192 KB (H100/H200)
    {256, 128, 64, 8, 1},  // 128 KB (A100)
    // d256, 4 warps, two CTAs per SM (one CTA's loads and epilogue overlap the other's
    // products): 64x64 with one buffer is FA2's H100 choice (295 / 263 against 316 / 270 for
    // 128x64 at N=4096 on an H200); 64x32 keeps two buffers within two CTAs' shared memory.
    {256, 64, 64, 4, 1},  // 96 KB (sm86/sm89)
    {256, 64, 32, 4, 2},  // 64 KB
};
inline constexpr int kSm80FwdTileCount = int(sizeof(kSm80FwdTiles) / sizeof(kSm80FwdTiles[0]));

// Shared memory of one forward CTA: Q tile + kv_stages K and V tiles (the O tile reuses Q).
constexpr int sm80_fwd_smem_bytes(Sm80FwdTile t, int element_bytes = 2) {
  return (t.block_m + 2 * t.kv_stages * t.block_n) * t.head_dim * element_bytes;
}

// The instantiated head dim that serves `head_dim` (the smallest table head dim >= it; smaller
// dims run zero-padded), or 0 when none is large enough.
constexpr int sm80_fwd_head_dim(int head_dim) {
  for (const Sm80FwdTile& t : kSm80FwdTiles)
    if (t.head_dim >= head_dim) return t.head_dim;
  return 0;
}

// The rows of a head dim, in table order: index of row `k` (0, 1, ...) of head dim
// `head_dim`, or -1.
constexpr int sm80_fwd_tile_index_nth(int head_dim, int k) {
  for (int i = 0; i < kSm80FwdTileCount; ++i)
    if (kSm80FwdTiles[i].head_dim == head_dim && k-- == 0) return i;
  return -1;
}
inline constexpr int kSm80FwdMaxRowsPerHeadDim = 4;

// What the tile choice looks at besides the head dim and the budget.
struct Sm80FwdShape {
  int seqlen_q = 0;  // the (max) query rows of a sequence
  int seqlen_k = 0;
  bool causal = false;
};

// The tile choice (the plan's one rule): the row of instantiated head dim `head_dim` that runs
// a call of `shape` within `budget_bytes` of shared memory per block; -1 when none fits.
// Today: the first row that fits (the largest).
constexpr int sm80_fwd_tile_index(int head_dim, int budget_bytes, Sm80FwdShape shape) {
  (void)shape;
  for (int i = 0; i < kSm80FwdTileCount; ++i)
    if (kSm80FwdTiles[i].head_dim == head_dim && sm80_fwd_smem_bytes(kSm80FwdTiles[i]) <= budget_bytes)
      return i;
  return -1;
}

// A row's name as kernel names and FLASHCPP_SM80_FWD_TILE_D<d> spell it: "<block_m>x<block_n>_
// <warps>w", then "_kv2" with two K/V buffers, e.g. "128x64_8w_kv2".
inline std::string sm80_fwd_tile_name(const Sm80FwdTile& t) {
  return std::to_string(t.block_m) + "x" + std::to_string(t.block_n) + "_" +
         std::to_string(t.warps) + "w" + (t.kv_stages == 2 ? "_kv2" : "");
}

// The row of instantiated head dim `head_dim` named `name`; -1 when it has none.
inline int sm80_fwd_tile_index_named(int head_dim, const std::string& name) {
  for (int i = 0; i < kSm80FwdTileCount; ++i) {
    if (kSm80FwdTiles[i].head_dim != head_dim) continue;
    if (sm80_fwd_tile_name(kSm80FwdTiles[i]) == name) return i;
  }
  return -1;
}

// Every head dim runs on every Ampere/Ada GPU: a row within 99 KB (sm86/sm89) and one within
// 163 KB (A100); a head dim's rows are consecutive, at most kSm80FwdMaxRowsPerHeadDim, head
// dims ascending and shared memory not growing within a head dim (so "the first that fits" is
// the largest that fits).
constexpr bool sm80_fwd_rows_cover_every_budget() {
  for (int i = 0; i < kSm80FwdTileCount; ++i) {
    const int d = kSm80FwdTiles[i].head_dim;
    if (sm80_fwd_tile_index(d, 99 * 1024, {}) < 0 || sm80_fwd_tile_index(d, 163 * 1024, {}) < 0)
      return false;
    if (sm80_fwd_tile_index_nth(d, kSm80FwdMaxRowsPerHeadDim) >= 0) return false;
    if (i > 0 && kSm80FwdTiles[i - 1].head_dim > d) return false;
    if (i > 0 && kSm80FwdTiles[i - 1].head_dim == d &&
        sm80_fwd_smem_bytes(kSm80FwdTiles[i - 1]) < sm80_fwd_smem_bytes(kSm80FwdTiles[i]))
      return false;
  }
  return true;
}
static_assert(sm80_fwd_rows_cover_every_budget(),
              "each head dim: a row within 99 KB and one within 163 KB, largest first");

}  // namespace flashcpp::detail::cuda
