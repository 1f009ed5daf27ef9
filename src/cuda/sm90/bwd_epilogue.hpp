#pragma once
// Epilogue of the sm90 backward, run by each consumer warpgroup on its own 64 keys: dK
// scaled by the softmax scale (dS carries the gradient with respect to the scaled score), both
// converted to the element type and stored from registers (two neighbouring columns per 4-byte
// store; keys past the sequence and columns past the real head dim predicated off). A key
// block that no query sees stores zeros.
#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include "cuda/common/bwd_params.hpp"
#include "cuda/common/fragment_utils.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Traits>
struct BwdEpilogue {
  using Element = typename Traits::Element;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;

  template <class AccDkv>
  __device__ void operator()(const BwdKernelParams& kp, int n_block, int head_kv, int batch,
                             AccDkv& acc_dk, AccDkv const& acc_dv, int tid) const {
    const BackwardParams& p = kp.p;
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.scale;
    store(p, acc_dk, p.dk, p.dk_stride, n_block, head_kv, batch, tid);
    store(p, acc_dv, p.dv, p.dv_stride, n_block, head_kv, batch, tid);
  }

 private:
  template <class AccDkv>
  __device__ static void store(const BackwardParams& p, AccDkv const& acc, void* dst,
                               const Strides& s, int n_block, int head_kv, int batch, int tid) {
    typename Traits::TiledMmaDkv mma;
    auto thr = mma.get_thread_slice(tid);
    // (key, dim) of every element; pairs (2i, 2i + 1) are adjacent dims of one key.
    Tensor c = thr.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    const int n0 = n_block * kBlockN;
    const int rows = p.seqlen_k - n0;
    Tensor r = convert_fragment<Element>(acc);
    Element* base = static_cast<Element*>(dst) + std::int64_t(batch) * s.batch +
                    std::int64_t(n0) * s.row + std::int64_t(head_kv) * s.head;
    CUTE_UNROLL
    for (int i = 0; i < size(r); i += 2) {
      const int row = get<0>(c(i)), col = get<1>(c(i));
      if (row < rows && col < p.head_dim) {
        cutlass::Array<Element, 2> pair;
        pair[0] = r(i);
        pair[1] = r(i + 1);
        *reinterpret_cast<cutlass::Array<Element, 2>*>(base + std::int64_t(row) * s.row + col) =
            pair;
      }
    }
  }
};

}  // namespace flashcpp::detail::cuda::sm90
