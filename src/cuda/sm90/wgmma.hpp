#pragma once
// One warpgroup matrix product as the sm90 mainloops issue it: fence the operands, wgmma.fence,
// all k slices, one commit. The caller chooses when to wait (warpgroup_wait<N>), so several
// products can be in flight while registers not involved in them are worked on.
#include <type_traits>

#include <cute/tensor.hpp>

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

// acc (+)= A * B over all k slices with one commit; the caller waits (warpgroup_wait<N>).
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__forceinline__ __device__ void wgmma(TiledMma& tiled_mma, TA& a, TB const& b, TC& acc) {
  // A from registers (P) rather than a shared-memory descriptor (Q): fence those registers too.
  constexpr bool kRegA =
      !std::is_same_v<std::remove_cvref_t<decltype(a.data())>, GMMA::DescriptorIterator>;
  if constexpr (kRegA) warpgroup_fence_operand(a);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  tiled_mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(tiled_mma, a(_, _, k), b(_, _, k), acc);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(acc);
  if constexpr (kRegA) warpgroup_fence_operand(a);
}

// A tensor of wgmma shared-memory descriptors whose base descriptor the compiler cannot see
// through: a product issued from it computes each k slice's descriptor (one add) where it is
// issued. Without it the compiler hoists every slice's descriptor out of the key loop and
// keeps them all in registers (2 each; at FP8 d256 the 8 of Q and 8 of K spilled).
template <class DescTensor>
__forceinline__ __device__ auto opaque_descriptors(const DescTensor& t) {
  auto base = t.data();
  asm volatile("" : "+r"(base.desc_.reg32_[0]), "+r"(base.desc_.reg32_[1]));
  return make_tensor(base, t.layout());
}

}  // namespace flashcpp::detail::cuda::sm90
