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

#include "common/half.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/sequence.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cpu {
namespace {

// The largest finite |x| of each row, on the bits: without the sign bit, finite values of
// fp32, fp16 and bf16 order like their integers, and every exponent bit set means NaN or Inf.
// Integer max reductions vectorise; this pass runs on every call, so it must stay cheap.
template <typename Bits>
Bits max_finite_bits(const Bits* row, int dim, Bits magnitude_mask, Bits infinity) {
  Bits largest = 0;
#pragma omp simd reduction(max : largest)
  for (int d = 0; d < dim; ++d) {
    const Bits a = row[d] & magnitude_mask;
    const Bits finite = a < infinity ? a : 0;
    largest = finite > largest ? finite : largest;
  }
  return largest;
}

float max_finite_abs(const void* data, ElementType type, const Strides& s, std::int64_t batch,
                     std::int64_t rows, int heads, int dim) {
  std::uint32_t largest = 0;  // bits of the dtype
#pragma omp parallel for collapse(2) reduction(max : largest)
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int h = 0; h < heads; ++h) {
        const std::int64_t offset = b * s.batch + r * s.row + h * s.head;
        std::uint32_t bits;
        if (type == ElementType::fp32)
          bits = max_finite_bits(static_cast<const std::uint32_t*>(data) + offset, dim,
                                 0x7fffffffu, 0x7f800000u);
        else
          bits = max_finite_bits(static_cast<const std::uint16_t*>(data) + offset, dim,
                                 std::uint16_t{0x7fff},
                                 static_cast<std::uint16_t>(type == ElementType::fp16 ? 0x7c00 : 0x7f80));
        largest = std::max(largest, bits);
      }
    }
  }
  if (type == ElementType::fp32) return std::bit_cast<float>(largest);
  const auto half = static_cast<std::uint16_t>(largest);
  return type == ElementType::fp16 ? fp16_to_float(half) : bf16_to_float(half);
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
