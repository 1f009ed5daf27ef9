#pragma once
// The sm90a backward main kernel, composed from parts given as template parameters:
//   Scheduler  which (key block, kv head, batch) this CTA owns: static tile(kp, blockIdx.x),
//              or of a ticket the CTA takes (deterministic, bwd_tile_scheduler.hpp);
//   Producer   the TMA loads of K, V and the Q / dO ring: load(...) (bwd_producer.hpp);
//   Mainloop   the consumers' products over the query blocks: mma(...) (bwd_mainloop.hpp,
//              or bwd_mainloop_split_d.hpp for split_d tiles); its Traits fix the tile;
//   Epilogue   stores dK and dV: operator()(...) (bwd_epilogue.hpp);
// and the mask rule (common/mask.hpp), which says which query blocks a key block meets. The
// shell only assigns warpgroup roles:
//   warpgroup 0      producer: gives registers back (setmaxnreg 24), one thread issues TMA;
//                    warps 2 and 3 clean the tiles the mask cuts (bwd_non_finite.hpp);
//                    deterministic: one thread of warp 1 adds the staged dQ blocks (d128,
//                    Mainloop::write_dq) or arrives for the blocks the consumers added (d64,
//                    d256, Mainloop::announce_dq; bwd_dq_order.hpp);
//   warpgroups 1, 2  consumers: take registers (setmaxnreg 240); 64 keys each, or half the
//                    head dim each for split_d tiles (the mainloop follows the tile).
// The pre-pass (bwd_prepass.hpp) and the dq post-pass (bwd_dq_convert.hpp) run around it.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/mask.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm90/bwd_non_finite.hpp"
#include "cuda/sm90/bwd_params.hpp"
#include "cuda/sm90/bwd_tile_scheduler.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Producer, class Mainloop, class Epilogue, class Scheduler>
__global__ void __launch_bounds__(Mainloop::Traits::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdParams<typename Mainloop::Traits> params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Traits = typename Mainloop::Traits;
  using Pipeline = typename Traits::Pipeline;
  using SharedStorage = typename Traits::SharedStorage;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);
  const BwdKernelParams& kp = params.kp;
  const BackwardParams& p = kp.p;

  unsigned block = blockIdx.x;
  // The ticket passes through the first statistics stage, which the producer fills only after
  // the __syncthreads that follows the pipelines' set-up below.
  if constexpr (Scheduler::kTicketed)
    block = Scheduler::take_ticket(kp, reinterpret_cast<unsigned*>(&ss.lse_log2[0][0]));
  const BwdTileCoord tile = Scheduler::tile(kp, block);
  const int n_block = tile.n_block, head_kv = tile.head_kv, batch = tile.batch;
  const SeqlenInfo seq = Traits::kVarlen ? SeqlenInfo(p, batch) : SeqlenInfo::padded(p, batch);
  // Varlen grids are sized by the longest key sequence: a key block past this sequence's end
  // owns no rows (nothing to load or store). The whole CTA leaves together.
  if (Traits::kVarlen && n_block * kBlockN >= seq.seqlen_k) return;

  const int warp_group = cutlass::canonical_warp_group_idx();
  const int warp = cutlass::canonical_warp_idx_sync();
  const bool elected = cute::elect_one_sync();

  if (warp == 0 && elected) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    cutlass::arch::ClusterTransactionBarrier::init(&ss.kv_full, 1);
    BwdNonFinite<Traits>::init(ss);
    ss.dq_added = 0;
    if constexpr (Mainloop::kDqWriter) {
      for (int s = 0; s < Traits::kStages; ++s) {
        cutlass::arch::ClusterBarrier::init(&ss.dq_full[s], 1);
        cutlass::arch::ClusterBarrier::init(&ss.dq_empty[s], 1);
      }
    }
  }
  typename Pipeline::Params pp;
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer
                            : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  // One scanner thread releases each Q and dO stage too (bwd_non_finite.hpp).
  pp.num_consumers = BwdNonFinite<Traits>::kRingConsumers;
  // Both constructors initialise their barriers from warp 0 and fence the initialisation;
  // each pipeline keeps its own copy of the parameters (a Q block is D wide, a dO block Dv).
  pp.transaction_bytes = Traits::kQStageBytes;
  Pipeline pipeline_q(ss.pipeline_q, pp, Shape<_1, _1, _1>{});
  pp.transaction_bytes = Traits::kDoStageBytes;
  Pipeline pipeline_do(ss.pipeline_do, pp, Shape<_1, _1, _1>{});
  __syncthreads();

  const WindowMask mask(seq.seqlen_q, seq.seqlen_k, p.window_left, p.window_right);
  const BlockRange m_range = mask.m_blocks(n_block, kBlockN, kBlockM);
  // Keys no query sees: the producer loads nothing, the consumers wait on nothing and store
  // zero gradients.
  const bool has_work = m_range.begin < m_range.end;

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    // One role per warp, in exclusive branches: at 24 registers, what one role needs must not
    // stay live through another's loop.
    if (warp == 0) {
      if (elected && has_work)
        Producer{}.load(params, seq, n_block, head_kv, batch, m_range, pipeline_q, pipeline_do,
                        ss);
    } else if (warp == 1) {
      if constexpr (Mainloop::kDqWriter) {
        if (elected && has_work)
          Mainloop{}.write_dq(kp, mask, n_block, head_kv, batch, m_range, ss);
      } else if constexpr (Mainloop::kDqAnnouncer) {
        if (elected && has_work) Mainloop{}.announce_dq(kp, head_kv, batch, m_range, ss);
      }
    } else if (has_work) {
      BwdNonFinite<Traits>::scanner(ss, mask, m_range, n_block, p.heads_q / p.heads_kv, warp);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    const int tid = threadIdx.x - 128;
    typename Traits::TiledMmaDk mma_dk;
    typename Traits::TiledMmaDv mma_dv;
    Tensor acc_dk = partition_fragment_C(mma_dk, Shape<Int<kBlockN>, Int<Traits::kHeadDim>>{});
    Tensor acc_dv = partition_fragment_C(mma_dv, Shape<Int<kBlockN>, Int<Traits::kHeadDimV>>{});
    clear(acc_dk);
    clear(acc_dv);
    if (has_work)
      Mainloop{}.mma(kp, mask, n_block, head_kv, batch, m_range, pipeline_q,
                                  pipeline_do, ss, tid, acc_dk, acc_dv);
    Epilogue{}(params, seq, n_block, head_kv, acc_dk, acc_dv, ss, tid);
  }
#endif
}

}  // namespace flashcpp::detail::cuda::sm90
