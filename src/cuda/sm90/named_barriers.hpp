#pragma once
// Named (bar.sync) barriers of the sm90 kernels. Ids 0..7 belong to CUTLASS
// (cutlass/arch/barrier.h, ReservedNamedBarriers; 0 is __syncthreads), so ours start at 8 of
// the 16 the hardware has.
#include <cstdint>

namespace flashcpp::detail::cuda::sm90 {

enum class NamedBarrier : int {
  // Ping-pong between the two consumer warpgroups: warpgroup w waits on kWarpScheduler0 + w
  // before issuing its GEMMs and, once they are issued, arrives on the other one's.
  kWarpScheduler0 = 8,
  kWarpScheduler1 = 9,
  // Epilogue of consumer warpgroup w (its 128 threads): the O buffer (forward) or the dK, dV
  // staging (backward) is free / has been written.
  kEpilogue0 = 10,
  kEpilogue1 = 11,
  // Backward: both consumer warpgroups have written their halves of dS (and fenced them for
  // the async proxy), so either may start dQ = dS K, which reads all of it. When the
  // warpgroups take turns on dQ (d64) there is one per dS buffer: kBwdDsReady + buffer.
  kBwdDsReady = 12,
  kBwdDsReady1 = 13,
  // Backward, turns on dQ: the dQ of the block in dS buffer b has been computed, so the other
  // warpgroup may overwrite the buffer (kBwdDsFree + b).
  kBwdDsFree = 14,
  kBwdDsFree1 = 15,
  // Forward with three consumer warpgroups (192-row tiles): the third one's turn and epilogue
  // barriers, on ids only the backward uses otherwise.
  kWarpScheduler2 = kBwdDsReady,
  kEpilogue2 = kBwdDsReady1,
  // Forward: the producer warpgroup's scanner warps 1-3 start on a cut block's V stage, OR
  // their verdicts, and end its rare path (fwd_non_finite_v.hpp).
  kFwdVScan = kBwdDsFree,
  // Forward without ping-pong, O in the ring (fwd_epilogue.hpp): both consumer warpgroups are
  // done reading the tile's last K and V stages. Without ping-pong the warp-scheduler id is
  // free.
  kFwdLastStagesRead = kWarpScheduler0,
  // Backward epilogue: both consumer warpgroups are done with the main loop's shared memory.
  // The backward has no warp scheduler, so it takes that id.
  kBwdEpilogueAll = kWarpScheduler0,
  // Backward, varlen: both consumer warpgroups have zeroed the K and V rows past the sequence's
  // end (zero_rows.hpp). The backward has no warp scheduler, so it takes that id too.
  kBwdKvTail = kWarpScheduler1,
};

__forceinline__ __device__ NamedBarrier operator+(NamedBarrier id, int i) {
  return static_cast<NamedBarrier>(static_cast<int>(id) + i);
}

// The turn (ping-pong) and epilogue barriers of forward consumer warpgroup wg (0, 1, 2).
__forceinline__ __device__ NamedBarrier fwd_scheduler_barrier(int wg) {
  return wg == 0 ? NamedBarrier::kWarpScheduler0
                 : wg == 1 ? NamedBarrier::kWarpScheduler1 : NamedBarrier::kWarpScheduler2;
}
__forceinline__ __device__ NamedBarrier fwd_epilogue_barrier(int wg) {
  return wg == 0 ? NamedBarrier::kEpilogue0
                 : wg == 1 ? NamedBarrier::kEpilogue1 : NamedBarrier::kEpilogue2;
}

__forceinline__ __device__ void named_barrier_sync(NamedBarrier id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}

__forceinline__ __device__ void named_barrier_arrive(NamedBarrier id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}

// barrier.sync without .aligned: for warps whose lanes may reach it apart (a lane that waited
// on an mbarrier alone, then the warp's other lanes), which bar.sync (= barrier.sync.aligned)
// does not allow.
__forceinline__ __device__ void named_barrier_sync_unaligned(NamedBarrier id, int threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}

// barrier.sync that also ORs `pred` over the participating threads: true for all of them if it
// was true for any. Without .aligned, as named_barrier_sync_unaligned.
__forceinline__ __device__ bool named_barrier_or_unaligned(NamedBarrier id, int threads,
                                                           bool pred) {
  std::uint32_t any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n barrier.red.or.pred q, %2, %3, p;\n"
      " selp.u32 %0, 1, 0, q;\n}"
      : "=r"(any)
      : "r"(std::uint32_t(pred)), "r"(static_cast<int>(id)), "r"(threads)
      : "memory");
  return any != 0;
}

}  // namespace flashcpp::detail::cuda::sm90
