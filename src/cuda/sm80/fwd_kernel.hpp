#pragma once
// The sm80 forward kernel = scheduler (which tile) + mask policy (which key blocks) +
// mainloop (the products and the online softmax) + epilogue (stores). The shell holds no
// math of its own.
#include <cute/tensor.hpp>

#include "cuda/sm80/fwd_epilogue.hpp"
#include "common/mask.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm80/softmax.hpp"
#include "cuda/sm80/fwd_tile_scheduler.hpp"
#include "cuda/sm80/fwd_mainloop.hpp"

namespace flashcpp::detail::cuda::sm80 {

using namespace cute;

// kPaged: K and V from a paged KV cache (fwd_mainloop.hpp).
template <class Traits, bool kSoftcap, bool kPaged = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    fwd_kernel(const __grid_constant__ FwdKernelParams kp) {
  extern __shared__ __align__(128) char smem[];
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;

  const TileCoord tile = tile_of_block(kp, blockIdx.x);
  const SeqlenInfo seq(kp.p, tile.batch);
  // Varlen grids are sized by the longest sequence; shorter ones leave CTAs with no rows.
  if (tile.m_block * kBlockM >= seq.seqlen_q) return;

  const WindowMask mask(seq.seqlen_q, seq.seqlen_k, kp.p.window_left, kp.p.window_right);
  BlockRange range = mask.n_blocks(tile.m_block, kBlockM, kBlockN);
  if (kp.num_splits > 1) {
    const int split_begin = tile.split * kp.n_blocks_per_split;
    range.begin = max(range.begin, split_begin);
    range.end = min(range.end, split_begin + kp.n_blocks_per_split);
  }
  const BlockRange unmasked = mask.unmasked_blocks(tile.m_block, kBlockM, kBlockN);

  typename Traits::TiledMmaO tiled_mma;
  Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<Traits::kHeadDim>>{});
  clear(acc_o);
  constexpr int kRows = decltype(size<0>(acc_rowcol(acc_o.layout())))::value;
  OnlineSoftmax<kRows> softmax;
  // A tile with no visible key skips every load and product: finalize then yields O = 0 and
  // lse = -inf for all its rows.
  if (range.begin < range.end) {
    FwdMainloop<Traits, kSoftcap, kPaged>{}(kp, seq, mask, tile.m_block, tile.head, tile.batch,
                                            range, unmasked, smem, acc_o, softmax);
  }
  float lse[kRows];
  Tensor o_rc = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));
  softmax.finalize(o_rc, kp.lse_scale, lse);
  FwdEpilogue<Traits>{}(kp, seq, tile, acc_o, lse, smem);
}

}  // namespace flashcpp::detail::cuda::sm80
