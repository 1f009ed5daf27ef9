#pragma once
// Persistent tile scheduler of the sm90 forward. The grid has one CTA per SM (the kernel's
// shared memory admits no second one); each CTA keeps its pipelines, barriers and register
// allocation across tiles, so the producer loads the next tile's Q, K and V while the
// consumers still run the current tile's last products and epilogue.
//
// Work is dealt in units of equal length, unit u to CTA u mod grid, in order:
//  - unmasked calls: a unit is one query tile;
//  - masked calls (causal, window): a unit is the pair of query tiles m and M - 1 - m of one
//    head. Under a bottom-right causal mask tile m sees about m + const key blocks, so every
//    pair costs the same and the static deal stays balanced; an odd M leaves the middle tile
//    alone in its unit (the pair's second slot is a hole, skipped by every role).
// Units run head by head (query tiles innermost), so the CTAs that run together read a few
// heads' K and V and find them in L2.
//
// Varlen calls deal the same slots, sized by the longest sequence (num_m_blocks); a sequence
// with fewer query tiles pairs its own tiles (m and M_b - 1 - m) and leaves the rest as holes.
//
// Varlen tiles differ in cost by their sequence's length (a static deal left CTAs 17-28% apart
// on 8 random lengths), so a varlen call given a workspace deals them dynamically instead
// (DynamicTileQueue below): each CTA starts at slot blockIdx.x and takes its next one from a
// counter in global memory, in the same slot order, so CTAs running together still share a few
// heads' K and V in L2; the imbalance left is at most one tile.
//
// Split-KV calls (kSplit, kp.num_splits > 1) repeat the whole deal once per split, split
// outermost: slot s of split j is slot j * (slots of one split) + s, and the tile's key blocks
// are split j's share (TileWork in fwd_kernel.hpp).
//
// The walk is stated in slots: unit u owns slots [u * kSlots, (u + 1) * kSlots). Everything
// is recomputed from the kernel parameters (constant memory) instead of being kept in
// registers across the main loop.
#include <cstdint>

#include <cutlass/arch/barrier.h>

#include "cuda/common/fwd_kernel_params.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/common/tile_coord.hpp"

namespace flashcpp::detail::cuda::sm90 {

template <int kBlockM, bool kVarlen, bool kSplit_ = false>
struct PersistentTileScheduler {
  static constexpr bool kSplit = kSplit_;
  __host__ __device__ static bool paired(const FwdKernelParams& kp) {
    return kp.p.window_left >= 0 || kp.p.window_right >= 0;
  }
  // Slots of one (head, batch): M query tiles, or ceil(M / 2) pairs of two slots.
  __host__ __device__ static int slots_per_head(const FwdKernelParams& kp) {
    return paired(kp) ? 2 * ((kp.num_m_blocks + 1) / 2) : kp.num_m_blocks;
  }
  __host__ __device__ static int slots_per_split(const FwdKernelParams& kp) {
    return slots_per_head(kp) * kp.p.heads_q * kp.p.batch;
  }
  __host__ __device__ static int num_slots(const FwdKernelParams& kp) {
    return slots_per_split(kp) * (kSplit ? kp.num_splits : 1);
  }
  __host__ __device__ static int num_units(const FwdKernelParams& kp) {
    return num_slots(kp) / (paired(kp) ? 2 : 1);
  }

  __device__ static int first(const FwdKernelParams& kp, int cta) {
    return paired(kp) ? 2 * cta : cta;
  }
  // The slot after `slot` in this CTA's walk: the unit's second slot, or the first slot of
  // the unit `grid` units further on.
  __device__ static int next(const FwdKernelParams& kp, int slot, int grid) {
    if (!paired(kp)) return slot + grid;
    return slot % 2 == 0 ? slot + 1 : slot + 2 * grid - 1;
  }

  // The query tile of `slot`; false for a hole (the odd M's middle pair slot, or a varlen
  // sequence's slots past its own tiles).
  __device__ static bool tile(const FwdKernelParams& kp, int slot, TileCoord& t) {
    t.split = 0;
    if constexpr (kSplit) {
      const int per_split = slots_per_split(kp);
      t.split = slot / per_split;
      slot %= per_split;
    }
    const int per_head = slots_per_head(kp);
    const int head_batch = slot / per_head;
    const int r = slot % per_head;
    t.head = head_batch % kp.p.heads_q;
    t.batch = head_batch / kp.p.heads_q;
    int m_blocks = kp.num_m_blocks;
    if constexpr (kVarlen)
      m_blocks = (SeqlenInfo(kp.p, t.batch).seqlen_q + kBlockM - 1) / kBlockM;
    if (paired(kp)) {
      const int pair = r / 2;
      t.m_block = r % 2 == 0 ? m_blocks - 1 - pair : pair;
      return pair < (m_blocks + 1) / 2 && (r % 2 == 0 || pair != m_blocks - 1 - pair);
    }
    t.m_block = m_blocks - 1 - r;
    return r < m_blocks;
  }
};

// The dynamic deal's hand-over from the producer thread, which takes the slots and skips the
// holes, to the consumer warpgroups: a two-entry queue in shared memory, each entry guarded by
// a "full" mbarrier (the producer's arrival) and an "empty" one (every consumer thread's). A
// slot >= num_slots tells the consumers that the CTA's walk has ended.
struct TileQueueStorage {
  alignas(8) std::uint64_t full[2];
  alignas(8) std::uint64_t empty[2];
  int slot[2];
};

struct DynamicTileQueue {
  using Barrier = cutlass::arch::ClusterBarrier;

  // Once, by one thread, before the CTA's first __syncthreads.
  __device__ static void init(TileQueueStorage& q, int consumer_threads) {
    for (int b = 0; b < 2; ++b) {
      Barrier::init(&q.full[b], 1);
      Barrier::init(&q.empty[b], consumer_threads);
    }
  }
  // The slot after a CTA's first (its blockIdx.x): the counter (zeroed before the launch)
  // deals the slots from gridDim.x on.
  __device__ static int take(const FwdKernelParams& kp) {
    return int(gridDim.x) + atomicAdd(kp.tile_counter, 1);
  }
  // Producer: entry i of the walk. Entry i - 2 used the same buffer: wait until every consumer
  // has read it.
  __device__ static void push(TileQueueStorage& q, int i, int slot) {
    const int b = i % 2;
    if (i >= 2) Barrier::wait(&q.empty[b], (i / 2 - 1) & 1);
    *reinterpret_cast<volatile int*>(&q.slot[b]) = slot;
    Barrier::arrive(&q.full[b]);  // release: the slot is visible to whoever sees the phase
  }
  // Consumers: entry i of the walk.
  __device__ static int pop(TileQueueStorage& q, int i) {
    const int b = i % 2;
    Barrier::wait(&q.full[b], (i / 2) & 1);
    const int slot = *reinterpret_cast<volatile const int*>(&q.slot[b]);
    Barrier::arrive(&q.empty[b]);
    return slot;
  }
};

}  // namespace flashcpp::detail::cuda::sm90
