#pragma once
// The sm80 forward's tile scheduler: which (query tile, split, head, batch) a CTA computes. One linear grid dimension (x allows
// 2^31-1 CTAs; y and z stop at 65535, too few for batch*heads of large decode batches).
// Query tiles vary fastest so CTAs that run together share a head's K/V in L2, and they run
// in reverse: with bottom-right causal masks the last tiles see the most keys, and starting
// the longest CTAs first shortens the tail of the wave.
#include "cuda/common/fwd_kernel_params.hpp"
#include "cuda/common/tile_coord.hpp"

namespace flashcpp::detail::cuda {

__device__ __forceinline__ TileCoord tile_of_block(const FwdKernelParams& kp, unsigned block) {
  TileCoord t;
  const unsigned m_blocks = unsigned(kp.num_m_blocks);
  t.m_block = int(m_blocks - 1 - block % m_blocks);
  block /= m_blocks;
  t.split = int(block % unsigned(kp.num_splits));
  block /= unsigned(kp.num_splits);
  t.head = int(block % unsigned(kp.p.heads_q));
  t.batch = int(block / unsigned(kp.p.heads_q));
  return t;
}

}  // namespace flashcpp::detail::cuda
