#pragma once
// The sm80 forward's online softmax over the rows a thread holds in its S accumulator (FlashAttention-2):
// running max m and running sum l per row, O rescaled by exp2((m_old - m_new) * scale) only
// when some row max of the warp grew by more than 2^8 (see kMaxGrowthLog2), exp2 with the
// scale folded into one FFMA, and the sum kept per thread (no shuffles) until finalize.
#include <cmath>

#include "cuda/common/fast_exp2.hpp"
#include "cuda/common/fragment_utils.hpp"
#include "cuda/common/softmax_finalize.hpp"

namespace flashcpp::detail::cuda {

// Reduction of N values in four interleaved chains, combined at the end: N/4 + 2 dependent
// steps instead of N - 1. The row max and row sum of a thread's S row were serial chains (15
// dependent FMNMX / FADD at d128), and fixed-latency dependencies were 38% of the d128
// kernel's stall cycles. (A full pairwise tree raised the d64 128x128 spills from 36/64 B
// to 176/152 B.)
template <int N, class Op>
__forceinline__ __device__ float chain4_reduce(const float (&t)[N], Op op) {
  static_assert(N % 4 == 0);
  float a[4] = {t[0], t[1], t[2], t[3]};
#pragma unroll
  for (int c = 4; c < N; ++c) a[c % 4] = op(a[c % 4], t[c]);
  return op(op(a[0], a[1]), op(a[2], a[3]));
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

  // A row's exp2 offset (row_max) moves only when the row max grew by more than this many
  // powers of two: P = exp2(s * scale - row_max * scale) then stays <= 2^8, harmless in fp32
  // sums and bf16/fp16 P, and most blocks skip the O rescale (acc_o FMULs: 128 per thread
  // and block at d128, as many as the exp2 FFMAs and MUFUs together). The test is taken
  // for the whole warp at once (vote), so the skipped rescale is a real branch rather than
  // predicated instructions. Finalize divides by the sum taken with the same offsets, so the
  // result is the softmax whatever offsets were used.
  static constexpr float kMaxGrowthLog2 = 8.f;

  // Each row's max over the block (s in (row, col) view), reduced over the quad.
  template <class TensorS>
  __forceinline__ __device__ static void block_max(TensorS const& s, float (&max)[kRows]) {
    static_assert(decltype(size<0>(s))::value == kRows);
    constexpr int kCols = decltype(size<1>(s))::value;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float t[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) t[c] = s(r, c);
      max[r] = quad_max(chain4_reduce(t, [](float a, float b) { return fmaxf(a, b); }));
    }
  }

  // s: S accumulator in (row, col) view, overwritten with unnormalised P.
  // o: O accumulator in (row, col) view.
  // kCheckInf: s may hold -inf (a masked block), so a row max can still be -inf. (A row whose
  // scores are all -Inf in an uncut block has a -inf max too: exp_offset covers both.)
  // (The max and the growth test in one loop: as two loops, the d256 128x64 two-buffer
  // kernel spilled 272/304 B.)
  template <bool kCheckInf, class TensorS, class TensorO>
  __forceinline__ __device__ void update(TensorS& s, TensorO& o, float scale_log2) {
    static_assert(decltype(size<0>(s))::value == kRows);
    constexpr int kCols = decltype(size<1>(s))::value;
    float block_max[kRows];
    bool grow = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float t[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) t[c] = s(r, c);
      block_max[r] = quad_max(chain4_reduce(t, [](float a, float b) { return fmaxf(a, b); }));
      // -inf - -inf = NaN compares false: a row that has still seen no key needs nothing;
      // the first visible keys of a row give +inf.
      grow |= (block_max[r] - row_max[r]) * scale_log2 > kMaxGrowthLog2;
    }
    rescale_and_exponentiate<kCheckInf>(s, o, block_max, grow, scale_log2);
  }

  // update with the block's row maxima given (warp pairs: the max of both halves of the row;
  // block_max[r] >= every s(r, c)).
  template <bool kCheckInf, class TensorS, class TensorO>
  __forceinline__ __device__ void update_with_max(TensorS& s, TensorO& o,
                                                  const float (&block_max)[kRows],
                                                  float scale_log2) {
    bool grow = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      grow |= (block_max[r] - row_max[r]) * scale_log2 > kMaxGrowthLog2;
    rescale_and_exponentiate<kCheckInf>(s, o, block_max, grow, scale_log2);
  }

  // The rest of update: O and the sums rescaled where `grow` (some row of the warp) asks,
  // then s -> exp2(s * scale - max * scale) and the row sums.
  template <bool kCheckInf, class TensorS, class TensorO>
  __forceinline__ __device__ void rescale_and_exponentiate(TensorS& s, TensorO& o,
                                                           const float (&block_max)[kRows],
                                                           bool grow, float scale_log2) {
    static_assert(decltype(size<0>(s))::value == kRows);
    constexpr int kCols = decltype(size<1>(s))::value;
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float m = fmaxf(row_max[r], block_max[r]);
        const float m_scaled = exp_offset<kCheckInf>(m, scale_log2);
        // exp2(-inf) = 0 when the previous max was -inf: O and l are still 0 then.
        const float rescale = fast_exp2(row_max[r] * scale_log2 - m_scaled);
        row_sum[r] *= rescale;
#pragma unroll
        for (int c = 0; c < size<1>(o); ++c) o(r, c) *= rescale;
        row_max[r] = m;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float m_scaled = exp_offset<kCheckInf>(row_max[r], scale_log2);
      float t[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        s(r, c) = fast_exp2(s(r, c) * scale_log2 - m_scaled);
        t[c] = s(r, c);
      }
      row_sum[r] += chain4_reduce(t, [](float a, float b) { return a + b; });
    }
  }

  // The exponent's offset for a row max m: m * scale_log2, but finite where m is -inf (a row
  // that has seen only -inf scores: masked keys, or scores of -Inf in its inputs), so that its
  // -inf scores give exp2(-inf) = 0 rather than exp2(-inf + inf) = NaN. A masked block
  // (kCheckInf) uses 0; an uncut block clamps at -FLT_MAX, one FMNMX where the test would be
  // two instructions (only an all -inf row reaches the clamp: a finite max is never below it,
  // and a NaN max still gives NaN weights through the NaN scores themselves).
  template <bool kCheckInf>
  __forceinline__ __device__ static float exp_offset(float m, float scale_log2) {
    if constexpr (kCheckInf)
      return m == -INFINITY ? 0.f : m * scale_log2;
    else
      return fmaxf(m * scale_log2, -3.402823466e38f);
  }

  // Normalises O and returns each row's lse (common/softmax_finalize.hpp).
  template <class TensorO>
  __forceinline__ __device__ void finalize(TensorO& o, float lse_scale, float (&lse)[kRows]) {
    finalize_softmax(o, row_max, row_sum, lse_scale, lse);
  }
};

}  // namespace flashcpp::detail::cuda
