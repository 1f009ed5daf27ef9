#pragma once
// The sm80 backward (FlashAttention-2 algorithm), three kernels:
//  1. bwd_preprocess: per query row, dsum = rowsum(dO * O) and lse_log2 = lse * log2(e)
//     (+inf where lse = -inf, so exp2 gives P = 0), and zeroes the row's fp32 dq_accum;
//  2. bwd_main: one CTA per (key block of kBlockN keys, KV head, batch). K and V stay in shared
//     memory; the CTA loops over the query heads of its KV head's group (GQA/MQA: dK and dV sum
//     over them in registers, no workspace) and, for each, over the query blocks that can see
//     its keys (the mask policy's bounds, bottom-right aligned), recomputing
//        S = Q K^T, P = exp2(S * scale_log2 - lse_log2)   (softcap: s = c tanh(x / c))
//        dV += P^T dO, dP = dO V^T, dS = P (dP - dsum)     (softcap: dS *= 1 - tanh^2)
//        dK += dS^T Q,  dQ_accum += dS K  (fp32 atomicAdd)
//     The matrix products are warp-level mma.sync (WMMA 16x16x16, fp16/bf16 in, fp32 out) on
//     shared-memory tiles; the element-wise step reads S and dP back from shared memory.
//  3. bwd_postprocess: dq = dq_accum * scale in the output dtype.
// Out-of-range rows and columns are zero-filled, so any length works.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include <cutlass/numeric_types.h>

#include "cuda/common/bwd_params.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/mask_policy.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

template <class E>
struct NativeOf;
template <>
struct NativeOf<cutlass::half_t> {
  using type = __half;
};
template <>
struct NativeOf<cutlass::bfloat16_t> {
  using type = __nv_bfloat16;
};

__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kRowsPerCta = 8;  // pre/post-pass: one warp per row

template <class T>
__global__ void __launch_bounds__(256) bwd_preprocess(const BwdKernelParams kp) {
  const BackwardParams& p = kp.p;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = blockIdx.x * kRowsPerCta + warp, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seqlen_q) return;
  const T* o = static_cast<const T*>(p.out) + b * p.out_stride.batch + i * p.out_stride.row +
               std::int64_t(h) * p.out_stride.head;
  const T* g = static_cast<const T*>(p.dout) + b * p.dout_stride.batch +
               i * p.dout_stride.row + std::int64_t(h) * p.dout_stride.head;
  float acc = 0.f;
  for (int d = lane; d < p.head_dim; d += 32) acc += to_f(o[d]) * to_f(g[d]);
#pragma unroll
  for (int s = 16; s > 0; s /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, s);
  const std::int64_t r = (std::int64_t(b) * p.heads_q + h) * p.seqlen_q + i;
  if (lane == 0) {
    kp.dsum[r] = acc;
    const float l = p.lse[b * p.lse_batch_stride + std::int64_t(h) * p.lse_head_stride + i];
    kp.lse_log2[r] = l == -INFINITY ? INFINITY : l * kLog2e;
  }
  float* a = kp.dq_accum + r * p.head_dim;
  for (int d = lane; d < p.head_dim; d += 32) a[d] = 0.f;
}

template <class T>
__global__ void __launch_bounds__(256) bwd_postprocess(const BwdKernelParams kp) {
  const BackwardParams& p = kp.p;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = blockIdx.x * kRowsPerCta + warp, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seqlen_q) return;
  const std::int64_t r = (std::int64_t(b) * p.heads_q + h) * p.seqlen_q + i;
  const float* a = kp.dq_accum + r * p.head_dim;
  T* dq = static_cast<T*>(p.dq) + b * p.dq_stride.batch + i * p.dq_stride.row +
          std::int64_t(h) * p.dq_stride.head;
  for (int d = lane; d < p.head_dim; d += 32) dq[d] = from_f<T>(a[d] * p.scale);
}

template <class T, int kHeadDim>
struct BwdTraits {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 8, kThreads = kWarps * 32;
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 128, "sm80 backward: head dim 32..128, /32");
  static constexpr int kLd = kHeadDim + 8;   // Q, dO, K, V tiles (elements)
  static constexpr int kLdS = kBlockN + 4;   // S, dP (fp32)
  static constexpr int kLdP = kBlockN + 8;   // P, dS (elements)
  static constexpr int kLdA = kHeadDim + 4;  // fp32 staging of dQ / dK / dV (aliases S, dP)
  static constexpr int kColTiles = kHeadDim / 16 / 2;  // per warp, of the head dim
  static constexpr std::size_t kTileBytes = std::size_t(kBlockM) * kLd * sizeof(T);
  static constexpr std::size_t kPBytes = std::size_t(kBlockM) * kLdP * sizeof(T);
  static constexpr std::size_t kSBytes = std::size_t(kBlockM) * kLdS * sizeof(float);
  static_assert(std::size_t(kBlockM) * kLdA * sizeof(float) <= 2 * kSBytes, "staging fits");
  static constexpr std::size_t kSmemBytes =
      4 * kTileBytes + 2 * kPBytes + 2 * kSBytes + 2 * kBlockM * sizeof(float);
};

// Loads rows [0, rows) x cols [0, cols) of a tile into smem (leading dim Tr::kLd), zero-filling
// the rest of the kBlockM x kHeadDim tile.
template <class Tr, class T, int kHeadDim>
__device__ __forceinline__ void load_tile(T* dst, const T* src, std::int64_t row_stride,
                                          int rows, int cols, bool vec8) {
  if (vec8) {
    constexpr int kChunks = kHeadDim / 8;
    for (int idx = threadIdx.x; idx < Tr::kBlockM * kChunks; idx += Tr::kThreads) {
      const int r = idx / kChunks, c = (idx % kChunks) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows && c < cols) v = *reinterpret_cast<const uint4*>(src + r * row_stride + c);
      *reinterpret_cast<uint4*>(dst + r * Tr::kLd + c) = v;
    }
  } else {
    const T zero = from_f<T>(0.f);
    for (int idx = threadIdx.x; idx < Tr::kBlockM * kHeadDim; idx += Tr::kThreads) {
      const int r = idx / kHeadDim, c = idx % kHeadDim;
      dst[r * Tr::kLd + c] = (r < rows && c < cols) ? src[r * row_stride + c] : zero;
    }
  }
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(256) bwd_main(const BwdKernelParams kp) {
  namespace wmma = nvcuda::wmma;
  using Tr = BwdTraits<T, kHeadDim>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  const BackwardParams& p = kp.p;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);
  T* dOs = reinterpret_cast<T*>(smem + Tr::kTileBytes);
  T* Ks = reinterpret_cast<T*>(smem + 2 * Tr::kTileBytes);
  T* Vs = reinterpret_cast<T*>(smem + 3 * Tr::kTileBytes);
  T* Ps = reinterpret_cast<T*>(smem + 4 * Tr::kTileBytes);
  T* dSs = reinterpret_cast<T*>(smem + 4 * Tr::kTileBytes + Tr::kPBytes);
  float* Ss = reinterpret_cast<float*>(smem + 4 * Tr::kTileBytes + 2 * Tr::kPBytes);
  float* dPs = Ss + BM * Tr::kLdS;
  float* stage = Ss;  // dQ / dK / dV staging, used only while S and dP are dead
  float* lse_s = Ss + 2 * BM * Tr::kLdS;
  float* dsum_s = lse_s + BM;

  const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int sq = p.seqlen_q, sk = p.seqlen_k, D = p.head_dim;
  const int n0 = n_block * BN;
  const int rows_k = sk - n0 < BN ? sk - n0 : BN;
  const WindowMask mask(sq, sk, p.window_left, p.window_right);
  // Queries that see some key of [n0, n0 + rows_k): lo <= j - i <= hi.
  std::int64_t i_begin = std::int64_t(n0) - mask.hi;
  std::int64_t i_end = std::int64_t(n0) + rows_k - 1 - mask.lo + 1;
  if (i_begin < 0) i_begin = 0;
  if (i_end > sq) i_end = sq;
  const int m_begin = int(i_begin / BM);
  const int m_end = i_begin < i_end ? int((i_end + BM - 1) / BM) : m_begin;

  const T* kbase = static_cast<const T*>(p.k) + b * p.k_stride.batch + n0 * p.k_stride.row +
                   std::int64_t(hk) * p.k_stride.head;
  const T* vbase = static_cast<const T*>(p.v) + b * p.v_stride.batch + n0 * p.v_stride.row +
                   std::int64_t(hk) * p.v_stride.head;
  load_tile<Tr, T, kHeadDim>(Ks, kbase, p.k_stride.row, rows_k, D, kp.vec8);
  load_tile<Tr, T, kHeadDim>(Vs, vbase, p.v_stride.row, rows_k, D, kp.vec8);

  const int warp = threadIdx.x / 32;
  // dK, dV: key-row tile warp % 4, head-dim tiles (warp / 4) * kColTiles + c.
  const int rt = warp % 4, cbase = (warp / 4) * Tr::kColTiles;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_dk[Tr::kColTiles],
      acc_dv[Tr::kColTiles];
#pragma unroll
  for (int c = 0; c < Tr::kColTiles; ++c) {
    wmma::fill_fragment(acc_dk[c], 0.f);
    wmma::fill_fragment(acc_dv[c], 0.f);
  }

  const int group = p.heads_q / p.heads_kv;
  const bool softcap = p.softcap > 0.f;
  for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
    const std::int64_t row_base = (std::int64_t(b) * p.heads_q + hq) * sq;
    for (int m_block = m_begin; m_block < m_end; ++m_block) {
      const int m0 = m_block * BM;
      const int rows_q = sq - m0 < BM ? sq - m0 : BM;
      __syncthreads();  // the previous iteration's readers of Q, dO, P, dS and staging are done
      const T* qbase = static_cast<const T*>(p.q) + b * p.q_stride.batch +
                       m0 * p.q_stride.row + std::int64_t(hq) * p.q_stride.head;
      const T* gbase = static_cast<const T*>(p.dout) + b * p.dout_stride.batch +
                       m0 * p.dout_stride.row + std::int64_t(hq) * p.dout_stride.head;
      load_tile<Tr, T, kHeadDim>(Qs, qbase, p.q_stride.row, rows_q, D, kp.vec8);
      load_tile<Tr, T, kHeadDim>(dOs, gbase, p.dout_stride.row, rows_q, D, kp.vec8);
      for (int t = threadIdx.x; t < BM; t += Tr::kThreads) {
        lse_s[t] = t < rows_q ? kp.lse_log2[row_base + m0 + t] : INFINITY;
        dsum_s[t] = t < rows_q ? kp.dsum[row_base + m0 + t] : 0.f;
      }
      __syncthreads();

      // S = Q K^T and dP = dO V^T: warp owns query-row tile warp / 2, key tiles 2 (warp % 2) + {0, 1}.
      {
        const int srt = warp / 2;
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int sct = (warp % 2) * 2 + cc;
          wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_s, acc_dp;
          wmma::fill_fragment(acc_s, 0.f);
          wmma::fill_fragment(acc_dp, 0.f);
#pragma unroll
          for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bt;
            wmma::load_matrix_sync(a, Qs + srt * 16 * Tr::kLd + kk * 16, Tr::kLd);
            wmma::load_matrix_sync(bt, Ks + sct * 16 * Tr::kLd + kk * 16, Tr::kLd);
            wmma::mma_sync(acc_s, a, bt, acc_s);
            wmma::load_matrix_sync(a, dOs + srt * 16 * Tr::kLd + kk * 16, Tr::kLd);
            wmma::load_matrix_sync(bt, Vs + sct * 16 * Tr::kLd + kk * 16, Tr::kLd);
            wmma::mma_sync(acc_dp, a, bt, acc_dp);
          }
          wmma::store_matrix_sync(Ss + srt * 16 * Tr::kLdS + sct * 16, acc_s, Tr::kLdS,
                                  wmma::mem_row_major);
          wmma::store_matrix_sync(dPs + srt * 16 * Tr::kLdS + sct * 16, acc_dp, Tr::kLdS,
                                  wmma::mem_row_major);
        }
      }
      __syncthreads();

      // P and dS, element-wise; invisible or out-of-range pairs give exactly 0.
      for (int idx = threadIdx.x; idx < BM * BN; idx += Tr::kThreads) {
        const int i = idx / BN, j = idx % BN;
        const int row = m0 + i, col = n0 + j;
        float pv = 0.f, ds = 0.f;
        if (row < sq && mask.visible(row, col)) {
          const float x = Ss[i * Tr::kLdS + j];
          float t = 0.f, s2;
          if (softcap) {
            t = tanhf(x * kp.softcap_in_scale);
            s2 = t * kp.scale_log2;
          } else {
            s2 = x * kp.scale_log2;
          }
          pv = exp2f(s2 - lse_s[i]);
          ds = pv * (dPs[i * Tr::kLdS + j] - dsum_s[i]);
          if (softcap) ds *= 1.f - t * t;
        }
        Ps[i * Tr::kLdP + j] = from_f<T>(pv);
        dSs[i * Tr::kLdP + j] = from_f<T>(ds);
      }
      __syncthreads();

      // dV += P^T dO, dK += dS^T Q (A operands read transposed: column-major views of P, dS).
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> pt, dst;
        wmma::load_matrix_sync(pt, Ps + kk * 16 * Tr::kLdP + rt * 16, Tr::kLdP);
        wmma::load_matrix_sync(dst, dSs + kk * 16 * Tr::kLdP + rt * 16, Tr::kLdP);
#pragma unroll
        for (int c = 0; c < Tr::kColTiles; ++c) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bm;
          wmma::load_matrix_sync(bm, dOs + kk * 16 * Tr::kLd + (cbase + c) * 16, Tr::kLd);
          wmma::mma_sync(acc_dv[c], pt, bm, acc_dv[c]);
          wmma::load_matrix_sync(bm, Qs + kk * 16 * Tr::kLd + (cbase + c) * 16, Tr::kLd);
          wmma::mma_sync(acc_dk[c], dst, bm, acc_dk[c]);
        }
      }
      // dQ (this block's part) = dS K: query-row tile rt, head-dim tiles cbase + c; staged in
      // fp32 where S and dP were (dead since the barrier above).
#pragma unroll
      for (int c = 0; c < Tr::kColTiles; ++c) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_q;
        wmma::fill_fragment(acc_q, 0.f);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bm;
          wmma::load_matrix_sync(a, dSs + rt * 16 * Tr::kLdP + kk * 16, Tr::kLdP);
          wmma::load_matrix_sync(bm, Ks + kk * 16 * Tr::kLd + (cbase + c) * 16, Tr::kLd);
          wmma::mma_sync(acc_q, a, bm, acc_q);
        }
        wmma::store_matrix_sync(stage + rt * 16 * Tr::kLdA + (cbase + c) * 16, acc_q, Tr::kLdA,
                                wmma::mem_row_major);
      }
      __syncthreads();
      float* dq_rows = kp.dq_accum + (row_base + m0) * D;
      for (int idx = threadIdx.x; idx < BM * kHeadDim; idx += Tr::kThreads) {
        const int i = idx / kHeadDim, d = idx % kHeadDim;
        if (i < rows_q && d < D) atomicAdd(dq_rows + std::int64_t(i) * D + d, stage[i * Tr::kLdA + d]);
      }
    }
  }

  // Epilogue: dK * scale and dV through the fp32 staging, rows past seqlen_k dropped.
  T* dk = static_cast<T*>(p.dk) + b * p.dk_stride.batch + n0 * p.dk_stride.row +
          std::int64_t(hk) * p.dk_stride.head;
  T* dv = static_cast<T*>(p.dv) + b * p.dv_stride.batch + n0 * p.dv_stride.row +
          std::int64_t(hk) * p.dv_stride.head;
  for (int which = 0; which < 2; ++which) {
    __syncthreads();
#pragma unroll
    for (int c = 0; c < Tr::kColTiles; ++c) {
      if (which == 0) {
#pragma unroll
        for (int e = 0; e < acc_dk[c].num_elements; ++e) acc_dk[c].x[e] *= p.scale;
      }
      wmma::store_matrix_sync(stage + rt * 16 * Tr::kLdA + (cbase + c) * 16,
                              which == 0 ? acc_dk[c] : acc_dv[c], Tr::kLdA, wmma::mem_row_major);
    }
    __syncthreads();
    T* dst = which == 0 ? dk : dv;
    const std::int64_t rs = which == 0 ? p.dk_stride.row : p.dv_stride.row;
    for (int idx = threadIdx.x; idx < BN * kHeadDim; idx += Tr::kThreads) {
      const int r = idx / kHeadDim, d = idx % kHeadDim;
      if (r < rows_k && d < D) dst[r * rs + d] = from_f<T>(stage[r * Tr::kLdA + d]);
    }
  }
}

template <class E, int kHeadDim>
void run_bwd(const BwdKernelParams& kp, cudaStream_t stream) {
  using T = typename NativeOf<E>::type;
  using Tr = BwdTraits<T, kHeadDim>;
  const BackwardParams& p = kp.p;
  if (p.seqlen_q > 0) {
    const dim3 grid((p.seqlen_q + kRowsPerCta - 1) / kRowsPerCta, p.heads_q, p.batch);
    bwd_preprocess<T><<<grid, 32 * kRowsPerCta, 0, stream>>>(kp);
    FLASHCPP_CUDA_CHECK(cudaGetLastError());
  }
  if (kp.num_n_blocks > 0) {
    auto kernel = bwd_main<T, kHeadDim>;
    FLASHCPP_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::kSmemBytes)));
    const dim3 grid(kp.num_n_blocks, p.heads_kv, p.batch);
    kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(kp);
    FLASHCPP_CUDA_CHECK(cudaGetLastError());
  }
  if (p.seqlen_q > 0) {
    const dim3 grid((p.seqlen_q + kRowsPerCta - 1) / kRowsPerCta, p.heads_q, p.batch);
    bwd_postprocess<T><<<grid, 32 * kRowsPerCta, 0, stream>>>(kp);
    FLASHCPP_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
