#pragma once
// NaN and Inf in V in the key blocks the mask cuts through, sm80 forward. A hidden key gets
// P = 0 there, but O += P V still multiplies that 0 by its V row (0 * NaN = 0 * Inf = NaN).
// In those blocks only, each thread checks the V chunks it loaded itself once its cp.async
// wait returns (its own copies are visible to it before any barrier), and the block's
// barrier becomes a vote (__syncthreads_or, the same cost). Almost always nobody found one.
// When someone did, the rare path zeroes the non-finite chunks and records the block's
// flagged key rows in shared memory; after the last block, each thread makes every O element
// of its rows that see a flagged key NaN (docs/semantics.md allows the whole row). The row
// test waits until then because the loop runs at the register limit (d128: 255 with acc_o,
// S and the softmax state live).
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
  // The blocks a tile's mask cuts: at most BM / BN + 2 on each side of the unmasked band.
  static constexpr int kMaxCut = 2 * (Traits::kBlockM / kBlockN + 2);

  // The flagged key rows of the cut blocks that had non-finite V, in the order met.
  struct Record {
    int count;
    int block[kMaxCut];
    std::uint32_t bits[kMaxCut][kWords];
  };
  __device__ static Record& record() {
    __shared__ Record r;
    return r;
  }

  // Before the CTA's first barrier, by one thread.
  __device__ static void clear() { record().count = 0; }

  // Whether one of this thread's V chunks (its partition_D of the stage, (CPY, M, K)) is not
  // finite. The loads are volatile so that they stay one at a time: this runs with O and S
  // live, and eight 16-byte loads in flight cost 32 registers (the loop spilled more).
  template <class VPart>
  __device__ static bool any_in_own_chunks(const VPart& tVsV) {
    std::uint32_t t = 0;
    CUTE_UNROLL
    for (int m = 0; m < cute::size<1>(tVsV); ++m)
      CUTE_UNROLL
      for (int k = 0; k < cute::size<2>(tVsV); ++k) {
        uint4 c;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w)
                     : "r"(static_cast<std::uint32_t>(__cvta_generic_to_shared(&tVsV(0, m, k)))));
        t |= chunk_non_finite<Element>(c);
      }
    return t != 0;
  }

  // The rare path of block n, by every thread once the vote said yes: zeroes the non-finite
  // chunks and records their rows. Ends with a barrier: V is ready for the product.
  template <class VPart>
  __device__ static void zero_and_record(VPart& tVsV, int n, int tid) {
    Record& rec = record();
    const int e = rec.count;  // last written before a barrier
    if (e >= kMaxCut) __trap();  // (the bound above; never)
    if (tid < kWords) rec.bits[e][tid] = 0;
    if (tid == 0) rec.block[e] = n;
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
          atomicOr(&rec.bits[e][row / 32], 1u << (row % 32));
        }
      }
    __syncthreads();
    if (tid == 0) rec.count = e + 1;  // read after the next barrier
  }

  // After the last block and a barrier: O rows (o_rc, with c_rc the (row, col) coordinates of
  // this thread's S elements in the same row order) of query tile m0 that see a recorded key
  // become NaN.
  template <class TensorO, class RowCol>
  __device__ static void poison_rows(TensorO& o_rc, const RowCol& c_rc, const WindowMask& mask,
                                     int m0) {
    const Record& rec = record();
    const int count = rec.count;
    if (count == 0) return;
#pragma unroll 1
    for (int e = 0; e < count; ++e)
      CUTE_UNROLL
      for (int r = 0; r < cute::size<0>(o_rc); ++r) {
        int first, last;
        mask.row_window(m0 + cute::get<0>(c_rc(r, 0)), rec.block[e] * kBlockN, kBlockN, first,
                        last);
        if (any_row_bit<kWords>(rec.bits[e], first, last)) {
          CUTE_UNROLL
          for (int c = 0; c < cute::size<1>(o_rc); ++c) o_rc(r, c) = NAN;
        }
      }
  }
};

}  // namespace flashcpp::detail::cuda::sm80
