#pragma once
// The sm90 backward's pre-pass, one CTA per (query block, query head, batch), in the blocked
// layouts the main kernel reads (block m of (batch, head) at ((batch * Hq + head) * M + m)):
//  - dsum = rowsum(dO * O) and lse_log2 = lse * log2(e) for the block's kBlockM rows, rows past
//    the sequence padded with dsum = 0 and lse_log2 = +inf (so P = 0 there): the main kernel's
//    producer copies a block's statistics with one bulk copy and the consumers need no bounds;
//  - the block's dq_accum zeroed (bwd_dq_convert.hpp has that layout).
#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/common/bwd_params.hpp"

namespace flashcpp::detail::cuda::sm90 {

constexpr int kPrepassThreads = 256;

template <class Traits>
__global__ void __launch_bounds__(kPrepassThreads) bwd_prepass(const BwdKernelParams kp) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kWarps = kPrepassThreads / 32;
  const BackwardParams& p = kp.p;
  const int m = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const std::int64_t block = (std::int64_t(batch) * p.heads_q + head) * gridDim.x + m;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // One warp per row; head_dim is even and the rows' strides too (bwd_covers), so each lane
  // reads element pairs.
  for (int r = warp; r < kBlockM; r += kWarps) {
    const int i = m * kBlockM + r;
    float dsum = 0.f, lse_log2 = INFINITY;
    if (i < p.seqlen_q) {
      using Pair = cute::array<Element, 2>;
      const Element* o = static_cast<const Element*>(p.out) + std::int64_t(batch) * p.out_stride.batch +
                         std::int64_t(i) * p.out_stride.row + std::int64_t(head) * p.out_stride.head;
      const Element* g = static_cast<const Element*>(p.dout) +
                         std::int64_t(batch) * p.dout_stride.batch +
                         std::int64_t(i) * p.dout_stride.row + std::int64_t(head) * p.dout_stride.head;
      for (int d = 2 * lane; d < p.head_dim; d += 64) {
        const Pair a = *reinterpret_cast<const Pair*>(o + d);
        const Pair b = *reinterpret_cast<const Pair*>(g + d);
        dsum += float(a[0]) * float(b[0]) + float(a[1]) * float(b[1]);
      }
      CUTE_UNROLL
      for (int s = 16; s > 0; s /= 2) dsum += __shfl_xor_sync(0xffffffffu, dsum, s);
      const float lse = p.lse[std::int64_t(batch) * p.lse_batch_stride +
                              std::int64_t(head) * p.lse_head_stride + i];
      lse_log2 = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    }
    if (lane == 0) {
      kp.dsum[block * kBlockM + r] = dsum;
      kp.lse_log2[block * kBlockM + r] = lse_log2;
    }
  }
  float4* dq = reinterpret_cast<float4*>(kp.dq_accum + block * Traits::kDqBlockFloats);
  for (int v = threadIdx.x; v < Traits::kDqBlockFloats / 4; v += kPrepassThreads)
    dq[v] = make_float4(0.f, 0.f, 0.f, 0.f);
}

}  // namespace flashcpp::detail::cuda::sm90
