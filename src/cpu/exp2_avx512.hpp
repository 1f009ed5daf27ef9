#pragma once
// 2^x on 16 lanes for the AVX-512 kernels (fast_exp2.hpp is the portable scalar twin).
#include <immintrin.h>

namespace flashcpp::detail::cpu {

// Exactly 0 for x <= -200 (so -inf, the mask, gives 0); NaN stays NaN; exactly 1 for x = 0.
// 2^x = 2^f * 2^floor(x) with f = x - floor(x) in [0, 1) (vreduceps) and vscalefps, which
// takes floor(x) itself; 2^f by a degree-6 polynomial fitted for relative error (2e-9 in
// exact arithmetic; 7e-8 at worst evaluated in fp32, as the degree-7 Taylor series on
// [-0.5, 0.5] it replaced, which took two more instructions: a round and a subtraction).
[[gnu::target("avx512f,avx512dq,fma")]] inline __m512 exp2_lanes(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-200.0f), x);  // vmaxps returns its second operand on NaN
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF);
  __m512 poly = _mm512_set1_ps(2.1702574e-4f);
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.2439728e-3f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(9.6788192e-3f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(5.5483364e-2f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(2.4022983e-1f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(6.9314700e-1f));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(poly, x);
}

}  // namespace flashcpp::detail::cpu
