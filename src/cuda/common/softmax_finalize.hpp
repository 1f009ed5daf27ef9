#pragma once
// The end of every forward's online softmax (sm80 and sm90a): O divided by each row's sum and
// the row's lse. Rows without a visible key, or whose weights are all 0 (sum 0), get O = 0 and
// lse = -inf; a NaN sum (a visible score was NaN or +Inf) gives NaN O and lse.
#include <cmath>

#include <cute/tensor.hpp>

#include "cuda/common/fragment_utils.hpp"

namespace flashcpp::detail::cuda {

// o: O accumulator in (row, col) view; row_max and row_sum: the softmax's running statistics
// of the rows this thread holds (sums not yet reduced over the quad); lse in natural-log units.
template <int kRows, class TensorO>
__forceinline__ __device__ void finalize_softmax(TensorO& o, const float (&row_max)[kRows],
                                                 const float (&row_sum)[kRows], float lse_scale,
                                                 float (&lse)[kRows]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const bool empty = sum == 0.f;
    const float inv = empty ? 0.f : 1.f / sum;
    lse[r] = empty ? -INFINITY : row_max[r] * lse_scale + logf(sum);
#pragma unroll
    for (int c = 0; c < cute::size<1>(o); ++c) o(r, c) *= inv;
  }
}

}  // namespace flashcpp::detail::cuda
