// Rows of a packed (varlen) output past the last sequence, cu_seqlens[B] ... total - 1, belong
// to no sequence. They are written all the same (out 0, lse -inf, gradients 0), so an output
// the caller allocated without initialising holds no garbage (docs/semantics.md).
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/element_io.hpp"

namespace flashcpp::detail::cpu {
namespace {

void zero_rows(void* base, ElementType type, const Strides& s, std::int64_t begin,
               std::int64_t end, int heads, int dim) {
  const std::vector<float> zeros(static_cast<std::size_t>(dim), 0.0f);
  for (std::int64_t r = begin; r < end; ++r)
    for (int h = 0; h < heads; ++h) store_row(base, type, r * s.row + h * s.head, zeros.data(), dim);
}

}  // namespace

void clear_varlen_tails(const ForwardParams& p, std::int64_t rows_q) {
  const std::int64_t end = p.cu_seqlens_q[p.batch];
  zero_rows(p.out, p.dtype, p.out_stride, end, rows_q, p.heads_q, p.head_dim_v);
  if (p.lse == nullptr) return;
  for (int h = 0; h < p.heads_q; ++h)
    for (std::int64_t r = end; r < rows_q; ++r)
      p.lse[h * p.lse_head_stride + r] = -std::numeric_limits<float>::infinity();
}

void clear_varlen_tails(const BackwardParams& p, std::int64_t rows_q, std::int64_t rows_k) {
  zero_rows(p.dq, p.dtype, p.dq_stride, p.cu_seqlens_q[p.batch], rows_q, p.heads_q, p.head_dim);
  const std::int64_t end_k = p.cu_seqlens_k[p.batch];
  zero_rows(p.dk, p.dtype, p.dk_stride, end_k, rows_k, p.heads_kv, p.head_dim);
  zero_rows(p.dv, p.dtype, p.dv_stride, end_k, rows_k, p.heads_kv, p.head_dim_v);
}

}  // namespace flashcpp::detail::cpu
