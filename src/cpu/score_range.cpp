// Scores that overflow float32, and NaN or Inf in q and k. The CPU backends keep scores in fp32 (the reference stores lse
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

struct Range {
  std::uint32_t largest = 0;  // bits of the largest finite |x| in the dtype
  bool non_finite = false;    // some x is NaN or Inf
};

// One run of contiguous elements, on the bits: without the sign bit, finite values of fp32,
// fp16 and bf16 order like their integers, and every exponent bit set means NaN or Inf.
// Integer reductions vectorise; this pass runs on every call, so it must stay cheap.
template <typename Bits>
Range scan_run(const Bits* x, std::int64_t n, Bits infinity) {
  constexpr Bits kMagnitude = Bits(~Bits(0) >> 1);
  Bits largest = 0;
  int non_finite = 0;
#pragma omp simd reduction(max : largest) reduction(| : non_finite)
  for (std::int64_t i = 0; i < n; ++i) {
    const Bits a = x[i] & kMagnitude;
    const bool finite = a < infinity;
    largest = finite && a > largest ? a : largest;
    non_finite |= !finite;
  }
  return {largest, non_finite != 0};
}

Range scan_tensor(const void* data, ElementType type, const Strides& s, std::int64_t batch,
                  std::int64_t rows, int heads, int dim) {
  // BSHD rows hold their heads back to back: one run per row instead of one per head.
  const bool heads_packed = s.head == dim;
  const std::int64_t run = heads_packed ? std::int64_t{heads} * dim : dim;
  const int runs_per_row = heads_packed ? 1 : heads;
  std::uint32_t largest = 0;
  int non_finite = 0;
#pragma omp parallel for collapse(2) reduction(max : largest) reduction(| : non_finite)
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int h = 0; h < runs_per_row; ++h) {
        const std::int64_t offset = b * s.batch + r * s.row + h * s.head;
        const Range range =
            type == ElementType::fp32
                ? scan_run(static_cast<const std::uint32_t*>(data) + offset, run, 0x7f800000u)
                : scan_run(static_cast<const std::uint16_t*>(data) + offset, run,
                           std::uint16_t(type == ElementType::fp16 ? 0x7c00 : 0x7f80));
        largest = std::max(largest, range.largest);
        non_finite |= range.non_finite;
      }
    }
  }
  return {largest, non_finite != 0};
}

float to_float(std::uint32_t bits, ElementType type) {
  if (type == ElementType::fp32) return std::bit_cast<float>(bits);
  const auto half = static_cast<std::uint16_t>(bits);
  return type == ElementType::fp16 ? fp16_to_float(half) : bf16_to_float(half);
}

}  // namespace

bool check_scores(const ForwardParams& p) {
  const bool varlen = p.is_varlen();
  const std::int64_t batch = varlen ? 1 : p.batch;
  const Range q = scan_tensor(p.q, p.dtype, p.q_stride, batch,
                              varlen ? total_rows_q(p) : p.seqlen_q, p.heads_q, p.head_dim);
  const Range k = scan_tensor(p.k, p.dtype, p.k_stride, batch,
                              varlen ? total_rows_k(p) : p.seqlen_k, p.heads_kv, p.head_dim);
  const bool non_finite = q.non_finite || k.non_finite;
  if (p.softcap > 0) return non_finite;  // the softcap bounds the scores; tanh(+-inf) is +-1
  const float q_max = to_float(q.largest, p.dtype), k_max = to_float(k.largest, p.dtype);
  const double dot = double{q_max} * k_max * p.head_dim;
  const double scaled = dot * std::max(1.0, double{p.scale} * 1.4426950408889634);
  if (2 * scaled <= FLT_MAX) return non_finite;
  std::ostringstream message;
  message << "q, k: scores overflow float32 (softmax_scale " << p.scale << ", max|q| " << q_max
          << ", max|k| " << k_max << ", head dim " << p.head_dim
          << "); scale the inputs or softmax_scale down";
  throw Error(message.str());
}

}  // namespace flashcpp::detail::cpu
