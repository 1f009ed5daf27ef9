#include "cpu/fp32_rows.hpp"

#include <algorithm>

#include "common/half.hpp"

namespace flashcpp::detail::cpu {

Fp32Rows::Fp32Rows(ElementType, int max_rows, int dim)
    : buffer_(static_cast<std::size_t>(max_rows) * dim) {}

void Fp32Rows::load(const void* base, ElementType type, std::int64_t first, std::int64_t ld,
                    int rows, int dim) {
  if (type == ElementType::fp32) {
    const float* src = static_cast<const float*>(base) + first;
    if (ld % 1024 != 0 || rows == 1) {
      data_ = src;
      ld_ = ld;
      return;
    }
    for (int i = 0; i < rows; ++i)
      std::copy_n(src + i * ld, dim, buffer_.data() + static_cast<std::int64_t>(i) * dim);
    data_ = buffer_.data();
    ld_ = dim;
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
