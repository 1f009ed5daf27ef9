#pragma once
// What the sm90 forward kernel receives: the common kernel parameters plus the TMA
// descriptors of Q, K, V (loads) and O (store; unused where O is stored from registers) built
// on the host (passed as a __grid_constant__ parameter, so
// the descriptors live in parameter memory where TMA can read them).
#include "cuda/common/fwd_kernel_params.hpp"
#include "cuda/sm90/tma_extents.hpp"

namespace flashcpp::detail::cuda::sm90 {

template <class Traits>
struct FwdParams {
  FwdKernelParams kp;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
  typename Traits::TmaO tma_o;
  // Paged instantiation only (empty otherwise): whole key blocks of a page, and boxes of
  // kPageBoxRowsWide rows (tma_k/tma_v: boxes of kPageBoxRows).
  typename Traits::TmaKWholeBlock tma_k_whole;
  typename Traits::TmaVWholeBlock tma_v_whole;
  typename Traits::TmaKWideBox tma_k_wide;
  typename Traits::TmaVWideBox tma_v_wide;
};

}  // namespace flashcpp::detail::cuda::sm90
