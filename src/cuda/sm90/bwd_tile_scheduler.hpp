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
// key block trails the other without a mask, while a group's Q and dO stay few enough for L2
// (ticket_head_group below). Tickets <
// num_n_blocks * heads_kv * batch.
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

// The group of ordered_key_block_tile for a call. Without a mask a key block reaches each query
// block about one block after the key block above it (its turn, bwd_dq_order.hpp, plus the
// reduction's completion), and CTAs start at about sm_count per CTA duration, a CTA walking
// (Hq / Hkv) x query blocks. Spacing the key blocks of a pair by kTicketLagBlocks blocks'
// worth of tickets lets each start when the one above already has that head start, instead of
// waiting for it. Long sequences give that spacing with one pair (group 1: the default
// kernel's order); short ones interleave a few pairs.
// The interleaved pairs' Q, dO and dq_accum rows (pair_bytes each) must also stay within a
// third of L2 (l2_bytes; 0: not known, no cap): on an H100 (50 MB) with causal masks, d256,
// B 1, 8 heads, N 16k (32 MB a pair), groups of 1 / 2 / 4 / 8 took 1.14 / 1.45 / 2.08 / 2.58x
// the default kernel's time, and N 8k (16 MB a pair) 1.16 / 1.17 / 1.35 (group 3) / 2.00 (6);
// with no mask the capped groups measured within 1.5% of the uncapped ones (d128 and d256,
// N 4k-16k; docs/performance.md).
inline constexpr int kTicketLagBlocks = 2;
inline constexpr int kTicketL2Share = 3;
inline int ticket_head_group(int heads_q, int heads_kv, int batch, int seqlen_q, int block_m,
                             int sm_count, std::int64_t pair_bytes = 0,
                             std::int64_t l2_bytes = 0) {
  const std::int64_t walk =
      std::int64_t(heads_q / heads_kv) * ((std::int64_t(seqlen_q) + block_m - 1) / block_m);
  const std::int64_t pairs = std::int64_t(heads_kv) * batch;
  if (walk <= 0 || pairs <= 1) return 1;
  std::int64_t group = (std::int64_t(kTicketLagBlocks) * sm_count + walk - 1) / walk;
  if (pair_bytes > 0 && l2_bytes > 0) {
    const std::int64_t fit = l2_bytes / kTicketL2Share / pair_bytes;
    if (fit < group) group = fit;
  }
  return int(group < 1 ? 1 : group < pairs ? group : pairs);
}

// The bytes of one (kv head, batch) pair that the deterministic kernel's CTAs stream: Q and dO
// (Element) and the fp32 dq_accum rows of its (Hq / Hkv) query heads. An estimate for the cap
// above: it takes dO and dq_accum as head_dim wide (the deterministic kernels have D = Dv;
// dq_accum's padding to the kernel's head dim is left out) and varlen's longest sequence.
inline std::int64_t ticket_pair_bytes(int heads_q, int heads_kv, int seqlen_q, int head_dim,
                                      int element_bytes) {
  return std::int64_t(heads_q / heads_kv) * seqlen_q * head_dim *
         (2 * std::int64_t(element_bytes) + std::int64_t(sizeof(float)));
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
