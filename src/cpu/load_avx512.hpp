#pragma once
// Reading input rows of any dtype as fp32, 16 elements at a time, for the AVX-512 kernels
// (element_io.hpp's load is the portable, one-element-at-a-time twin): the bf16/fp16 inputs
// are converted where they are used, a row at a time, never as whole-tensor copies.
#include <immintrin.h>

#include <cstdint>

#include "common/params.hpp"

namespace flashcpp::detail::cpu {

// dst[i] = base[offset + i] * scale for i < n (base of dtype `type`).
[[gnu::target("avx512f,avx512bw,avx512vl")]] inline void load_scaled_row(
    const void* base, ElementType type, std::int64_t offset, int n, float scale, float* dst) {
  const __m512 factor = _mm512_set1_ps(scale);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes =
        n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512 x;
    if (type == ElementType::fp32) {
      x = _mm512_maskz_loadu_ps(lanes, static_cast<const float*>(base) + offset + i);
    } else {
      const __m256i h = _mm256_maskz_loadu_epi16(
          lanes, static_cast<const std::uint16_t*>(base) + offset + i);
      x = type == ElementType::bf16
              ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
              : _mm512_cvtph_ps(h);
    }
    _mm512_mask_storeu_ps(dst + i, lanes, _mm512_mul_ps(x, factor));
  }
}

}  // namespace flashcpp::detail::cpu
