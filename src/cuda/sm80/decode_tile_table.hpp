#pragma once
// The one tile table of the KV-cache decode kernel (sm80 mma.sync; it runs on Ampere, Ada and
// Hopper), read by the host (shared memory, split count, kernel name, which head dims get a
// TU) and by the device code.
//
// Decode reads every key and value once and does little arithmetic on them, so the tile is
// shaped for memory bandwidth: a CTA owns one (sequence, kv head, split) and 16 rows of
// (new token, query head of the group) pairs (the whole group of GQA shares each K/V load);
// its warps share each block of block_n keys (16 keys each) and combine their softmax states
// at the end. `stages` K/V blocks are in flight (cp.async), enough bytes per SM to cover the
// memory latency with one CTA per SM.
// Host constexpr only.

namespace flashcpp::detail::cuda {

struct DecodeTile {
  int head_dim;     // the instantiated (padded) head dim
  int block_n;      // keys per pipeline stage: 16 per warp
  int stages;       // K/V stages in shared memory
  int ctas_per_sm;  // resident CTAs per SM the kernel is built for (__launch_bounds__)
  int warps;        // warps per CTA, each taking 16 keys of a block
};

inline constexpr int kDecodeRows = 16;  // rows per CTA: one mma.sync m16 tile

inline constexpr DecodeTile kDecodeTiles[] = {
    {64, 64, 4, 2, 4},
    {128, 64, 3, 2, 4},
    {256, 64, 2, 1, 4},
};

constexpr DecodeTile decode_tile(int head_dim) {
  for (const DecodeTile& t : kDecodeTiles)
    if (t.head_dim >= head_dim) return t;
  return {0, 0, 0, 0, 0};
}

// An fp8 (e4m3) cache holds twice the keys in the same bytes: the 16-bit tile's stages take
// blocks of twice the keys, shared by twice the warps. Its CTA converts every element it
// reads, so it is bounded by instructions, and 4 warps (one per scheduler, at one CTA per SM)
// left every latency exposed. d256 keeps 4 warps and doubles the stages instead: the warps'
// merge buffers (warps x 16 rows x D fp32) must fit in the stages.
constexpr DecodeTile decode_tile_fp8(int head_dim) {
  DecodeTile t = decode_tile(head_dim);
  if (t.head_dim <= 128) {
    t.block_n *= 2;
    t.warps *= 2;
    t.ctas_per_sm = 1;
  } else {
    t.stages *= 2;
  }
  return t;
}

// Q (16 rows of q_bytes elements) plus stages x (K + V) blocks of kv_bytes elements.
constexpr int decode_smem_bytes(DecodeTile t, int q_bytes, int kv_bytes) {
  return kDecodeRows * t.head_dim * q_bytes + 2 * t.stages * t.block_n * t.head_dim * kv_bytes;
}

static_assert(decode_smem_bytes(decode_tile(128), 2, 2) <= 163 * 1024);
static_assert(decode_smem_bytes(decode_tile(256), 2, 2) <= 163 * 1024);
static_assert(decode_smem_bytes(decode_tile_fp8(256), 2, 1) <= 163 * 1024);

}  // namespace flashcpp::detail::cuda
