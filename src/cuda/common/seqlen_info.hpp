#pragma once
// Where sequence b lives: padded batches address it by batch stride, varlen batches by
// cu_seqlens (read on the device, so the host never synchronises). All offsets int64.
// Device-side offsets are not checked by the host, so they are clamped here, where every kernel
// reads them: a sequence starts inside its packed tensor and holds at most max_seqlen rows
// (p.seqlen_q/k, what grids and workspaces are sized by) and at most the rows left in the
// tensor. Wrong offsets then give wrong numbers but no access outside the given buffers
// (docs/semantics.md, "Device-side lengths").
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
  std::int64_t lse_row0;   // lse of the sequence's row i, head h: lse_row0 + h * head stride + i

  SeqlenInfo() = default;

  // Sequence b of a call a kernel instantiation knows to be padded: the compiler sees the zero
  // row offsets (the general constructor keeps both cases live in registers).
  __device__ __forceinline__ static SeqlenInfo padded(const ForwardParams& p, int b) {
    SeqlenInfo s;
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqlen_k;
    s.row_q = s.row_k = 0;
    s.batch_q = s.batch_k = b;
    s.lse_row0 = b * p.lse_batch_stride;
    return s;
  }

  __device__ __forceinline__ SeqlenInfo(const ForwardParams& p, int b) {
    if (p.cu_seqlens_q != nullptr) {
      clamp_rows(p.cu_seqlens_q[b], p.cu_seqlens_q[b + 1], p.total_rows_q, p.seqlen_q, row_q,
                 seqlen_q);
      clamp_rows(p.cu_seqlens_k[b], p.cu_seqlens_k[b + 1], p.total_rows_k, p.seqlen_k, row_k,
                 seqlen_k);
      batch_q = batch_k = 0;
      lse_row0 = row_q;
    } else if (p.seqused_k != nullptr) {
      // Sequences of seqlen_q rows and seqlen_k key slots, seqused_k[b] + add of them in use.
      seqlen_q = p.seqlen_q;
      row_q = std::int64_t(b) * p.seqlen_q;
      const std::int64_t used = std::int64_t(p.seqused_k[b]) + p.seqused_k_add;
      seqlen_k = int(used < 0 ? 0 : used > p.seqlen_k ? p.seqlen_k : used);
      row_k = std::int64_t(b) * p.seqlen_k;
      batch_q = batch_k = 0;
      lse_row0 = b * p.lse_batch_stride;
    } else {
      seqlen_q = p.seqlen_q;
      seqlen_k = p.seqlen_k;
      row_q = row_k = 0;
      batch_q = batch_k = b;
      lse_row0 = b * p.lse_batch_stride;
    }
  }

  // Rows [begin, end) of a tensor of `total` rows, at most `max_rows` of them.
  __device__ __forceinline__ static void clamp_rows(std::int64_t begin, std::int64_t end,
                                                    std::int64_t total, int max_rows,
                                                    std::int64_t& first, int& count) {
    first = begin < 0 ? 0 : begin > total ? total : begin;
    std::int64_t n = end - first;
    if (n > total - first) n = total - first;
    if (n > max_rows) n = max_rows;
    count = n < 0 ? 0 : int(n);
  }

  __device__ __forceinline__ std::int64_t offset(const Strides& s, std::int64_t batch,
                                                 std::int64_t row0, int head) const {
    return batch * s.batch + row0 * s.row + std::int64_t(head) * s.head;
  }
};

}  // namespace flashcpp::detail::cuda
