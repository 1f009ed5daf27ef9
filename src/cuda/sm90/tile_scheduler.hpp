#pragma once
// Persistent tile scheduler of the sm90 forward: the grid has one CTA per SM (the kernel's
// shared memory allows no second one), and CTA c computes tiles c, c + G, c + 2G, ... of a
// linear tile order (G = grid size). A CTA keeps its pipelines, barriers and register
// allocation across tiles, so the producer loads the next tile's Q, K and V while the
// consumers still run the current tile's last products and epilogue.
//
// Tile order:
//  - masked calls (causal, window): query block outermost, from the last (longest under the
//    bottom-right causal mask) to the first, heads and batches inside. Tiles of one round have
//    about the same length and later rounds are shorter, so the static striding stays
//    balanced and the wave ends on short tiles;
//  - unmasked calls: query block innermost, so CTAs that run together read the same head's K
//    and V from L2.
#include "cuda/common/fwd_params.hpp"
#include "cuda/common/tile_scheduler.hpp"

namespace flashcpp::detail::cuda::sm90 {

struct PersistentTileScheduler {
  int num_m_blocks;
  int heads;
  int num_tiles;
  bool longest_first;

  __host__ __device__ explicit PersistentTileScheduler(const FwdKernelParams& kp)
      : num_m_blocks(kp.num_m_blocks),
        heads(kp.p.heads_q),
        num_tiles(kp.num_m_blocks * kp.p.heads_q * kp.p.batch),
        longest_first(kp.p.window_left >= 0 || kp.p.window_right >= 0) {}

  __device__ __forceinline__ TileCoord tile(int index) const {
    TileCoord t;
    t.split = 0;
    int head_batch;
    if (longest_first) {
      const int head_batches = num_tiles / num_m_blocks;
      t.m_block = num_m_blocks - 1 - index / head_batches;
      head_batch = index % head_batches;
    } else {
      t.m_block = num_m_blocks - 1 - index % num_m_blocks;
      head_batch = index / num_m_blocks;
    }
    t.head = head_batch % heads;
    t.batch = head_batch / heads;
    return t;
  }
};

}  // namespace flashcpp::detail::cuda::sm90
