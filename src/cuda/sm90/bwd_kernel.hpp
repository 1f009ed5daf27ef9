#pragma once
// The sm90a backward main kernel = mask policy (which query blocks) + producer (loads) +
// consumer mainloop (products) + epilogue (dK, dV stores). One CTA per (key block, kv head,
// batch), a linear grid (key blocks fastest: with bottom-right causal masks the first key
// blocks see the most queries and start first). The shell only assigns warpgroup roles:
//   warpgroup 0      producer: gives registers back (setmaxnreg 24), one thread issues TMA;
//   warpgroups 1, 2  consumers: take registers (setmaxnreg 240); 64 keys each, or half the
//                    head dim each for split_d tiles (the mainloop follows the tile).
// The pre-pass (bwd_prepass.hpp) and the dq post-pass (bwd_dq_convert.hpp) run around it.
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/mask.hpp"
#include "cuda/sm90/bwd_epilogue.hpp"
#include "cuda/sm90/bwd_mainloop.hpp"
#include "cuda/sm90/bwd_mainloop_split_d.hpp"
#include "cuda/sm90/bwd_params.hpp"
#include "cuda/sm90/bwd_producer.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

// The consumer mainloop of the tile's layout (bwd_tile_table.hpp).
template <class Traits>
using BwdMainloopOf = std::conditional_t<Traits::kTile.split_d, BwdMainloopSplitD<Traits>,
                                         BwdMainloop<Traits>>;

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdParams<Traits> params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Pipeline = typename Traits::Pipeline;
  using SharedStorage = typename Traits::SharedStorage;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);
  const BwdKernelParams& kp = params.kp;
  const BackwardParams& p = kp.p;

  unsigned block = blockIdx.x;
  const int n_block = int(block % unsigned(kp.num_n_blocks));
  block /= unsigned(kp.num_n_blocks);
  const int head_kv = int(block % unsigned(p.heads_kv));
  const int batch = int(block / unsigned(p.heads_kv));

  const int warp_group = cutlass::canonical_warp_group_idx();
  const int warp = cutlass::canonical_warp_idx_sync();
  const bool elected = cute::elect_one_sync();

  if (warp == 0 && elected) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    cutlass::arch::ClusterTransactionBarrier::init(&ss.kv_full, 1);
  }
  typename Pipeline::Params pp;
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer
                            : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = Traits::kConsumerThreads;
  pp.transaction_bytes = Traits::kQStageBytes;  // one Q block, or one dO block
  // Both constructors initialise their barriers from warp 0 and fence the initialisation.
  Pipeline pipeline_q(ss.pipeline_q, pp, Shape<_1, _1, _1>{});
  Pipeline pipeline_do(ss.pipeline_do, pp, Shape<_1, _1, _1>{});
  __syncthreads();

  const WindowMask mask(p.seqlen_q, p.seqlen_k, p.window_left, p.window_right);
  const BlockRange m_range = mask.m_blocks(n_block, kBlockN, kBlockM);
  // Keys no query sees: the producer loads nothing, the consumers wait on nothing and store
  // zero gradients.
  const bool has_work = m_range.begin < m_range.end;

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (warp == 0 && elected && has_work)
      BwdProducer<Traits>{}.load(params, n_block, head_kv, batch, m_range, pipeline_q,
                                 pipeline_do, ss);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    const int tid = threadIdx.x - 128;
    typename Traits::TiledMmaDkv mma_dkv;
    Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<Traits::kHeadDim>>{});
    Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<Traits::kHeadDim>>{});
    clear(acc_dk);
    clear(acc_dv);
    if (has_work)
      BwdMainloopOf<Traits>{}.mma(kp, mask, n_block, head_kv, batch, m_range, pipeline_q,
                                  pipeline_do, ss, tid, acc_dk, acc_dv);
    BwdEpilogue<Traits>{}(params, n_block, head_kv, batch, acc_dk, acc_dv, ss, tid);
  }
#endif
}

}  // namespace flashcpp::detail::cuda::sm90
