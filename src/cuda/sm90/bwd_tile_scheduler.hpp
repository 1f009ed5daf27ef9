#pragma once
// Tile schedulers of the sm90 backward main kernel: one CTA per (key block, kv head, batch).
//  - KeyBlockScheduler: the tile from blockIdx.x, a linear grid with key blocks fastest. With
//    bottom-right causal masks the first key blocks see the most queries, so the longest CTAs
//    start first.
//  - OrderedKeyBlockScheduler (deterministic backward): the tile from a ticket that the CTA
//    takes from a counter once it runs, so that tickets follow the order in which key blocks
//    add dQ (bwd_dq_order.hpp) whatever order the hardware starts CTAs in.
// The ticket order is plain host/device arithmetic (ordered_key_block_tile), so the CPU tests
// check it (tests/cpp/bwd_dq_order_test.cpp); the schedulers themselves are device code.
#include <cstdint>

#include "common/host_device.hpp"
#include "cuda/common/bwd_kernel_params.hpp"

namespace flashcpp::detail::cuda::sm90 {

struct BwdTileCoord {
  int n_block;
  int head_kv;
  int batch;
};

// The tile of `ticket` in OrderedKeyBlockScheduler's order: tickets 0, 1, ... in groups of
// `group` (kv head, batch) pairs (pair = batch * heads_kv + kv head), group after group; inside
// a group the key blocks from the last down, each for every pair of the group before the next.
// A key block therefore follows the one above it in its own pair (which it waits for) by a
// group's worth of tickets: the host picks the group so that this spacing covers the time one
// key block trails the other without a mask (bwd_ticket_head_group, bwd_dispatch.hpp), while a
// group's Q and dO stay few enough for L2. Tickets < num_n_blocks * heads_kv * batch.
FLASHCPP_HOST_DEVICE BwdTileCoord ordered_key_block_tile(int num_n_blocks, int heads_kv,
                                                         int batch, int group,
                                                         unsigned ticket) {
  const unsigned n_blocks = unsigned(num_n_blocks);
  const unsigned pairs = unsigned(heads_kv) * unsigned(batch);
  const unsigned g = unsigned(group);
  const unsigned first_pair = ticket / (g * n_blocks) * g;
  const unsigned in_group = pairs - first_pair < g ? pairs - first_pair : g;
  const unsigned r = ticket - first_pair * n_blocks;  // the ticket within its group
  const unsigned pair = first_pair + r % in_group;
  BwdTileCoord t;
  t.n_block = int(n_blocks - 1 - r / in_group);
  t.head_kv = int(pair % unsigned(heads_kv));
  t.batch = int(pair / unsigned(heads_kv));
  return t;
}

#if defined(__CUDACC__)
struct KeyBlockScheduler {
  static constexpr bool kTicketed = false;  // the tile comes from blockIdx.x

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

// The deterministic backward's scheduler (bwd_dq_order.hpp): tiles in ticket order.
struct OrderedKeyBlockScheduler {
  static constexpr bool kTicketed = true;

  static std::int64_t num_ctas(const BwdKernelParams& kp) {
    return KeyBlockScheduler::num_ctas(kp);
  }

  // Thread 0 takes the CTA's ticket from kp.tile_ticket (zeroed by the pre-pass) and hands it
  // to the others through `slot`, shared memory that nothing else uses until the next
  // __syncthreads (a static __shared__ variable would cost 1 KB: the dynamic shared memory
  // after it is 1024-byte aligned). Every thread returns the ticket. Call from all threads.
  __device__ static unsigned take_ticket(const BwdKernelParams& kp, unsigned* slot) {
    if (threadIdx.x == 0) *slot = unsigned(atomicAdd(kp.tile_ticket, 1));
    __syncthreads();
    return *slot;
  }

  __device__ static BwdTileCoord tile(const BwdKernelParams& kp, unsigned ticket) {
    return ordered_key_block_tile(kp.num_n_blocks, kp.p.heads_kv, kp.p.batch,
                                  kp.ticket_head_group, ticket);
  }
};
#endif  // __CUDACC__

}  // namespace flashcpp::detail::cuda::sm90
