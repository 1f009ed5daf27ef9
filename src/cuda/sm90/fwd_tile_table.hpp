#pragma once
// The one tile table of the sm90a (TMA + wgmma, warp-specialised) forward, read by the host
// (grid size, shared memory, kernel name) and by the device code (kernel traits).
//
// Every tile has kBlockM = 128 query rows: two consumer warpgroups of 64 rows each, plus one
// producer warpgroup (384 threads). The key block shrinks as the head dim grows so that
//  - shared memory fits in 227 KB: Q (kBlockM x D) + stages x (K + V) (kBlockN x D each);
//  - registers fit in the consumers' 240: S (kBlockN/2 floats per thread), P of the previous
//    block (kBlockN/4 registers, live at the same time as S with the intra-warpgroup overlap)
//    and O (D/2 floats per thread).
// d256 at 128 x 80 with 2 stages uses 224 KB (FA3's choice for the same reason).
// Host constexpr only: device code reads it at compile time.

namespace flashcpp::detail::cuda {

struct Sm90FwdTile {
  int head_dim;  // the instantiated (padded) head dim
  int block_m;   // query rows per CTA (2 consumer warpgroups x 64)
  int block_n;   // keys per main-loop iteration
  int stages;    // depth of the K and of the V shared-memory ring
};

inline constexpr Sm90FwdTile kSm90FwdTiles[] = {
    {64, 128, 128, 2},
    {128, 128, 128, 2},
    {256, 128, 80, 2},
};

// The tile of the instantiation that serves `head_dim` (the smallest instantiated head dim
// >= head_dim; smaller dims run zero-padded: TMA fills the missing columns with zeros).
// Returns {0,...} when none is large enough.
constexpr Sm90FwdTile sm90_fwd_tile(int head_dim) {
  for (const Sm90FwdTile& t : kSm90FwdTiles)
    if (t.head_dim >= head_dim) return t;
  return {0, 0, 0, 0};
}

// True when `head_dim` is itself an entry of the table (the head dims that get a TU).
constexpr bool sm90_fwd_has_tile(int head_dim) {
  for (const Sm90FwdTile& t : kSm90FwdTiles)
    if (t.head_dim == head_dim) return true;
  return false;
}

// Tile payload in shared memory (the kernel adds a few mbarriers on top).
constexpr int sm90_fwd_smem_bytes(Sm90FwdTile t, int element_bytes) {
  return (t.block_m + 2 * t.stages * t.block_n) * t.head_dim * element_bytes;
}

static_assert(sm90_fwd_smem_bytes(sm90_fwd_tile(256), 2) <= 227 * 1024);

}  // namespace flashcpp::detail::cuda
