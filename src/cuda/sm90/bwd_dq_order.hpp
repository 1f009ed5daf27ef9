#pragma once
// The fixed order in which the deterministic sm90a backward adds dQ partials into dq_accum.
//
// Every key-block CTA of a (kv head, batch) adds its fp32 dQ partial of each query block it
// meets into that block of dq_accum (bwd_dq_convert.hpp). fp32 addition is not associative, so
// the result depends on the order; the default kernel takes whatever order the CTAs reach the
// reductions in. The deterministic kernel fixes it: the key blocks that meet query block m add
// last block first, down to the first. dq_semaphore[block] (one int per dq_accum block, zeroed
// by the pre-pass) counts the arrivals so far; an adder waits until the count says that every
// key block before it in the order has added and its additions are visible, adds, and arrives.
// An adder is a warp (float4 atomics from registers, d64 and d256: kArrivals warps per key
// block, each owning fixed float4s of the block) or the dQ writer thread that issues the bulk
// reductions (d128, one arrival), so the key blocks before rank r have all added when the
// count is at least r * kArrivals.
//
// Why last block first: with causal and window masks key block n + 1 starts its walk over
// the query blocks further down than key block n does (its first query block is later), so by
// the time key block n reaches a query block, n + 1 has usually added to it already; in the
// other order each CTA would wait for its neighbour's whole head start. Without a mask every
// key block meets every query block and either order makes consecutive key blocks of one head
// trail each other by one query block; the ticket order (bwd_tile_scheduler.hpp) starts them
// that far apart instead.
//
// No deadlock: a CTA waits only for key blocks above its own in the same (kv head, batch),
// and the deterministic kernel's CTAs take their tiles from a ticket counter
// (OrderedKeyBlockScheduler, bwd_tile_scheduler.hpp) that hands out the key blocks of a
// (kv head, batch) from the last down. A CTA holding a ticket is resident or finished, so every
// CTA it can wait for holds a smaller ticket and is running or done, whatever order the
// hardware starts CTAs in; the smallest unfinished ticket never waits.
// Masks: the key blocks that meet query block m are exactly mask.n_blocks(m) (the blocks whose
// mask.m_blocks contains m; tests/cpp/mask_test.cpp checks that the two agree), so a key block
// that meets no query (empty m range), and a varlen key block past its sequence, is never
// waited for: it is not in any query block's range.
#include <cstdint>

#include "common/mask.hpp"

namespace flashcpp::detail::cuda::sm90 {

// How many key blocks add to query block m before key block n_block (which meets m).
__device__ __forceinline__ int dq_add_rank(const WindowMask& mask, int m, int block_m,
                                           int n_block, int block_n) {
  return mask.n_blocks(m, block_m, block_n).end - 1 - n_block;
}

__device__ __forceinline__ int dq_load_acquire(const int* counter) {
  int seen;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
  return seen;
}

// Waits until `counter` is at least `target` (every lane of the calling warp spins: each gets
// its own acquire). Global writes that the arrivals made visible are then visible here.
__device__ __forceinline__ void dq_wait_turn(const int* counter, int target) {
  while (dq_load_acquire(counter) < target)
    __nanosleep(64);  // fewer loads on the line the other CTAs arrive on
}

// dq_wait_turn that gives up after kDqTurnSpinLimit polls (each a 64 ns sleep plus a load from
// L2: a minute or more, so that tools that slow kernels down, such as compute-sanitizer, do not
// trip it; real waits last a few key blocks' work, microseconds to milliseconds): a turn
// that never comes means a broken order (a key block that never adds), and the kernel traps,
// so that the call fails with a launch error instead of hanging the GPU. Used by the d128 dQ
// writer; in the consumers' loops (d64, d256) the trap's branch made ptxas spill 240 B and 1 KB.
inline constexpr unsigned kDqTurnSpinLimit = 1u << 30;
__device__ __forceinline__ void dq_wait_turn_or_trap(const int* counter, int target) {
  for (unsigned polls = 0; dq_load_acquire(counter) < target; ++polls) {
    if (polls >= kDqTurnSpinLimit) __trap();
    __nanosleep(64);
  }
}

// After the wait, before a bulk reduction (async proxy) of the same memory.
__device__ __forceinline__ void dq_fence_to_async_proxy() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// One arrival on `counter`, made by one thread after its own writes (and, through a preceding
// warp barrier, the other lanes'): the fence and the release order them before the increment.
__device__ __forceinline__ void dq_arrive(int* counter) {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(counter) : "memory");
}

// One arrival after this thread's bulk reduction into the block has completed
// (bulk_wait_all): its writes came through the async proxy, hence the proxy fence first.
__device__ __forceinline__ void dq_arrive_after_bulk(int* counter) {
  asm volatile("fence.proxy.async.global;" ::: "memory");
  dq_arrive(counter);
}

// A warp's float4 additions into dq_accum are done (every lane): each lane fences its own
// atomics, the warp meets, lane 0 arrives.
__device__ __forceinline__ void dq_warp_arrive(int* counter) {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
  __syncwarp();
  if ((threadIdx.x & 31) == 0) dq_arrive(counter);
}

}  // namespace flashcpp::detail::cuda::sm90
