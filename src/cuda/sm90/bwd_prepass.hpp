#pragma once
// The sm90 backward's pre-pass, one CTA per (query block, query head, batch), in the blocked
// layouts the main kernel reads (block m of (batch, head) at ((batch * Hq + head) * M + m)):
//  - dsum = rowsum(dO * O) and lse_log2 = lse * log2(e) for the block's kBlockM rows, rows past
//    the sequence padded with dsum = 0 and lse_log2 = +inf (so P = 0 there): the main kernel's
//    producer copies a block's statistics with one bulk copy and the consumers need no bounds;
//  - the block's dq_accum zeroed (bwd_dq_convert.hpp has that layout);
//  - deterministic: the block's dq_semaphore and the main kernel's ticket counter zeroed
//    (bwd_dq_order.hpp).
#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/common/bwd_kernel_params.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm90/value_head_dim.hpp"

namespace flashcpp::detail::cuda::sm90 {

constexpr int kPrepassThreads = 256;

template <class Traits>
__global__ void __launch_bounds__(kPrepassThreads) bwd_prepass(const BwdKernelParams kp) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  // kThreadsPerRow threads share a row, each reading kChunks 16-byte chunks of O and of dO
  // (bwd_covers makes both 16-byte aligned), all issued before any arithmetic: the pass is
  // bound by memory latency, not by math.
  constexpr int kElemsPerChunk = 16 / sizeof(Element);
  constexpr int kThreadsPerRow = kPrepassThreads / kBlockM;  // every row in one pass
  constexpr int kChunks = Traits::kHeadDimV / kElemsPerChunk / kThreadsPerRow;  // O, dO: Dv
  static_assert(kChunks >= 1 && kThreadsPerRow * kBlockM == kPrepassThreads);
  const BackwardParams& p = kp.p;
  const int m = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const std::int64_t block = (std::int64_t(batch) * p.heads_q + head) * gridDim.x + m;
  const int part = threadIdx.x % kThreadsPerRow;
  const SeqlenInfo seq(p, batch);  // varlen: this sequence's rows of the packed tensors
  const int dv = value_head_dim<Traits>(p);
  const bool whole_chunks = dv % kElemsPerChunk == 0;  // (the common case)
  {
    const int r = threadIdx.x / kThreadsPerRow;
    const int i = m * kBlockM + r;
    float dsum = 0.f, lse = -INFINITY;
    if (i < seq.seqlen_q) {
      if (part == 0)
        lse = p.lse[seq.batch_q * p.lse_batch_stride + std::int64_t(head) * p.lse_head_stride +
                    seq.row_q + i];
      const Element* o = static_cast<const Element*>(p.out) +
                         seq.offset(p.out_stride, seq.batch_q, seq.row_q + i, head);
      const Element* g = static_cast<const Element*>(p.dout) +
                         seq.offset(p.dout_stride, seq.batch_q, seq.row_q + i, head);
      if (whole_chunks) {
        uint4 oc[kChunks], gc[kChunks];
        CUTE_UNROLL
        for (int c = 0; c < kChunks; ++c) {
          const int d = (c * kThreadsPerRow + part) * kElemsPerChunk;
          oc[c] = gc[c] = make_uint4(0, 0, 0, 0);
          if (d < dv) {
            oc[c] = *reinterpret_cast<const uint4*>(o + d);
            gc[c] = *reinterpret_cast<const uint4*>(g + d);
          }
        }
        CUTE_UNROLL
        for (int c = 0; c < kChunks; ++c) {
          const Element* oe = reinterpret_cast<const Element*>(&oc[c]);
          const Element* ge = reinterpret_cast<const Element*>(&gc[c]);
          CUTE_UNROLL
          for (int e = 0; e < kElemsPerChunk; ++e) dsum += float(oe[e]) * float(ge[e]);
        }
      } else {  // a head dim that is not a multiple of 8: element by element
        CUTE_UNROLL
        for (int c = 0; c < kChunks; ++c) {
          const int d = (c * kThreadsPerRow + part) * kElemsPerChunk;
          CUTE_UNROLL
          for (int e = 0; e < kElemsPerChunk; ++e)
            if (d + e < dv) dsum += float(o[d + e]) * float(g[d + e]);
        }
      }
    }
    CUTE_UNROLL
    for (int s = kThreadsPerRow / 2; s > 0; s /= 2) dsum += __shfl_xor_sync(0xffffffffu, dsum, s);
    if (part == 0) {  // rows past the sequence keep lse = -inf: lse_log2 = +inf, P = 0
      kp.dsum[block * kBlockM + r] = dsum;
      kp.lse_log2[block * kBlockM + r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
    }
  }
  if constexpr (Traits::kDeterministic) {  // the block's arrival counter, and the tickets
    if (threadIdx.x == 0) {
      kp.dq_semaphore[block] = 0;
      if (block == 0) *kp.tile_ticket = 0;
    }
  }
  float4* dq = reinterpret_cast<float4*>(kp.dq_accum + block * Traits::kDqBlockFloats);
  CUTE_UNROLL
  for (int v = threadIdx.x; v < Traits::kDqBlockFloats / 4; v += kPrepassThreads)
    dq[v] = make_float4(0.f, 0.f, 0.f, 0.f);
}

}  // namespace flashcpp::detail::cuda::sm90
