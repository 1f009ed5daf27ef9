#pragma once
// Named (bar.sync) barriers of the sm90 kernels. Ids 0..7 belong to CUTLASS
// (cutlass/arch/barrier.h, ReservedNamedBarriers; 0 is __syncthreads), so ours start at 8 of
// the 16 the hardware has.
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
  // Forward (which has no dS): consumer warpgroup w has zeroed the varlen tail rows of a V
  // stage (fwd_mainloop.hpp).
  kFwdVTail0 = kBwdDsReady,
  kFwdVTail1 = kBwdDsReady1,
  // Forward without ping-pong, O aliasing Q (fwd_epilogue.hpp): both consumer warpgroups are
  // done reading the tile's Q. Without ping-pong the warp-scheduler id is free.
  kFwdQRead = kWarpScheduler0,
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

__forceinline__ __device__ void named_barrier_sync(NamedBarrier id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}

__forceinline__ __device__ void named_barrier_arrive(NamedBarrier id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}

}  // namespace flashcpp::detail::cuda::sm90
