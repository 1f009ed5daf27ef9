#pragma once
// The one tile table of the sm80 (mma.sync) backward, read by the host (grid, kernel name) and
// the device code (bwd_traits.hpp). Host constexpr only.

namespace flashcpp::detail::cuda {

// One backward instantiation's tile: the main kernel's CTA owns block_n keys and walks the
// query blocks of block_m rows; the deterministic dq kernel's CTA owns block_m query rows and
// walks the key blocks.
struct Sm80BwdTile {
  int head_dim;  // the instantiated (padded) head dim
  int block_m;   // query rows per step (main) / per CTA (dq kernel)
  int block_n;   // keys per CTA (main) / per step (dq kernel)
  int warps;
};

// Shared memory (sm80/bwd_traits.hpp): Q, dO (block_m rows) and K, V (block_n rows) of
// head_dim + 8 elements, P and dS (block_m x block_n + 8, elements), S and dP (fp32).
// Every row fits the 163 KB per-block opt-in of an A100 (sm80), so the same kernels run on
// A100 and H100/H200 (227 KB): d128 120.5 KB, d192 152.5 KB; d256 with 64 query rows would
// need 184.5 KB (Hopper only), with 32 rows it needs 125.3 KB.
// Registers: dK and dV live in registers, block_n x head_dim each over 8 warps: 128 floats per
// thread at d256 (independent of block_m).
inline constexpr Sm80BwdTile kSm80BwdTiles[] = {
    {32, 64, 64, 8},  {64, 64, 64, 8},  {96, 64, 64, 8},
    {128, 64, 64, 8}, {192, 64, 64, 8}, {256, 32, 64, 8},
};

// The tile of the instantiation that serves `head_dim` (the smallest instantiated head dim
// >= head_dim); {0, ...} when none is large enough.
constexpr Sm80BwdTile sm80_bwd_tile(int head_dim) {
  for (const Sm80BwdTile& t : kSm80BwdTiles)
    if (t.head_dim >= head_dim) return t;
  return {0, 0, 0, 0};
}

}  // namespace flashcpp::detail::cuda
