#pragma once
// Online softmax of the sm90 forward, split in two halves so that the O rescale can wait for
// the in-flight P V product (intra-warpgroup overlap): `step` turns S into unnormalised P and
// returns each row's O rescale factor without touching O; `rescale_o` applies it once the
// product that writes O has completed (touching O earlier would serialise the wgmma, C7515).
// Row statistics follow the FlashAttention-2 rules of sm80/softmax.hpp: exp2 with the scale
// folded into one FFMA, a -inf row max replaced by 0 as the offset, sums kept per thread until
// finalize.
#include <cmath>

#include <cute/tensor.hpp>

#include "cuda/common/fragment_utils.hpp"
#include "cuda/common/softmax_finalize.hpp"
#include "cuda/common/fast_exp2.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

// wgmma accumulator ((2 cols, 2 rows, N/8), MMA_M, MMA_N) -> ((2 rows, MMA_M), (2 cols, N/8,
// MMA_N)): each thread holds 2 rows (lane/4 and lane/4 + 8 of its warp's 16) of the
// warpgroup's 64, and the 4 threads of a quad share them, as with mma.sync.
template <class Layout>
__forceinline__ __device__ auto wgmma_acc_rowcol(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3);
  static_assert(decltype(rank<0>(acc))::value == 3);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// S accumulator ((2, 2, N/8), MMA_M, MMA_N) -> A operand ((2, 2, 2), MMA_M, N/16 * MMA_N) of
// the 16-bit register-sourced wgmma: two neighbouring n8 column groups of S are exactly the
// registers of one k16 slice of A, so the converted P is consumed in place.
template <class Layout>
__forceinline__ __device__ auto wgmma_acc_as_a_operand(Layout acc) {
  auto l = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});  // (2,2,(2,N/16))
  return make_layout(make_layout(get<0>(l), get<1>(l), get<2, 0>(l)), get<1>(acc),
                     coalesce(make_layout(get<2, 1>(l), get<2>(acc))));
}

template <int kRows>
struct Softmax {
  float row_max[kRows];
  float row_sum[kRows];

  __forceinline__ __device__ Softmax() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // s: S in (row, col) view, overwritten with unnormalised P. o_scale[r]: factor O must be
  // multiplied by before the next P V (exp2 of the max shift; 0 while the row had no key).
  template <class TensorS>
  __forceinline__ __device__ void step(TensorS& s, float scale_log2, float (&o_scale)[kRows]) {
    static_assert(decltype(size<0>(s))::value == kRows);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int c = 0; c < size<1>(s); ++c) m = fmaxf(m, s(r, c));
      m = quad_max(m);
      const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
      // exp2(-inf) = 0 when the previous max was -inf: O and the sum are still 0 then.
      o_scale[r] = fast_exp2(row_max[r] * scale_log2 - m_scaled);
      row_max[r] = m;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < size<1>(s); ++c) {
        const float p = fast_exp2(s(r, c) * scale_log2 - m_scaled);
        s(r, c) = p;
        sum += p;
      }
      row_sum[r] = row_sum[r] * o_scale[r] + sum;
    }
  }

  // Whether any row of the warp must rescale O (a warp-uniform answer): o_scale is exactly 1
  // where the row maximum did not move (once it has settled on a long row, most blocks), and
  // then the multiplies are skipped. The branch also keeps ptxas from putting the wait for the
  // in-flight P V product above the softmax: with the softmax and the wait in one basic block
  // (the FP8 kernels, which have no V-scan test between them) it scheduled the wait first, so
  // the softmax did not overlap the product (sm90-kernels.md, "Wait placement").
  __forceinline__ __device__ static bool any_row_rescales(const float (&o_scale)[kRows]) {
    bool moved = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) moved |= o_scale[r] != 1.f;
    return __any_sync(0xffffffffu, moved);
  }

  template <class TensorO>
  __forceinline__ __device__ static void rescale_o(TensorO& o, const float (&o_scale)[kRows]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= o_scale[r];
  }

  // Normalises O and returns each row's lse (common/softmax_finalize.hpp).
  template <class TensorO>
  __forceinline__ __device__ void finalize(TensorO& o, float lse_scale, float (&lse)[kRows]) {
    finalize_softmax(o, row_max, row_sum, lse_scale, lse);
  }
};

}  // namespace flashcpp::detail::cuda::sm90
