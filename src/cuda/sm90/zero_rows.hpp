#pragma once
// Varlen tails in shared memory. A tile loaded by TMA from a packed (varlen) tensor holds the
// next sequence's rows past its own sequence's end. The mask hides them, but a hidden element
// still meets them in a product (0 * NaN is NaN), so the kernels zero those rows before the
// products read them; padded calls never need this (TMA fills rows past the tensor with zeros).
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/named_barriers.hpp"

namespace flashcpp::detail::cuda::sm90 {

// Rows [first_row, rows) of a (rows, cols) tile of 2-byte elements, written 16 bytes at a time
// by `threads` threads (thread index `thread`): every swizzle of these layouts moves whole
// 16-byte chunks, so 8 consecutive columns from a multiple of 8 are contiguous.
template <class SmemTile>
__device__ void zero_rows(SmemTile tile, int first_row, int thread, int threads) {
  using namespace cute;
  static_assert(sizeof(typename SmemTile::value_type) == 2, "16-byte chunks of 8 elements");
  constexpr int kRows = decltype(size<0>(tile))::value;
  constexpr int kChunks = decltype(size<1>(tile))::value / 8;
  for (int i = (first_row > 0 ? first_row : 0) * kChunks + thread; i < kRows * kChunks;
       i += threads)
    *reinterpret_cast<uint4*>(&tile(i / kChunks, i % kChunks * 8)) = make_uint4(0, 0, 0, 0);
}

// zero_rows on each tile by the `threads` threads that share the work, then the writes made
// visible to the async proxy (wgmma reads shared memory through it) and those threads synced
// at `barrier`.
template <class... SmemTiles>
__device__ void zero_rows_and_sync(int first_row, int thread, int threads, NamedBarrier barrier,
                                   SmemTiles... tiles) {
  (zero_rows(tiles, first_row, thread, threads), ...);
  cutlass::arch::fence_view_async_shared();
  named_barrier_sync(barrier, threads);
}

}  // namespace flashcpp::detail::cuda::sm90
