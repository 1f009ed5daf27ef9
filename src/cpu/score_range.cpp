// Scores that overflow float32. The CPU backends keep scores in fp32 (the reference stores lse
// in fp32): |scale * q.k| <= scale * D * max|q| * max|k|, and the softmax takes differences of
// two scores, so twice the bound (times log2(e), the tiled backend's unit) must stay finite.
// Only finite values count: NaN and Inf in the inputs follow the NaN rules instead.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/element_io.hpp"
#include "cpu/sequence.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cpu {
namespace {

float max_finite_abs(const void* data, ElementType type, const Strides& s, std::int64_t batch,
                     std::int64_t rows, int heads, int dim) {
  float largest = 0.0f;
#pragma omp parallel for collapse(2) reduction(max : largest)
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t r = 0; r < rows; ++r) {
      std::vector<float> row(static_cast<std::size_t>(dim));
      for (int h = 0; h < heads; ++h) {
        load_row(data, type, b * s.batch + r * s.row + h * s.head, dim, row.data());
        for (float x : row) {
          const float a = std::fabs(x);
          if (a <= FLT_MAX) largest = std::max(largest, a);
        }
      }
    }
  }
  return largest;
}

}  // namespace

void check_scores_fit(const ForwardParams& p) {
  if (p.softcap > 0) return;  // the softcap bounds the scores; tanh(+-inf) is +-1
  const bool varlen = p.is_varlen();
  const std::int64_t batch = varlen ? 1 : p.batch;
  const float q_max = max_finite_abs(p.q, p.dtype, p.q_stride, batch,
                                     varlen ? total_rows_q(p) : p.seqlen_q, p.heads_q, p.head_dim);
  const float k_max = max_finite_abs(p.k, p.dtype, p.k_stride, batch,
                                     varlen ? total_rows_k(p) : p.seqlen_k, p.heads_kv, p.head_dim);
  const double dot = double{q_max} * k_max * p.head_dim;
  const double scaled = dot * std::max(1.0, double{p.scale} * 1.4426950408889634);
  if (2 * scaled <= FLT_MAX) return;
  std::ostringstream message;
  message << "q, k: scores overflow float32 (softmax_scale " << p.scale << ", max|q| " << q_max
          << ", max|k| " << k_max << ", head dim " << p.head_dim
          << "); scale the inputs or softmax_scale down";
  throw Error(message.str());
}

}  // namespace flashcpp::detail::cpu
