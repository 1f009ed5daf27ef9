#pragma once
// float8 e4m3 (the "fn" variant: no infinities, NaN = S.1111.111, largest finite 448) to and
// from float, shared by the CPU backend and the CUDA kernels so both read and write the same
// bits. Decoding is exact (every e4m3 value is a float and a bf16); encoding rounds to nearest
// even and saturates: finite values beyond +-448 and +-Inf become +-448, NaN stays NaN
// (PTX's cvt.rn.satfinite rule).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.hpp"

namespace flashcpp::detail {

FLASHCPP_HOST_DEVICE float fp8_bits_to_float(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

FLASHCPP_HOST_DEVICE std::uint32_t fp8_float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
#endif
}

inline constexpr float kE4m3Max = 448.0f;

// An e4m3 byte held in bits 24..31 of `u` (lower bits are ignored) as float, NaN not handled:
// the byte's exponent and mantissa become a float's low exponent bits (an arithmetic shift
// keeps the sign in bit 31), and one multiply by 2^(127 - 7) rebiases; e4m3 subnormals are
// float subnormals before the multiply and come out exact (no flush to zero in this build).
FLASHCPP_HOST_DEVICE float e4m3_top_byte_to_float_no_nan(std::uint32_t u) {
  const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(u) >> 4) & 0x87f00000u;
  return fp8_bits_to_float(bits) * 0x1p120f;
}

FLASHCPP_HOST_DEVICE bool e4m3_is_nan(std::uint8_t byte) { return (byte & 0x7fu) == 0x7fu; }

FLASHCPP_HOST_DEVICE float e4m3_to_float(std::uint8_t byte) {
  if (e4m3_is_nan(byte)) return fp8_bits_to_float(0x7fc00000u | (std::uint32_t{byte & 0x80u} << 24));
  return e4m3_top_byte_to_float_no_nan(std::uint32_t{byte} << 24);
}

FLASHCPP_HOST_DEVICE std::uint8_t float_to_e4m3(float x) {
  const std::uint32_t sign = (fp8_float_to_bits(x) >> 24) & 0x80u;
  const float a = fabsf(x);
  if (a != a) return static_cast<std::uint8_t>(sign | 0x7fu);             // NaN
  if (a >= kE4m3Max) return static_cast<std::uint8_t>(sign | 0x7eu);      // saturate (Inf too)
  if (a < 0x1p-6f) {  // subnormal range: multiples of 2^-9 (8 * 2^-9 is the smallest normal)
    const float m = rintf(a * 512.0f);  // exact product; rounds to nearest even
    return static_cast<std::uint8_t>(sign | static_cast<std::uint32_t>(m));
  }
  std::uint32_t bits = fp8_float_to_bits(a);
  bits += 0x7ffffu + ((bits >> 20) & 1u);  // round the mantissa to 3 bits, nearest even
  const std::uint32_t exponent = (bits >> 23) - 120u;  // rebias 127 -> 7
  const std::uint32_t mantissa = (bits >> 20) & 7u;
  if (exponent > 15u || (exponent == 15u && mantissa == 7u)) return static_cast<std::uint8_t>(sign | 0x7eu);
  return static_cast<std::uint8_t>(sign | (exponent << 3) | mantissa);
}

// Four e4m3 bytes (byte i in bits 8i..8i+7 of `w`) as two bf16 pairs: `lo` holds bytes 0 (low
// half) and 1, `hi` bytes 2 and 3. Exact; NaN bytes give NaN. The decode kernel converts its
// K/V fragments with it right after reading them from shared memory.
FLASHCPP_HOST_DEVICE void e4m3x4_to_bf16x2x2(std::uint32_t w, std::uint32_t& lo, std::uint32_t& hi) {
  const std::uint32_t f0 = fp8_float_to_bits(e4m3_top_byte_to_float_no_nan(w << 24));
  const std::uint32_t f1 = fp8_float_to_bits(e4m3_top_byte_to_float_no_nan(w << 16));
  const std::uint32_t f2 = fp8_float_to_bits(e4m3_top_byte_to_float_no_nan(w << 8));
  const std::uint32_t f3 = fp8_float_to_bits(e4m3_top_byte_to_float_no_nan(w));
  // Every e4m3 value has at most 4 significant bits: a float's top half is its exact bf16.
  lo = (f0 >> 16) | (f1 & 0xffff0000u);
  hi = (f2 >> 16) | (f3 & 0xffff0000u);
  // Bytes with magnitude 0x7f (NaN) carry into bit 7 of their byte here; rare, so a branch.
  const std::uint32_t nan = ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
  if (nan != 0u) {
    lo |= ((nan & 0x80u) ? 0x7fc0u : 0u) | ((nan & 0x8000u) ? 0x7fc00000u : 0u);
    hi |= ((nan & 0x800000u) ? 0x7fc0u : 0u) | ((nan & 0x80000000u) ? 0x7fc00000u : 0u);
  }
}

}  // namespace flashcpp::detail
