#pragma once
// 2^x on 16 lanes for the AVX-512 kernels (fast_exp2.hpp is the portable scalar twin).
#include <immintrin.h>

namespace flashcpp::detail::cpu {

// Exactly 0 for x <= -200 (so -inf, the mask, gives 0); NaN stays NaN. Taylor series of
// e^(f ln 2) to degree 7 on f = x - round(x) in [-0.5, 0.5]: relative error about 2e-7.
[[gnu::target("avx512f,fma")]] inline __m512 exp2_lanes(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-200.0f), x);  // vmaxps returns its second operand on NaN
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 poly = _mm512_set1_ps(0.0000152527f);
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(0.0001540353f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(0.0013333558f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(0.0096181291f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(0.0555041087f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(0.2402265070f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(0.6931471806f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(poly, n);
}

}  // namespace flashcpp::detail::cpu
