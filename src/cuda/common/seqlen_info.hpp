#pragma once
// Where sequence b lives: padded batches address it by batch stride, varlen batches by
// cu_seqlens (read on the device, so the host never synchronises). All offsets int64.
#include <cstdint>

#include "common/params.hpp"

namespace flashcpp::detail::cuda {

struct SeqlenInfo {
  int seqlen_q;            // this sequence's query count
  int seqlen_k;            // this sequence's key count
  std::int64_t row_q;      // first query row (varlen: cu_seqlens_q[b]; padded: 0)
  std::int64_t row_k;      // first key row
  std::int64_t batch_q;    // b (padded) or 0 (varlen): multiplies the batch strides
  std::int64_t batch_k;

  __device__ __forceinline__ SeqlenInfo(const ForwardParams& p, int b) {
    if (p.cu_seqlens_q != nullptr) {
      const int q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
      const int k0 = p.cu_seqlens_k[b], k1 = p.cu_seqlens_k[b + 1];
      seqlen_q = q1 - q0;
      seqlen_k = k1 - k0;
      row_q = q0;
      row_k = k0;
      batch_q = batch_k = 0;
    } else {
      seqlen_q = p.seqlen_q;
      seqlen_k = p.seqlen_k;
      row_q = row_k = 0;
      batch_q = batch_k = b;
    }
  }

  __device__ __forceinline__ std::int64_t offset(const Strides& s, std::int64_t batch,
                                                 std::int64_t row0, int head) const {
    return batch * s.batch + row0 * s.row + std::int64_t(head) * s.head;
  }
};

}  // namespace flashcpp::detail::cuda
