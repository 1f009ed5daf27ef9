#pragma once
// The block products of attention on a block the mask cuts through: those that sum over keys,
// P.V (forward) and dS.K (backward dQ), and those that sum over query rows, P^T dO and dS^T Q
// (backward dV, dK). A plain block product also adds 0 * V[j] for the keys a row does not see
// (0 * Q[i] for the rows a key is not seen by), which is NaN when V[j] (Q[i]) holds NaN or Inf:
// garbage in a KV cache's padding, say, or one bad query row. A pair the mask hides must
// contribute exactly nothing (docs/semantics.md). Blocks whose B rows are all finite take the
// plain product (0 * finite is exactly 0), the rest go row by row (key by key) over the
// visible pairs.
#include <cstdint>

#include "cpu/block_gemm.hpp"
#include "cpu/block_mask.hpp"

namespace flashcpp::detail::cpu {

// In both, A is [rows][cols] (row i, key j): `a` holds A (op_a none, A[i, j] = a[i * lda + j])
// or its transpose (op_a transpose, A[i, j] = a[j * lda + i]).

// C[i, :] += alpha * sum over the keys j of [c0, c0 + cols) that row r0 + i sees of
// A[i, j - c0] * B[j - c0, :], for rows i < rows; B rows have n columns.
void visible_product(const BlockMask& mask, std::int64_t r0, int rows, std::int64_t c0, int cols,
                     int n, float alpha, Op op_a, const float* a, std::int64_t lda,
                     const float* b, std::int64_t ldb, float* c, std::int64_t ldc);

// C[j, :] += alpha * sum over the rows i of [r0, r0 + rows) that see key c0 + j of
// A[i, j] * B[i, :], for keys j < cols; B rows have n columns.
void visible_product_by_key(const BlockMask& mask, std::int64_t r0, int rows, std::int64_t c0,
                            int cols, int n, float alpha, Op op_a, const float* a,
                            std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                            std::int64_t ldc);

}  // namespace flashcpp::detail::cpu
