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
  // 1: each warp owns block_m / warps whole rows of S and O. 2: warp pairs, each owning
  // 2 * block_m / warps rows, split the keys of S and the head dim of O between them and
  // swap the row maxima and P halves through shared memory (fwd_mainloop.hpp): each warp
  // reads half of K and V per block where a lone warp reads all of them for half the rows.
  int warps_n = 1;
};

// Rows of one head dim are consecutive and go largest shared memory first. The choice
// (sm80_fwd_tile_index) takes a row within the device's per-block budget (227 KB on
// H100/H200, 163 KB on A100, 99 KB on sm86/sm89; FLASHCPP_SM80_SMEM_BUDGET forces a smaller
// one); FLASHCPP_SM80_FWD_TILE_D<d> names any row of head dim d instead (A/B runs;
// fwd_dispatch.hpp).
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
    {32, 128, 64, 4, 1},   // 16 KB
    {64, 128, 128, 4, 1},  // 48 KB
    {96, 128, 64, 4, 1},   // 48 KB
    {128, 128, 64, 4, 1},  // 64 KB
    // d192/d256: 8 warps so acc_o stays at 96/128 floats per thread, one CTA per SM. With two
    // K/V buffers the loads of block n+1 get all of block n to land (d256 316 / 270 TFLOP/s
    // against 307 / 263 with one, H200, N=4096, non-causal / causal, 2026-11-21); the
    // one-buffer rows fit A100 (d256) and sm86/sm89 (d192). d256 on an H100 (2026-11-24):
    // the one-buffer row ran at 0.94-1.03x FA2 (non-causal, N 512-4k) against 0.86-0.91x,
    // but that two-buffer kernel spilled 260/280 B (a prologue change, since reverted; 0 now,
    // not measured again). The choice takes the one-buffer row: sm80_fwd_tile_index.
    {192, 128, 64, 8, 2},  // 144 KB
    {192, 128, 64, 8, 1},  // 96 KB
#ifdef FLASHCPP_SM80_FWD_PAIRS
    // d256 warp pairs (configure with -DFLASHCPP_SM80_FWD_PAIRS=ON; never the choice, only
    // FLASHCPP_SM80_FWD_TILE_D256=128x64_8w_kv2_pairs runs it; not yet run on a GPU): 32 rows
    // per pair, acc_o 128 and acc_s 32 floats per thread as the 8-warp row, 96 ldmatrix.x4
    // per warp and block against 144.
    {256, 128, 64, 8, 2, 2},  // 212 KB (H100/H200)
#endif
    {256, 128, 64, 8, 2},  // 192 KB (H100/H200; only when named)
    {256, 128, 64, 8, 1},  // 128 KB (A100)
    // d256, 4 warps, two CTAs per SM where 2 x 96 KB fit (one CTA's loads and epilogue
    // overlap the other's products): 64x64 with one buffer is FA2's H100 choice; 64x32 keeps
    // two buffers within two CTAs' shared memory (slowest of the four on the H100).
    {256, 64, 64, 4, 1},  // 96 KB (sm86/sm89)
    {256, 64, 32, 4, 2},  // 96 KB
};
inline constexpr int kSm80FwdTileCount = int(sizeof(kSm80FwdTiles) / sizeof(kSm80FwdTiles[0]));

// Bytes one warp of a warp pair swaps with its partner per block (fwd_mainloop.hpp): per lane
// the 2 * rows / 16 row statistics (floats) of its rows and its half of P (element_bytes
// each); 0 without pairs.
constexpr int sm80_fwd_pair_swap_bytes(Sm80FwdTile t, int element_bytes = 2) {
  if (t.warps_n != 2) return 0;
  const int rows = t.block_m / (t.warps / 2);
  return 32 * 4 * (rows / 8) + rows * (t.block_n / 2) * element_bytes;
}

// Shared memory of one forward CTA: Q tile + kv_stages K and V tiles (the O tile reuses Q),
// and the warp pairs' swap areas.
constexpr int sm80_fwd_smem_bytes(Sm80FwdTile t, int element_bytes = 2) {
  return (t.block_m + 2 * t.kv_stages * t.block_n) * t.head_dim * element_bytes +
         t.warps * sm80_fwd_pair_swap_bytes(t, element_bytes);
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
inline constexpr int kSm80FwdMaxRowsPerHeadDim = 5;

// What the tile choice looks at besides the head dim and the budget.
struct Sm80FwdShape {
  int seqlen_q = 0;  // the (max) query rows of a sequence
  int seqlen_k = 0;
  bool causal = false;
};

// The row of head dim `head_dim` with this tile, or -1.
constexpr int sm80_fwd_row(int head_dim, int block_m, int block_n, int warps, int kv_stages) {
  for (int i = 0; i < kSm80FwdTileCount; ++i) {
    const Sm80FwdTile& t = kSm80FwdTiles[i];
    if (t.head_dim == head_dim && t.block_m == block_m && t.block_n == block_n &&
        t.warps == warps && t.kv_stages == kv_stages && t.warps_n == 1)
      return i;
  }
  return -1;
}

// The tile choice (the plan's one rule): the row of instantiated head dim `head_dim` that runs
// a call of `shape` within `budget_bytes` of shared memory per block; -1 when none fits.
// d256 (H100, bf16, 16k tokens, H 8, sm80 kernels forced, TFLOP/s / FA2's, 2026-11-24; the
// table in docs/design/sm80-kernels.md): causal up to N = 2k runs 64x64 with 4 warps, two
// CTAs per SM (0.95-0.97x FA2, against 0.91-0.95x for 128x64), where two of its CTAs fit the
// budget (not on A100: 163 KB); everything else the one-buffer 128x64 with 8 warps (0.94-1.03x
// non-causal, 0.97x causal at N = 4k, against 0.88-0.94x / 0.95x for 64x64). Other head dims,
// and d256 where neither fits: the first row that fits (the largest). Warp pairs never.
constexpr int sm80_fwd_tile_index(int head_dim, int budget_bytes, Sm80FwdShape shape) {
  auto fits = [&](int i, int ctas) {
    return i >= 0 && ctas * sm80_fwd_smem_bytes(kSm80FwdTiles[i]) <= budget_bytes;
  };
  if (head_dim == 256) {
    const int two_ctas = sm80_fwd_row(256, 64, 64, 4, 1);
    const int one_buffer = sm80_fwd_row(256, 128, 64, 8, 1);
    const bool short_causal =
        shape.causal && shape.seqlen_q <= 2048 && shape.seqlen_k <= 2048;
    if (short_causal && fits(two_ctas, 2)) return two_ctas;
    if (fits(one_buffer, 1)) return one_buffer;
  }
  for (int i = 0; i < kSm80FwdTileCount; ++i)
    if (kSm80FwdTiles[i].head_dim == head_dim && kSm80FwdTiles[i].warps_n == 1 && fits(i, 1))
      return i;
  return -1;
}

// A row's name as kernel names and FLASHCPP_SM80_FWD_TILE_D<d> spell it: "<block_m>x<block_n>_
// <warps>w", then "_kv2" with two K/V buffers and "_pairs" with warp pairs, e.g.
// "128x64_8w_kv2".
inline std::string sm80_fwd_tile_name(const Sm80FwdTile& t) {
  return std::to_string(t.block_m) + "x" + std::to_string(t.block_n) + "_" +
         std::to_string(t.warps) + "w" + (t.kv_stages == 2 ? "_kv2" : "") +
         (t.warps_n == 2 ? "_pairs" : "");
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
