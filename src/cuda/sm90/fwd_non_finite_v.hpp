#pragma once
// NaN and Inf in V in the key blocks the mask cuts through, sm90a forward. A hidden key gets
// P = 0 there, but O += P V still multiplies that 0 by its V row, and 0 * NaN = 0 * Inf = NaN,
// so a non-finite V at a hidden key would reach rows that do not see it. The work is done off
// the consumers' path, by warps 1-3 of the producer warpgroup (the "scanner"; one thread of
// warp 0 issues the TMA loads):
//  - the producer thread lands a cut block's V tile on a `v_landed` barrier instead of the
//    pipeline's full barrier, and says in `v_cut_stage` which V stage it went to. The cut
//    loads take the v_landed barriers in turn (the c-th on barrier c % kStages, a ring of its
//    own), so the scanner needs no tile walk: it takes them in the same turn;
//  - the scanner waits for the landing, zeroes the non-finite 16-byte chunks in place, writes
//    the stage's key bits (bit k: V row k held one) and then gives the full barrier the one
//    arrival it expects; a stage of -1 (after the producer's last tile) ends its loop;
//  - the consumers, on a cut block only, read the bits (a broadcast load) and make every O
//    element of a row that sees a flagged key NaN (docs/semantics.md allows the whole row).
// Blocks the mask does not cut load exactly as before.
// A v_landed barrier is armed again only for the cut load kStages cut loads later, whose V
// stage the consumers must have released first, which they do only after the scanner has
// released this load's: so the scanner never falls a phase behind.
#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/mask.hpp"
#include "cuda/common/non_finite_rows.hpp"
#include "cuda/sm90/named_barriers.hpp"

namespace flashcpp::detail::cuda::sm90 {

// Whether key block n of a tile needs the mask (and so the scan): outside the unmasked band.
__device__ __forceinline__ bool block_is_cut(int n, BlockRange unmasked) {
  return n >= unmasked.end || n < unmasked.begin;
}

template <class Traits>
struct FwdNonFiniteV {
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDimV = Traits::kHeadDimV;
  static constexpr int kWords = Traits::kVKeyWords;
  static constexpr int kScanWarps = Traits::kScanThreads / 32;

  // Producer thread, for a cut block's V going to stage `stage`: the barrier its TMA load
  // completes (armed here for the tile's bytes), as a shared-memory address.
  __device__ static std::uint32_t arm_landing(SharedStorage& ss, int stage) {
    const int slot = ss.v_cut_loads++ % Traits::kStages;
    ss.v_cut_stage[slot] = stage;  // published by the arrival (release)
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.v_landed[slot],
                                                                   Traits::kVStageBytes);
    return cute::cast_smem_ptr_to_uint(&ss.v_landed[slot]);
  }

  // Producer thread, after its last tile, once every V stage has been released (so every cut
  // load has been scanned): ends the scanner's loop.
  __device__ static void end_scans(SharedStorage& ss) {
    const int slot = ss.v_cut_loads % Traits::kStages;
    ss.v_cut_stage[slot] = -1;
    cutlass::arch::ClusterBarrier::arrive(&ss.v_landed[slot]);
  }

  // The scanner (warps 1..kScanWarps of the CTA): every cut load in turn, until the end.
  // Lane l of a warp owns key row 32 w + l of the words w it takes: the 128-byte swizzle puts
  // the same chunk of 8 consecutive rows in 8 different bank groups, so the loads are
  // conflict-free, and a ballot gives each word without shared-memory atomics.
  __device__ static void scanner(SharedStorage& ss) {
    using namespace cute;
    const int warp = threadIdx.x / 32 - 1, lane = threadIdx.x % 32;
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
#pragma unroll 1
    for (int c = 0;; ++c) {
      const int slot = c % Traits::kStages;
      cutlass::arch::ClusterTransactionBarrier::wait(&ss.v_landed[slot],
                                                     (c / Traits::kStages) & 1);
      const int stage = *reinterpret_cast<volatile const int*>(&ss.v_cut_stage[slot]);
      if (stage < 0) return;
#pragma unroll 1
      for (int w = warp; w < kWords; w += kScanWarps) {
        const int row = 32 * w + lane;
        bool bad = false;
        if (row < kBlockN) {
          Tensor v_row = sV(row, _, stage);
#pragma unroll 2
          for (int k = 0; k < kHeadDimV / 8; ++k) {
            uint4* const chunk = reinterpret_cast<uint4*>(&v_row(8 * k));
            if (chunk_non_finite<Element>(*chunk)) {
              *chunk = make_uint4(0, 0, 0, 0);
              bad = true;
            }
          }
        }
        const std::uint32_t bits = __ballot_sync(0xffffffffu, bad);
        if (lane == 0) ss.v_bad_keys[stage][w] = bits;
      }
      // The zeros are read by wgmma (async proxy); the full barrier's arrival (release) after
      // the scanners' barrier publishes zeros and bits to the consumers.
      cutlass::arch::fence_view_async_shared();
      named_barrier_sync(NamedBarrier::kFwdVScan, Traits::kScanThreads);
      if (warp == 0 && lane == 0) ss.pipeline_v.full_barrier_[stage].arrive();
    }
  }

  // Consumer, on cut block n (keys from n0 = n * kBlockN) whose V is in stage `stage` (waited
  // for, not yet released): bit r set for each of this thread's rows r (query m0 + the row of
  // c_rc(r, 0), c_rc the (row, col) coordinates of its S elements) that sees a key the
  // scanner flagged. Almost always one uniform test of the bits that returns 0.
  template <int kRows, class RowCol>
  __device__ static std::uint32_t rows_seeing_flagged_keys(const SharedStorage& ss, int stage,
                                                           const WindowMask& mask,
                                                           const RowCol& c_rc, int m0, int n0) {
    const std::uint32_t* const bits = ss.v_bad_keys[stage];
    std::uint32_t any = 0;
#pragma unroll
    for (int w = 0; w < kWords; ++w) any |= bits[w];
    if (any == 0) return 0;
    std::uint32_t rows = 0;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      int first, last;
      mask.row_window(m0 + cute::get<0>(c_rc(r, 0)), n0, kBlockN, first, last);
      if (any_row_bit<kWords>(bits, first, last)) rows |= 1u << r;
    }
    return rows;
  }
};

}  // namespace flashcpp::detail::cuda::sm90
