#pragma once
// The FP8 forward's P V of one key block, summed apart from O in chunks of Dv columns and added
// to O in fp32 (Traits::kPvChunk columns per chunk; fwd_mainloop.hpp issues and finishes it).
//
// Why apart: Hopper's e4m3 wgmma adds into its accumulator with only ~13 bits below the
// largest term, so an O carried along the whole row by the tensor cores stops taking a key
// block's terms once it is ~2^8 times larger than them (long rows with flat attention).
// A fresh accumulator per key block keeps each block's sum at the tensor cores' width and
// the sum over blocks in fp32. Why chunks: a fresh accumulator as wide as O costs Dv/2 more
// registers per thread (d128 spilled, d256 had no room); a chunk of W columns costs W/2, and
// with two temporaries (Traits::kPvTemps) chunk c + 1 runs on the tensor cores while chunk c
// is added to O (with one, each chunk waits for the addition of the one before).
//
// Each chunk is one wgmma of N = W with the same P registers as A operand and the chunk's W
// rows of the V^T stage as B operand. Chunk c covers O columns [cW, cW + W): in the (row, col)
// views of the wgmma accumulators (wgmma_acc_rowcol) its column j is O's column cW/4 + j
// (each thread holds 2 neighbouring columns of each 8-column group).
#include <cute/tensor.hpp>

#include "cuda/sm90/softmax.hpp"
#include "cuda/sm90/wgmma.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Traits>
struct Fp8PvChunks {
  static constexpr int kWidth = Traits::kPvChunk;
  static constexpr int kChunks = Traits::kHeadDimV / kWidth;
  static constexpr int kTemps = kChunks < Traits::kPvTemps ? kChunks : Traits::kPvTemps;
  static_assert(kWidth > 0 && Traits::kHeadDimV % kWidth == 0);
  using TiledMma = typename Traits::TiledMmaPVChunk;
  using Acc = decltype(partition_fragment_C(TiledMma{},
                                            Shape<Int<Traits::kBlockM>, Int<kWidth>>{}));
  // The wgmma commit groups pending after start(): one chunk. It runs under the softmax of the
  // next S; finish() issues the second. (Two under the softmax spilled O at d256 128 x 96:
  // there S, the new P in fp32, the old P and O are all live.)
  static constexpr int kGroupsInFlight = 1;

  TiledMma mma;
  Acc temp[kTemps];

  // V^T stages (Dv, kBlockN, stage) -> B descriptors (MMA, chunk, kBlockN / 32, stage).
  template <class SmemVt>
  __device__ auto b_fragments(int tid, const SmemVt& s_vt) const {
    return mma.get_thread_slice(tid).partition_fragment_B(s_vt);
  }

  // Issues chunk 0 of P V_stage (one commit group).
  template <class P, class B>
  __device__ void start(P& p, const B& b, int stage) {
    issue<0>(p, b, stage);
  }

  // Issues the chunks up to kTemps in flight, then waits for every chunk in turn, adds it to O
  // (o_rc: O in (row, col) view), times the row's o_scale with kRescale, and issues chunk
  // c + kTemps into the temporary chunk c has freed. Every O column is in one chunk, so the
  // rescale covers all of O. done() is called once the last chunk has completed (P's
  // registers and the V stage are free), before its addition.
  template <bool kRescale, class P, class B, class ORowCol, int kRows, class Done>
  __device__ void finish(P& p, const B& b, int stage, ORowCol& o_rc,
                         const float (&o_scale)[kRows], Done&& done) {
    for_each(make_int_sequence<kTemps - 1>{},
             [&](auto c) { issue<decltype(c)::value + 1>(p, b, stage); });
    for_each(make_int_sequence<kChunks>{}, [&](auto c_) {
      constexpr int c = decltype(c_)::value;
      constexpr int kLater = kTemps - 1 < kChunks - 1 - c ? kTemps - 1 : kChunks - 1 - c;
      warpgroup_wait<kLater>();
      if constexpr (c == kChunks - 1) done();
      Acc& t = temp[c % kTemps];
      warpgroup_fence_operand(t);
      Tensor t_rc = make_tensor(t.data(), wgmma_acc_rowcol(t.layout()));
      static_assert(decltype(size<0>(t_rc))::value == kRows);
      constexpr int kCols = decltype(size<1>(t_rc))::value;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r)
        CUTE_UNROLL
        for (int j = 0; j < kCols; ++j) {
          float& o = o_rc(r, c * kCols + j);
          o = kRescale ? (o + t_rc(r, j)) * o_scale[r] : o + t_rc(r, j);
        }
      if constexpr (c + kTemps < kChunks) issue<c + kTemps>(p, b, stage);
    });
  }

 private:
  template <int c, class P, class B>
  __device__ void issue(P& p, const B& b, int stage) {
    // Each (chunk, k step) descriptor computed here, not kept across the key loop.
    Tensor bc = opaque_descriptors(b(_, _, _, stage))(_, c, _);  // (MMA, kBlockN / 32)
    Tensor b3 = make_tensor(bc.data(), make_layout(layout<0>(bc), Layout<_1, _0>{},
                                                   layout<1>(bc)));  // (MMA, 1, k)
    wgmma<true>(mma, p, b3, temp[c % kTemps]);
  }
};

}  // namespace flashcpp::detail::cuda::sm90
