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

// Two e4m3 bytes (bits 0..7 and 8..15 of `pair`) as two f16 bit patterns (the first in the
// low half) whose values are the bytes' values times 2^-8, NaN not handled: an e4m3 byte's
// exponent and mantissa fields, shifted into an f16's, read with f16's bias (15, not 7), and
// e4m3 subnormals land on f16 subnormals. The decode kernel's fallback where the GPU has no
// e4m3 conversion instruction (before sm89): it multiplies by 2^8 in f16, which is exact.
FLASHCPP_HOST_DEVICE std::uint32_t e4m3x2_to_f16x2_bits_over_256(std::uint32_t pair) {
  const std::uint32_t w = (pair & 0xffu) | ((pair & 0xff00u) << 8);  // byte i at bit 16 i
  return ((w & 0x00800080u) << 8) | ((w & 0x007f007fu) << 7);
}

// Bit 7 (byte 0) and bit 15 (byte 1) set where the e4m3 bytes of `pair` are NaN (|x| = 0x7f;
// adding 1 carries into bit 7 of exactly those bytes).
FLASHCPP_HOST_DEVICE std::uint32_t e4m3x2_nan_bits(std::uint32_t pair) {
  return ((pair & 0x7f7fu) + 0x0101u) & 0x8080u;
}

}  // namespace flashcpp::detail
