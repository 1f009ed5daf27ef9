#include "cpu/visible_product.hpp"

#include <algorithm>
#include <bit>

#include "cpu/block_gemm.hpp"

namespace flashcpp::detail::cpu {
namespace {

// NaN and Inf have every exponent bit set; integer tests vectorise where float ones do not.
bool all_finite(const float* b, int rows, int n, std::int64_t ldb) {
  std::uint32_t non_finite = 0;
  for (int r = 0; r < rows; ++r) {
    const float* row = b + r * ldb;
#pragma omp simd reduction(| : non_finite)
    for (int j = 0; j < n; ++j) {
      const std::uint32_t exponent = std::bit_cast<std::uint32_t>(row[j]) & 0x7f800000u;
      non_finite |= exponent == 0x7f800000u ? 1u : 0u;
    }
  }
  return non_finite == 0;
}

// Where A[i, j] is.
const float* element(Op op_a, const float* a, std::int64_t lda, std::int64_t i, std::int64_t j) {
  return op_a == Op::none ? a + i * lda + j : a + j * lda + i;
}

}  // namespace

void visible_product(const BlockMask& mask, std::int64_t r0, int rows, std::int64_t c0, int cols,
                     int n, float alpha, Op op_a, const float* a, std::int64_t lda,
                     const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  if (mask.is_full(r0, r0 + rows, c0, c0 + cols) || all_finite(b, cols, n, ldb)) {
    block_gemm(op_a, Op::none, rows, n, cols, alpha, a, lda, b, ldb, 1.0f, c, ldc);
    return;
  }
  for (int i = 0; i < rows; ++i) {
    const KeyRange keys = mask.keys(r0 + i);
    const std::int64_t begin = std::max(keys.begin, c0) - c0;
    const std::int64_t end = std::min(keys.end, c0 + cols) - c0;
    if (begin >= end) continue;
    block_gemm(op_a, Op::none, 1, n, static_cast<int>(end - begin), alpha,
               element(op_a, a, lda, i, begin), lda, b + begin * ldb, ldb, 1.0f, c + i * ldc, ldc);
  }
}

void visible_product_by_key(const BlockMask& mask, std::int64_t r0, int rows, std::int64_t c0,
                            int cols, int n, float alpha, Op op_a, const float* a,
                            std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                            std::int64_t ldc) {
  // The product runs over A^T (keys x rows): op_a none means `a` holds A, so A^T is transposed.
  const Op op_at = op_a == Op::none ? Op::transpose : Op::none;
  if (mask.is_full(r0, r0 + rows, c0, c0 + cols) || all_finite(b, rows, n, ldb)) {
    block_gemm(op_at, Op::none, cols, n, rows, alpha, a, lda, b, ldb, 1.0f, c, ldc);
    return;
  }
  for (int j = 0; j < cols; ++j) {
    const RowRange seen = mask.rows_of_keys(c0 + j, c0 + j + 1);
    const std::int64_t begin = std::max(seen.begin, r0) - r0;
    const std::int64_t end = std::min(seen.end, r0 + rows) - r0;
    if (begin >= end) continue;
    block_gemm(op_at, Op::none, 1, n, static_cast<int>(end - begin), alpha,
               element(op_a, a, lda, begin, j), lda, b + begin * ldb, ldb, 1.0f, c + j * ldc, ldc);
  }
}

}  // namespace flashcpp::detail::cpu
