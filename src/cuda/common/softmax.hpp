#pragma once
// Online softmax over the rows a thread holds in its S accumulator (FlashAttention-2):
// running max m and running sum l per row, O rescaled by exp2((m_old - m_new) * scale) only
// when the row max moved, exp2 with the scale folded into one FFMA, and the sum kept per
// thread (no shuffles) until finalize.
#include <cmath>

#include "cuda/common/fragment_utils.hpp"

namespace flashcpp::detail::cuda {

// exp2 on the MUFU unit (ex2.approx.ftz): exp2f without fast-math adds denormal handling
// around it; the inputs here are <= 0 and results below 2^-126 do not matter next to the 1 of
// the row maximum.
__forceinline__ __device__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];

  __forceinline__ __device__ OnlineSoftmax() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // s: S accumulator in (row, col) view, overwritten with unnormalised P.
  // o: O accumulator in (row, col) view. kFirst: o holds nothing yet (no rescale needed).
  template <bool kFirst, class TensorS, class TensorO>
  __forceinline__ __device__ void update(TensorS& s, TensorO& o, float scale_log2) {
    static_assert(decltype(size<0>(s))::value == kRows);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int c = 0; c < size<1>(s); ++c) m = fmaxf(m, s(r, c));
      m = quad_max(m);
      // A row that has seen only masked keys keeps max -inf; use 0 as the offset so that
      // exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
      const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
      if (!kFirst && m != row_max[r]) {
        // exp2(-inf) = 0 when the previous max was -inf: O and l are still 0 then.
        const float rescale = fast_exp2(row_max[r] * scale_log2 - m_scaled);
        row_sum[r] *= rescale;
#pragma unroll
        for (int c = 0; c < size<1>(o); ++c) o(r, c) *= rescale;
      }
      row_max[r] = m;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < size<1>(s); ++c) {
        const float p = fast_exp2(s(r, c) * scale_log2 - m_scaled);
        s(r, c) = p;
        sum += p;
      }
      row_sum[r] += sum;
    }
  }

  // Normalises O and returns each row's lse (natural log, scale included) in `lse`.
  // Rows without a visible key (sum 0) get O = 0 and lse = -inf, never NaN.
  template <class TensorO>
  __forceinline__ __device__ void finalize(TensorO& o, float lse_scale, float (&lse)[kRows]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_sum(row_sum[r]);
      const bool empty = sum == 0.f || sum != sum;
      const float inv = empty ? 0.f : 1.f / sum;
      lse[r] = empty ? -INFINITY : row_max[r] * lse_scale + logf(sum);
#pragma unroll
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= inv;
    }
  }
};

}  // namespace flashcpp::detail::cuda
