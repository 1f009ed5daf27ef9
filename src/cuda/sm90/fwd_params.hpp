#pragma once
// What the sm90 forward kernel receives: the common kernel parameters plus the TMA
// descriptors of Q, K, V (loads) and O (store; unused where O is stored from registers) built
// on the host (passed as a __grid_constant__ parameter, so
// the descriptors live in parameter memory where TMA can read them).
#include "cuda/common/fwd_kernel_params.hpp"

namespace flashcpp::detail::cuda::sm90 {

// The (rows, dim, heads, batch) extents the TMA descriptors describe. Padded calls: one
// sequence per batch entry, so rows past a sequence's end load as zeros. Varlen calls: one
// batch entry holding every packed row; a tile addresses its sequence through SeqlenInfo's
// first row, and rows past the sequence's end belong to the next sequence.
__host__ __device__ inline int tma_rows_q(const ForwardParams& p) {
  return p.is_varlen() ? int(p.total_rows_q) : p.seqlen_q;
}
__host__ __device__ inline int tma_rows_k(const ForwardParams& p) {
  return p.is_varlen() ? int(p.total_rows_k) : p.seqlen_k;
}
__host__ __device__ inline int tma_batches(const ForwardParams& p) {
  return p.is_varlen() ? 1 : p.batch;
}

template <class Traits>
struct FwdParams {
  FwdKernelParams kp;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::TmaO tma_o;
};

}  // namespace flashcpp::detail::cuda::sm90
