#pragma once
// Writing finished fp32 output rows in the output's dtype, 16 elements at a time, for the
// AVX-512 kernels (element_io.hpp's store_row is the portable, one-element-at-a-time twin and
// rounds the same way: to nearest even, NaN kept quiet).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/params.hpp"
#include "cpu/scores.hpp"
#include "cpu/sequence.hpp"

namespace flashcpp::detail::cpu {

// base[offset + i] = src[i] * scale for i < n.
[[gnu::target("avx512f,avx512bw,avx512vl")]] inline void store_scaled_row(
    void* base, ElementType type, std::int64_t offset, const float* src, int n, float scale) {
  const __m512 factor = _mm512_set1_ps(scale);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes =
        n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, src + i), factor);
    if (type == ElementType::fp32) {
      _mm512_mask_storeu_ps(static_cast<float*>(base) + offset + i, lanes, x);
      continue;
    }
    __m256i half;
    if (type == ElementType::fp16) {
      half = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    } else {
      const __m512i bits = _mm512_castps_si512(x);
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      const __m512i rounded = _mm512_srli_epi32(
          _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
      const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
      half = _mm512_cvtepi32_epi16(
          _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), quiet_nan));
    }
    _mm256_mask_storeu_epi16(static_cast<std::uint16_t*>(base) + offset + i, lanes, half);
  }
}

// A forward task's finished rows r0 .. r0 + rows of `head`: o (rows x Dv, unnormalised), the
// running max m (log2 units) and sum l of each row become out = o / l and lse. A row with no
// visible key (l = 0) gives out 0 and lse -inf; NaN stays NaN.
[[gnu::target("avx512f,avx512bw,avx512vl")]] inline void store_finished_rows(
    const ForwardParams& p, const Sequence& seq, int head, std::int64_t r0, int rows,
    const float* o, const float* m, const float* l) {
  const int dv = p.head_dim_v;
  for (int i = 0; i < rows; ++i) {
    const bool empty = l[i] == 0.0f;
    store_scaled_row(p.out, p.dtype, q_offset(p.out_stride, seq, r0 + i, head),
                     o + static_cast<std::int64_t>(i) * dv, dv, empty ? 0.0f : 1.0f / l[i]);
    if (p.lse)
      p.lse[lse_offset(p, seq, r0 + i, head)] =
          empty ? -std::numeric_limits<float>::infinity() : (m[i] + std::log2(l[i])) * kLn2;
  }
}

}  // namespace flashcpp::detail::cpu
