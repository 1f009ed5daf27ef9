#include "cpu/fp32_input.hpp"

#include "cpu/element_io.hpp"

namespace flashcpp::detail::cpu {

Fp32Input::Fp32Input(const void* data, ElementType type, const Strides& stride, std::int64_t batch,
                     std::int64_t rows, int heads, int dim)
    : data_(static_cast<const float*>(data)), stride_(stride) {
  if (type == ElementType::fp32) return;
  // Dense [batch, rows, heads, dim]; a packed (varlen) tensor keeps batch stride 0.
  const Strides dense{stride.batch == 0 ? 0 : rows * heads * dim, std::int64_t{heads} * dim, dim};
  copy_.resize(static_cast<std::size_t>(batch * rows * heads * dim));
#pragma omp parallel for collapse(2)
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int h = 0; h < heads; ++h) {
        const std::int64_t src = b * stride.batch + r * stride.row + h * stride.head;
        const std::int64_t dst = (b * rows + r) * heads * dim + std::int64_t{h} * dim;
        load_row(data, type, src, dim, &copy_[dst]);
      }
    }
  }
  data_ = copy_.data();
  stride_ = dense;
}

}  // namespace flashcpp::detail::cpu
