#pragma once
// The sm80 forward's K and V tile loads from a paged KV cache (prefill with a cache): the
// partition of TileLoader (gemm.hpp: each thread one 16-byte chunk column, its rows
// kRowsPerPass apart), with every row's address from its own block-table entry, so any page
// size works. Rows past the sequence's keys, and rows whose entry is outside
// [0, num_pages), are zero-filled: the block-table entries past a sequence's keys are never
// read, and no byte outside the page pool is.
#include <cstdint>

#include <cute/tensor.hpp>

#include "common/params.hpp"
#include "cuda/common/fwd_kernel_params.hpp"

namespace flashcpp::detail::cuda::sm80 {

// Block n of the K (or V) cache `cache` (strides s, `cols` real columns), kv head head_kv of
// sequence `batch`, into dst (this thread's partition_D of the shared tile, (CPY, M, K)); rows:
// the sequence's keys from the block's first row on. Everything but batch, head_kv and the
// block is read from the kernel parameters where it is used (constant-bank operands), not
// kept in registers: the d128 kernel has none to spare.
template <class Traits, class Dst>
__forceinline__ __device__ void load_paged_tile(const FwdKernelParams& kp, const void* cache,
                                                const Strides& s, int cols, int batch,
                                                int head_kv, Dst& dst, int n, int rows) {
  using Element = typename Traits::Element;
  constexpr int kRowsPerPass = Traits::kNThreads / Traits::kThreadsPerRow;
  static_assert(decltype(size<2>(dst))::value == Traits::kHeadDim / Traits::kBlockKSmem);
  const PagedKV& pg = kp.paged;
  const int tid = threadIdx.x;
  const int r0 = tid / Traits::kThreadsPerRow;
  const int c0 = tid % Traits::kThreadsPerRow * Traits::kElemsPerVec;
  const std::int32_t* table = pg.block_table + batch * pg.block_table_stride;
  const Element* head = static_cast<const Element*>(cache) + head_kv * s.head + c0;
  const int rows_left = rows - r0;
  const int key0 = n * Traits::kBlockN + r0;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    const int key = key0 + m * kRowsPerPass;
    int page = -1, in_page = 0;
    if (m * kRowsPerPass < rows_left) {
      const int index = pg.page_shift >= 0 ? key >> pg.page_shift : key / pg.page_size;
      in_page = key - index * pg.page_size;
      page = table[index];
    }
    const bool row_ok = page >= 0 && page < pg.num_pages;
    const Element* row = head + (row_ok ? page * s.batch + std::int64_t(in_page) * s.row : 0);
    CUTE_UNROLL
    for (int k = 0; k < size<2>(dst); ++k) {
      auto* d = reinterpret_cast<cute::uint128_t*>(&dst(0, m, k));
      if (row_ok && c0 + k * Traits::kBlockKSmem < cols)
        cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(
            *reinterpret_cast<const cute::uint128_t*>(row + k * Traits::kBlockKSmem), *d);
      else
        *d = cute::uint128_t{0, 0};
    }
  }
}

}  // namespace flashcpp::detail::cuda::sm80
