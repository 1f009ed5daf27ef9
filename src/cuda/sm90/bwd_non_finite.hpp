#pragma once
// NaN and Inf in the blocks the mask cuts through, sm90a backward. A hidden (key, query) pair
// has P = dS = 0 (a select, so a NaN dP never gets in), but the products still multiply
// those zeros by the pair's rows: dV += P^T dO and dK += dS^T Q by the query's dO and Q
// rows, dQ = dS K by the key's K row, and 0 * NaN = NaN. So, in shared memory:
//  - Q and dO of a query block that the key block meets partly masked: their NaN/Inf chunks
//    are zeroed before the products. No row marks are needed: such a row's lse (a NaN or +Inf
//    score in the forward) or dsum (rowsum(dO * O)) is not finite, so at its visible pairs
//    P or dS is still NaN; the mainloop also sets P += 0 * dS there, so that dV of the keys a
//    NaN dO row sees stays NaN although that dO row is now zero.
//  - K, once per CTA whose key block some query block meets partly masked: its NaN chunks
//    are zeroed. A row that sees such a key had a NaN score, hence a NaN lse, so its P is NaN
//    whatever S is. Inf chunks stay: a -Inf score (weight 0) at a visible key would otherwise
//    get a wrong finite P; 0 * Inf at a hidden pair still gives NaN there.
// Both consumer warpgroups check and zero the same tiles (the same zeros), each before its
// own products: a chunk the other one has zeroed already reads as 0.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/common/non_finite_rows.hpp"
#include "cuda/sm90/named_barriers.hpp"

namespace flashcpp::detail::cuda::sm90 {

// Zeroes the chunks of a (rows, cols) tile of 2-byte elements that hold NaN or Inf
// (kWithInf) or NaN only, `threads` threads sharing the work (thread index `thread`).
template <bool kWithInf, class SmemTile>
__device__ void zero_non_finite_chunks(SmemTile tile, int thread, int threads) {
  using namespace cute;
  using Element = typename SmemTile::value_type;
  static_assert(sizeof(Element) == 2, "16-byte chunks of 8 elements");
  constexpr int kRows = decltype(size<0>(tile))::value;
  constexpr int kChunks = decltype(size<1>(tile))::value / 8;
  // One chunk at a time: this runs with dK and dV live, at the register limit.
#pragma unroll 1
  for (int i = thread; i < kRows * kChunks; i += threads) {
    void* const chunk = &tile(i / kChunks, i % kChunks * 8);
    const uint4 c = load_shared_volatile(chunk);
    if (kWithInf ? chunk_non_finite<Element>(c) : chunk_has_nan<Element>(c))
      zero_shared_volatile(chunk);
  }
}

// zero_non_finite_chunks on each tile, then the zeros made visible to the async proxy (wgmma)
// and the `threads` threads synced at `barrier`.
template <bool kWithInf, class... SmemTiles>
__device__ void zero_non_finite_and_sync(int thread, int threads, NamedBarrier barrier,
                                         SmemTiles... tiles) {
  (zero_non_finite_chunks<kWithInf>(tiles, thread, threads), ...);
  cutlass::arch::fence_view_async_shared();
  named_barrier_sync(barrier, threads);
}

}  // namespace flashcpp::detail::cuda::sm90
