#pragma once
// Epilogue of the sm90 forward, run by each consumer warpgroup on its own 64 rows: the
// normalised O converted to the element type and stored from registers (two neighbouring
// columns per 4-byte store; rows past the sequence and columns past the real head dim
// predicated off), and lse one value per row from the quad's first thread.
#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include "cuda/common/fragment_utils.hpp"
#include "cuda/common/fwd_params.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/common/tile_scheduler.hpp"
#include "cuda/sm90/softmax.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Traits>
struct FwdEpilogue {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kHeadDim = Traits::kHeadDim;

  template <class AccO, int kRows>
  __device__ void operator()(const FwdKernelParams& kp, const SeqlenInfo& seq,
                             const TileCoord& tile, AccO const& acc_o,
                             const float (&lse)[kRows], int tid) const {
    const ForwardParams& p = kp.p;
    const int m0 = tile.m_block * kBlockM;
    const int rows = seq.seqlen_q - m0;
    typename Traits::TiledMmaPV mma_pv;
    auto thr = mma_pv.get_thread_slice(tid);
    Tensor cO = thr.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor cO_rc = make_tensor(cO.data(), wgmma_acc_rowcol(cO.layout()));
    static_assert(decltype(size<0>(cO_rc))::value == kRows);

    if (p.lse != nullptr && get<1>(cO_rc(0, 0)) == 0) {
      float* lse_out = p.lse + seq.batch_q * p.lse_batch_stride +
                       std::int64_t(tile.head) * p.lse_head_stride + seq.row_q + m0;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = get<0>(cO_rc(r, 0));
        if (row < rows) lse_out[row] = lse[r];
      }
    }

    Tensor rO = convert_fragment<Element>(acc_o);
    Tensor rO_rc = make_tensor(rO.data(), wgmma_acc_rowcol(rO.layout()));
    Element* o_base = static_cast<Element*>(p.out) +
                      seq.offset(p.out_stride, seq.batch_q, seq.row_q + m0, tile.head);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(cO_rc(r, 0));
      if (row >= rows) continue;
      Element* o_row = o_base + std::int64_t(row) * p.out_stride.row;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(rO_rc); c += 2) {
        const int col = get<1>(cO_rc(r, c));
        if (col < p.head_dim_v) {
          cutlass::Array<Element, 2> pair;
          pair[0] = rO_rc(r, c);
          pair[1] = rO_rc(r, c + 1);
          *reinterpret_cast<cutlass::Array<Element, 2>*>(o_row + col) = pair;
        }
      }
    }
  }
};

}  // namespace flashcpp::detail::cuda::sm90
