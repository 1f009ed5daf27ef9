#pragma once
// NaN and Inf in V in the key blocks the mask cuts through, sm80 forward. A hidden key gets
// P = 0 there, but O += P V still multiplies that 0 by its V row (0 * NaN = 0 * Inf = NaN).
// In those blocks only, each thread checks the V chunks it loaded itself once its cp.async
// wait returns (its own copies are visible to it before any barrier; a few loads in flight,
// then packed integer tests), and the block's barrier becomes a vote (__syncthreads_or, the
// same cost; with one K/V buffer, a barrier of its own once P is packed, where fewer
// registers are live). Almost always nobody found one. When someone did, the rare path zeroes
// the non-finite chunks, writes the block's flagged key rows to shared memory, and then makes
// the whole P row of every row that sees a flagged key NaN: O += P V
// then makes that O row NaN (docs/semantics.md allows the whole row) while its row sum, and
// so lse, stay finite. Everything happens inside the masked step, where the mask is live
// anyway: nothing is kept for after the loop (the unmasked steps run at the register limit).
#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>

#include "common/mask.hpp"
#include "cuda/common/non_finite_rows.hpp"

namespace flashcpp::detail::cuda::sm80 {

template <class Traits>
struct FwdNonFiniteV {
  using Element = typename Traits::Element;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kWords = (kBlockN + 31) / 32;
  // Chunk (m, k) of a thread's copy partition is on row tid / kThreadsPerRow + m * this.
  static constexpr int kRowsPerPass = Traits::kNThreads / Traits::kThreadsPerRow;
  // 16-byte loads in flight per thread (4 registers each).
  static constexpr int kBatch = 4;

  // The flagged key rows (bit per row) of the masked block being run, valid after the rare
  // path's barrier and until the next step's first barrier.
  __device__ static std::uint32_t* flagged_keys() {
    __shared__ std::uint32_t bits[kWords];
    return bits;
  }

  // Whether one of this thread's V chunks (its partition_D of the stage, (CPY, M, K)) is not
  // finite: kBatch loads, then their tests OR-ed (non_finite_rows.hpp), and so on. The loads
  // are volatile so that no more than kBatch are in flight: this runs with O and S live.
  template <class VPart>
  __device__ static bool any_in_own_chunks(const VPart& tVsV) {
    constexpr int kM = decltype(cute::size<1>(tVsV))::value;
    constexpr int kK = decltype(cute::size<2>(tVsV))::value;
    constexpr int kChunks = kM * kK;
    std::uint32_t lanes = 0;
    CUTE_UNROLL
    for (int i0 = 0; i0 < kChunks; i0 += kBatch) {
      uint4 c[kBatch];
      CUTE_UNROLL
      for (int j = 0; j < kBatch; ++j)
        if (i0 + j < kChunks)
          asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                       : "=r"(c[j].x), "=r"(c[j].y), "=r"(c[j].z), "=r"(c[j].w)
                       : "r"(static_cast<std::uint32_t>(__cvta_generic_to_shared(
                             &tVsV(0, (i0 + j) / kK, (i0 + j) % kK)))));
      CUTE_UNROLL
      for (int j = 0; j < kBatch; ++j)
        if (i0 + j < kChunks) lanes |= non_finite_lanes<Element>(c[j]);
    }
    return lanes != 0;
  }

  // The rare path of a masked block, by every thread once the vote said yes: zeroes the
  // non-finite chunks and flags their rows. Ends with a barrier: V is ready for the product
  // and the flags for poison_p_rows.
  template <class VPart>
  __device__ static void zero_and_flag(VPart& tVsV, int tid) {
    std::uint32_t* const bits = flagged_keys();
    if (tid < kWords) bits[tid] = 0;
    __syncthreads();
    const int r0 = tid / Traits::kThreadsPerRow;
    CUTE_UNROLL
    for (int m = 0; m < cute::size<1>(tVsV); ++m)
      CUTE_UNROLL
      for (int k = 0; k < cute::size<2>(tVsV); ++k) {
        uint4* const chunk = reinterpret_cast<uint4*>(&tVsV(0, m, k));
        if (chunk_non_finite<Element>(*chunk)) {
          *chunk = make_uint4(0, 0, 0, 0);
          const int row = r0 + m * kRowsPerPass;
          atomicOr(&bits[row / 32], 1u << (row % 32));
        }
      }
    __syncthreads();
  }

  // Before O += P V of a flagged block n0 / kBlockN: every P element (p_rc, with c_rc the
  // (row, col) coordinates of this thread's S elements in the same row order) of a row of
  // query tile m0 that sees a flagged key becomes NaN.
  template <class TensorP, class RowCol>
  __device__ static void poison_p_rows(TensorP& p_rc, const RowCol& c_rc,
                                       const WindowMask& mask, int m0, int n0) {
    const std::uint32_t* const bits = flagged_keys();
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(p_rc); ++r) {
      int first, last;
      mask.row_window(m0 + cute::get<0>(c_rc(r, 0)), n0, kBlockN, first, last);
      if (any_row_bit<kWords>(bits, first, last)) {
        CUTE_UNROLL
        for (int c = 0; c < cute::size<1>(p_rc); ++c)
          p_rc(r, c) = typename TensorP::value_type(NAN);
      }
    }
  }
};

}  // namespace flashcpp::detail::cuda::sm80
