#pragma once
// The one tile table of the sm80 (mma.sync) backward, read by the host (grid, shared-memory
// budget, kernel name) and the device code (bwd_main_traits.hpp, bwd_traits.hpp). Host
// constexpr only.

namespace flashcpp::detail::cuda {

// One tile of the main backward kernel (bwd_kernel.hpp): a CTA owns block_n keys (K and V
// resident in shared memory) and walks the query blocks of block_m rows with q_stages buffers
// of Q and do_stages of dO (2: the next block's load is issued before this block's products;
// 1: after the last product that reads the buffer, dK += dS^T Q or dV += P^T dO, so it hides
// behind dQ += dS K only).
// The warps split each product's output tile as a grid:
//   S, dP   (block_m x block_n):  sdp_warps_m along the queries, warps / sdp_warps_m along keys;
//   dK, dV  (block_n x head_dim): dkv_warps_n along the keys, the rest along the head dim;
//   dQ      (block_m x head_dim): dq_warps_m along the queries, the rest along the head dim.
struct Sm80BwdTile {
  int head_dim;  // the instantiated (padded) head dim
  int block_m;
  int block_n;
  int warps;
  int q_stages;   // 1 or 2
  int do_stages;  // 1 or 2
  int sdp_warps_m;
  int dkv_warps_n;
  int dq_warps_m;
};

// Shared-memory rows: 16-byte chunks XOR-swizzled by row when a row holds a multiple of 64
// elements, else padded by 8 elements (either way the 8 rows an ldmatrix phase reads fall in
// 8 different bank groups).
constexpr int sm80_bwd_smem_row_elems(int cols) { return cols % 64 == 0 ? cols : cols + 8; }

// Q (q_stages) and dO (do_stages), K and V, P and dS, 2-byte elements.
constexpr int sm80_bwd_smem_bytes(Sm80BwdTile t) {
  const int ld = sm80_bwd_smem_row_elems(t.head_dim);
  return 2 * ((t.q_stages + t.do_stages) * t.block_m * ld + 2 * t.block_n * ld +
              2 * t.block_m * sm80_bwd_smem_row_elems(t.block_n));
}

// Rows of one head dim go largest shared memory first; the launcher takes the first row that
// fits the device's per-block opt-in (or FLASHCPP_SM80_SMEM_BUDGET, smem_budget.hpp):
// 227 KB on H100/H200, 163 KB on A100, 99 KB on sm86/sm89 (a head dim has at most three rows;
// only d256 has one above 163 KB: FA2's H100 choice, Q double-buffered).
// Registers per thread (8 warps): dK + dV are 2 * block_n * head_dim / 256 floats, S + dP
// 2 * block_m * block_n / 256 (d128 64x128: 128 + 64). The tiles follow FlashAttention-2's
// sm80 choices where they fit 163 KB. dQ with 2 warps along the queries (32 x D/4 per warp:
// 4 ldmatrix per 8 mma.sync at d128, against 5 for 16 x D/2) where D/4 is a multiple of 16 and
// it does not add spills (d128 64x128: 48 -> 72 bytes with it; d192, d256 keep 16-row chunks).
// d64 at 163 KB: FA2's 128x128 (twice the mma.sync per block of 64x128 for the same
// per-block overhead: barriers, the element-wise step, the loads; 28 bytes of spills on sm_80).
// d256 at 163 KB: dK/dV and dQ as 2 x 4 warp grids (32 x 64 per warp: 6 ldmatrix per 16
// mma.sync, against 9 for 16 x 128), as FA2; spills about the same (36 B stores either way).
inline constexpr Sm80BwdTile kSm80BwdTiles[] = {
    {32, 64, 128, 8, 2, 2, 2, 4, 4},   // 72 KB
    {64, 128, 128, 8, 2, 2, 2, 4, 4},  // 160 KB
    {64, 64, 128, 8, 2, 2, 2, 4, 2},   // 96 KB
    {96, 64, 128, 8, 2, 2, 2, 4, 4},   // 136 KB
    {96, 64, 64, 8, 2, 2, 2, 4, 4},    // 94 KB
    {128, 64, 128, 8, 2, 2, 2, 4, 4},  // 160 KB
    {128, 64, 64, 8, 2, 1, 2, 4, 2},   // 96 KB
    {192, 64, 64, 8, 2, 2, 2, 4, 4},   // 160 KB
    {192, 32, 64, 8, 2, 1, 2, 4, 2},   // 92 KB
    {256, 64, 64, 8, 2, 1, 2, 2, 2},   // 176 KB (H100/H200)
    {256, 64, 64, 8, 1, 1, 2, 2, 2},   // 144 KB
    {256, 32, 32, 4, 2, 1, 2, 2, 2},   // 85 KB
};
inline constexpr int kSm80BwdTileCount = int(sizeof(kSm80BwdTiles) / sizeof(kSm80BwdTiles[0]));

// The instantiated head dim that serves `head_dim` (the smallest table head dim >= it; smaller
// dims run zero-padded), or 0 when none is large enough.
constexpr int sm80_bwd_head_dim(int head_dim) {
  for (const Sm80BwdTile& t : kSm80BwdTiles)
    if (t.head_dim >= head_dim) return t.head_dim;
  return 0;
}

// Index of the first row of instantiated head dim `head_dim` whose shared memory fits
// `budget_bytes`; -1 when none does.
constexpr int sm80_bwd_tile_index(int head_dim, int budget_bytes) {
  for (int i = 0; i < kSm80BwdTileCount; ++i)
    if (kSm80BwdTiles[i].head_dim == head_dim && sm80_bwd_smem_bytes(kSm80BwdTiles[i]) <= budget_bytes)
      return i;
  return -1;
}

// The rows of a head dim, in table order: index `k` (0, 1, ...) of head dim `head_dim`, or -1.
constexpr int sm80_bwd_tile_index_nth(int head_dim, int k) {
  for (int i = 0; i < kSm80BwdTileCount; ++i)
    if (kSm80BwdTiles[i].head_dim == head_dim && k-- == 0) return i;
  return -1;
}

// Every head dim runs on every Ampere/Ada GPU: a row within 99 KB (sm86/sm89), and the rows of
// a head dim go largest first (the launcher takes the first that fits).
constexpr bool sm80_bwd_rows_cover_every_budget() {
  for (int i = 0; i < kSm80BwdTileCount; ++i) {
    const int d = kSm80BwdTiles[i].head_dim;
    if (sm80_bwd_tile_index(d, 99 * 1024) < 0 || sm80_bwd_tile_index(d, 163 * 1024) < 0)
      return false;
    if (i > 0 && kSm80BwdTiles[i - 1].head_dim == d &&
        sm80_bwd_smem_bytes(kSm80BwdTiles[i - 1]) <= sm80_bwd_smem_bytes(kSm80BwdTiles[i]))
      return false;
    if (i > 0 && kSm80BwdTiles[i - 1].head_dim > d) return false;  // head dims ascending
  }
  return true;
}
static_assert(sm80_bwd_rows_cover_every_budget(),
              "each head dim: a row within 99 KB and one within 163 KB, largest first");

// The deterministic dq kernel's tile (bwd_dq_kernel.hpp, WMMA): its CTA owns block_m query rows
// and walks the key blocks of block_n keys. Shared memory (bwd_traits.hpp): Q, dO, K, V of
// head_dim + 8 elements, P and dS, S and dP in fp32: d128 120.5 KB, d192 152.5 KB, d256 (32
// rows) 125.3 KB; d >= 96 does not fit 99 KB.
struct Sm80BwdDqTile {
  int head_dim;
  int block_m;
  int block_n;
  int warps;
};
inline constexpr Sm80BwdDqTile kSm80BwdDqTiles[] = {
    {32, 64, 64, 8},  {64, 64, 64, 8},  {96, 64, 64, 8},
    {128, 64, 64, 8}, {192, 64, 64, 8}, {256, 32, 64, 8},
};
constexpr Sm80BwdDqTile sm80_bwd_dq_tile(int head_dim) {
  for (const Sm80BwdDqTile& t : kSm80BwdDqTiles)
    if (t.head_dim >= head_dim) return t;
  return {0, 0, 0, 0};
}

}  // namespace flashcpp::detail::cuda
