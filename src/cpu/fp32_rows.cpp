#include "cpu/fp32_rows.hpp"

#include "common/half.hpp"

namespace flashcpp::detail::cpu {

Fp32Rows::Fp32Rows(ElementType type, int max_rows, int dim)
    : buffer_(type == ElementType::fp32 ? 0 : static_cast<std::size_t>(max_rows) * dim) {}

void Fp32Rows::load(const void* base, ElementType type, std::int64_t first, std::int64_t ld,
                    int rows, int dim) {
  if (type == ElementType::fp32) {
    data_ = static_cast<const float*>(base) + first;
    ld_ = ld;
    return;
  }
  const auto* src = static_cast<const std::uint16_t*>(base) + first;
  float* dst = buffer_.data();
  // The type test outside the loops, so the bf16 widening vectorises.
  for (int i = 0; i < rows; ++i) {
    const std::uint16_t* s = src + i * ld;
    float* d = dst + static_cast<std::int64_t>(i) * dim;
    if (type == ElementType::bf16) {
#pragma omp simd
      for (int j = 0; j < dim; ++j) d[j] = bf16_to_float(s[j]);
    } else {
      for (int j = 0; j < dim; ++j) d[j] = fp16_to_float(s[j]);
    }
  }
  data_ = dst;
  ld_ = dim;
}

}  // namespace flashcpp::detail::cpu
