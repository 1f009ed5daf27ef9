#pragma once
// 2^x without a library call, so that loops over score rows vectorise. The softmax spends one
// exp per score against 4*D flops of block products; a scalar expf call per score cost about
// as much as the products themselves.
#include <bit>
#include <cstdint>

namespace flashcpp::detail::cpu {

// For x <= 128: relative error about 2e-7; exactly 0 below -125 (so -inf gives 0).
inline float fast_exp2(float x) {
  // Branch-free on integer masks: under the default -ftrapping-math GCC does not turn float
  // compares or float selects into vector code, and this loop must vectorise.
  // x < -125 is tested on the bits: negative floats order like their unsigned bits.
  constexpr std::uint32_t kBound = std::bit_cast<std::uint32_t>(-125.0f);
  const std::uint32_t x_bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t keep = x_bits > kBound ? 0u : ~0u;  // all ones unless x < -125
  const float clamped = std::bit_cast<float>((x_bits & keep) | (kBound & ~keep));

  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: x + kRound keeps round(x) in the low bits
  const float shifted = clamped + kRound;
  const float f = clamped - (shifted - kRound);  // in [-0.5, 0.5]
  // 2^f = e^(f ln2): Taylor series to degree 7, truncation error < 1e-8 on [-0.5, 0.5].
  constexpr float c1 = 0.6931471806f, c2 = 0.2402265070f, c3 = 0.0555041087f, c4 = 0.0096181291f,
                  c5 = 0.0013333558f, c6 = 0.0001540353f, c7 = 0.0000152527f;
  const float poly =
      1.0f + f * (c1 + f * (c2 + f * (c3 + f * (c4 + f * (c5 + f * (c6 + f * c7))))));
  // Add round(x) to the exponent field: the low bits of `shifted` hold round(x).
  const std::uint32_t bits =
      std::bit_cast<std::uint32_t>(poly) + (std::bit_cast<std::uint32_t>(shifted) << 23);
  return std::bit_cast<float>(bits & keep);
}

}  // namespace flashcpp::detail::cpu
