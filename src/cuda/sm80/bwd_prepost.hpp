#pragma once
// The backward's pre- and post-pass, one warp per query row (padded or varlen):
//  bwd_preprocess:  dsum = rowsum(dO * O), lse_log2 = lse * log2(e) (+inf where lse = -inf,
//                   so exp2 gives P = 0), and, unless deterministic, a zeroed fp32 dq_accum
//                   row;
//  bwd_postprocess: dq = dq_accum * scale in the output dtype (not run when deterministic:
//                   the dq kernel writes dq itself).
#include <cmath>
#include <cstdint>

#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm80/bwd_traits.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

constexpr int kRowsPerCta = 8;  // 8 warps, one row each

template <class T>
__global__ void __launch_bounds__(32 * kRowsPerCta) bwd_preprocess(const BwdKernelParams kp) {
  const BackwardParams& p = kp.p;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = blockIdx.x * kRowsPerCta + warp, h = blockIdx.y, b = blockIdx.z;
  const SeqlenInfo seq(p, b);
  if (i >= seq.seqlen_q) return;
  const std::int64_t row = seq.row_q + i;
  const T* o = static_cast<const T*>(p.out) + seq.offset(p.out_stride, seq.batch_q, row, h);
  const T* g = static_cast<const T*>(p.dout) + seq.offset(p.dout_stride, seq.batch_q, row, h);
  float acc = 0.f;
  for (int d = lane; d < p.head_dim; d += 32) acc += to_f(o[d]) * to_f(g[d]);
#pragma unroll
  for (int s = 16; s > 0; s /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, s);
  const std::int64_t r = ws_row(p, b, h, i);
  if (lane == 0) {
    kp.dsum[r] = acc;
    // lse: [B, Hq, Nq] (batch_q = b, row = i) or varlen [Hq, total_q] (batch stride 0).
    const float l = p.lse[seq.batch_q * p.lse_batch_stride + std::int64_t(h) * p.lse_head_stride + row];
    kp.lse_log2[r] = l == -INFINITY ? INFINITY : l * kLog2e;
  }
  if (p.deterministic) return;
  float* a = kp.dq_accum + r * p.head_dim;
  for (int d = lane; d < p.head_dim; d += 32) a[d] = 0.f;
}

template <class T>
__global__ void __launch_bounds__(32 * kRowsPerCta) bwd_postprocess(const BwdKernelParams kp) {
  const BackwardParams& p = kp.p;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = blockIdx.x * kRowsPerCta + warp, h = blockIdx.y, b = blockIdx.z;
  const SeqlenInfo seq(p, b);
  if (i >= seq.seqlen_q) return;
  const float* a = kp.dq_accum + ws_row(p, b, h, i) * p.head_dim;
  T* dq = static_cast<T*>(p.dq) + seq.offset(p.dq_stride, seq.batch_q, seq.row_q + i, h);
  for (int d = lane; d < p.head_dim; d += 32) dq[d] = from_f<T>(a[d] * p.scale);
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
