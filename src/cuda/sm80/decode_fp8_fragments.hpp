#pragma once
// The decode kernel's operands from an fp8 (e4m3) KV cache: K and V stay e4m3 in shared memory
// (cp.async moves half the bytes of a bf16 cache) and become bf16 mma.sync operands in
// registers, converted exactly (common/fp8.hpp). ldmatrix moves 16-bit elements, so the
// fragments are read with plain shared loads, in orders chosen so that each thread's bytes are
// contiguous:
//   S = Q K^T  the reduction over the head dim may run in any order, as long as Q and K agree:
//              k step kk's logical columns {2t, 2t+1, 2t+8, 2t+9} (t = lane % 4) are taken
//              from dims 16 kk + 4t .. 16 kk + 4t + 3, so a thread reads one 4-byte word per
//              key row and kk (Q's fragments, bf16, are read to match);
//   O += P V   V's n index (the output dim) may be permuted, as long as the epilogue knows:
//              thread column g = lane / 4 of n tile n is dim v_dim(n, g), which gives each
//              thread a run of up to 16 consecutive dims of its 4 key rows (2t, 2t + 1, 2t + 8,
//              2t + 9); a 4 x 4 byte transpose turns 4 such words into the B operands of 4 n
//              tiles.
// Shared memory rows of K and V are D bytes in 16-byte chunks, XOR-swizzled so that the 8 key
// rows of a K read, and the 4 rows x 8 threads of a V read, fall in distinct banks (2-way
// conflicts remain for D = 64's V reads).
#include <cstdint>

#include "common/byte_perm.hpp"
#include "common/fp8.hpp"

namespace flashcpp::detail::cuda::sm80 {

// Byte offset of 16-byte chunk `chunk` of row `row` in an e4m3 tile of kChunks chunks per row.
template <int kChunks>
__device__ __forceinline__ int fp8_swizzled(int row, int chunk) {
  static_assert(kChunks >= 4, "fp8 rows of at least 64 bytes");
  if constexpr (kChunks >= 8)
    return (row * kChunks + (chunk ^ (row & 7))) * 16;
  else  // 64-byte rows: two rows share a 128-byte bank window, so rows 2i and 2i+1 differ in it
    return (row * kChunks + (chunk ^ ((row >> 1) & (kChunks - 1)))) * 16;
}

// Bytes of consecutive dims a thread reads per V row, and the dim of n tile n, column g.
template <int kHeadDim>
inline constexpr int kFp8VRun = kHeadDim / 8 < 16 ? kHeadDim / 8 : 16;
template <int kHeadDim>
__device__ __forceinline__ int fp8_v_dim(int n, int g) {
  constexpr int run = kFp8VRun<kHeadDim>;
  return (n / 16) * 128 + g * run + n % 16;
}

// Q's A fragment of k step kk (bf16 in the swizzled [16][D] tile of `swizzled`), in the order
// the K fragments below use: regs 0 and 2 are row g's dims 16 kk + 4t .. +3, regs 1 and 3
// row g + 8's.
template <int kQChunks, class Element, class Swizzle>
__device__ __forceinline__ void fp8_q_fragment(std::uint32_t (&a)[4], const Element* s_q, int kk,
                                               int lane, Swizzle swizzled) {
  const int g = lane / 4, t = lane % 4;
  const int chunk = 2 * kk + t / 2, within = 4 * (t % 2);  // 8 bf16 per chunk
  const uint2 r0 = *reinterpret_cast<const uint2*>(s_q + swizzled(g, chunk) + within);
  const uint2 r1 = *reinterpret_cast<const uint2*>(s_q + swizzled(g + 8, chunk) + within);
  a[0] = r0.x;
  a[1] = r1.x;
  a[2] = r0.y;
  a[3] = r1.y;
}

// K's B fragments of k step kk for key rows row0 + g (n tile 0) and row0 + 8 + g (n tile 1).
template <int kChunks>
__device__ __forceinline__ void fp8_k_fragments(std::uint32_t (&b)[2][2], const unsigned char* s_k,
                                                int row0, int kk, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const int row = row0 + 8 * n + g;
    const std::uint32_t w = *reinterpret_cast<const std::uint32_t*>(s_k + fp8_swizzled<kChunks>(row, kk) + 4 * t);
    e4m3x4_to_bf16x2x2(w, b[n][0], b[n][1]);
  }
}

// O += P V for the warp's 16 keys (rows row0 ..): P is the A operand (keys 2t, 2t+1, 2t+8,
// 2t+9 of rows g and g + 8), acc[n] the C fragment of n tile n (dims fp8_v_dim(n, 2t) and
// fp8_v_dim(n, 2t + 1)). Mma is a functor (c, a, b0, b1) issuing one m16n8k16.
template <int kHeadDim, int kChunks, class Mma>
__device__ __forceinline__ void fp8_pv(float (&acc)[kHeadDim / 8][4], const std::uint32_t (&p)[4],
                                       const unsigned char* s_v, int row0, int lane, Mma mma) {
  constexpr int run = kFp8VRun<kHeadDim>;  // 8 or 16 bytes
  constexpr int words = run / 4;
  const int g = lane / 4, t = lane % 4;
  const int rows[4] = {row0 + 2 * t, row0 + 2 * t + 1, row0 + 2 * t + 8, row0 + 2 * t + 9};
#pragma unroll
  for (int piece = 0; piece < (kHeadDim + 127) / 128; ++piece) {
    // This thread's run of the piece: chunk (piece * 128 + g * run) / 16, byte offset within.
    const int byte = piece * 128 + g * run;
    std::uint32_t r[4][words];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned char* src = s_v + fp8_swizzled<kChunks>(rows[i], byte / 16) + byte % 16;
      if constexpr (words == 4) {
        const uint4 v = *reinterpret_cast<const uint4*>(src);
        r[i][0] = v.x, r[i][1] = v.y, r[i][2] = v.z, r[i][3] = v.w;
      } else {
        const uint2 v = *reinterpret_cast<const uint2*>(src);
        r[i][0] = v.x, r[i][1] = v.y;
      }
    }
#pragma unroll
    for (int w = 0; w < words; ++w) {
      // Rows (keys) by columns (dims 4w .. 4w + 3 of the run) -> one word per dim.
      std::uint32_t c0 = r[0][w], c1 = r[1][w], c2 = r[2][w], c3 = r[3][w];
      transpose_bytes_4x4(c0, c1, c2, c3);
      const std::uint32_t cols[4] = {c0, c1, c2, c3};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        std::uint32_t b0, b1;  // keys (2t, 2t + 1) and (2t + 8, 2t + 9) of this dim
        e4m3x4_to_bf16x2x2(cols[j], b0, b1);
        mma(acc[piece * 16 + 4 * w + j], p, b0, b1);
      }
    }
  }
}

}  // namespace flashcpp::detail::cuda::sm80
