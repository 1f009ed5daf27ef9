#pragma once
// What the sm90 backward main kernel receives: the common backward kernel parameters (scales
// folded on the host, workspace pointers) plus the TMA descriptors of Q, dO, K and V built on
// the host, and those of the dK and dV stores (a __grid_constant__ parameter, so the
// descriptors live where TMA can read them).
#include "cuda/common/bwd_kernel_params.hpp"

namespace flashcpp::detail::cuda::sm90 {

template <class Traits>
struct BwdParams {
  BwdKernelParams kp;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaDo tma_do;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
  typename Traits::TmaDkv tma_dk;  // stores (split-by-keys tiles only)
  typename Traits::TmaDkv tma_dv;
};

}  // namespace flashcpp::detail::cuda::sm90
