#pragma once
// Varlen tails in shared memory. A tile loaded by TMA from a packed (varlen) tensor holds the
// next sequence's rows past its own sequence's end. The mask hides them, but a hidden element
// still meets them in a product (0 * NaN is NaN), so the kernels zero those rows before the
// products read them; padded calls never need this (TMA fills rows past the tensor with zeros).
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

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

}  // namespace flashcpp::detail::cuda::sm90
