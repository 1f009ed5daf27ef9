#pragma once
// fp16 and bf16 <-> fp32 conversions on the CPU, by bit manipulation (round to nearest even),
// so the CPU backend needs no compiler support for half types.
#include <cstdint>
#include <cstring>

namespace flashcpp::detail {

inline float bits_to_float(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline std::uint32_t float_to_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float bf16_to_float(std::uint16_t h) { return bits_to_float(std::uint32_t{h} << 16); }

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<std::uint16_t>(bits >> 16);
}

inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // subnormal: mantissa * 2^-24
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

inline std::uint16_t float_to_fp16(float f) {
  const std::uint32_t bits = float_to_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;        // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;       // overflows to inf (>= 65520)
  if (abs < 0x38800000u) {                             // subnormal or zero in fp16
    const float scaled = bits_to_float(abs) * 16777216.0f;  // x / 2^-24
    // round to nearest even via float conversion of the integer part
    std::uint32_t m = static_cast<std::uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return sign | static_cast<std::uint16_t>(m);
  }
  std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<std::uint16_t>(((rounded >> 13) - (112u << 10)) & 0x7fffu);
}

}  // namespace flashcpp::detail
