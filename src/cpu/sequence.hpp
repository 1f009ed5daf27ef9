#pragma once
// Where one batch entry's rows live, for padded and varlen (packed) layouts alike, so the
// backends address both with the same code: element (b, row, head) of a tensor sits at
// b * stride.batch + (first_row + row) * stride.row + head * stride.head, where first_row is
// cu_seqlens[b] for varlen (whose batch stride is 0) and 0 for padded tensors.
#include <cstdint>

#include "common/params.hpp"

namespace flashcpp::detail::cpu {

struct Sequence {
  int batch = 0;
  std::int64_t q_begin = 0;  // first packed row of q/out (varlen), else 0
  std::int64_t k_begin = 0;  // first packed row of k/v (varlen), else 0
  std::int64_t nq = 0;
  std::int64_t nk = 0;
};

inline Sequence sequence_of(const ForwardParams& p, int b) {
  if (!p.is_varlen()) return {b, 0, 0, p.seqlen_q, p.seqlen_k};
  const std::int32_t* cq = p.cu_seqlens_q;
  const std::int32_t* ck = p.cu_seqlens_k;
  return {b, cq[b], ck[b], cq[b + 1] - cq[b], ck[b + 1] - ck[b]};
}

// Rows of q (and out) over all batch entries: B * Nq padded, cu_seqlens_q[B] packed.
inline std::int64_t total_rows_q(const ForwardParams& p) {
  return p.is_varlen() ? p.cu_seqlens_q[p.batch] : std::int64_t{p.batch} * p.seqlen_q;
}
inline std::int64_t total_rows_k(const ForwardParams& p) {
  return p.is_varlen() ? p.cu_seqlens_k[p.batch] : std::int64_t{p.batch} * p.seqlen_k;
}

inline std::int64_t q_offset(const Strides& s, const Sequence& seq, std::int64_t row, int head) {
  return seq.batch * s.batch + (seq.q_begin + row) * s.row + head * s.head;
}
inline std::int64_t k_offset(const Strides& s, const Sequence& seq, std::int64_t row, int head) {
  return seq.batch * s.batch + (seq.k_begin + row) * s.row + head * s.head;
}
inline std::int64_t lse_offset(const ForwardParams& p, const Sequence& seq, std::int64_t row,
                               int head) {
  return seq.batch * p.lse_batch_stride + head * p.lse_head_stride + seq.q_begin + row;
}

}  // namespace flashcpp::detail::cpu
