#pragma once
// The sm80 forward mainloop (FlashAttention-2 schedule) for one query tile: stream K and V
// tiles through shared memory with cp.async, S = Q K^T and O += P V on mma.sync, online
// softmax in registers. Key blocks run from the last to the first so that the block that
// needs the seqlen_k / diagonal mask comes first and the rest run unmasked.
//
// Overlap (one K and one V buffer): the V load of block n is issued before S_n is computed,
// and the K load of block n-1 right after S_n is consumed, so each copy hides behind a product.
#include <cute/tensor.hpp>

#include "cuda/common/fragment_utils.hpp"
#include "cuda/common/fwd_params.hpp"
#include "cuda/common/mask_policy.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/common/softmax.hpp"
#include "cuda/sm80/gemm.hpp"

namespace flashcpp::detail::cuda::sm80 {

using namespace cute;

template <class Traits>
struct FwdMainloop {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;

  // Runs key blocks [range.begin, range.end) (non-empty) of query tile m_block and leaves the
  // unnormalised O in acc_o and the row statistics in softmax.
  template <class AccO, class Softmax>
  __device__ void operator()(const FwdKernelParams& kp, const SeqlenInfo& seq,
                             const WindowMask& mask, int m_block, int head, BlockRange range,
                             BlockRange unmasked, char* smem, AccO& acc_o,
                             Softmax& softmax) const {
    const ForwardParams& p = kp.p;
    const int tid = threadIdx.x;
    const int head_kv = head / (p.heads_q / p.heads_kv);
    const int m0 = m_block * kBlockM;

    // ---- global tiles (int64 offsets) ----
    const Element* q_ptr = static_cast<const Element*>(p.q) +
                           seq.offset(p.q_stride, seq.batch_q, seq.row_q + m0, head);
    const Element* k_base = static_cast<const Element*>(p.k) +
                            seq.offset(p.k_stride, seq.batch_k, seq.row_k, head_kv);
    const Element* v_base = static_cast<const Element*>(p.v) +
                            seq.offset(p.v_stride, seq.batch_k, seq.row_k, head_kv);
    const auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
    const auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
    Tensor gQ = make_tensor(make_gmem_ptr(q_ptr), tile_q, make_stride(p.q_stride.row, _1{}));
    auto k_tile = [&](int n) {
      return make_tensor(make_gmem_ptr(k_base + std::int64_t(n) * kBlockN * p.k_stride.row),
                         tile_kv, make_stride(p.k_stride.row, _1{}));
    };
    auto v_tile = [&](int n) {
      return make_tensor(make_gmem_ptr(v_base + std::int64_t(n) * kBlockN * p.v_stride.row),
                         tile_kv, make_stride(p.v_stride.row, _1{}));
    };

    // ---- shared memory: Q | K | V ----
    Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                            typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
    Tensor sVtNoSwizzle =
        make_tensor(make_smem_ptr(sV.data().get()), typename Traits::SmemLayoutVtNoSwizzle{});

    typename Traits::GmemTiledCopyQKV gmem_copy;
    auto gmem_thr = gmem_copy.get_thread_slice(tid);
    Tensor tQsQ = gmem_thr.partition_D(sQ);
    Tensor tKsK = gmem_thr.partition_D(sK);
    Tensor tVsV = gmem_thr.partition_D(sV);
    Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(tile_q));
    Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(tile_kv));

    typename Traits::TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(tid);
    Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
    Tensor tSrK = thr_mma.partition_fragment_B(sK);
    Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);

    auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
    auto smem_thr_q = smem_copy_q.get_thread_slice(tid);
    Tensor tSsQ = smem_thr_q.partition_S(sQ);
    auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
    auto smem_thr_k = smem_copy_k.get_thread_slice(tid);
    Tensor tSsK = smem_thr_k.partition_S(sK);
    auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
    auto smem_thr_v = smem_copy_v.get_thread_slice(tid);
    Tensor tOsVt = smem_thr_v.partition_S(sVt);

    const int q_rows = seq.seqlen_q - m0;
    // Rows past seqlen_k and columns past the real head dim are zero-filled. (An unpredicated
    // fast path for full blocks raised the spills at d128 from 180 B to 636 B with nvcc 13.)
    auto load_k = [&](int n) {
      copy_zfill(gmem_copy, gmem_thr.partition_S(k_tile(n)), tKsK, tKVcKV,
                 seq.seqlen_k - n * kBlockN, p.head_dim);
    };
    auto load_v = [&](int n) {
      copy_zfill(gmem_copy, gmem_thr.partition_S(v_tile(n)), tVsV, tKVcKV,
                 seq.seqlen_k - n * kBlockN, p.head_dim_v);
    };

    // ---- prologue: Q and the first K block ----
    copy_zfill(gmem_copy, gmem_thr.partition_S(gQ), tQsQ, tQcQ, q_rows, p.head_dim);
    load_k(range.end - 1);
    cp_async_fence();

    const bool has_softcap = kp.softcap_in_scale != 0.f;
    // Key blocks run from the last down: the blocks right of the unmasked band (partial last
    // block, causal/window diagonal) first, then the unmasked band, then the blocks left of
    // it (sliding-window left edge). Only blocks outside the band evaluate the mask: a
    // uniform branch per block. (Instantiating the body twice, masked and unmasked, spilled
    // 1.4 KB at d128 against 180 B for this form, with nvcc 13.)
    for (int n = range.end - 1; n >= range.begin; --n) {
      Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
      clear(acc_s);
      cp_async_wait<0>();  // K_n (and Q) landed
      __syncthreads();     // ... for every thread; V buffer free (previous P V done)
      load_v(n);
      cp_async_fence();

      gemm_smem_smem(tiled_mma, acc_s, tSrQ, tSrK, tSsQ, tSsK, smem_copy_q, smem_copy_k,
                     smem_thr_q, smem_thr_k);

      if (has_softcap) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) acc_s(i) = tanhf(acc_s(i) * kp.softcap_in_scale);
      }
      if (n >= unmasked.end || n < unmasked.begin) {
        // (row, col) of every S accumulator element.
        Tensor tScS =
            thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
        const int n0 = n * kBlockN;
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) {
          const auto c = tScS(i);
          if (!mask.visible(m0 + get<0>(c), n0 + get<1>(c))) acc_s(i) = -INFINITY;
        }
      }

      cp_async_wait<0>();  // V_n landed
      __syncthreads();     // ... for every thread; K buffer free (S_n done everywhere)
      if (n > range.begin) {
        load_k(n - 1);
        cp_async_fence();
      }

      Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
      Tensor o_rc = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));
      softmax.template update<false>(s_rc, o_rc, kp.scale_log2);

      Tensor p_regs = convert_fragment<Element>(acc_s);
      Tensor tOrP = make_tensor(p_regs.data(), acc_as_a_operand(p_regs.layout()));
      gemm_reg_smem(tiled_mma, acc_o, tOrP, tOrVt, tOsVt, smem_copy_v, smem_thr_v);
    }
    // Every thread is done reading Q/K/V before the epilogue reuses shared memory.
    __syncthreads();
  }
};

}  // namespace flashcpp::detail::cuda::sm80
