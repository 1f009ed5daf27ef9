#pragma once
// Forward epilogue, shared by the sm80 kernels: normalised O and lse of one query tile go
//  - unsplit: O converted to the element type, staged through shared memory (reusing the Q
//    buffer) so global stores are 16-byte vectors, rows/cols past the sequence or the real
//    head dim predicated off; lse one value per row;
//  - split-KV: fp32 partial O and partial lse straight from registers into the workspace,
//    merged later by the combine kernel.
#include <cute/tensor.hpp>

#include "cuda/common/fragment_utils.hpp"
#include "cuda/common/fwd_kernel_params.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/common/tile_coord.hpp"

namespace flashcpp::detail::cuda {

using namespace cute;

template <class Traits>
struct FwdEpilogue {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kHeadDim = Traits::kHeadDim;

  // acc_o: normalised O accumulator; lse[r]: lse of (row, col)-view row r.
  template <class AccO, int kRows>
  __device__ void operator()(const FwdKernelParams& kp, const SeqlenInfo& seq,
                             const TileCoord& tile, AccO const& acc_o,
                             const float (&lse)[kRows], char* smem) const {
    const ForwardParams& p = kp.p;
    const int tid = threadIdx.x;
    const int m0 = tile.m_block * kBlockM;
    const int rows = seq.seqlen_q - m0;
    typename Traits::TiledMmaO tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(tid);
    // (row, col) of each accumulator element; column 0 of the (row, col) view tells each
    // thread which rows it holds (the quad's lane 0 owns col 0 of its rows).
    Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));

    if (kp.num_splits > 1) {
      const std::int64_t bh = (std::int64_t(tile.split) * p.batch + tile.batch) * p.heads_q + tile.head;
      const std::int64_t row0 = bh * p.seqlen_q + m0;
      float* o_acc = kp.o_accum + row0 * p.head_dim_v;
      CUTE_UNROLL
      for (int i = 0; i < size(acc_o); ++i) {
        const auto c = tOcO(i);
        if (get<0>(c) < rows && get<1>(c) < p.head_dim_v)
          o_acc[std::int64_t(get<0>(c)) * p.head_dim_v + get<1>(c)] = acc_o(i);
      }
      if (get<1>(tOcO_rc(0, 0)) == 0) {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const int row = get<0>(tOcO_rc(r, 0));
          if (row < rows) kp.lse_accum[row0 + row] = lse[r];
        }
      }
      return;
    }

    if (p.lse != nullptr && get<1>(tOcO_rc(0, 0)) == 0) {
      float* lse_out = p.lse + seq.lse_row0 + std::int64_t(tile.head) * p.lse_head_stride + m0;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = get<0>(tOcO_rc(r, 0));
        if (row < rows) lse_out[row] = lse[r];
      }
    }

    Tensor rO = convert_fragment<Element>(acc_o);
    Tensor sO = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                            typename Traits::SmemLayoutQ{});
    auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
    auto smem_thr_o = smem_copy_o.get_thread_slice(tid);
    copy(smem_copy_o, smem_thr_o.retile_S(rO), smem_thr_o.partition_D(sO));
    __syncthreads();

    Element* o_ptr = static_cast<Element*>(p.out) +
                     seq.offset(p.out_stride, seq.batch_q, seq.row_q + m0, tile.head);
    Tensor gO = make_tensor(make_gmem_ptr(o_ptr), Shape<Int<kBlockM>, Int<kHeadDim>>{},
                            make_stride(p.out_stride.row, _1{}));
    typename Traits::GmemTiledCopyO gmem_copy;
    auto gmem_thr = gmem_copy.get_thread_slice(tid);
    Tensor tOsO = gmem_thr.partition_S(sO);
    Tensor tOgO = gmem_thr.partition_D(gO);
    Tensor tOcO_g = gmem_thr.partition_D(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor tOrO = make_tensor<Element>(shape(tOgO));
    copy(gmem_copy, tOsO, tOrO);
    CUTE_UNROLL
    for (int m = 0; m < size<1>(tOgO); ++m) {
      if (get<0>(tOcO_g(0, m, 0)) >= rows) continue;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tOgO); ++k) {
        if (get<1>(tOcO_g(0, m, k)) < p.head_dim_v) copy(gmem_copy, tOrO(_, m, k), tOgO(_, m, k));
      }
    }
  }
};

}  // namespace flashcpp::detail::cuda
