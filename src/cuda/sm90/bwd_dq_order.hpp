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
// Each key block arrives once per block, so the key blocks before rank r have all added when
// the count is at least r. The adders that wait for the turn are the warps (float4 atomics from
// registers, d64 and d256, each warp owning fixed float4s of the block) or the dQ writer thread
// that issues the bulk reductions (d128). The arrival is one thread's: the d128 writer's after
// its reduction has completed; at d64 and d256 the announcer's (dq_announce below), a thread
// of the producer warpgroup that arrives for the block once every adding warp of its CTA has
// told it (through shared memory) that its atomics are issued. The gpu-scope release that
// makes the atomics visible before the arrival waits for them to complete (MEMBAR.GPU +
// ERRBAR): in the adding warps themselves it stalled the consumers (the d256 backward took
// 1.3-1.4x the default kernel's time that way, H100, 2026-11-25).
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
#include "cuda/common/bwd_kernel_params.hpp"

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

// Without the acquire's L1 invalidation: for the polls.
__device__ __forceinline__ int dq_load_relaxed(const int* counter) {
  int seen;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
  return seen;
}

// Waits until `counter` is at least `target` (every lane of the calling warp spins), then
// acquires once: global writes that the counted arrivals made visible are then visible here.
// The polls are relaxed because an acquire load invalidates L1 (CCTL.IVALL) each time.
__device__ __forceinline__ void dq_wait_turn(const int* counter, int target) {
  while (dq_load_relaxed(counter) < target)
    __nanosleep(64);  // fewer loads on the line the other CTAs arrive on
  dq_load_acquire(counter);
}

// dq_wait_turn that gives up after kDqTurnSpinLimit polls (each a 64 ns sleep plus a load from
// L2: a minute or more, so that tools that slow kernels down, such as compute-sanitizer, do not
// trip it; real waits last a few key blocks' work, microseconds to milliseconds): a turn
// that never comes means a broken order (a key block that never adds), and the kernel traps,
// so that the call fails with a launch error instead of hanging the GPU. Used by the d128 dQ
// writer; in the consumers' loops (d64, d256) the trap's branch made ptxas spill 240 B and 1 KB.
inline constexpr unsigned kDqTurnSpinLimit = 1u << 30;
__device__ __forceinline__ void dq_wait_turn_or_trap(const int* counter, int target) {
  for (unsigned polls = 0; dq_load_relaxed(counter) < target; ++polls) {
    if (polls >= kDqTurnSpinLimit) __trap();
    __nanosleep(64);
  }
  dq_load_acquire(counter);
}

// After the wait, before a bulk reduction (async proxy) of the same memory.
__device__ __forceinline__ void dq_fence_to_async_proxy() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// One arrival on `counter`, made by one thread after its own writes and those it has observed
// (release is cumulative): the release orders them before the increment. A release alone, not
// after a fence.acq_rel: the fence's acquire half invalidates L1 (CCTL.IVALL), and with the
// fence in the consumers ptxas emitted their float4 additions as returning atomics (ATOMG)
// instead of reductions (REDG).
__device__ __forceinline__ void dq_arrive(int* counter) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(counter) : "memory");
}

// One arrival after this thread's bulk reduction into the block has completed
// (bulk_wait_all): its writes came through the async proxy, hence the proxy fence first.
__device__ __forceinline__ void dq_arrive_after_bulk(int* counter) {
  asm volatile("fence.proxy.async.global;" ::: "memory");
  dq_arrive(counter);
}

// ---- the announcer (d64, d256) ----------------------------------------------------------------

__device__ __forceinline__ unsigned dq_smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// A warp's float4 additions into dq_accum are issued (every lane): the warp meets (bar.warp.sync
// orders the lanes' memory operations before lane 0's next ones) and lane 0 counts the warp in
// `added` (shared memory) with a CTA-scope release, which is cumulative and costs no wait for
// the atomics to complete (MEMBAR.CTA).
__device__ __forceinline__ void dq_warp_added(unsigned* added) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0)
    asm volatile("red.release.cta.shared::cta.add.u32 [%0], 1;" ::"r"(dq_smem_address(added))
                 : "memory");
}

// The announcer: for the i-th block of the CTA's walk (i = 1, 2, ...: every query head of the
// kv head's group, every query block of m_range, the consumers' order), waits until
// kAddingWarps x i warps have counted themselves in `added` (CTA-scope acquire), then arrives
// on the block's counter with a gpu-scope release. Release is cumulative, so the arrival orders
// every warp's atomics that the acquire observed, and the release's wait for them to complete
// falls on this thread instead of on the consumers. One thread; m_range is non-empty.
template <int kAddingWarps, int kBlockM>
__device__ __forceinline__ void dq_announce(const BwdKernelParams& kp, int head_kv, int batch,
                                            BlockRange m_range, const unsigned* added) {
  const BackwardParams& p = kp.p;
  const int group = p.heads_q / p.heads_kv;
  const int num_m_blocks = int((std::int64_t(p.seqlen_q) + kBlockM - 1) / kBlockM);
  // The counters of this batch's blocks, named head * num_m_blocks + m.
  int* const counters = kp.dq_semaphore + std::int64_t(batch) * p.heads_q * num_m_blocks;
  const unsigned added_address = dq_smem_address(added);
  unsigned target = 0;
  for (int head = head_kv * group; head < (head_kv + 1) * group; ++head) {
    for (int m = m_range.begin; m < m_range.end; ++m) {
      target += kAddingWarps;
      unsigned seen;
      for (;;) {
        asm volatile("ld.relaxed.cta.shared::cta.u32 %0, [%1];"
                     : "=r"(seen)
                     : "r"(added_address)
                     : "memory");
        if (seen >= target) break;
        __nanosleep(32);  // one thread: keep its polls off the consumers' issue slots
      }
      asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];"
                   : "=r"(seen)
                   : "r"(added_address)
                   : "memory");
      dq_arrive(counters + head * num_m_blocks + m);
    }
  }
}

}  // namespace flashcpp::detail::cuda::sm90
