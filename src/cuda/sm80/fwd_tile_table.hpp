#pragma once
// The one tile table of the sm80 (mma.sync) forward: read by the host heuristics (grid size,
// split count, shared memory) and by the device code (kernel traits). Shapes follow the
// FlashAttention-2 design for 4-warp/8-warp CTAs: 128 query rows per CTA (each warp owns 16 or
// 32 rows), with the key block shrinking as the head dim grows so that the S and O
// accumulators fit in registers without spilling (acc_o is kBlockM*D/threads floats/thread).
// Host constexpr only: device code reads it at compile time (kernel traits).

namespace flashcpp::detail::cuda {

struct Sm80FwdTile {
  int head_dim;  // the instantiated (padded) head dim
  int block_m;   // query rows per CTA
  int block_n;   // keys per main-loop iteration
  int warps;     // warps per CTA; each warp owns block_m / warps rows
  int kv_stages; // K/V shared-memory buffers: 1, or 2 (loads of block n+1 during block n)
};

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
    {32, 128, 64, 4, 1},
    {64, 128, 128, 4, 1},
    {96, 128, 64, 4, 1},
    {128, 128, 64, 4, 1},
    // d192/d256: 8 warps so acc_o stays at 96/128 floats per thread. d256 64x64 with 4 warps
    // (2 CTAs per SM, FA2's H100 choice) ran at 295 TFLOP/s against 315 for this.
    // One CTA of 8 warps per SM: with a single K/V buffer all warps of the SM waited for the
    // V load together; two buffers (192 KB) give the loads a whole block to land: d256 316 /
    // 270 TFLOP/s against 307 / 263 with one (H200, non-causal / causal).
    {192, 128, 64, 8, 2},
    {256, 128, 64, 8, 2},
};

// The tile of the instantiation that serves `head_dim` (the smallest instantiated head dim
// >= head_dim; smaller dims run zero-padded). Returns {0,...} when none is large enough.
constexpr Sm80FwdTile sm80_fwd_tile(int head_dim) {
  for (const Sm80FwdTile& t : kSm80FwdTiles)
    if (t.head_dim >= head_dim) return t;
  return {0, 0, 0, 0, 0};
}

// Shared memory of one forward CTA: Q tile + kv_stages K and V tiles (the O tile reuses Q).
constexpr int sm80_fwd_smem_bytes(Sm80FwdTile t, int element_bytes) {
  return (t.block_m + 2 * t.kv_stages * t.block_n) * t.head_dim * element_bytes;
}

}  // namespace flashcpp::detail::cuda
