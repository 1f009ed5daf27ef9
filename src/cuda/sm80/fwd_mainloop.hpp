#pragma once
// The sm80 forward mainloop (FlashAttention-2 schedule) for one query tile: stream K and V
// tiles through shared memory with cp.async, S = Q K^T and O += P V on mma.sync, online
// softmax in registers. The key blocks that need the seqlen_k / diagonal / window mask run
// first, then the unmasked band with no mask code at all. In the masked blocks only, a
// non-finite V is kept from the rows that do not see it (fwd_non_finite_v.hpp).
#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/common/fragment_utils.hpp"
#include "cuda/common/fwd_kernel_params.hpp"
#include "common/mask.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm80/fwd_non_finite_v.hpp"
#include "cuda/sm80/softmax.hpp"
#include "cuda/sm80/gemm.hpp"
#include "cuda/sm80/paged_tile_loader.hpp"

namespace flashcpp::detail::cuda::sm80 {

using namespace cute;

// kSoftcap: S goes through softcap * tanh(S * scale / softcap) (a compile-time flag: the
// run-time test was if-converted into ~17 predicated instructions per S element).
// kPaged: K and V come from a paged KV cache (kp.paged; each row through the block table,
// paged_tile_loader.hpp); everything else is the varlen path of the same kernel.
template <class Traits, bool kSoftcap, bool kPaged = false>
struct FwdMainloop {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kKVStages = Traits::kKVStages;

  // Runs key blocks [range.begin, range.end) (non-empty) of query tile m_block and leaves the
  // unnormalised O in acc_o and the row statistics in softmax. `batch`: the tile's sequence
  // (its block-table row when paged).
  template <class AccO, class Softmax>
  __device__ void operator()(const FwdKernelParams& kp, const SeqlenInfo& seq,
                             const WindowMask& mask, int m_block, int head, int batch,
                             BlockRange range, BlockRange unmasked, char* smem, AccO& acc_o,
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
    const TileLoader<Traits> load_q(q_ptr, p.q_stride.row, kBlockM, p.head_dim, tid);
    const TileLoader<Traits> load_k_tile(k_base, p.k_stride.row, kBlockN, p.head_dim, tid);
    const TileLoader<Traits> load_v_tile(v_base, p.v_stride.row, kBlockN, p.head_dim_v, tid);

    // ---- shared memory: Q | K[kKVStages] | V[kKVStages] (step i uses buffer i % stages) ----
    Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                            typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});
    constexpr int kKVTile = decltype(size(sK))::value;
    Tensor sV = make_tensor(sK.data() + kKVStages * kKVTile, typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
    Tensor sVtNoSwizzle =
        make_tensor(make_smem_ptr(sV.data().get()), typename Traits::SmemLayoutVtNoSwizzle{});

    typename Traits::GmemTiledCopyQKV gmem_copy;
    auto gmem_thr = gmem_copy.get_thread_slice(tid);
    Tensor tQsQ = gmem_thr.partition_D(sQ);
    Tensor tKsK = gmem_thr.partition_D(sK);
    Tensor tVsV = gmem_thr.partition_D(sV);

    // S = Q K^T on mma_s, O += P V on mma_o: the same tiled MMA unless warps pair up.
    typename Traits::TiledMmaS mma_s;
    typename Traits::TiledMmaO mma_o;
    auto thr_mma = mma_s.get_thread_slice(tid);
    auto thr_mma_o = mma_o.get_thread_slice(tid);
    Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
    Tensor tSrK = thr_mma.partition_fragment_B(sK);
    Tensor tOrVt = thr_mma_o.partition_fragment_B(sVtNoSwizzle);

    auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_s);
    auto smem_thr_q = smem_copy_q.get_thread_slice(tid);
    Tensor tSsQ = smem_thr_q.partition_S(sQ);
    auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma_s);
    auto smem_thr_k = smem_copy_k.get_thread_slice(tid);
    Tensor tSsK = smem_thr_k.partition_S(sK);
    auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_o);
    auto smem_thr_v = smem_copy_v.get_thread_slice(tid);
    Tensor tOsVt = smem_thr_v.partition_S(sVt);

    // Warp pairs (Traits::kWarpsN == 2): warp w and its partner w ^ kWarpsM own the same rows;
    // w holds keys [n * kBlockN/2, ...) of S and head-dim columns [n * D/2, ...) of O, n =
    // w / kWarpsM. Per block they swap their row maxima (so both take the same exp2 offsets)
    // and their halves of P (each needs all of P for its columns of O) through their swap
    // areas (after the K/V buffers; Traits::kPairRows floats, then kPairPWords 16-byte words
    // per lane, lane-minor so that a warp's 16-byte accesses hit 32 consecutive words), with
    // a 64-thread barrier of the pair (id 1 + row group) after each write.
    const int warp = tid / 32, lane = tid % 32;
    const int pair_rows = warp % Traits::kWarpsM;
    constexpr int kSwapBytes = 16 * 32 * (1 + Traits::kPairPWords);
    char* const swap = reinterpret_cast<char*>(raw_pointer_cast(sV.data() + kKVStages * kKVTile));
    auto swap_stats = [&](int w) { return reinterpret_cast<float4*>(swap + w * kSwapBytes) + lane; };
    auto swap_p = [&](int w, int j) {
      return reinterpret_cast<uint4*>(swap + w * kSwapBytes) + 32 * (1 + j) + lane;
    };
    auto pair_barrier = [&] {
      asm volatile("bar.sync %0, 64;" ::"r"(1 + pair_rows) : "memory");
    };
    // Swaps the row statistics v[0..3] with the partner: returns the partner's.
    auto swap_with_partner = [&](const float (&v)[4], float (&other)[4]) {
      *swap_stats(warp) = make_float4(v[0], v[1], v[2], v[3]);
      pair_barrier();
      const float4 o = *swap_stats(warp ^ Traits::kWarpsM);
      other[0] = o.x, other[1] = o.y, other[2] = o.z, other[3] = o.w;
    };

    // Buffer `b` of a K/V partition: the same per-thread layout moved by whole tiles (a
    // multiple of the swizzle period, so the bank pattern is unchanged). With a run-time b,
    // CuTe re-applies the swizzle to the moved address: ~2 more instructions per 16-byte
    // chunk and ldmatrix slice, and registers (one of the costs of two buffers at d128).
    auto buf = [&](auto const& t, int b) { return make_tensor(t.data() + b * kKVTile, t.layout()); };
    // Rows past seqlen_k are zero-filled. (An unpredicated fast path for full blocks raised
    // the spills at d128 from 180 B to 636 B with nvcc 13.)
    auto load_k = [&](int n, int b) {
      auto dst = buf(tKsK, b);
      if constexpr (kPaged)
        load_paged_tile<Traits>(kp, p.k, p.k_stride, p.head_dim, batch, head_kv, dst, n,
                                seq.seqlen_k - n * kBlockN);
      else
        load_k_tile(dst, n, seq.seqlen_k - n * kBlockN);
    };
    auto load_v = [&](int n, int b) {
      auto dst = buf(tVsV, b);
      if constexpr (kPaged)
        load_paged_tile<Traits>(kp, p.v, p.v_stride, p.head_dim_v, batch, head_kv, dst, n,
                                seq.seqlen_k - n * kBlockN);
      else
        load_v_tile(dst, n, seq.seqlen_k - n * kBlockN);
    };

    // ---- block order: masked blocks first, then the unmasked band ----
    // Masked: right of the band (partial last block, causal/window diagonal), then left of it
    // (sliding-window left edge); both run from the highest block down. The masked and the
    // unmasked body are separate loops: with one loop and a run-time "needs mask" test, nvcc
    // if-converted the mask (and the softcap) into predicated code that every iteration
    // issued (2280 instructions per 128 HMMA at d128, sm_90 SASS).
    const int band_begin = min(max(unmasked.begin, range.begin), range.end);
    const int band_end = min(max(unmasked.end, band_begin), range.end);
    const int n_right = range.end - band_end;
    const int n_masked = n_right + (band_begin - range.begin);
    const int n_total = range.end - range.begin;
    auto block_at = [&](int i) {
      return i < n_right ? range.end - 1 - i
                         : (i < n_masked ? band_begin - 1 - (i - n_right) : band_end - 1 - (i - n_masked));
    };

    // ---- prologue: Q and the first K (and V) block ----
    // (Waiting for V_0 only before O += P V of step 0, a second barrier in step 0, raised
    // the d256 two-buffer kernel's spills from 0 to 260/280 B.)
    load_q(tQsQ, 0, seq.seqlen_q - m0);
    load_k(block_at(0), 0);
    if constexpr (kKVStages == 2) load_v(block_at(0), 0);
    cp_async_fence();

    // (row, col) of every S accumulator element, in the (row, col) view of acc_s.
    auto s_coords = [&] {
      Tensor tScS =
          thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
      return make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
    };
    // Whether some row of this warp sees a key of block n. A masked block that none does (a
    // causal diagonal block past the warp's last row, a window's left edge) is skipped by the
    // warp: its P would be all zeros and leave O and the row statistics unchanged, and the
    // ldmatrix reads it saves are what the large head dims are bound by (Traits::kSkipUnseen).
    auto warp_sees = [&](int n) {
      Tensor c_rc = s_coords();
      bool sees = false;
      CUTE_UNROLL
      for (int r = 0; r < size<0>(c_rc); ++r) {
        int first, last;
        mask.row_window(m0 + get<0>(c_rc(r, 0)), n * kBlockN, kBlockN, first, last);
        sees |= max(first, 0) <= min(last, kBlockN - 1);
      }
      return __any_sync(0xffffffffu, sees);
    };
    // Pipeline.
    // Two buffers, one barrier per block: at the top of step i, K_i/V_i are waited for and
    // made visible by the barrier, which also tells that every warp is done with step i - 1,
    // so its buffers take the loads of block i + 1 at once; those get all of step i to land.
    // One buffer, two barriers per block: the V load of block i is issued before S_i, the K
    // load of block i + 1 right after S_i is consumed by every warp; each hides behind one
    // product (the softmax waits for V_i).
    // Masked blocks: a barrier votes on whether some thread's V_i chunks are not finite (two
    // buffers: the barrier after V_i's wait; one buffer: a barrier of its own once P is
    // packed); if so, the rare path zeroes them and flags their keys, and the P rows that see
    // one are made NaN before O += P V (fwd_non_finite_v.hpp).
    using NonFiniteV = FwdNonFiniteV<Traits>;
    auto masked_v_barrier = [&](int b) {
      auto tVsV_b = buf(tVsV, b);
      const bool flagged = __syncthreads_or(NonFiniteV::any_in_own_chunks(tVsV_b));
      if (flagged) NonFiniteV::zero_and_flag(tVsV_b, tid);
      return flagged;
    };
    auto step = [&](int i, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      const int n = block_at(i);
      const int b = kKVStages == 2 ? (i & 1) : 0;
      Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});
      clear(acc_s);
      cp_async_wait<0>();  // K_i (V_i with two buffers; Q) of this thread landed
      // ... of every thread; the buffers step i - 1 read are free
      bool v_flagged = false;  // (masked blocks: V_i held a non-finite value)
      if constexpr (kMasked && kKVStages == 2)
        v_flagged = masked_v_barrier(b);
      else
        __syncthreads();
      if constexpr (kKVStages == 2) {
        if (i + 1 < n_total) {
          load_k(block_at(i + 1), b ^ 1);
          load_v(block_at(i + 1), b ^ 1);
          cp_async_fence();
        }
      } else {
        load_v(n, 0);
        cp_async_fence();
      }

      const bool run = !kMasked || !Traits::kSkipUnseen || warp_sees(n);
      Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
      if (run) {
        auto tSsK_b = buf(tSsK, b);
        gemm_smem_smem(mma_s, acc_s, tSrQ, tSrK, tSsQ, tSsK_b, smem_copy_q, smem_copy_k,
                       smem_thr_q, smem_thr_k);

        if constexpr (kSoftcap) {
          CUTE_UNROLL
          for (int e = 0; e < size(acc_s); ++e) acc_s(e) = tanhf(acc_s(e) * kp.softcap_in_scale);
        }
        if constexpr (kMasked) {
          Tensor c_rc = s_coords();
          const int n0 = n * kBlockN;
          CUTE_UNROLL
          for (int r = 0; r < size<0>(s_rc); ++r) {
            int first, last;
            mask.row_window(m0 + get<0>(c_rc(r, 0)), n0, kBlockN, first, last);
            CUTE_UNROLL
            for (int c = 0; c < size<1>(s_rc); ++c) {
              const int col = get<1>(c_rc(r, c));
              if (col < first || col > last) s_rc(r, c) = -INFINITY;
            }
          }
        }
      }

      if constexpr (kKVStages == 1) {
        cp_async_wait<0>();  // V_i landed
        __syncthreads();     // ... for every thread; K buffer free (S_i done everywhere)
        if (i + 1 < n_total) {
          load_k(block_at(i + 1), 0);
          cp_async_fence();
        }
      }

      Tensor o_rc = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));
      if constexpr (Traits::kWarpsN == 2) {
        float own[4], other[4];
        softmax.block_max(s_rc, own);
        swap_with_partner(own, other);
        CUTE_UNROLL
        for (int r = 0; r < 4; ++r) own[r] = fmaxf(own[r], other[r]);
        softmax.template update_with_max<kMasked>(s_rc, o_rc, own, kp.scale_log2);
      } else if (run) {
        softmax.template update<kMasked>(s_rc, o_rc, kp.scale_log2);
      }
      // One buffer: the vote is a barrier of its own, here where S is about to be packed into
      // P (at V_i's barrier, with S and O live, the check's registers raised the spills at d128
      // from 40 B to 216 B). Every warp takes it, also one that skips this block.
      if constexpr (kMasked && kKVStages == 1) v_flagged = masked_v_barrier(0);
      // P rows that see a flagged key of V_i become NaN before O += P V.
      auto poison_if_flagged = [&](auto& p_regs) {
        if constexpr (kMasked) {
          if (v_flagged) {
            Tensor p_rc = make_tensor(p_regs.data(), acc_rowcol(p_regs.layout()));
            NonFiniteV::poison_p_rows(p_rc, s_coords(), mask, m0, n * kBlockN);
          }
        }
      };
      if constexpr (Traits::kWarpsN == 2) {
        // This warp's half of P as A-operand k16 slices, in the register order of one slice
        // after another (the order of a whole-P fragment); the pair's two halves side by side
        // are that fragment.
        Tensor p_regs = convert_fragment<Element>(acc_s);
        poison_if_flagged(p_regs);
        Tensor p_half = make_tensor(p_regs.data(), acc_as_a_operand(p_regs.layout()));
        constexpr int kM = decltype(size<1>(p_half))::value;
        constexpr int kHalfK = decltype(size<2>(p_half))::value;
        Tensor tOrP = make_tensor<Element>(Shape<Shape<_2, _2, _2>, Int<kM>, Int<2 * kHalfK>>{});
        static_assert(decltype(size(tOrP))::value == 2 * decltype(size(p_half))::value);
        Tensor own = make_tensor<Element>(Shape<Shape<_2, _2, _2>, Int<kM>, Int<kHalfK>>{});
        CUTE_UNROLL
        for (int k = 0; k < kHalfK; ++k)
          CUTE_UNROLL
          for (int m = 0; m < kM; ++m)
            CUTE_UNROLL
            for (int v = 0; v < 8; ++v) own(v, m, k) = p_half(v, m, k);
        const uint4* own_words = reinterpret_cast<const uint4*>(own.data());
        CUTE_UNROLL
        for (int j = 0; j < Traits::kPairPWords; ++j) *swap_p(warp, j) = own_words[j];
        pair_barrier();
        uint4* words = reinterpret_cast<uint4*>(tOrP.data());
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h)
          CUTE_UNROLL
          for (int j = 0; j < Traits::kPairPWords; ++j)
            words[h * Traits::kPairPWords + j] = *swap_p(pair_rows + h * Traits::kWarpsM, j);
        auto tOsVt_b = buf(tOsVt, b);
        gemm_reg_smem(mma_o, acc_o, tOrP, tOrVt, tOsVt_b, smem_copy_v, smem_thr_v);
      } else if (run) {
        Tensor p_regs = convert_fragment<Element>(acc_s);
        poison_if_flagged(p_regs);
        Tensor tOrP = make_tensor(p_regs.data(), acc_as_a_operand(p_regs.layout()));
        auto tOsVt_b = buf(tOsVt, b);
        gemm_reg_smem(mma_o, acc_o, tOrP, tOrVt, tOsVt_b, smem_copy_v, smem_thr_v);
      }
    };
    int i = 0;
    for (; i < n_masked; ++i) step(i, cute::true_type{});
    for (; i < n_total; ++i) step(i, cute::false_type{});
    if constexpr (Traits::kWarpsN == 2) {
      // Each warp summed P over its half of the keys: the row sums are both halves'. (The
      // partner read the swap area's maxima before the last P swap's barrier.)
      float other[4];
      swap_with_partner(softmax.row_sum, other);
      CUTE_UNROLL
      for (int r = 0; r < 4; ++r) softmax.row_sum[r] += other[r];
    }
    // Every thread is done reading Q/K/V before the epilogue reuses shared memory.
    __syncthreads();
  }
};

}  // namespace flashcpp::detail::cuda::sm80
