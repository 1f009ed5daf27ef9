#pragma once
// The real head dim of V, O, dO and dV that an sm90a backward instantiation bounds its loads
// and stores with. Instantiations with D == Dv only run calls with head_dim == head_dim_v and
// read head_dim: the same value, and the code they had before Dv existed (no extra parameter
// load, so they stay bit-for-bit the kernels that were measured).
#include "common/params.hpp"

namespace flashcpp::detail::cuda::sm90 {

template <class Traits>
__host__ __device__ inline int value_head_dim(const ForwardParams& p) {
  return Traits::kHeadDim == Traits::kHeadDimV ? p.head_dim : p.head_dim_v;
}

}  // namespace flashcpp::detail::cuda::sm90
