#pragma once
// The two block products of the sm80 forward, software-pipelined over k: the ldmatrix for
// slice k+1 is issued before the mma.sync of slice k so shared-memory latency hides behind
// the tensor cores.
#include <cute/tensor.hpp>

namespace flashcpp::detail::cuda::sm80 {

using namespace cute;

// acc += A * B with both operands read from shared memory (S = Q K^T).
template <class TiledMma, class Acc, class RegA, class RegB, class SmemA, class SmemB,
          class CopyA, class CopyB, class ThrCopyA, class ThrCopyB>
__forceinline__ __device__ void gemm_smem_smem(TiledMma& mma, Acc& acc, RegA& rA, RegB& rB,
                                               SmemA const& sA, SmemB const& sB,
                                               CopyA const& copy_a, CopyB const& copy_b,
                                               ThrCopyA const& thr_a, ThrCopyB const& thr_b) {
  Tensor rA_view = thr_a.retile_D(rA);
  Tensor rB_view = thr_b.retile_D(rB);
  copy(copy_a, sA(_, _, _0{}), rA_view(_, _, _0{}));
  copy(copy_b, sB(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) {
      copy(copy_a, sA(_, _, k + 1), rA_view(_, _, k + 1));
      copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    }
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// acc += A * B with A already in registers (O += P V, P converted from the S accumulator).
template <class TiledMma, class Acc, class RegA, class RegB, class SmemB, class CopyB,
          class ThrCopyB>
__forceinline__ __device__ void gemm_reg_smem(TiledMma& mma, Acc& acc, RegA const& rA, RegB& rB,
                                              SmemB const& sB, CopyB const& copy_b,
                                              ThrCopyB const& thr_b) {
  Tensor rB_view = thr_b.retile_D(rB);
  copy(copy_b, sB(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// Global -> shared copy of one tile with zero fill: rows at or past `rows` and columns at or
// past `cols` (the real head dim of a padded instantiation) are written as zeros, so padding,
// other sequences' rows or NaN garbage never reach a product (0 * NaN = NaN).
template <class TiledCopy, class Src, class Dst, class Coord>
__forceinline__ __device__ void copy_zfill(TiledCopy const& tiled_copy, Src const& src, Dst& dst,
                                           Coord const& coord, int rows, int cols) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    const bool row_ok = get<0>(coord(0, m, 0)) < rows;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k) {
      if (row_ok && get<1>(coord(0, m, k)) < cols) {
        copy(tiled_copy, src(_, m, k), dst(_, m, k));
      } else {
        clear(dst(_, m, k));
      }
    }
  }
}

}  // namespace flashcpp::detail::cuda::sm80
