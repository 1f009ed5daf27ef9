#pragma once
// The one tile table of the sm90a (TMA + wgmma, warp-specialised) forward, read by the host
// (grid size, shared memory, kernel name) and by the device code (kernel traits).
//
// Every table tile has kBlockM = 128 query rows: two consumer warpgroups of 64 rows each, plus
// one producer warpgroup (384 threads); d64's long-call tile has 192 (three consumer
// warpgroups at 160 registers, 512 threads, with 96-key blocks, which keep the padded
// kernel's spill at 8 B). The key block shrinks as the head dim grows so that
//  - shared memory fits in 227 KB: Q (kBlockM x D) + stages x (K + V) (kBlockN x D each);
//  - registers fit in the consumers' 240: S (kBlockN/2 floats per thread), P of the previous
//    block (kBlockN/4 registers, live at the same time as S with the intra-warpgroup overlap)
//    and O (D/2 floats per thread).
// d256 at 128 x 80 with 2 stages uses 224 KB (FA3's choice for the same reason).
//
// One row per (D, Dv) pair: Q and K tiles are D wide, V and O tiles Dv wide. Rows with
// D == Dv serve every call with D == Dv (zero-padded up to the row); rows with D != Dv
// (DeepSeek-style MLA prefill: D 192 = 128 + 64 rope dims, Dv 128) serve only calls with
// D != Dv, and are built only when listed in FLASHCPP_HEAD_DIM_PAIRS ("192x128").
// 192 x 128 at 128 x 128 with 2 stages: Q 48 KB + K 96 KB + V 64 KB = 208 KB, so O goes
// through the ring's stages (no room for a 32 KB O buffer; fwd_traits.hpp, kOInRing); S 64 + P 32 + O 64 registers per consumer
// thread, as at d128; no ping-pong (the products of D = 192 dominate, as at d256). These are
// FA3's hdim 192 / hdimv 128 choices too (128 x 128, P from registers, intra-warpgroup
// overlap, no warp-scheduler barrier above hdim 128).
// Host constexpr only: device code reads it at compile time.

#include "cuda/sm90/tile_for_head_dims.hpp"

namespace flashcpp::detail::cuda {

struct Sm90FwdTile {
  int head_dim;    // the instantiated (padded) head dim of Q and K
  int head_dim_v;  // the instantiated (padded) head dim of V and O
  int block_m;   // query rows per CTA (2 consumer warpgroups x 64)
  int block_n;   // keys per main-loop iteration
  int stages;    // depth of the K and of the V shared-memory ring
  // FP8 only: the width of the Dv chunks in which each key block's P V is summed apart from
  // O and added to it in fp32 (fp8_pv_chunks.hpp); 0: O is the tensor cores' P V accumulator
  // along the whole row (what the fp16/bf16 rows do: their tensor cores add in fp32).
  int pv_chunk = 0;
  int pv_temps = 0;  // FP8 with pv_chunk: chunk temporaries in flight (1 or 2)
  // A second key block for short calls (sm90_fwd_short_call), 0: none. A separate
  // instantiation of the padded, unsplit kernel.
  int short_block_n = 0;
  // A tile for long calls (sm90_fwd_long_call): its query rows (192: three consumer
  // warpgroups) and key block, 0: none. Separate instantiations of the padded and the varlen
  // unsplit, unpaged kernels.
  int long_block_m = 0;
  int long_block_n = 0;
};

// The key block and stage count of the fp16/bf16 rows D 64, 128, 256 can be set at configure
// time (A/B builds): cmake -DFLASHCPP_SM90_FWD_TILE_D64=176x2 (cmake/TileTables.cmake) writes
// FLASHCPP_SM90_FWD_D64_BLOCK_N 176 and ..._STAGES 2 into the generated
// sm90_fwd_tile_overrides.inc; the kernel name carries the tile. Where Q + the rings leave no
// room for the O buffer the epilogue stores O from registers (fwd_traits.hpp, kTmaStoreO).
#include "sm90_fwd_tile_overrides.inc"
#ifndef FLASHCPP_SM90_FWD_D64_BLOCK_N
#define FLASHCPP_SM90_FWD_D64_BLOCK_N 128
#endif
#ifndef FLASHCPP_SM90_FWD_D64_STAGES
#define FLASHCPP_SM90_FWD_D64_STAGES 2
#endif
#ifndef FLASHCPP_SM90_FWD_D128_BLOCK_N
#define FLASHCPP_SM90_FWD_D128_BLOCK_N 128
#endif
#ifndef FLASHCPP_SM90_FWD_D128_STAGES
#define FLASHCPP_SM90_FWD_D128_STAGES 2
#endif
#ifndef FLASHCPP_SM90_FWD_D256_BLOCK_N
#define FLASHCPP_SM90_FWD_D256_BLOCK_N 80
#endif
#ifndef FLASHCPP_SM90_FWD_D256_STAGES
#define FLASHCPP_SM90_FWD_D256_STAGES 2
#endif
// d256 has a second key block of 64 for short calls: at N = 512 the 80-key blocks compute
// 560 keys (and 18 diagonal-crossing blocks for 4 causal query tiles where 64-key blocks
// have 20 of 64 keys: 1280 key columns instead of 1440). H100, bf16, 16k tokens: 64-key
// blocks took 0.85-0.93x the time causal at N 512-1k and 0.98x non-causal at 512, but
// 1.02-1.09x from 2k (docs/design/sm90-kernels.md). 0 turns it off (an A/B build:
// -DFLASHCPP_SM90_FWD_D256_SHORT_BLOCK_N=0 in CMAKE_CUDA_FLAGS).
#ifndef FLASHCPP_SM90_FWD_D256_SHORT_BLOCK_N
#define FLASHCPP_SM90_FWD_D256_SHORT_BLOCK_N 64
#endif
// d64 has a long-call tile of 192 x 96 (three consumer warpgroups at 160 registers each).
// H100, bf16, 16k tokens: 1.05-1.10x the 128 x 128 tile's TFLOP/s at 8k-16k, 1.00-1.05x at
// 4k, 1.05-1.09x on varlen, but 0.86-0.93x at 1-2k, 0.61x at 512 causal, and 0.68-0.72x on
// prefill of 256-1024 new tokens over a long cache (docs/design/sm90-kernels.md). A configure switch
// (FLASHCPP_SM90_FWD_LONG_TILE_D64 in cmake/TileTables.cmake) sets another or turns it off
// (0x0).
#ifndef FLASHCPP_SM90_FWD_D64_LONG_BLOCK_M
#define FLASHCPP_SM90_FWD_D64_LONG_BLOCK_M 192
#endif
#ifndef FLASHCPP_SM90_FWD_D64_LONG_BLOCK_N
#define FLASHCPP_SM90_FWD_D64_LONG_BLOCK_N 96
#endif
inline constexpr Sm90FwdTile kSm90FwdTiles[] = {
    {64, 64, 128, FLASHCPP_SM90_FWD_D64_BLOCK_N, FLASHCPP_SM90_FWD_D64_STAGES, 0, 0, 0,
     FLASHCPP_SM90_FWD_D64_LONG_BLOCK_M, FLASHCPP_SM90_FWD_D64_LONG_BLOCK_N},
    {128, 128, 128, FLASHCPP_SM90_FWD_D128_BLOCK_N, FLASHCPP_SM90_FWD_D128_STAGES},
    {256, 256, 128, FLASHCPP_SM90_FWD_D256_BLOCK_N, FLASHCPP_SM90_FWD_D256_STAGES, 0, 0,
     FLASHCPP_SM90_FWD_D256_SHORT_BLOCK_N},
    {192, 128, 128, 128, 2},
};

// Whether a padded, unsplit call runs its row's short-call key block: a row that has one, and
// at most 1024 keys under a mask (causal, window) or 512 without (where the measured gain
// ends).
constexpr bool sm90_fwd_short_call(Sm90FwdTile t, bool masked, int seqlen_k) {
  return t.short_block_n > 0 && seqlen_k <= (masked ? 1024 : 512);
}
// The row with its short-call key block in place of the standard one.
constexpr Sm90FwdTile sm90_fwd_short_tile(Sm90FwdTile t) {
  t.block_n = t.short_block_n;
  return t;
}

// Whether an unsplit, unpaged call (padded, or varlen by its longest sequences) may run its
// row's long-call tile: a row that has one, more than 2048 queries and keys (below, the
// 192-row tile's wasted rows and fewer tiles cost more than its three warpgroups gain), and no
// mask beyond the causal one (never measured on it: a window crosses more key blocks of a
// 192-row tile). fwd_tile_row (fwd_dispatch.hpp) also asks for a wave of long tiles.
constexpr bool sm90_fwd_long_call(Sm90FwdTile t, int seqlen_q, int seqlen_k, bool local) {
  return t.long_block_m > 0 && seqlen_q > 2048 && seqlen_k > 2048 && !local;
}
// The row with its long-call tile in place of the standard one.
constexpr Sm90FwdTile sm90_fwd_long_tile(Sm90FwdTile t) {
  t.block_m = t.long_block_m;
  t.block_n = t.long_block_n;
  return t;
}

// The tile of the instantiation that serves a call of head dims (head_dim, head_dim_v)
// (tile_for_head_dims.hpp); {0,...} when none covers the call.
constexpr Sm90FwdTile sm90_fwd_tile(int head_dim, int head_dim_v) {
  return tile_for_head_dims(kSm90FwdTiles, head_dim, head_dim_v);
}
constexpr Sm90FwdTile sm90_fwd_tile(int head_dim) { return sm90_fwd_tile(head_dim, head_dim); }

// The FP8 (e4m3 q, k, v) forward: D == Dv only. kBlockN a multiple of 32 (the e4m3 wgmma's
// k; V^T tiles are kBlockN keys wide, K-major, with the widest swizzle that divides them).
// Every row sums each key block's P V apart from O (the tensor cores' FP8 adder keeps ~13
// bits, fp8_pv_chunks.hpp), in chunks of pv_chunk Dv columns with pv_temps temporaries,
// chosen by ptxas spills and H100 speed (docs/design/sm90-kernels.md): d64 one whole-width
// chunk (32 more registers), d128 chunks of 64 with one temporary (32 registers; 3-5% faster
// than 32x2 on the H100), d256 chunks of 32 with two temporaries of 16 registers (faster than
// 128 x 64 tiles). d256 at 128 x 96: shared memory would take 128 keys (Q 32 KB + 2 x (K 32 +
// V^T 32) KB), but the registers do not (S 64 + P 16 + O 128 per consumer thread); 96 keys
// (S 48 + P 12 + O 128 + 2 x 16) nearly fit (2 spilled loads and stores per key block). O is
// stored from registers at d256 (fwd_traits.hpp).
//
// The key block, stage count and chunk width of each FP8 row can be set at configure time, so
// that variants build side by side without editing this file: cmake
// -DFLASHCPP_SM90_FP8_TILE_D128=224x2 -DFLASHCPP_SM90_FP8_PV_CHUNK_D128=32x2
// (cmake/TileTables.cmake) writes FLASHCPP_SM90_FP8_D128_BLOCK_N 224, ..._STAGES 2,
// ..._PV_CHUNK 32 and ..._PV_TEMPS 2 into sm90_fwd_tile_overrides.inc (included above); the
// kernel name carries the tile and the chunks, so RunInfo::kernel says which variant ran.
#ifndef FLASHCPP_SM90_FP8_D64_BLOCK_N
#define FLASHCPP_SM90_FP8_D64_BLOCK_N 128
#endif
#ifndef FLASHCPP_SM90_FP8_D64_STAGES
#define FLASHCPP_SM90_FP8_D64_STAGES 2
#endif
#ifndef FLASHCPP_SM90_FP8_D64_PV_TEMPS
#define FLASHCPP_SM90_FP8_D64_PV_TEMPS 2
#endif
#ifndef FLASHCPP_SM90_FP8_D64_PV_CHUNK
#define FLASHCPP_SM90_FP8_D64_PV_CHUNK 64
#endif
#ifndef FLASHCPP_SM90_FP8_D128_BLOCK_N
#define FLASHCPP_SM90_FP8_D128_BLOCK_N 128
#endif
#ifndef FLASHCPP_SM90_FP8_D128_STAGES
#define FLASHCPP_SM90_FP8_D128_STAGES 2
#endif
#ifndef FLASHCPP_SM90_FP8_D128_PV_TEMPS
#define FLASHCPP_SM90_FP8_D128_PV_TEMPS 1
#endif
#ifndef FLASHCPP_SM90_FP8_D128_PV_CHUNK
#define FLASHCPP_SM90_FP8_D128_PV_CHUNK 64
#endif
#ifndef FLASHCPP_SM90_FP8_D256_BLOCK_N
#define FLASHCPP_SM90_FP8_D256_BLOCK_N 96
#endif
#ifndef FLASHCPP_SM90_FP8_D256_STAGES
#define FLASHCPP_SM90_FP8_D256_STAGES 2
#endif
#ifndef FLASHCPP_SM90_FP8_D256_PV_TEMPS
#define FLASHCPP_SM90_FP8_D256_PV_TEMPS 2
#endif
#ifndef FLASHCPP_SM90_FP8_D256_PV_CHUNK
#define FLASHCPP_SM90_FP8_D256_PV_CHUNK 32
#endif
inline constexpr Sm90FwdTile kSm90FwdTilesFp8[] = {
    {64, 64, 128, FLASHCPP_SM90_FP8_D64_BLOCK_N, FLASHCPP_SM90_FP8_D64_STAGES,
     FLASHCPP_SM90_FP8_D64_PV_CHUNK, FLASHCPP_SM90_FP8_D64_PV_TEMPS},
    {128, 128, 128, FLASHCPP_SM90_FP8_D128_BLOCK_N, FLASHCPP_SM90_FP8_D128_STAGES,
     FLASHCPP_SM90_FP8_D128_PV_CHUNK, FLASHCPP_SM90_FP8_D128_PV_TEMPS},
    {256, 256, 128, FLASHCPP_SM90_FP8_D256_BLOCK_N, FLASHCPP_SM90_FP8_D256_STAGES,
     FLASHCPP_SM90_FP8_D256_PV_CHUNK, FLASHCPP_SM90_FP8_D256_PV_TEMPS},
};
constexpr Sm90FwdTile sm90_fwd_tile_fp8(int head_dim, int head_dim_v) {
  return tile_for_head_dims(kSm90FwdTilesFp8, head_dim, head_dim_v);
}

// The FP8 rows of calls that allow fast accumulation (AttentionOptions::fp8_fast_accum): O is
// the tensor cores' P V accumulator along the whole row (pv_chunk 0), as FlashAttention-3 and
// cuDNN run FP8. Without the per-block sum's temporaries d256 takes 128-key blocks (S 64 + P 16
// + O 128 registers; 72 / 104 bytes of spill stores, padded / varlen), 4-5% faster than 96
// keys on the H100; d128 keeps 128 keys (192 or 224 were no faster at 4k).
// cmake -DFLASHCPP_SM90_FP8_FAST_TILE_D256=96x2 sets them like the rows above.
#ifndef FLASHCPP_SM90_FP8_FAST_D64_BLOCK_N
#define FLASHCPP_SM90_FP8_FAST_D64_BLOCK_N 128
#endif
#ifndef FLASHCPP_SM90_FP8_FAST_D64_STAGES
#define FLASHCPP_SM90_FP8_FAST_D64_STAGES 2
#endif
#ifndef FLASHCPP_SM90_FP8_FAST_D128_BLOCK_N
#define FLASHCPP_SM90_FP8_FAST_D128_BLOCK_N 128
#endif
#ifndef FLASHCPP_SM90_FP8_FAST_D128_STAGES
#define FLASHCPP_SM90_FP8_FAST_D128_STAGES 2
#endif
#ifndef FLASHCPP_SM90_FP8_FAST_D256_BLOCK_N
#define FLASHCPP_SM90_FP8_FAST_D256_BLOCK_N 128
#endif
#ifndef FLASHCPP_SM90_FP8_FAST_D256_STAGES
#define FLASHCPP_SM90_FP8_FAST_D256_STAGES 2
#endif
inline constexpr Sm90FwdTile kSm90FwdTilesFp8FastAccum[] = {
    {64, 64, 128, FLASHCPP_SM90_FP8_FAST_D64_BLOCK_N, FLASHCPP_SM90_FP8_FAST_D64_STAGES},
    {128, 128, 128, FLASHCPP_SM90_FP8_FAST_D128_BLOCK_N, FLASHCPP_SM90_FP8_FAST_D128_STAGES},
    {256, 256, 128, FLASHCPP_SM90_FP8_FAST_D256_BLOCK_N, FLASHCPP_SM90_FP8_FAST_D256_STAGES},
};
constexpr Sm90FwdTile sm90_fwd_tile_fp8_fast_accum(int head_dim, int head_dim_v) {
  return tile_for_head_dims(kSm90FwdTilesFp8FastAccum, head_dim, head_dim_v);
}

// Which row of its head dims an instantiation runs: the table's, the short-call key block
// (fp16/bf16, sm90_fwd_short_call), the long-call tile (fp16/bf16, sm90_fwd_long_call) or the
// FP8 fast-accumulation row.
enum class FwdTileRow { table, short_call, long_call, fp8_fast_accum };

// Tile payload in shared memory (the kernel adds a few mbarriers on top).
constexpr int sm90_fwd_smem_bytes(Sm90FwdTile t, int element_bytes) {
  return (t.block_m * t.head_dim + t.stages * t.block_n * (t.head_dim + t.head_dim_v)) *
         element_bytes;
}

static_assert(sm90_fwd_smem_bytes(sm90_fwd_tile(64), 2) <= 227 * 1024);
static_assert(sm90_fwd_smem_bytes(sm90_fwd_tile(128), 2) <= 227 * 1024);
static_assert(sm90_fwd_smem_bytes(sm90_fwd_tile(256), 2) <= 227 * 1024);
static_assert(sm90_fwd_smem_bytes(sm90_fwd_short_tile(sm90_fwd_tile(256)), 2) <= 227 * 1024);
static_assert(sm90_fwd_smem_bytes(sm90_fwd_long_tile(sm90_fwd_tile(64)), 2) <= 227 * 1024);
static_assert(sm90_fwd_smem_bytes(sm90_fwd_tile(192, 128), 2) <= 227 * 1024);
static_assert(sm90_fwd_smem_bytes(sm90_fwd_tile_fp8(64, 64), 1) <= 227 * 1024);
static_assert(sm90_fwd_smem_bytes(sm90_fwd_tile_fp8(128, 128), 1) <= 227 * 1024);
static_assert(sm90_fwd_smem_bytes(sm90_fwd_tile_fp8(256, 256), 1) <= 227 * 1024);
static_assert(sm90_fwd_smem_bytes(sm90_fwd_tile_fp8_fast_accum(128, 128), 1) <= 227 * 1024);
static_assert(sm90_fwd_smem_bytes(sm90_fwd_tile_fp8_fast_accum(256, 256), 1) <= 227 * 1024);

}  // namespace flashcpp::detail::cuda
