#pragma once
// The decode kernel's operands from an fp8 (e4m3) KV cache: K and V stay e4m3 in shared memory
// (cp.async moves half the bytes of a bf16 cache) and become f16 mma.sync operands in
// registers. Every e4m3 value (subnormals included) is an f16 normal, so the conversion is
// exact, and from sm89 on it is one instruction per two elements (cvt.rn.f16x2.e4m3x2, NaN
// kept); older GPUs shift the bits into place (common/fp8.hpp) and patch NaN. Q (bf16) is
// converted once per CTA, scaled by a power of two so that the tile's largest finite |q|
// lands in [2^14, 2^15): f16 holds it without overflow, bf16's 8 significant bits fit in
// f16's 11, and the scale is undone in the fp32 score scale. P goes to P V as f16 (3 more
// bits than bf16; weights under 2^-24 of the row's largest flush to 0).
// ldmatrix moves 16-bit elements, so the fragments are read with plain shared loads, in orders
// chosen so that each thread's bytes are contiguous:
//   S = Q K^T  the reduction over the head dim may run in any order, as long as Q and K agree:
//              a thread reads 16-byte chunks of its key rows (fp8_k_chunk), and k step kk's
//              logical columns {2t, 2t+1, 2t+8, 2t+9} (t = lane % 4) are the 4 consecutive
//              dims starting at fp8_k_dim(kk, t) (Q's fragments are read to match);
//   O += P V   V's n index (the output dim) may be permuted, as long as the epilogue knows:
//              thread column g = lane / 4 of n tile n is dim fp8_v_dim(n, g), which gives each
//              thread a run of up to 16 consecutive dims of its 4 key rows (2t, 2t + 1,
//              2t + 8, 2t + 9); byte permutes pair rows 2t and 2t + 1 (2t + 8 and 2t + 9) dim
//              by dim, the key pairs of the B operands.
// Shared memory rows of K and V are D bytes in 16-byte chunks, XOR-swizzled so that the 8 key
// rows of a K read, and the 4 rows x 8 threads of a V read, fall in distinct banks (2-way
// conflicts remain for D = 64's V reads).
#include <cstdint>

#include <cuda_fp16.h>
#include <cutlass/numeric_types.h>

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

// Four e4m3 bytes (byte i in bits 8i..8i+7 of `w`) as two f16 pairs: `lo` holds bytes 0 (low
// half) and 1, `hi` bytes 2 and 3. Exact; NaN bytes give NaN.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(std::uint32_t w, std::uint32_t& lo, std::uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n"
      " cvt.rn.f16x2.e4m3x2 %1, b;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  const __half2 k256 = __float2half2_rn(256.f);
  const std::uint32_t raw[2] = {e4m3x2_to_f16x2_bits_over_256(w), e4m3x2_to_f16x2_bits_over_256(w >> 16)};
  std::uint32_t out[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const __half2 h = __hmul2(*reinterpret_cast<const __half2*>(&raw[i]), k256);
    out[i] = *reinterpret_cast<const std::uint32_t*>(&h);
  }
  // NaN bytes (|x| = 0x7f) came out as +-480: rare, so a branch.
  const std::uint32_t nan = ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
  if (nan != 0u) {
    out[0] |= ((nan & 0x80u) ? 0x7e00u : 0u) | ((nan & 0x8000u) ? 0x7e000000u : 0u);
    out[1] |= ((nan & 0x800000u) ? 0x7e00u : 0u) | ((nan & 0x80000000u) ? 0x7e000000u : 0u);
  }
  lo = out[0];
  hi = out[1];
#endif
}

// The chunk of a key row that thread t (lane % 4) reads in its j-th 16-byte K load: the 8
// threads of a shared-memory phase (key rows g and g + 1) then cover all 32 banks.
template <int kChunks>
__device__ __forceinline__ int fp8_k_chunk(int t, int j) {
  if constexpr (kChunks == 4)
    return t;
  else
    return 2 * t + (j & 1) + 8 * (j >> 1);
}

// The first of the 4 consecutive dims that k step kk gives thread t.
template <int kChunks>
__device__ __forceinline__ int fp8_k_dim(int kk, int t) {
  return 16 * fp8_k_chunk<kChunks>(t, kk / 4) + 4 * (kk % 4);
}

// Bytes of consecutive dims a thread reads per V row, and the dim of n tile n, column g.
template <int kHeadDim>
inline constexpr int kFp8VRun = kHeadDim / 8 < 16 ? kHeadDim / 8 : 16;
template <int kHeadDim>
__device__ __forceinline__ int fp8_v_dim(int n, int g) {
  constexpr int run = kFp8VRun<kHeadDim>;
  return (n / 16) * 128 + g * run + n % 16;
}

// Where the epilogue's fp32 merge buffer ([row][D]) keeps dim `dim` of row `row`: XOR-swizzled
// inside each aligned group of 32 dims, by the row (mod 8) and the group: one store of a
// permuted accumulator writes dim 32 t + c of row g for every (g, t), all in one bank without
// the swizzle, in 32 distinct banks with it; reads of 32 consecutive dims of a row stay
// conflict-free.
__device__ __forceinline__ int fp8_merge_slot(int row, int dim) {
  return dim ^ ((row & 7) | (((dim >> 5) & 3) << 3));
}

// The power of two 2^e that puts the largest finite |q| of the CTA's Q tile (bf16, [16][D],
// any layout) in [2^14, 2^15), e clamped to [-100, 64] (a tile whose largest |q| is under
// 2^-50 keeps 2^64: its scores are 0 to any precision that matters). Every thread returns the
// same e. Contains a __syncthreads: call it from every thread of the CTA.
template <int kThreads, int kElems>
__device__ __forceinline__ int fp8_q_scale_exponent(const cutlass::bfloat16_t* s_q, int* s_partial) {
  static_assert(kElems % 8 == 0, "whole 16-byte chunks");
  const int tid = threadIdx.x;
  std::uint32_t m = 0;  // largest finite magnitude, as bf16 bits (their order is the values')
#pragma unroll
  for (int i = tid; i < kElems / 8; i += kThreads) {
    const uint4 c = reinterpret_cast<const uint4*>(s_q)[i];
    const std::uint32_t words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int w = 0; w < 4; ++w)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const std::uint32_t mag = (words[w] >> (16 * h)) & 0x7fffu;
        if (mag < 0x7f80u) m = mag > m ? mag : m;  // Inf and NaN do not count
      }
  }
  m = __reduce_max_sync(0xffffffffu, m);
  if (tid % 32 == 0) s_partial[tid / 32] = int(m);
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) m = std::uint32_t(s_partial[w]) > m ? std::uint32_t(s_partial[w]) : m;
  if (m == 0) return 0;
  const int e = 14 - (int(m >> 7) - 127);  // bf16 subnormals read as 2^-127
  return e < -100 ? -100 : (e > 64 ? 64 : e);
}

// 2^e as a float, e in [-126, 127].
__device__ __forceinline__ float fp8_pow2(int e) { return __int_as_float((e + 127) << 23); }

// Q's A fragment of k step kk (bf16 in the swizzled [16][D] tile of `swizzled`) as f16, times
// `scale` (a power of two), in the order of the K fragments: regs 0 and 2 are row g's dims
// fp8_k_dim(kk, t) .. +3, regs 1 and 3 row g + 8's.
template <int kChunks, class Swizzle>
__device__ __forceinline__ void fp8_q_fragment(std::uint32_t (&a)[4], const cutlass::bfloat16_t* s_q, int kk,
                                               int lane, float scale, Swizzle swizzled) {
  const int g = lane / 4, t = lane % 4;
  const int dim = fp8_k_dim<kChunks>(kk, t);
  const int chunk = dim / 8, within = dim % 8;  // 8 bf16 per chunk of Q
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint2 v = *reinterpret_cast<const uint2*>(s_q + swizzled(g + 8 * r, chunk) + within);
    const std::uint32_t words[2] = {v.x, v.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float lo = __uint_as_float(words[i] << 16) * scale;
      const float hi = __uint_as_float(words[i] & 0xffff0000u) * scale;
      const __half2 h = __floats2half2_rn(lo, hi);
      a[r + 2 * i] = *reinterpret_cast<const std::uint32_t*>(&h);
    }
  }
}

// S += Q K^T for the warp's 16 keys (rows row0 + g: n tile 0, row0 + 8 + g: n tile 1): each
// thread reads 16 bytes of each of its two key rows per 4 k steps. Mma is a functor
// (c, a, b0, b1) issuing one f16 m16n8k16.
template <int kHeadDim, int kChunks, class Mma>
__device__ __forceinline__ void fp8_qk(float (&s)[2][4], const std::uint32_t (&q)[kHeadDim / 16][4],
                                       const unsigned char* s_k, int row0, int lane, Mma mma) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < kChunks / 4; ++j) {
    uint4 w[2];
#pragma unroll
    for (int n = 0; n < 2; ++n)
      w[n] = *reinterpret_cast<const uint4*>(s_k + fp8_swizzled<kChunks>(row0 + 8 * n + g, fp8_k_chunk<kChunks>(t, j)));
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const std::uint32_t word = i == 0 ? w[n].x : i == 1 ? w[n].y : i == 2 ? w[n].z : w[n].w;
        std::uint32_t b0, b1;
        e4m3x4_to_f16x2x2(word, b0, b1);
        mma(s[n], q[4 * j + i], b0, b1);
      }
  }
}

// O += P V for the warp's 16 keys (rows row0 ..): P is the A operand (keys 2t, 2t+1, 2t+8,
// 2t+9 of rows g and g + 8, f16), acc[n] the C fragment of n tile n (dims fp8_v_dim(n, 2t)
// and fp8_v_dim(n, 2t + 1)). Mma is a functor (c, a, b0, b1) issuing one f16 m16n8k16.
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
      // Key pairs dim by dim: {r0.d, r1.d} for dims 4w + d of the run (likewise rows 2 and 3).
      const std::uint32_t pairs01[2] = {byte_perm(r[0][w], r[1][w], 0x5140u), byte_perm(r[0][w], r[1][w], 0x7362u)};
      const std::uint32_t pairs23[2] = {byte_perm(r[2][w], r[3][w], 0x5140u), byte_perm(r[2][w], r[3][w], 0x7362u)};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        std::uint32_t b0[2], b1[2];  // [dim 4w + 2h + i]: keys (2t, 2t + 1) and (2t + 8, 2t + 9)
        e4m3x4_to_f16x2x2(pairs01[h], b0[0], b0[1]);
        e4m3x4_to_f16x2x2(pairs23[h], b1[0], b1[1]);
#pragma unroll
        for (int i = 0; i < 2; ++i) mma(acc[piece * 16 + 4 * w + 2 * h + i], p, b0[i], b1[i]);
      }
    }
  }
}

}  // namespace flashcpp::detail::cuda::sm80
