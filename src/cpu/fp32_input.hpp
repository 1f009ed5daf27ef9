#pragma once
// A read-only fp32 view of an input tensor for the generic tiled forward: the tensor itself
// when it is fp32, otherwise a converted copy made once up front. K and V blocks are read by every query
// block, so converting per block would repeat the conversion Nq / block_m times; the copy costs
// 2x the input's memory instead.
#include <cstdint>
#include <vector>

#include "common/params.hpp"
#include "cpu/sequence.hpp"

namespace flashcpp::detail::cpu {

class Fp32Input {
 public:
  // `batch` and `rows` span the tensor: (B, N) padded, (1, total rows) varlen.
  Fp32Input(const void* data, ElementType type, const Strides& stride, std::int64_t batch,
            std::int64_t rows, int heads, int dim);
  // data_ may point into copy_: moving keeps the buffer, copying would not.
  Fp32Input(const Fp32Input&) = delete;
  Fp32Input& operator=(const Fp32Input&) = delete;
  Fp32Input(Fp32Input&&) = default;

  // Row `row` of a sequence in a tensor laid out like q (q, out, dout) or like k (k, v).
  const float* q_row(const Sequence& seq, std::int64_t row, int head) const {
    return data_ + q_offset(stride_, seq, row, head);
  }
  const float* k_row(const Sequence& seq, std::int64_t row, int head) const {
    return data_ + k_offset(stride_, seq, row, head);
  }
  std::int64_t ld() const { return stride_.row; }

 private:
  std::vector<float> copy_;
  const float* data_;
  Strides stride_;
};

// The views of q-like ([.., Nq, Hq, ..]) and k-like ([.., Nk, Hkv, ..]) tensors of a call.
inline Fp32Input q_input(const ForwardParams& p, const void* data, const Strides& stride, int dim) {
  if (p.is_varlen()) return {data, p.dtype, stride, 1, total_rows_q(p), p.heads_q, dim};
  return {data, p.dtype, stride, p.batch, p.seqlen_q, p.heads_q, dim};
}
inline Fp32Input k_input(const ForwardParams& p, const void* data, const Strides& stride, int dim) {
  if (p.is_varlen()) return {data, p.dtype, stride, 1, total_rows_k(p), p.heads_kv, dim};
  return {data, p.dtype, stride, p.batch, p.seqlen_k, p.heads_kv, dim};
}

}  // namespace flashcpp::detail::cpu
