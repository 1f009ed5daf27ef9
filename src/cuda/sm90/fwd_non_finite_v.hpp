#pragma once
// NaN and Inf in V in the key blocks the mask cuts through, sm90a forward. A hidden key gets
// P = 0 there, but O += P V still multiplies that 0 by its V row, and 0 * NaN = 0 * Inf = NaN,
// so a non-finite V at a hidden key would reach rows that do not see it. The work is done off
// the consumers' path, by warps 1-3 of the producer warpgroup (the "scanner"); the producer
// thread issues its TMA loads exactly as without the scan:
//  - the producer thread writes, for each tile, its key block range, query block and sequence
//    lengths to a small ring (v_scan_tiles; an end of -1 after its last tile) before the
//    tile's loads;
//  - warp 1 follows the V ring as a consumer would: it waits for each stage's full barrier
//    and works out, from the ring entry of the tile (its mask's unmasked band), whether the
//    block is cut (the producer loads V blocks from range.end - 1 down). A stage that is not
//    cut it passes on at once; a cut one it scans with warps 2 and 3 (common path: loads and
//    integer ops only, no stores, one barrier that ORs the verdict). Only if some value is not
//    finite does warp 1 alone zero those 16-byte chunks in place and write the stage's key
//    bits (bit k: V row k held one). Warp 1 then sets the stage's `v_flagged` word and arrives on `v_scanned` of the stage and on its
//    empty barrier (the V pipeline counts the scanner as one more consumer thread, so a stage
//    is never refilled before the scanner is done with it, and the scanner never falls a
//    phase behind);
//  - the consumers wait on v_scanned (same phase as the full barrier) for a cut block only,
//    read v_flagged, and only if it is set read the bits and make every O element of a row
//    that sees a flagged key NaN (docs/semantics.md allows the whole row).
// The ring has kStages + 1 entries: the producer writes a tile's entry once it has acquired
// every V stage of the tiles before, so the scanner has read at least up to kStages uses
// back, which covers the kStages + 1 tiles back that entry would overwrite.
// FP8: the stage holds V^T (Dv rows of keys, fwd_fp8_vt_prepass.cuh), and the pre-pass has
// already found the keys whose v holds a NaN (e4m3's only non-finite value): it wrote them as
// bits to the workspace (fp8_vt_layout.hpp). So no stage is scanned: for a cut block warp 1
// alone reads the block's words of bits (the ring entry says where the tile's sequence and kv
// head start), and only if one is set zeroes the stage's NaN bytes (a flat walk: the layout
// does not matter) and sets the tile's `flagged` in its ring entry. Warps 2 and 3 have no
// work. The consumers still wait on v_scanned before the P V of a cut block (the zeros), read
// `flagged` before releasing the tile's last V stage and, if set, make the rows that see a
// flagged key NaN at the end of the tile, from the bits in the workspace (a per-block test
// between the P V chunks' wgmmas made ptxas serialise them; a flag carried along the key loop
// spilled at d256).
#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/mask.hpp"
#include "cuda/common/non_finite_rows.hpp"
#include "cuda/sm90/named_barriers.hpp"
#include "cuda/sm90/zero_rows.hpp"

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
  static constexpr int kStages = Traits::kStages;
  static constexpr int kWords = Traits::kVKeyWords;
  static constexpr int kScanThreads = Traits::kScanThreads;
  // A V stage as 16-byte chunks; the common path's loads in flight per thread (4 x 4
  // registers: the producer warpgroup runs at 24).
  static constexpr int kChunks = int(Traits::kVStageBytes / 16);
  static constexpr int kBatch = 4;
  static constexpr int kTileSlots = Traits::kScanTileSlots;
  using ScanTile = typename SharedStorage::ScanTile;
  static_assert(kTileSlots >= kStages + 1);
  // The flat walk reads stage s at bytes [s, s + 1) * kVStageBytes of ss.v.
  static_assert(cute::cosize_v<typename Traits::SmemLayoutV> * sizeof(Element) ==
                kStages * Traits::kVStageBytes);
  static_assert(typename Traits::SmemLayoutV{}(0, 0, 1) * sizeof(Element) ==
                Traits::kVStageBytes);
  static_assert(!Traits::kFp8 || typename Traits::SmemLayoutVt{}(0, 0, 1) * sizeof(Element) ==
                                     Traits::kVStageBytes);
  static_assert(!Traits::kFp8 || Traits::kBlockN % 32 == 0,
                "FP8: a key block is whole words of the pre-pass's NaN key bits");

  __device__ static void init(SharedStorage& ss) {
    for (int s = 0; s < kStages; ++s) cutlass::arch::ClusterBarrier::init(&ss.v_scanned[s], 1);
  }

  // Producer thread, at the start of tile number `work` (counting the tiles with work), before
  // its loads: the tile's key blocks, query block and sequence lengths, for the scanner (which
  // works out the unmasked band itself: this thread runs at 24 registers). FP8: nan_word, the
  // word of the NaN key bits that holds key 0 of the tile's sequence and kv head.
  __device__ static void publish_tile(SharedStorage& ss, int work, BlockRange range, int m_block,
                                      int seqlen_q, int seqlen_k, int nan_word) {
    ss.v_scan_tiles[work % kTileSlots] = {range.begin, range.end, m_block, seqlen_q,
                                          seqlen_k,    nan_word,  0};
  }

  // Producer thread, after its last tile (`work` tiles) and pipeline_v.producer_tail (every
  // stage released, by the scanner too): an end entry, and the next V stage's full barrier
  // completed without a load, end the scanner.
  template <class PipelineState>
  __device__ static void end_scans(SharedStorage& ss, int work, const PipelineState& state) {
    ss.v_scan_tiles[work % kTileSlots].end = -1;
    ss.pipeline_v.full_barrier_[state.index()].arrive();
  }

  // Warps 1-3 of the CTA (kScanThreads). Warp 1 follows the ring; the others wait for a cut stage.
  // Every barrier of the scan is reached from one place in the code by all three warps.
  // window_left / window_right: the call's (the tiles' masks). FP8: warp 1 alone, and nan_keys
  // the pre-pass's NaN key bits.
  __device__ static void scanner(SharedStorage& ss, int window_left, int window_right,
                                 const std::uint32_t* nan_keys) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if constexpr (Traits::kFp8)
      if (warp != 1) return;
    // Warp 1, lane 0's walk: the V stage and phase, the tile's ring slot, its blocks left and
    // the next one, its unmasked band.
    int stage = 0, slot = 0, left = 0, n = 0, seqlen_k = 0;
    BlockRange band{0, 0};
    std::uint32_t phase = 0;
    auto release_stage = [&] {  // warp 1: the stage's scan (if any) done
      // (release: the verdict, and the rare path's zeros and bits, ordered before it)
      if (lane == 0) {
        // The consumers wait on v_scanned for the cut blocks only: the stage's previous phase
        // (long complete) is waited on here, so no phase goes unwaited for (synccheck).
        cutlass::arch::ClusterBarrier::wait(&ss.v_scanned[stage], phase ^ 1);
        cutlass::arch::ClusterBarrier::arrive(&ss.v_scanned[stage]);
        ss.pipeline_v.empty_barrier_[stage].arrive();
      }
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    };
#pragma unroll 1
    for (;;) {
      if (warp == 1) {
        // Passes the stages the mask does not cut on at once, up to a cut one or the end.
        int cut = 0;
#pragma unroll 1
        for (;;) {
          if (lane == 0) {
            ss.pipeline_v.full_barrier_[stage].wait(phase);
            if (left == 0) {  // (the entry was written before this load's arrival)
              const volatile int* const e = &ss.v_scan_tiles[slot].begin;
              const int end = e[1];
              n = end - 1;
              left = end - e[0];
              seqlen_k = e[4];
              band = WindowMask(e[3], seqlen_k, window_left, window_right)
                         .unmasked_blocks(e[2], Traits::kBlockM, kBlockN);
              slot = slot + 1 == kTileSlots ? 0 : slot + 1;
              if (end < 0) cut = -1;
            }
            if (cut == 0) {
              cut = block_is_cut(n, band);
              // (read after the barrier below; >= kBlockN: no key of the block is past the end)
              if constexpr (!Traits::kFp8) ss.v_scan_tail = seqlen_k - n * kBlockN;
              --n;
            }
            --left;
          }
          cut = __shfl_sync(0xffffffffu, cut, 0);
          if (cut != 0) break;
          release_stage();
        }
        if constexpr (Traits::kFp8) {
          if (cut < 0) return;
          // The tile's entry (still the tile's: the producer cannot rewrite it before this
          // stage is released): the cut block n + 1's first word; flagged for the consumers.
          volatile ScanTile* const entry = &ss.v_scan_tiles[slot == 0 ? kTileSlots - 1 : slot - 1];
          int word = 0;
          if (lane == 0) word = entry->nan_word + (n + 1) * (kBlockN / 32);
          if (read_nan_keys(ss, stage, nan_keys, __shfl_sync(0xffffffffu, word, 0)) && lane == 0)
            entry->flagged = 1;
          release_stage();
          continue;
        }
        if (lane == 0) ss.v_scan_stage = cut < 0 ? -1 : stage;  // read after the barrier
        __syncwarp();
      }
      if constexpr (!Traits::kFp8) {
        named_barrier_sync_unaligned(NamedBarrier::kFwdVScan, kScanThreads);
        const int scan_stage = *reinterpret_cast<volatile const int*>(&ss.v_scan_stage);
        if (scan_stage < 0) return;
        const bool flagged =
            scan(ss, scan_stage, *reinterpret_cast<volatile const int*>(&ss.v_scan_tail));
        if (warp == 1) {
          if (lane == 0) ss.v_flagged[stage] = flagged;
          release_stage();
        }
      }
    }
  }

  // The consumers, before O += P V of a cut block whose V is in stage `state` (full barrier
  // waited for): the scan of the stage is done.
  template <class PipelineState>
  __device__ static void wait_scanned(SharedStorage& ss, const PipelineState& state) {
    cutlass::arch::ClusterBarrier::wait(&ss.v_scanned[state.index()], state.phase());
  }

  // FP8, consumer, at the end of a tile (O complete) one of whose cut blocks held a flagged key:
  // each of this thread's O rows r (query m0 + the row of c_rc(r, 0)) that sees a key with a
  // NaN v in a cut block of `range` becomes NaN. From the pre-pass's bits (words from
  // `word0`, the tile's sequence and kv head; the stages' flags are released by now). Rare:
  // only calls with NaN in v come here.
  template <int kRows, class RowCol, class ORowCol>
  __device__ static void nan_rows_seeing_nan_keys(const std::uint32_t* nan_keys, int word0,
                                                  BlockRange range, BlockRange unmasked,
                                                  const WindowMask& mask, const RowCol& c_rc,
                                                  int m0, ORowCol& o_rc) {
#pragma unroll 1
    for (int n = range.begin; n < range.end; ++n) {
      if (!block_is_cut(n, unmasked)) continue;
      std::uint32_t bits[kWords];
      CUTE_UNROLL
      for (int w = 0; w < kWords; ++w) bits[w] = nan_keys[word0 + n * (kBlockN / 32) + w];
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        int first, last;
        mask.row_window(m0 + cute::get<0>(c_rc(r, 0)), n * kBlockN, kBlockN, first, last);
        if (any_row_bit<kWords>(bits, first, last)) {
          CUTE_UNROLL
          for (int c = 0; c < cute::size<1>(o_rc); ++c) o_rc(r, c) = NAN;
        }
      }
    }
  }

  // FP8, consumer, before releasing the last V stage of tile number `work` (the producer may
  // rewrite the tile's ring entry after that): whether a cut block of the tile had a NaN key.
  __device__ static bool tile_flagged(const SharedStorage& ss, int work) {
    return reinterpret_cast<const volatile ScanTile&>(ss.v_scan_tiles[work % kTileSlots])
               .flagged != 0;
  }

  // Consumer, on cut block n (keys from n0 = n * kBlockN) whose V is in stage `stage`
  // (scanned, not yet released), once the stage's v_flagged word said yes: bit r set for each
  // of this thread's rows r (query m0 + the row of c_rc(r, 0), c_rc the (row, col)
  // coordinates of its S elements) that sees a key the scanner flagged.
  template <int kRows, class RowCol>
  __device__ static std::uint32_t rows_seeing_flagged_keys(const SharedStorage& ss, int stage,
                                                           const WindowMask& mask,
                                                           const RowCol& c_rc, int m0, int n0) {
    const std::uint32_t* const bits = ss.v_bad_keys[stage];
    std::uint32_t rows = 0;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      int first, last;
      mask.row_window(m0 + cute::get<0>(c_rc(r, 0)), n0, kBlockN, first, last);
      if (any_row_bit<kWords>(bits, first, last)) rows |= 1u << r;
    }
    return rows;
  }

 private:
  // Warps 1-3 (threads t = 0..kScanThreads-1): whether stage `stage` holds a
  // non-finite value (the same answer in every thread). The common path reads the stage as
  // flat 16-byte chunks (chunk t + kScanThreads i: consecutive threads read consecutive
  // chunks, so no bank conflicts whatever the swizzle), kBatch loads issued before any test,
  // the packed tests OR-ed together; one barrier ORs the verdict over the threads.
  __device__ static bool scan(SharedStorage& ss, int stage, int tail) {
    const int t = threadIdx.x - 32;
    if constexpr (Traits::kVarlen) {
      // Rows [tail, kBlockN) are the next sequence's keys (packed) or past the sequence in
      // its last page (paged): the mask hides them, and they are zeroed here, before the scan
      // and the products (zero_rows.hpp); padded calls load zeros there.
      if (tail < kBlockN) {
        using namespace cute;
        Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
        zero_rows(sV(_, _, stage), tail, t, kScanThreads);
        cutlass::arch::fence_view_async_shared();
        __syncwarp();
        named_barrier_sync_unaligned(NamedBarrier::kFwdVScan, kScanThreads);
      }
    }
    const std::uint32_t tile =
        cute::cast_smem_ptr_to_uint(ss.v.data()) + stage * Traits::kVStageBytes;
    std::uint32_t lanes = 0;
#pragma unroll 1
    for (int f0 = t; f0 < kChunks; f0 += kBatch * kScanThreads) {
      uint4 chunk[kBatch];
      // (volatile: issued in this order, all before the tests below)
      CUTE_UNROLL
      for (int j = 0; j < kBatch; ++j) {
        const int f = min(f0 + j * kScanThreads, kChunks - 1);  // (past the end: re-read)
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(chunk[j].x), "=r"(chunk[j].y), "=r"(chunk[j].z), "=r"(chunk[j].w)
                     : "r"(tile + 16 * f));
      }
      CUTE_UNROLL
      for (int j = 0; j < kBatch; ++j) lanes |= non_finite_lanes<Element>(chunk[j]);
    }
    __syncwarp();
    const bool flagged =
        named_barrier_or_unaligned(NamedBarrier::kFwdVScan, kScanThreads, lanes != 0);
    // (the same branch in every thread of warp 1; warps 2 and 3 go back to waiting)
    if (flagged && t < 32) zero_and_flag_rows(ss, stage);
    return flagged;
  }

  // FP8, warp 1: whether a key of the cut block in stage `stage` holds a NaN v, from the
  // pre-pass's bits (words nan_keys[word ...], one per 32 keys). If so (rare), zeroes every
  // NaN byte of the stage (all of them belong to those keys: the pre-pass flags every NaN of
  // the sequence, and past its keys V^T holds zeros); the consumers read the bits again at the
  // end of the tile. Zeroing whole 16-byte chunks, as the 16-bit path does, would not do: a
  // chunk of V^T is one value column of 16 keys.
  __device__ static bool read_nan_keys(SharedStorage& ss, int stage,
                                       const std::uint32_t* nan_keys, int word) {
    const int lane = threadIdx.x % 32;
    const std::uint32_t bits = lane < kWords ? nan_keys[word + lane] : 0u;
    if (!__any_sync(0xffffffffu, bits != 0)) return false;
    // (lane 0 waited for the stage's load: the warp reads it after this)
    __syncwarp();
    uint4* const chunks = reinterpret_cast<uint4*>(ss.v.data()) + stage * kChunks;
#pragma unroll 1
    for (int f = lane; f < kChunks; f += 32) {
      uint4 c = chunks[f];
      const uint4 nan = make_uint4(e4m3_nan_bytes(c.x), e4m3_nan_bytes(c.y), e4m3_nan_bytes(c.z),
                                   e4m3_nan_bytes(c.w));
      if ((nan.x | nan.y | nan.z | nan.w) != 0) {
        c.x &= ~nan.x;
        c.y &= ~nan.y;
        c.z &= ~nan.z;
        c.w &= ~nan.w;
        chunks[f] = c;
      }
    }
    cutlass::arch::fence_view_async_shared();
    __syncwarp();
    return true;
  }

  // The rare path of the scan, by warp 1 alone (the warp that then publishes the verdict, so
  // the key bits are its own lane 0's writes): zeroes the stage's non-finite chunks and writes
  // its key bits. Lane l owns key row 32 w + l of word w: the 128-byte swizzle puts the same
  // chunk of 8 consecutive rows in 8 different bank groups, and a ballot gives each word
  // without shared-memory atomics. The zeros are read by wgmma (async proxy): fenced before
  // warp 1's arrival on v_scanned.
  __device__ static void zero_and_flag_rows(SharedStorage& ss, int stage) {
    using namespace cute;
    const int lane = threadIdx.x % 32;
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
#pragma unroll 1
    for (int w = 0; w < kWords; ++w) {
      const int row = 32 * w + lane;
      bool bad = false;
      if (row < kBlockN) {
        Tensor v_row = sV(row, _, stage);
#pragma unroll 1
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
    cutlass::arch::fence_view_async_shared();
    __syncwarp();
  }
};

}  // namespace flashcpp::detail::cuda::sm90
