#pragma once
// The backward's pre- and post-pass (padded or varlen):
//  bwd_preprocess:  one warp per query row: dsum = rowsum(dO * O), lse_log2 = lse * log2(e)
//                   (+inf where lse = -inf, so exp2 gives P = 0), and, unless deterministic,
//                   a zeroed fp32 dq_accum row;
//  bwd_postprocess: dq = dq_accum * scale in the output dtype, one CTA per query block of
//                   the main kernel (it reads the block in the order that kernel wrote it);
//                   not run when deterministic (the dq kernel writes dq itself).
#include <cmath>
#include <cstdint>

#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm80/bwd_dq_accum_layout.hpp"
#include "cuda/sm80/bwd_main_traits.hpp"
#include "cuda/sm80/bwd_traits.hpp"
#include "cuda/sm80/bwd_warp_gemm.hpp"  // acc_row, acc_col
#include "cuda/sm80/mma_ptx.hpp"        // pack2

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
  // The usual case (head dim a multiple of 8, 16-byte aligned rows): 16-byte loads, a warp
  // instruction reads 512 contiguous bytes of the row.
  const bool vec = p.head_dim % 8 == 0 &&
                   (reinterpret_cast<std::uintptr_t>(o) | reinterpret_cast<std::uintptr_t>(g)) % 16 == 0;
  if (vec) {
    for (int d = lane * 8; d < p.head_dim; d += 32 * 8) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + d);
      const uint4 gv = *reinterpret_cast<const uint4*>(g + d);
      const T* const oe = reinterpret_cast<const T*>(&ov);
      const T* const ge = reinterpret_cast<const T*>(&gv);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc += to_f(oe[e]) * to_f(ge[e]);
    }
  } else {
    for (int d = lane; d < p.head_dim; d += 32) acc += to_f(o[d]) * to_f(g[d]);
  }
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
  if (p.head_dim % 4 == 0 && reinterpret_cast<std::uintptr_t>(a) % 16 == 0) {
    for (int d = lane * 4; d < p.head_dim; d += 32 * 4)
      *reinterpret_cast<float4*>(a + d) = make_float4(0.f, 0.f, 0.f, 0.f);
  } else {
    for (int d = lane; d < p.head_dim; d += 32) a[d] = 0.f;
  }
}

// One CTA per query block of the main kernel's tile (kTileIndex), in its thread layout: a whole
// block is read in fragment order (bwd_dq_accum_layout.hpp; every warp load one 128-byte line)
// and each lane writes its neighbouring column pairs; a block cut short or a padded head dim is
// read row-major.
template <class Element, int kTileIndex>
__global__ void __launch_bounds__(BwdMainTraits<Element, kTileIndex>::kThreads)
    bwd_postprocess(const BwdKernelParams kp) {
  using Tr = BwdMainTraits<Element, kTileIndex>;
  using DqAccum = DqAccumBlock<Tr>;
  const BackwardParams& p = kp.p;
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqlenInfo seq(p, b);
  const int sq = seq.seqlen_q, D = p.head_dim, m0 = m_block * Tr::kBlockM;
  if (m0 >= sq) return;
  const float* const acc = kp.dq_accum + ws_row(p, b, h, m0) * D;
  Element* const dq =
      static_cast<Element*>(p.dq) + seq.offset(p.dq_stride, seq.batch_q, seq.row_q + m0, h);
  if (DqAccum::fragment_order(D, m0, sq)) {
    // Even row strides and a 4-byte aligned dq: a lane's two neighbouring columns as one store.
    const bool pairs = p.dq_stride.row % 2 == 0 && reinterpret_cast<std::uintptr_t>(dq) % 4 == 0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int q_row0 = warp % Tr::kDqWarpsM * Tr::kDqRows;
    const int q_col0 = warp / Tr::kDqWarpsM * Tr::kDqCols;
#pragma unroll
    for (int chunk = 0; chunk < Tr::kDqChunks; ++chunk) {
      const float* const src = acc + DqAccum::lane_offset(warp, lane, chunk);
      const int col0 = q_col0 + chunk * Tr::kDqChunkNT * 8;
#pragma unroll
      for (int mt = 0; mt < Tr::kDqMT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          Element* const dq_row = dq + std::int64_t(q_row0 + acc_row(mt, hh)) * p.dq_stride.row;
#pragma unroll
          for (int nt = 0; nt < Tr::kDqChunkNT; ++nt) {
            const int v = DqAccum::value(mt, hh, nt, 0);
            const float x0 = src[v * 32] * p.scale, x1 = src[(v + 1) * 32] * p.scale;
            Element* const out = dq_row + col0 + acc_col(nt, 0);
            if (pairs) {
              *reinterpret_cast<std::uint32_t*>(out) = pack2<Element>(x0, x1);
            } else {
              out[0] = Element(x0);
              out[1] = Element(x1);
            }
          }
        }
    }
    return;
  }
  const int rows = sq - m0 < Tr::kBlockM ? sq - m0 : Tr::kBlockM;
  for (int idx = threadIdx.x; idx < rows * D; idx += Tr::kThreads) {
    const int r = idx / D, c = idx % D;
    dq[std::int64_t(r) * p.dq_stride.row + c] = Element(acc[idx] * p.scale);
  }
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
