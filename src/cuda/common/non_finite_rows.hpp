#pragma once
// Non-finite rows of a tile in shared memory, for the blocks a mask cuts through. A hidden
// key (or query) gets an exact 0 weight there, but the tensor cores still multiply that 0 by
// its row of V (K, Q, dO), and 0 * NaN = 0 * Inf = NaN. So the kernels, in those blocks only,
// zero the non-finite 16-byte chunks of the operand before the product reads it and remember
// which rows held them (a bit per row): a row of the result that does see such a row is made
// NaN instead (docs/semantics.md, "NaN and Inf in the inputs").
// The test works on packed 16-bit values with integer ops: |x| (sign cleared) is NaN or Inf
// iff its exponent field is all ones, i.e. |x| >= 0x7f80 (bf16) or 0x7c00 (fp16); adding
// 0x8000 minus that bound sets bit 15 of exactly those lanes, without a carry into the next.
#include <cstdint>
#include <type_traits>

#include <cuda_fp16.h>
#include <cutlass/numeric_types.h>

namespace flashcpp::detail::cuda {

// Bit 15 (16) of a word set where its low (high) 16-bit value of the chunk is not finite, for
// any of the chunk's four words: OR these over many chunks and test once.
template <class Element>
__device__ __forceinline__ std::uint32_t non_finite_lanes(uint4 c) {
  static_assert(sizeof(Element) == 2, "16-bit elements, two per word");
  constexpr std::uint32_t kAbs = 0x7fff7fffu;
  constexpr bool kHalf =
      std::is_same_v<Element, cutlass::half_t> || std::is_same_v<Element, __half>;
  constexpr std::uint32_t kBias = kHalf ? 0x04000400u : 0x00800080u;
  const std::uint32_t t = ((c.x & kAbs) + kBias) | ((c.y & kAbs) + kBias) |
                          ((c.z & kAbs) + kBias) | ((c.w & kAbs) + kBias);
  return t & 0x80008000u;
}

// A word of two 16-bit values with the non-finite ones replaced by 0 (same test).
template <class Element>
__device__ __forceinline__ std::uint32_t finite_or_zero(std::uint32_t w) {
  constexpr bool kHalf =
      std::is_same_v<Element, cutlass::half_t> || std::is_same_v<Element, __half>;
  constexpr std::uint32_t kBias = kHalf ? 0x04000400u : 0x00800080u;
  const std::uint32_t lanes = ((w & 0x7fff7fffu) + kBias) & 0x80008000u;
  return w & ~((lanes >> 15) * 0xffffu);  // bits 0 and 16 -> 0xffff in their halves
}

template <class Element>
__device__ __forceinline__ bool chunk_non_finite(uint4 c) {
  return non_finite_lanes<Element>(c) != 0;
}

// Whether a 16-byte chunk of 16-bit values holds a NaN (Inf does not count): |x| above the
// all-ones exponent with a zero mantissa, lane by lane.
template <class Element>
__device__ __forceinline__ bool chunk_has_nan(uint4 c) {
  static_assert(sizeof(Element) == 2, "16-bit elements, two per word");
  constexpr bool kHalf =
      std::is_same_v<Element, cutlass::half_t> || std::is_same_v<Element, __half>;
  constexpr std::uint32_t kInf = kHalf ? 0x7c00u : 0x7f80u;
  const std::uint32_t w[4] = {c.x, c.y, c.z, c.w};
  bool nan = false;
#pragma unroll
  for (int i = 0; i < 4; ++i) nan |= (w[i] & 0x7fffu) > kInf || (w[i] >> 16 & 0x7fffu) > kInf;
  return nan;
}

// Whether one of a 16-byte chunk's sixteen e4m3 (fn) values is NaN, the format's only
// non-finite value: |x| = 0x7f. 0x7f + 1 sets bit 7 of exactly those bytes (|x| <= 0x7f: no
// carry into the next byte).
__device__ __forceinline__ bool chunk_has_e4m3_nan(uint4 c) {
  constexpr std::uint32_t kAbs = 0x7f7f7f7fu, kOne = 0x01010101u;
  const std::uint32_t t = ((c.x & kAbs) + kOne) | ((c.y & kAbs) + kOne) |
                          ((c.z & kAbs) + kOne) | ((c.w & kAbs) + kOne);
  return (t & 0x80808080u) != 0;
}

// 0xff in each byte of a word of four e4m3 values that is NaN, 0 in the others (the test of
// chunk_has_e4m3_nan, bit 7 of each byte spread over the byte).
__device__ __forceinline__ std::uint32_t e4m3_nan_bytes(std::uint32_t w) {
  return ((((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) >> 7) * 0xffu;
}

// Whether any bit in [first, last] (block-relative, may reach past [0, 32 * kWords)) is set.
template <int kWords>
__device__ __forceinline__ bool any_row_bit(const std::uint32_t* row_bits, int first, int last) {
  bool hit = false;
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    const int a = first - 32 * w > 0 ? first - 32 * w : 0;
    const int b = last - 32 * w < 31 ? last - 32 * w : 31;
    if (a <= b) hit |= (row_bits[w] & ((0xffffffffu >> (31 - (b - a))) << a)) != 0;
  }
  return hit;
}

}  // namespace flashcpp::detail::cuda
