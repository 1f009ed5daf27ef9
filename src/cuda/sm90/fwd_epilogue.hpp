#pragma once
// Epilogue of the sm90 forward, run by each consumer warpgroup on its own 64 rows of a tile:
// lse one value per row from the quad's first thread, and the normalised O in the element
// type, either
//  - through shared memory and a TMA store (d64, d128; varlen: where the warpgroup's 64 rows
//    lie inside the sequence): the warpgroup writes its 64 x D half
//    of the O buffer (4-byte stores into the 128-byte swizzle, conflict-free) and one thread
//    issues the bulk store; the descriptor's real extents clip rows past the sequence and
//    columns past the real head dim. The store runs while the warpgroup starts its next tile;
//    the buffer is rewritten only after that store has finished reading it;
//    O is staged in its own buffer or in the last key block's K and V stages
//    (Traits::kOInRing: warpgroup 0's half in K's, 1's in V's), where the main loop left
//    those stages held for it;
//  - or from registers (varlen d256 and 192 x 128, where shared memory has no room for O,
//    and varlen rows that reach past the sequence's end): two neighbouring
//    columns per 4-byte store, predicated on the row and column bounds.
// Split-KV instantiations (kSplit) store the split's normalised O in float32 and its lse into
// the workspace instead, for the combine kernel (split_kv_combine.hpp).
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/array.h>

#include "cuda/common/fragment_utils.hpp"
#include "cuda/common/fwd_kernel_params.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/common/tile_coord.hpp"
#include "cuda/sm90/fwd_params.hpp"
#include "cuda/sm90/named_barriers.hpp"
#include "cuda/sm90/softmax.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Traits_, bool kSplit = false>
struct FwdEpilogue {
  using Traits = Traits_;
  using Element = typename Traits::ElementOut;  // O's type (bf16 for fp8 inputs)
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kHeadDimV = Traits::kHeadDimV;  // O's columns

  // O converted to the output type. FP8 inputs: bf16 (ElementOut), or fp16 where the call's out
  // is fp16 (a uniform branch; both are 2-byte values written alike, carried in ElementOut).
  template <class AccO>
  __device__ static auto convert_o(const ForwardParams& p, AccO const& acc_o) {
    if constexpr (Traits::kFp8) {
      if (p.dtype == ElementType::fp16) {
        Tensor half = convert_fragment<cutlass::half_t>(acc_o);
        Tensor as_out = make_tensor<Element>(half.layout());
        CUTE_UNROLL
        for (int i = 0; i < size(half); ++i)
          as_out(i) = Element::bitcast(half(i).raw());
        return as_out;
      }
    }
    return convert_fragment<Element>(acc_o);
  }

  // (row, col) in the kBlockM-row tile of every accumulator element this thread holds.
  __device__ static auto coords(int tid) {
    typename Traits::TiledMmaPV mma_pv;
    auto thr = mma_pv.get_thread_slice(tid);
    Tensor cO = thr.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDimV>>{}));
    return make_tensor(cO.data(), wgmma_acc_rowcol(cO.layout()));
  }

  // `has_work`: the tile had a visible key, so the main loop ran and, with O in the ring
  // (Traits::kOInRing), left the K and V stages `last_stage` of its last key block held
  // (mma's result), which the epilogue gives back.
  template <class AccO, int kRows>
  __device__ void operator()(const FwdParams<Traits>& params, const SeqlenInfo& seq,
                             const TileCoord& tile, bool has_work, AccO const& acc_o,
                             const float (&lse)[kRows], SharedStorage& ss, int tid,
                             int last_stage) const {
    // An opaque copy of tid: otherwise the compiler hoists this thread's O addresses out of
    // the persistent tile loop and keeps them live (spilled) across the main loop.
    asm volatile("mov.b32 %0, %0;" : "+r"(tid));
    if constexpr (kSplit) {
      if constexpr (Traits::kOInRing)
        if (has_work) release_stages(ss, last_stage);
      store_partial(params.kp, seq, tile, acc_o, lse, tid);
      return;
    }
    store_lse(params.kp, seq, tile, lse, tid);
    if constexpr (Traits::kOInRing) {
      // A tile without work holds no stages: the ring may already hold the next tile's
      // blocks, so its zeros go from registers.
      if (!has_work) {
        store_o_registers(params.kp, seq, tile, acc_o, tid);
        return;
      }
      // O overwrites the last K and V stages only once both warpgroups' last S = Q K^T and
      // last P V have completed.
      named_barrier_sync(NamedBarrier::kFwdLastStagesRead, Traits::kConsumerThreads);
      store_o_tma(params, seq, tile, acc_o, ss, tid, last_stage);
      return;
    }
    // Varlen: a warpgroup whose 64 rows run past the sequence's end stores from registers; a
    // TMA store would write those rows into the next sequence's (only the packed tensor's end
    // clips).
    if constexpr (Traits::kTmaStoreO && !Traits::kVarlen) {
      store_o_tma(params, seq, tile, acc_o, ss, tid, last_stage);
    } else if constexpr (Traits::kTmaStoreO) {
      if (seq.seqlen_q - tile.m_block * kBlockM - tid / 128 * 64 >= 64)
        store_o_tma(params, seq, tile, acc_o, ss, tid, last_stage);
      else
        store_o_registers(params.kp, seq, tile, acc_o, tid);
    } else {
      store_o_registers(params.kp, seq, tile, acc_o, tid);
    }
  }

  // Before the CTA exits: its last TMA stores must have finished reading shared memory.
  __device__ void drain(int tid) const {
    if constexpr (Traits::kTmaStoreO && !kSplit)
      if (tid % 128 == 0) tma_store_wait<0>();
  }

 private:
  template <int kRows>
  __device__ static void store_lse(const FwdKernelParams& kp, const SeqlenInfo& seq,
                                   const TileCoord& tile, const float (&lse)[kRows], int tid) {
    const ForwardParams& p = kp.p;
    auto c = coords(tid);
    static_assert(decltype(size<0>(c))::value == kRows);
    if (p.lse == nullptr || get<1>(c(0, 0)) != 0) return;
    const int m0 = tile.m_block * kBlockM;
    const int rows = seq.seqlen_q - m0;
    float* lse_out = p.lse + seq.lse_row0 + std::int64_t(tile.head) * p.lse_head_stride + m0;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(c(r, 0));
      if (row < rows) lse_out[row] = lse[r];
    }
  }

  template <class AccO>
  __device__ static void store_o_tma(const FwdParams<Traits>& params, const SeqlenInfo& seq,
                                     const TileCoord& tile, AccO const& acc_o,
                                     SharedStorage& ss, int tid, int last_stage) {
    const ForwardParams& p = params.kp.p;
    const int wg = tid / 128;
    const bool leader = tid % 128 == 0;
    const NamedBarrier bar = fwd_epilogue_barrier(wg);
    // (64, Dv): this warpgroup's half.
    Tensor sO_wg = make_tensor(make_smem_ptr(o_half(ss, wg, last_stage)),
                               typename Traits::SmemLayoutOHalf{});

    // The previous tile's store from this half must have finished reading it (in the ring
    // every store has been waited for before its stage went back).
    if constexpr (!Traits::kOInRing) {
      if (leader) tma_store_wait<0>();
      named_barrier_sync(bar, 128);
    }

    Tensor rO = convert_o(p, acc_o);
    Tensor rO_rc = make_tensor(rO.data(), wgmma_acc_rowcol(rO.layout()));
    auto c = coords(tid);
    CUTE_UNROLL
    for (int r = 0; r < size<0>(rO_rc); ++r) {
      const int row = get<0>(c(r, 0)) - wg * 64;
      CUTE_UNROLL
      for (int col_i = 0; col_i < size<1>(rO_rc); col_i += 2) {
        cutlass::Array<Element, 2> pair;
        pair[0] = rO_rc(r, col_i);
        pair[1] = rO_rc(r, col_i + 1);
        // Columns col, col + 1 (col even) share a 16-byte chunk of the swizzled row.
        *reinterpret_cast<cutlass::Array<Element, 2>*>(&sO_wg(row, get<1>(c(r, col_i)))) = pair;
      }
    }
    // Generic-proxy writes must be visible to the TMA (async proxy) before the store reads them.
    cutlass::arch::fence_view_async_shared();
    named_barrier_sync(bar, 128);

    if (leader) {
      Tensor mO = domain_offset(
          make_coord(int(seq.row_q), _0{}),
          params.tma_o.get_tma_tensor(make_shape(tma_rows_q(p), p.head_dim_v, p.heads_q,
                                                 tma_batches(p)))(_, _, tile.head,
                                                                  int(seq.batch_q)));
      Tensor gO = local_tile(mO, Shape<_64, Int<kHeadDimV>>{}, make_coord(_, _0{}));  // (64, Dv, m)
      auto [tOgO, tOsO] = tma_partition(params.tma_o, _0{}, Layout<_1>{},
                                        group_modes<0, 2>(sO_wg), group_modes<0, 2>(gO));
      copy(params.tma_o, tOsO, tOgO(_, tile.m_block * (kBlockM / 64) + wg));
      tma_store_arrive();
      // O in the ring: the stages are free for the next loads once the store has read them
      // (the leader's arrival completes the release of every thread).
      if constexpr (Traits::kOInRing) tma_store_wait<0>();
    }
    if constexpr (Traits::kOInRing) release_stages(ss, last_stage);
  }

  // Warpgroup wg's 64 x Dv staging half of O: in the O buffer, or in ring stage `stage` of K
  // (warpgroup 0) or V (warpgroup 1) (Traits::kOInRing; each stage starts at a multiple of
  // 1024 bytes, the swizzle period).
  __device__ static Element* o_half(SharedStorage& ss, int wg, int stage) {
    if constexpr (Traits::kOInRing) {
      using Input = typename Traits::Element;
      Input* base = wg == 0 ? ss.k.data() + stage * (Traits::kKStageBytes / sizeof(Input))
                            : ss.v.data() + stage * (Traits::kVStageBytes / sizeof(Input));
      return reinterpret_cast<Element*>(base);
    } else {
      return ss.o.o.data() + wg * (Traits::kOHalfBytes / int(sizeof(Element)));
    }
  }

  // With O in the ring: this thread is done with the K and V stages `stage` (the pipelines'
  // consumer release: every consumer thread arrives on the stage's empty barrier).
  __device__ static void release_stages(SharedStorage& ss, int stage) {
    ss.pipeline_k.empty_barrier_[stage].arrive();
    ss.pipeline_v.empty_barrier_[stage].arrive();
  }

  // Split j's rows: O [split, b, h, row, Dv] and lse [split, b, h, row] of the workspace, rows
  // counted up to seqlen_q (the longest sequence for varlen), as the combine reads them.
  template <class AccO, int kRows>
  __device__ static void store_partial(const FwdKernelParams& kp, const SeqlenInfo& seq,
                                       const TileCoord& tile, AccO const& acc_o,
                                       const float (&lse)[kRows], int tid) {
    const ForwardParams& p = kp.p;
    const int m0 = tile.m_block * kBlockM;
    const int rows = seq.seqlen_q - m0;
    const std::int64_t rows_per_split = std::int64_t(p.batch) * p.heads_q * p.seqlen_q;
    const std::int64_t row0 = tile.split * rows_per_split +
                              (std::int64_t(tile.batch) * p.heads_q + tile.head) * p.seqlen_q + m0;
    auto c = coords(tid);
    Tensor o_rc = make_tensor(acc_o.data(), wgmma_acc_rowcol(acc_o.layout()));
    CUTE_UNROLL
    for (int r = 0; r < size<0>(o_rc); ++r) {
      const int row = get<0>(c(r, 0));
      if (row >= rows) continue;
      if (get<1>(c(r, 0)) == 0) kp.lse_accum[row0 + row] = lse[r];
      float* o_row = kp.o_accum + (row0 + row) * p.head_dim_v;
      CUTE_UNROLL
      for (int col_i = 0; col_i < size<1>(o_rc); col_i += 2) {
        const int col = get<1>(c(r, col_i));
        if (col < p.head_dim_v)
          *reinterpret_cast<float2*>(o_row + col) = make_float2(o_rc(r, col_i), o_rc(r, col_i + 1));
      }
    }
  }

  template <class AccO>
  __device__ static void store_o_registers(const FwdKernelParams& kp, const SeqlenInfo& seq,
                                           const TileCoord& tile, AccO const& acc_o, int tid) {
    const ForwardParams& p = kp.p;
    const int m0 = tile.m_block * kBlockM;
    const int rows = seq.seqlen_q - m0;
    auto c = coords(tid);
    Tensor rO = convert_o(p, acc_o);
    Tensor rO_rc = make_tensor(rO.data(), wgmma_acc_rowcol(rO.layout()));
    Element* o_base = static_cast<Element*>(p.out) +
                      seq.offset(p.out_stride, seq.batch_q, seq.row_q + m0, tile.head);
    CUTE_UNROLL
    for (int r = 0; r < size<0>(rO_rc); ++r) {
      const int row = get<0>(c(r, 0));
      if (row >= rows) continue;
      Element* o_row = o_base + std::int64_t(row) * p.out_stride.row;
      CUTE_UNROLL
      for (int col_i = 0; col_i < size<1>(rO_rc); col_i += 2) {
        const int col = get<1>(c(r, col_i));
        if (col < p.head_dim_v) {
          cutlass::Array<Element, 2> pair;
          pair[0] = rO_rc(r, col_i);
          pair[1] = rO_rc(r, col_i + 1);
          *reinterpret_cast<cutlass::Array<Element, 2>*>(o_row + col) = pair;
        }
      }
    }
  }
};

}  // namespace flashcpp::detail::cuda::sm90
