#pragma once
// The sm90a forward kernel, composed from three parts given as template parameters:
//   Scheduler  which tiles this CTA walks: static num_slots(kp), first(kp, cta),
//              next(kp, slot, grid) and tile(kp, slot, TileCoord&) -> false for a hole, or
//              the dynamic deal of DynamicTileQueue (fwd_tile_scheduler.hpp);
//   Mainloop   producer loads and consumer products and softmax: load(...), mma(...),
//              pingpong_start/finish (fwd_mainloop.hpp); its Traits fix the tile;
//   Epilogue   stores O and lse of a tile: operator()(...) and drain(tid) (fwd_epilogue.hpp);
// and the mask rule (common/mask.hpp), which says which key blocks a tile visits. The shell
// only assigns warpgroup roles and walks the scheduler's tiles:
//   warpgroup 0      producer: gives registers back (setmaxnreg 24), one thread issues TMA,
//                    warps 1-3 check the V of the key blocks the mask cuts
//                    (fwd_non_finite_v.hpp; FP8: warp 1 reads the pre-pass's NaN bits);
//   warpgroups 1, 2  consumers: take registers (setmaxnreg 240), 64 query rows each (d64's
//                    long-call tile: warpgroups 1-3 at 160 registers).
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/mask.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/common/tile_coord.hpp"
#include "cuda/sm90/fwd_non_finite_v.hpp"
#include "cuda/sm90/fwd_params.hpp"
#include "cuda/sm90/fwd_tile_scheduler.hpp"
#include "cuda/sm90/softmax.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

// What both roles derive from a scheduler slot: the tile (or a hole), its sequence, mask and
// key blocks (a split's share of them).
template <class Scheduler, int kBlockM, int kBlockN>
struct TileWork {
  TileCoord tile;
  bool valid;  // false: the hole of an odd pair, nothing to compute or store
  SeqlenInfo seq;
  WindowMask mask;
  BlockRange range;

  __device__ TileWork(const FwdKernelParams& kp, int slot)
      : tile{},
        valid(Scheduler::tile(kp, slot, tile)),
        seq(kp.p, tile.batch),
        mask(seq.seqlen_q, seq.seqlen_k, kp.p.window_left, kp.p.window_right),
        range(mask.n_blocks(tile.m_block, kBlockM, kBlockN)) {
    if constexpr (Scheduler::kSplit) {
      // Split j takes the j-th equal share of the tile's key blocks (none past the end).
      const int per = (range.end - range.begin + kp.num_splits - 1) / kp.num_splits;
      const int begin = min(range.end, range.begin + tile.split * per);
      range = {begin, min(range.end, begin + per)};
    }
  }

  // False also for a tile whose rows see no key: it stores O = 0 and lse = -inf.
  __device__ bool has_work() const { return valid && range.begin < range.end; }
};

template <class Mainloop, class Epilogue, class Scheduler>
__global__ void __launch_bounds__(Mainloop::Traits::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdParams<typename Mainloop::Traits> params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Traits = typename Mainloop::Traits;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  using SharedStorage = typename Traits::SharedStorage;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);
  const FwdKernelParams& kp = params.kp;

  const int warp_group = cutlass::canonical_warp_group_idx();
  const int warp = cutlass::canonical_warp_idx_sync();
  const bool elected = cute::elect_one_sync();

  if (warp == 0 && elected) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    if constexpr (Traits::kTmaStoreO)
      cute::prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
    if constexpr (Traits::kPaged) {
      cute::prefetch_tma_descriptor(params.tma_k_whole.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_v_whole.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_k_wide.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_v_wide.get_tma_descriptor());
    }
    cutlass::arch::ClusterTransactionBarrier::init(&ss.q_full, 1);
    cutlass::arch::ClusterBarrier::init(&ss.q_empty, Traits::kConsumerThreads);
    DynamicTileQueue::init(ss.tile_queue, Traits::kConsumerThreads);
    if constexpr (Traits::kScanV) FwdNonFiniteV<Traits>::init(ss);
    cutlass::arch::fence_barrier_init();
  }
  typename Pipeline::Params pp;
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer
                            : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = Traits::kConsumerThreads;
  // Both constructors initialise their barriers from warp 0 and fence the initialisation;
  // each pipeline keeps its own copy of the parameters (a K stage is D wide, a V stage Dv).
  pp.transaction_bytes = Traits::kKStageBytes;
  Pipeline pipeline_k(ss.pipeline_k, pp, Shape<_1, _1, _1>{});
  pp.transaction_bytes = Traits::kVStageBytes;
  // The V scan's warp 1 releases each V stage too (fwd_non_finite_v.hpp).
  if constexpr (Traits::kScanV) pp.num_consumers = Traits::kConsumerThreads + 1;
  Pipeline pipeline_v(ss.pipeline_v, pp, Shape<_1, _1, _1>{});
  __syncthreads();

  // Producer and consumers walk the same slots and skip the same ones (holes; tiles without a
  // visible key), so the Q barriers' phases (`work`) and the K/V ring stay in step. The walk is
  // the scheduler's static one, or (kp.tile_counter set) the one the producer thread takes from
  // the counter and hands to the consumers through the tile queue.
  using Work = TileWork<Scheduler, kBlockM, kBlockN>;
  const int num_slots = Scheduler::num_slots(kp);
  // (The paged instantiation runs for KV-cache calls, planned without a tile counter: static.)
  const bool dynamic = Traits::kVarlen && !Traits::kPaged && kp.tile_counter != nullptr;

  Mainloop mainloop;
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    // One elected thread issues the loads; the paged instantiation's whole warp 0, whose lanes
    // look up and issue the boxes of a key block side by side (fwd_mainloop.hpp).
    if (warp == 0 && (Traits::kPaged || elected)) {
      PipelineState state = cutlass::make_producer_start_state<Pipeline>();
      int work = 0;
      // The dynamic walk: from a candidate slot, skip the holes and hand the slot (or the end)
      // to the consumers.
      int entry = 0;
      auto publish = [&](int slot) {
        if constexpr (Traits::kVarlen) {
          if (dynamic) {
            TileCoord t;
            while (slot < num_slots && !Scheduler::tile(kp, slot, t))
              slot = DynamicTileQueue::take(kp);
            DynamicTileQueue::push(ss.tile_queue, entry++, slot);
          }
        }
        return slot;
      };
      for (int slot = publish(dynamic ? int(blockIdx.x) : Scheduler::first(kp, blockIdx.x));
           slot < num_slots;
           slot = publish(dynamic ? DynamicTileQueue::take(kp)
                                  : Scheduler::next(kp, slot, gridDim.x))) {
        const Work w(kp, slot);
        if (!w.has_work()) continue;
        mainloop.load(params, w.seq, w.tile.m_block, w.tile.head, w.tile.batch, w.range, work,
                      state, pipeline_k, pipeline_v, ss);
        ++work;
      }
      if constexpr (Traits::kScanV) {
        // Every V stage released (every cut load scanned): the scanner may stop.
        pipeline_v.producer_tail(state);
        if (threadIdx.x == 0) FwdNonFiniteV<Traits>::end_scans(ss, work, state);
      }
    } else if (warp > 0) {
      if constexpr (Traits::kScanV)
        FwdNonFiniteV<Traits>::scanner(ss, kp.p.window_left, kp.p.window_right,
                                       kp.fp8_v_nan_keys);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    const int tid = threadIdx.x - 128;
    Epilogue epilogue;
    PipelineState state;  // consumer states start at phase 0
    int work = 0;
    Mainloop::pingpong_start(tid);
    int entry = 0;
    auto next_slot = [&](int slot) {
      return dynamic ? DynamicTileQueue::pop(ss.tile_queue, entry++)
                     : Scheduler::next(kp, slot, gridDim.x);
    };
    for (int slot = dynamic ? DynamicTileQueue::pop(ss.tile_queue, entry++)
                            : Scheduler::first(kp, blockIdx.x);
         slot < num_slots; slot = next_slot(slot)) {
      const Work w(kp, slot);
      if (!w.valid) continue;
      typename Traits::TiledMmaPV mma_pv;
      Tensor acc_o = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<Traits::kHeadDimV>>{});
      clear(acc_o);
      constexpr int kRows = decltype(size<0>(wgmma_acc_rowcol(acc_o.layout())))::value;
      Softmax<kRows> softmax;
      // A tile with no visible key stores O = 0 and lse = -inf (the empty softmax's result).
      // The ring stage of the tile's last key block (O goes through it where
      // Traits::kOInRing).
      int last_stage = 0;
      if (w.has_work()) {
        const BlockRange unmasked = w.mask.unmasked_blocks(w.tile.m_block, kBlockM, kBlockN);
        last_stage = mainloop.mma(kp, w.seq, w.mask, w.tile.m_block, w.tile.head, w.tile.batch,
                                  w.range, unmasked, work, state, pipeline_k, pipeline_v, ss, tid,
                                  acc_o, softmax);
        ++work;
      }
      float lse[kRows];
      Tensor o_rc = make_tensor(acc_o.data(), wgmma_acc_rowcol(acc_o.layout()));
      if constexpr (Traits::kFp8) {
        // The scores were Q K^T of the codes (lse needs the descaled ones) and O sums codes of
        // V: the descales of the tile's (sequence, kv head) apply here.
        const ForwardParams& p = kp.p;
        const int head_kv = w.tile.head / (p.heads_q / p.heads_kv);
        const float qk = p.q_descale.at(w.tile.batch, head_kv) * p.k_descale.at(w.tile.batch, head_kv);
        softmax.finalize(o_rc, kp.softcap_in_scale != 0.f ? kp.lse_scale : kp.lse_scale * qk, lse);
        const float v_descale = p.v_descale.at(w.tile.batch, head_kv);
        CUTE_UNROLL
        for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= v_descale;
      } else {
        softmax.finalize(o_rc, kp.lse_scale, lse);
      }
      epilogue(params, w.seq, w.tile, w.has_work(), acc_o, lse, ss, tid, last_stage);
    }
    Mainloop::pingpong_finish(tid);
    epilogue.drain(tid);
  }
#endif
}

}  // namespace flashcpp::detail::cuda::sm90
