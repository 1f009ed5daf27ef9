#pragma once
// Tile scheduler of the sm90 backward main kernel: one CTA per (key block, kv head, batch), in
// a linear grid with key blocks fastest. With bottom-right causal masks the first key blocks
// see the most queries, so the longest CTAs start first.
#include <cstdint>

#include "cuda/common/bwd_kernel_params.hpp"

namespace flashcpp::detail::cuda::sm90 {

struct BwdTileCoord {
  int n_block;
  int head_kv;
  int batch;
};

struct KeyBlockScheduler {
  static std::int64_t num_ctas(const BwdKernelParams& kp) {
    return std::int64_t(kp.num_n_blocks) * kp.p.heads_kv * kp.p.batch;
  }

  __device__ static BwdTileCoord tile(const BwdKernelParams& kp, unsigned block) {
    BwdTileCoord t;
    t.n_block = int(block % unsigned(kp.num_n_blocks));
    block /= unsigned(kp.num_n_blocks);
    t.head_kv = int(block % unsigned(kp.p.heads_kv));
    t.batch = int(block / unsigned(kp.p.heads_kv));
    return t;
  }
};

}  // namespace flashcpp::detail::cuda::sm90
