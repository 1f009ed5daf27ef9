#pragma once
// Epilogue of the sm90 backward, run by each consumer warpgroup: dK scaled by the softmax scale
// (dS carries the gradient with respect to the scaled score), dK and dV converted to the element
// type and stored. A key block that no query sees stores zeros.
//  - Split by keys (d64, d128): the warpgroup's 64 keys of dK and dV go to shared memory (stage
//    w of the Q and dO rings, stmatrix) and one thread stores each with TMA, whose descriptor
//    clips keys past the sequence and columns past the real head dim. The register stores this
//    replaced waited on each other (every store's address and data registers were reused by
//    the next one): the tail of every CTA.
//    Varlen: only when the whole key block lies inside the sequence (a TMA store would write
//    past its end into the next sequence's rows); otherwise from registers as below, both
//    warpgroups alike (the TMA path synchronises them).
//  - Split by head dim (d256, 192 x 128): from registers, two neighbouring columns per 4-byte store (keys
//    past the sequence and columns past the real head dim predicated off); the rings fill the
//    shared memory there and nothing else is free to stage in.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/array.h>

#include "cuda/common/bwd_kernel_params.hpp"
#include "cuda/common/fragment_utils.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm90/tma_extents.hpp"
#include "cuda/sm90/bwd_params.hpp"
#include "cuda/sm90/named_barriers.hpp"
#include "cuda/sm90/value_head_dim.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Traits_>
struct BwdEpilogue {
  using Traits = Traits_;
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kHeadDimV = Traits::kHeadDimV;

  template <class AccDk, class AccDv>
  __device__ void operator()(const BwdParams<Traits>& params, const SeqlenInfo& seq,
                             int n_block, int head_kv, AccDk& acc_dk, AccDv const& acc_dv,
                             SharedStorage& ss, int tid) const {
    const BackwardParams& p = params.kp.p;
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.scale;
    bool tma = !Traits::kTile.split_d;
    if constexpr (Traits::kVarlen) tma = tma && (n_block + 1) * kBlockN <= seq.seqlen_k;
    if constexpr (!Traits::kTile.split_d) {
      if (tma) {
        store_tma(params, seq, acc_dk, acc_dv, n_block, head_kv, ss, tid);
        return;
      }
    }
    using TiledMmaDk = typename Traits::TiledMmaDk;
    using TiledMmaDv = typename Traits::TiledMmaDv;
    store_registers<TiledMmaDk, kHeadDim>(p, seq, acc_dk, p.dk, p.dk_stride, false, n_block,
                                          head_kv, tid);
    store_registers<TiledMmaDv, kHeadDimV>(p, seq, acc_dv, p.dv, p.dv_stride, true, n_block,
                                           head_kv, tid);
  }

 private:
  // Split by keys only, where D == Dv (one stage layout and tile for both).
  template <class AccDkv>
  __device__ static void store_tma(const BwdParams<Traits>& params, const SeqlenInfo& seq,
                                   AccDkv const& acc_dk, AccDkv const& acc_dv, int n_block,
                                   int head_kv, SharedStorage& ss, int tid) {
    const BackwardParams& p = params.kp.p;
    const int wg = tid / 128;
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutDo{});
    // The rings are free once neither warpgroup reads Q or dO any more (the other one may
    // still be in its last products) and every load into them has landed (all were waited).
    named_barrier_sync(NamedBarrier::kBwdEpilogueAll, Traits::kConsumerThreads);

    // A warpgroup's accumulators have the register layout of a one-warpgroup MMA of its 64
    // keys, so that MMA's stmatrix partition of one ring stage is where they go.
    using TiledMmaWg = decltype(make_tiled_mma(typename Traits::TiledMmaDkv::Atom{}));
    auto copy_wg = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, TiledMmaWg{});
    auto thr = copy_wg.get_thread_slice(tid % 128);
    Tensor rdk = convert_fragment<Element>(acc_dk);
    Tensor rdv = convert_fragment<Element>(acc_dv);
    copy(copy_wg, thr.retile_S(rdk), thr.partition_D(sQ(_, _, wg)));
    copy(copy_wg, thr.retile_S(rdv), thr.partition_D(sdO(_, _, wg)));
    // Generic-proxy writes that the TMA store (async proxy) reads.
    cutlass::arch::fence_view_async_shared();
    named_barrier_sync(NamedBarrier::kEpilogue0 + wg, 128);

    if (tid % 128 == 0) {
      auto tile = Shape<_64, Int<kHeadDim>>{};
      const int rows = tma_rows_k(p), batches = tma_batches(p);
      Tensor mdK = domain_offset(
          make_coord(int(seq.row_k), _0{}),
          params.tma_dk.get_tma_tensor(make_shape(rows, p.head_dim, p.heads_kv, batches))(
              _, _, head_kv, int(seq.batch_k)));
      Tensor mdV = domain_offset(
          make_coord(int(seq.row_k), _0{}),
          params.tma_dv.get_tma_tensor(make_shape(rows, p.head_dim_v, p.heads_kv, batches))(
              _, _, head_kv, int(seq.batch_k)));
      Tensor gdK = local_tile(mdK, tile, make_coord(_, _0{}));  // (64, D, n)
      Tensor gdV = local_tile(mdV, tile, make_coord(_, _0{}));
      auto [tdKg, tdKs] = tma_partition(params.tma_dk, _0{}, Layout<_1>{},
                                        group_modes<0, 2>(sQ), group_modes<0, 2>(gdK));
      auto [tdVg, tdVs] = tma_partition(params.tma_dv, _0{}, Layout<_1>{},
                                        group_modes<0, 2>(sdO), group_modes<0, 2>(gdV));
      const int block64 = n_block * (kBlockN / 64) + wg;
      copy(params.tma_dk, tdKs(_, wg), tdKg(_, block64));
      copy(params.tma_dv, tdVs(_, wg), tdVg(_, block64));
      tma_store_arrive();
      tma_store_wait<0>();  // the shared memory stays valid until the stores have read it
    }
  }

  // acc: the (kBlockN, kCols) accumulator of TiledMma, dV (`value`, real width Dv) or dK
  // (real width D); columns past the real width are padding. With D == Dv both calls are one
  // instantiation, as before Dv existed.
  template <class TiledMma, int kCols, class Acc>
  __device__ static void store_registers(const BackwardParams& p, const SeqlenInfo& seq,
                                         Acc const& acc, void* dst, const Strides& s, bool value,
                                         int n_block, int head_kv, int tid) {
    TiledMma mma;
    auto thr = mma.get_thread_slice(tid);
    // (key, dim) of every element; pairs (2i, 2i + 1) are adjacent dims of one key.
    Tensor c = thr.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kCols>>{}));
    const int n0 = n_block * kBlockN;
    const int rows = seq.seqlen_k - n0;
    Tensor r = convert_fragment<Element>(acc);
    Element* base =
        static_cast<Element*>(dst) + seq.offset(s, seq.batch_k, seq.row_k + n0, head_kv);
    CUTE_UNROLL
    for (int i = 0; i < size(r); i += 2) {
      const int row = get<0>(c(i)), col = get<1>(c(i));
      if (row < rows && col < (value ? value_head_dim<Traits>(p) : p.head_dim)) {
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
