#pragma once
// NaN and Inf at the hidden pairs of the tiles the mask cuts through, sm90a backward. A hidden
// (query, key) pair has P = 0 there, but the products still multiply that 0 by the pair's
// rows (0 * NaN = 0 * Inf = NaN): dV += P^T dO and dK += dS^T Q by the query's dO and Q rows,
// dQ = dS K by the key's K row, and dS = P (dP - dsum) by a non-finite dP (V or dO) or dsum.
// So, in the tiles the mask cuts (a few at the ends of a key block's query range):
//  - the consumers select dS = 0 at the hidden pairs (with P), whatever dP and dsum hold;
//  - two warps of the producer warpgroup (the "scanners"; warp 0 issues the TMA loads, warp 1
//    may be the dQ writer) zero the non-finite 16-byte chunks of the tile's Q (warp 2) and dO
//    (warp 3), and, once per CTA whose key block the mask cuts somewhere, the non-finite
//    chunks of K (both, half the keys each), with a bit per key that had one zeroed;
//  - the consumers wait for the scanners only before the products that read those operands
//    for a cut tile (dV, dK, dQ), and once per CTA for the K scan, before the first tile's P
//    (their first dQ product reads K after that). The scans overlap S^T and dP^T, which read
//    the same chunks meanwhile. That race is harmless: a Q or dO chunk read before its
//    zeroing is non-finite either way, and it only reaches pairs that are hidden (P, dS
//    selected) or visible to a row whose lse (non-finite q, or a NaN key it sees) or dsum
//    (non-finite dO) is not finite, which is NaN whatever the product gives; a K chunk read
//    before or after its zeroing only reaches the scores of its key, which the consumers
//    replace (next item);
//  - the scores of a key with a zeroed K chunk are wrong in every tile of the CTA (S^T reads
//    the zeroed K; d64 copies K into registers once the scan is done), so without a softcap the
//    consumers make them -inf for every row, as the mask does (every tile of such a CTA takes
//    the masked path; the verdict is read from shared memory per tile): a row with a finite
//    lse that sees the key had a score of -Inf there (a +Inf or NaN score makes lse NaN), so
//    P = 0 and dS = 0 are exact, and a row with a NaN lse gets P = NaN whatever the score.
//    dQ = dS K then multiplies those zeros by the zeroed K: the key adds 0 to dq of every row
//    (IEEE gives NaN in its non-finite columns to the rows that see it with a -Inf score:
//    docs/semantics.md).
//    With a softcap an Inf k gives the rows that see it a finite score (c tanh(+-Inf) = +-c)
//    that is in their lse, so -inf would be wrong: there the consumers recompute that key's
//    scores in fp32 from its k row in global memory (exact_score), which the zeroed K lost;
//  - when a tile's dO had a non-finite chunk (rare), the consumers add 0 * dS to P: that row's
//    dsum is not finite, so its dS is at the pairs it sees, and dV of those keys stays NaN
//    though its dO row was zeroed.
// How the scanners follow the tiles: the producer loads as before, onto the rings' full
// barriers, and the consumers wait on those as before; the scanners walk the same (head, query
// block) sequence as one more consumer thread each of the Q (warp 2) and dO (warp 3) rings
// (their empty barriers count kConsumerThreads + 1 arrivals): each waits on the stage's full
// barrier, scans it if the mask cuts the tile, arrives on the stage's clean barrier (both
// scanners, every tile), which the consumers wait for on the cut tiles only, and releases the
// stage. A tile the mask does not cut costs the consumers nothing.
// Phases: a stage's full barrier completes again only after the scanner released the stage,
// and its clean barrier only after that, so nobody waits a phase behind.
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/mask.hpp"
#include "cuda/common/non_finite_rows.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm90/zero_rows.hpp"

namespace flashcpp::detail::cuda::sm90 {

// The scanners' state in shared memory (a member of both backward SharedStorages).
template <int kStages>
struct BwdNonFiniteStorage {
  static constexpr int kKeyWords = 4;           // a bit per key, up to 128 keys
  alignas(8) std::uint64_t k_clean;             // K's non-finite chunks zeroed (scanner lanes)
  alignas(8) std::uint64_t kv_tail;             // varlen: K's rows past the end zeroed (consumers)
  alignas(8) std::uint64_t clean[kStages];      // a ring stage's Q and dO cleaned (both)
  std::uint32_t do_zeroed[kStages];             // ... its dO had a non-finite chunk
  alignas(16) std::uint32_t k_zeroed[kKeyWords];  // the keys whose K had a chunk zeroed
};

template <class Traits>
struct BwdNonFinite {
  using SharedStorage = typename Traits::SharedStorage;
  using Element = typename Traits::Element;
  using PipelineState = typename Traits::PipelineState;
  static constexpr int kStages = Traits::kStages;
  static constexpr int kQScanWarp = 2;

  // By the producer's elected thread of warp 0, before the CTA's first __syncthreads.
  __device__ static void init(SharedStorage& ss) {
    auto& st = ss.non_finite;
    cutlass::arch::ClusterBarrier::init(&st.k_clean, 2 * 32);  // every scanner lane
    cutlass::arch::ClusterBarrier::init(&st.kv_tail, Traits::kConsumerThreads);
    for (int s = 0; s < kStages; ++s) cutlass::arch::ClusterBarrier::init(&st.clean[s], 2);
  }

  // The extra consumer thread of the Q and dO rings: a scanner's (the pipelines' parameter).
  static constexpr int kRingConsumers = Traits::kConsumerThreads + 1;

  // ---- consumers ----

  // On a cut tile, after the rings' consumer_wait: waits until the tile's Q and dO and the key
  // block's K are clean; returns whether the dO had a non-finite chunk.
  __device__ static bool wait_clean(SharedStorage& ss, const PipelineState& state) {
    auto& st = ss.non_finite;
    cutlass::arch::ClusterBarrier::wait(&st.clean[state.index()], state.phase());
    cutlass::arch::ClusterBarrier::wait(&st.k_clean, 0);
    return st.do_zeroed[state.index()] != 0;
  }

  // Once per CTA, in the first tile before its P: waits for the K scan.
  __device__ static void wait_k_scanned(SharedStorage& ss) {
    cutlass::arch::ClusterBarrier::wait(&ss.non_finite.k_clean, 0);
  }
  // After that, every tile: whether some key had a K chunk zeroed (almost never; read from
  // shared memory each time: a register live across the loop spilled at d128).
  __device__ static bool any_key_zeroed(const SharedStorage& ss) {
    std::uint32_t any = 0;
    CUTE_UNROLL
    for (int w = 0; w < Traits::kBlockN / 32; ++w) any |= ss.non_finite.k_zeroed[w];
    return any != 0;
  }
  // Whether block-relative key `key` had one.
  __device__ static bool key_zeroed(const SharedStorage& ss, int key) {
    return (ss.non_finite.k_zeroed[key / 32] >> (key % 32) & 1u) != 0;
  }

  // With a softcap, the score q . k of such a key at query `query` of ring stage `stage` (clean:
  // wait_clean first), in fp32 from k's row in global memory: an Inf term makes it +-Inf, or
  // NaN with a zero q or terms of both signs, as on the tensor cores. `key` is the sequence's
  // key index (< its length). Rare (a CTA whose key block holds such a key), so not inlined:
  // the registers it needs would otherwise be taken from the loop around its call sites.
  __device__ __noinline__ static float exact_score(const BackwardParams& p, int batch,
                                                   int head_kv, int key, const SharedStorage& ss,
                                                   int stage, int query) {
    const SeqlenInfo seq = Traits::kVarlen ? SeqlenInfo(p, batch) : SeqlenInfo::padded(p, batch);
    const Element* k = static_cast<const Element*>(p.k) + seq.batch_k * p.k_stride.batch +
                       (seq.row_k + key) * p.k_stride.row + std::int64_t(head_kv) * p.k_stride.head;
    const cute::Tensor sQ = cute::make_tensor(cute::make_smem_ptr(ss.q.data()),
                                              typename Traits::SmemLayoutQ{});
    float s = 0.f;
#pragma unroll 1
    for (int d = 0; d < p.head_dim; ++d) s = fmaf(float(sQ(query, d, stage)), float(k[d]), s);
    return s;
  }

  // Varlen, every consumer thread once its share of the zeros of the K and V rows past the
  // sequence's end is written (or at once where there are none): the scanners' K scan reads
  // those rows after it. (Each writer arrives itself: its own writes are what it publishes.)
  __device__ static void kv_tail_zeroed(SharedStorage& ss) {
    cutlass::arch::ClusterBarrier::arrive(&ss.non_finite.kv_tail);
  }

  // ---- scanners ----

  // The tiles are scanned in memory order: a stage of the Q or dO ring (the last mode of its
  // swizzled layout), and K, are contiguous runs of whole 16-byte chunks, and the swizzle
  // only permutes chunks inside them. Lanes take consecutive chunks: conflict-free, and no
  // layout arithmetic at 24 registers.
  template <class Layout>
  static constexpr int kStageElems = int(cute::cosize_v<Layout>) / kStages;

  // Zeroes the chunks [begin, end) of `tile` that hold NaN or Inf; returns whether the warp
  // found one. Two loads in flight per lane.
  __device__ static bool zero_chunks(Element* tile, int begin, int end, int lane) {
    uint4* const chunks = reinterpret_cast<uint4*>(tile);
    auto bad = [](uint4 c) { return chunk_non_finite<Element>(c); };
    bool found = false;
#pragma unroll 1
    for (int i = begin + lane; i < end; i += 64) {
      const uint4 a = chunks[i], b = chunks[i + 32];
      if (bad(a)) {
        chunks[i] = make_uint4(0, 0, 0, 0);
        found = true;
      }
      if (bad(b)) {
        chunks[i + 32] = make_uint4(0, 0, 0, 0);
        found = true;
      }
    }
    return __any_sync(0xffffffffu, found);
  }

  // K, key by key: zeroes the non-finite chunks of keys [first, first + 32 kWords), lane l
  // taking keys first + l, first + l + 32, ..., and writes their bits (lane 0). Two loads in
  // flight per lane.
  template <int kWords>
  __device__ static void zero_keys(SharedStorage& ss, int first, int lane) {
    // Through a tensor: the layout's swizzle acts on byte addresses, via the pointer.
    cute::Tensor sK =
        cute::make_tensor(cute::make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    constexpr int kChunks = Traits::kHeadDim / 8;  // a key's 16-byte chunks
    static_assert(kChunks % 2 == 0);
    auto bad = [](uint4 c) { return chunk_non_finite<Element>(c); };
    CUTE_UNROLL
    for (int w = 0; w < kWords; ++w) {
      const int key = first + 32 * w + lane;
      bool zeroed = false;
#pragma unroll 1
      for (int c = 0; c < kChunks; c += 2) {
        uint4* const a = reinterpret_cast<uint4*>(&sK(key, 8 * c));
        uint4* const b = reinterpret_cast<uint4*>(&sK(key, 8 * c + 8));
        const uint4 va = *a, vb = *b;
        if (bad(va)) {
          *a = make_uint4(0, 0, 0, 0);
          zeroed = true;
        }
        if (bad(vb)) {
          *b = make_uint4(0, 0, 0, 0);
          zeroed = true;
        }
      }
      const std::uint32_t bits = __ballot_sync(0xffffffffu, zeroed);
      if (lane == 0) ss.non_finite.k_zeroed[first / 32 + w] = bits;
    }
  }

  // Warps 2 and 3 of the producer warpgroup, in has_work CTAs.
  __device__ static void scanner(SharedStorage& ss, const WindowMask& mask, BlockRange m_range,
                                 int n_block, int group, int warp) {
    auto& st = ss.non_finite;
    const int lane = threadIdx.x % 32;
    const bool q_side = warp == kQScanWarp;
    // The uncut band (the cut query blocks lie at the ends of m_range, a few each).
    int begin = m_range.begin, end = m_range.end;
    while (begin < end && !mask.tile_unmasked(begin, Traits::kBlockM, n_block, Traits::kBlockN))
      ++begin;
    while (end > begin && !mask.tile_unmasked(end - 1, Traits::kBlockM, n_block, Traits::kBlockN))
      --end;
    const bool any_cut = begin != m_range.begin || end != m_range.end;
    // The consumers wait on a stage's clean barrier for the tiles they need it for only; lane
    // 0 waits on the stage's previous phase (long complete) before each arrival, so no phase
    // goes unwaited for (compute-sanitizer synccheck's "missing wait").
    auto arrive_clean = [&](int stage, std::uint32_t phase, bool fence) {
      if (fence) {
        cutlass::arch::fence_view_async_shared();
        __syncwarp();
      }
      if (lane == 0) {
        cutlass::arch::ClusterBarrier::wait(&st.clean[stage], phase ^ 1);
        cutlass::arch::ClusterBarrier::arrive(&st.clean[stage]);
      }
    };
    // K: each scanner half of the keys.
    constexpr int kHalfWords = Traits::kBlockN / 64;
    static_assert(Traits::kBlockN % 64 == 0 &&
                  2 * kHalfWords <= BwdNonFiniteStorage<kStages>::kKeyWords);
    const int first_key = q_side ? 0 : Traits::kBlockN / 2;
    if (any_cut) {
      cutlass::arch::ClusterTransactionBarrier::wait(&ss.kv_full, 0);
      if constexpr (Traits::kVarlen) cutlass::arch::ClusterBarrier::wait(&st.kv_tail, 0);
      zero_keys<kHalfWords>(ss, first_key, lane);
    } else if (lane == 0) {
      CUTE_UNROLL
      for (int w = 0; w < kHalfWords; ++w) st.k_zeroed[first_key / 32 + w] = 0;
    }
    // Every lane arrives (in every CTA: every consumer waits on it): the d64 consumers read K
    // with generic loads, and each writer's own arrival is what publishes its zeros to them.
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::ClusterBarrier::arrive(&st.k_clean);
    constexpr int kQChunks = kStageElems<typename Traits::SmemLayoutQ> / 8;
    constexpr int kDoChunks = kStageElems<typename Traits::SmemLayoutDo> / 8;
    static_assert(kQChunks % 64 == 0 && kDoChunks % 64 == 0);
    PipelineState state;  // consumer states start at phase 0
#pragma unroll 1
    for (int t = 0; t < group * (m_range.end - m_range.begin); ++t) {
      const int m = m_range.begin + t % (m_range.end - m_range.begin);
      const int stage = state.index();
      if (q_side)
        ss.pipeline_q.full_barrier_[stage].wait(state.phase());
      else
        ss.pipeline_do.full_barrier_[stage].wait(state.phase());
      // Varlen: the stage's rows past the sequence's end (the next sequence's queries) are
      // zeroed here, before the scan; the consumers wait for the clean barrier on such a tile
      // before they start on it (zero_rows.hpp).
      bool tail = false;
      if constexpr (Traits::kVarlen) {
        const int rows = mask.seqlen_q - m * Traits::kBlockM;
        if (rows < Traits::kBlockM) {
          tail = true;
          using namespace cute;
          if (q_side) {
            Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
            zero_rows(sQ(_, _, stage), rows, lane, 32);
          } else {
            Tensor sdO =
                make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutDo{});
            zero_rows(sdO(_, _, stage), rows, lane, 32);
          }
          __syncwarp();
        }
      }
      // (On a tile without such rows the consumers start on the stage meanwhile: S^T and dP^T
      // may read the chunks being zeroed, above.)
      if (m < begin || m >= end) {
        if (q_side) {
          zero_chunks(ss.q.data() + stage * kQChunks * 8, 0, kQChunks, lane);
        } else {
          const bool zeroed =
              zero_chunks(ss.dout.data() + stage * kDoChunks * 8, 0, kDoChunks, lane);
          if (lane == 0) st.do_zeroed[stage] = zeroed;
        }
        arrive_clean(stage, state.phase(), true);
      } else {
        arrive_clean(stage, state.phase(), tail);
      }
      if (lane == 0) {  // done with the stage (the clean arrival above is ordered before)
        if (q_side)
          ss.pipeline_q.empty_barrier_[stage].arrive();
        else
          ss.pipeline_do.empty_barrier_[stage].arrive();
      }
      ++state;
    }
  }
};

}  // namespace flashcpp::detail::cuda::sm90
