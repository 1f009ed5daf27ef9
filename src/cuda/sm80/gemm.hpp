#pragma once
// The two block products of the sm80 forward, software-pipelined over k (the ldmatrix for
// slice k+1 is issued before the mma.sync of slice k so shared-memory latency hides behind
// the tensor cores), and the per-thread global -> shared tile loader.
#include <cstdint>

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

// This thread's share of the global -> shared copies of one tile (GmemTiledCopyQKV's thread
// layout): 16-byte chunks at rows r0 + m * kRowsPerPass and columns c0 + k * kBlockKSmem.
// Rows at or past the valid row count and columns at or past the real head dim (a padded
// instantiation) are written as zeros, so padding, other sequences' rows or NaN garbage never
// reach a product (0 * NaN = NaN). The addresses are one pointer per thread advanced by a
// precomputed step: CuTe's partition of an int64-strided tensor rebuilt every 16-byte chunk
// address from the kernel parameters (LDC + 64-bit IADD + LEA pair per chunk, 7 instructions
// where this takes 3).
template <class Traits>
struct TileLoader {
  using Element = typename Traits::Element;
  static constexpr int kRowsPerPass = Traits::kNThreads / Traits::kThreadsPerRow;

  const Element* src;      // block 0, chunk (0, 0) of this thread
  std::int64_t row_step;   // bytes from chunk row m to m + 1
  std::int64_t block_step; // bytes from key block n to n + 1
  int r0;                  // this thread's first row
  unsigned col_ok;         // bit k: chunk column k is inside the real head dim

  __forceinline__ __device__ TileLoader(const Element* base, std::int64_t row_stride, int block_rows,
                                        int cols, int tid) {
    r0 = tid / Traits::kThreadsPerRow;
    const int c0 = tid % Traits::kThreadsPerRow * Traits::kElemsPerVec;
    src = base + r0 * row_stride + c0;
    // The pointer goes through an opaque move: otherwise nvcc rebuilds it from the kernel
    // parameter for every chunk (LDC + 64-bit add + LEA pair) instead of keeping it.
    asm("mov.b64 %0, %0;" : "+l"(src));
    row_step = kRowsPerPass * row_stride * std::int64_t(sizeof(Element));
    block_step = block_rows * row_stride * std::int64_t(sizeof(Element));
    col_ok = 0;
    CUTE_UNROLL
    for (int k = 0; k < Traits::kHeadDim / Traits::kBlockKSmem; ++k)
      col_ok |= unsigned(c0 + k * Traits::kBlockKSmem < cols) << k;
  }

  // Block n into dst (this thread's partition_D of the shared tile, (CPY, M, K)); rows: valid
  // rows of block n counted from its first row.
  template <class Dst>
  __forceinline__ __device__ void operator()(Dst& dst, int n, int rows) const {
    static_assert(decltype(size<2>(dst))::value == Traits::kHeadDim / Traits::kBlockKSmem);
    const char* p = reinterpret_cast<const char*>(src) + n * block_step;
    const int rows_left = rows - r0;
    CUTE_UNROLL
    for (int m = 0; m < size<1>(dst); ++m) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(dst); ++k) {
        auto* d = reinterpret_cast<cute::uint128_t*>(&dst(0, m, k));
        if (m * kRowsPerPass < rows_left && (col_ok >> k & 1u))
          SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(
              *reinterpret_cast<const cute::uint128_t*>(p + k * Traits::kBlockKSmem * sizeof(Element)), *d);
        else
          *d = cute::uint128_t{0, 0};
      }
      p += row_step;
    }
  }
};

}  // namespace flashcpp::detail::cuda::sm80
