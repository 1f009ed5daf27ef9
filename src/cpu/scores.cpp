#include "cpu/scores.hpp"

#include <cmath>

#include "cpu/block_gemm.hpp"

namespace flashcpp::detail::cpu {

void block_scores(const float* q, std::int64_t ldq, const float* k, std::int64_t ldk, int dim,
                  const ScoreTransform& transform, const BlockMask& mask, std::int64_t r0, int rows,
                  std::int64_t c0, int cols, float* s, float* tanh_out) {
  block_gemm(Op::none, Op::transpose, rows, cols, dim, transform.alpha, q, ldq, k, ldk, 0.0f, s,
             cols);
  const std::int64_t count = std::int64_t{rows} * cols;
  if (transform.softcap_log2 > 0) {
    for (std::int64_t e = 0; e < count; ++e) {
      const float t = std::tanh(s[e]);
      if (tanh_out) tanh_out[e] = t;
      s[e] = transform.softcap_log2 * t;
    }
  }
  if (!mask.is_full(r0, r0 + rows, c0, c0 + cols)) mask.apply(s, cols, r0, rows, c0, cols);
}

}  // namespace flashcpp::detail::cpu
