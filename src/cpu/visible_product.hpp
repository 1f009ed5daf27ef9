#pragma once
// The products that sum over keys, P.V (forward) and dS.K (backward dQ), on a block the mask
// cuts through. A plain block product also adds 0 * V[j] for the keys a row does not see,
// which is NaN when V[j] holds NaN or Inf (garbage in a KV cache's padding, say); masked keys
// must contribute exactly nothing (docs/semantics.md). Blocks whose B rows are all finite
// take the plain product (0 * finite is exactly 0), the rest go row by row over the keys
// each row sees.
#include <cstdint>

#include "cpu/block_mask.hpp"

namespace flashcpp::detail::cpu {

// C[i, :] += alpha * sum over the keys j of [c0, c0 + cols) that row r0 + i sees of
// A[i, j - c0] * B[j - c0, :], for rows i < rows; B rows have n columns.
void visible_product(const BlockMask& mask, std::int64_t r0, int rows, std::int64_t c0, int cols,
                     int n, float alpha, const float* a, std::int64_t lda, const float* b,
                     std::int64_t ldb, float* c, std::int64_t ldc);

}  // namespace flashcpp::detail::cpu
