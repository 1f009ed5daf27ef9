#pragma once
// The (rows, dim, heads, batch) extents the sm90 TMA descriptors of a call describe, read by
// the launchers (host) and by the kernels (device). Padded calls: one sequence per batch entry,
// so rows past a sequence's end load as zeros and stores past it are clipped. Varlen calls: one
// batch entry holding every packed row; a tile addresses its sequence through SeqlenInfo's
// first row, and rows past the sequence's end belong to the next sequence (the kernels zero
// them in shared memory and store such tiles without TMA).
#include "common/params.hpp"

namespace flashcpp::detail::cuda::sm90 {

__host__ __device__ inline int tma_rows_q(const ForwardParams& p) {
  return p.is_varlen() ? int(p.total_rows_q) : p.seqlen_q;
}
__host__ __device__ inline int tma_rows_k(const ForwardParams& p) {
  return p.is_varlen() ? int(p.total_rows_k) : p.seqlen_k;
}
__host__ __device__ inline int tma_batches(const ForwardParams& p) {
  return p.is_varlen() ? 1 : p.batch;
}

}  // namespace flashcpp::detail::cuda::sm90
