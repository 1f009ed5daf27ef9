#pragma once
// Compile-time shape of the deterministic dq kernel (WMMA, bwd_dq_kernel.hpp; its tile is
// kSm80BwdDqTiles in sm80/bwd_tile_table.hpp), its shared-memory carve-up, and the small
// helpers it and the pre/post passes share: dtype conversion, tile loads, workspace row index.
// The main kernel's shape is bwd_main_traits.hpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <cutlass/numeric_types.h>

#include "cuda/common/bwd_kernel_params.hpp"
#include "cuda/sm80/bwd_tile_table.hpp"

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

// The largest dynamic shared memory a block may opt in to on an A100 (163 KB); every
// instantiation stays under it so that sm80 and sm90 run the same kernels.
constexpr std::size_t kA100SmemOptin = 163 * 1024;

template <class T, int kHeadDim>
struct BwdTraits {
  static constexpr Sm80BwdDqTile kTile = sm80_bwd_dq_tile(kHeadDim);
  static_assert(kTile.head_dim == kHeadDim, "each instantiated head dim has its tile row");
  static constexpr int kBlockM = kTile.block_m, kBlockN = kTile.block_n, kWarps = kTile.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kDim = kHeadDim;
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "sm80 backward: head dim 32..256, /32");
  static_assert(kBlockN == 64 && kWarps == 8, "S tiles: 64 keys over 8 warps");
  static_assert(kBlockM % 16 == 0 && kBlockM <= 64, "query block: 16..64 rows, /16");

  static constexpr int kLd = kHeadDim + 8;   // Q, dO, K, V tiles (elements)
  static constexpr int kLdS = kBlockN + 4;   // S, dP (fp32)
  static constexpr int kLdP = kBlockN + 8;   // P, dS (elements)
  static constexpr int kLdA = kHeadDim + 4;  // fp32 staging of dQ

  // S and dP: (kBlockM / 16) x (kBlockN / 16) WMMA tiles, the same count per warp.
  static constexpr int kSTiles = (kBlockM / 16) * (kBlockN / 16);
  static_assert(kSTiles % kWarps == 0, "S tiles divide over the warps");
  static constexpr int kSTilesPerWarp = kSTiles / kWarps;

  // The deterministic dq kernel keeps all of dQ (kBlockM x kHeadDim) in registers.
  static constexpr int kDqTiles = (kBlockM / 16) * (kHeadDim / 16);
  static_assert(kDqTiles % kWarps == 0, "dQ tiles divide over the warps");
  static constexpr int kDqTilesPerWarp = kDqTiles / kWarps;

  // Byte offsets; each buffer starts on a 128-byte boundary (WMMA needs 32).
  static constexpr std::size_t kQBytes = std::size_t(kBlockM) * kLd * sizeof(T);
  static constexpr std::size_t kKBytes = std::size_t(kBlockN) * kLd * sizeof(T);
  static constexpr std::size_t kPBytes = std::size_t(kBlockM) * kLdP * sizeof(T);
  static constexpr std::size_t kSBytes = std::size_t(kBlockM) * kLdS * sizeof(float);
  static constexpr std::size_t kOffQ = 0;
  static constexpr std::size_t kOffDO = kOffQ + kQBytes;
  static constexpr std::size_t kOffK = kOffDO + kQBytes;
  static constexpr std::size_t kOffV = kOffK + kKBytes;
  static constexpr std::size_t kOffP = kOffV + kKBytes;
  static constexpr std::size_t kOffDS = kOffP + kPBytes;
  static constexpr std::size_t kOffS = kOffDS + kPBytes;
  static constexpr std::size_t kOffDP = kOffS + kSBytes;
  static constexpr std::size_t kOffLse = kOffDP + kSBytes;
  static constexpr std::size_t kOffDsum = kOffLse + kBlockM * sizeof(float);
  static constexpr std::size_t kSmemBytes = kOffDsum + kBlockM * sizeof(float);
  static_assert(kQBytes % 128 == 0 && kKBytes % 128 == 0 && kPBytes % 128 == 0 &&
                    kSBytes % 128 == 0,
                "buffers stay 128-byte aligned");

  // The end-of-kernel staging of dQ reuses the whole buffer, dead by then.
  static_assert(std::size_t(kBlockM) * kLdA * sizeof(float) <= kSmemBytes, "dQ staging fits");
  static_assert(kSmemBytes <= kA100SmemOptin, "fits an A100's 163 KB opt-in");
};

// Typed views of the dynamic shared memory.
template <class Tr, class T>
struct BwdSmem {
  T *q, *dout, *k, *v, *p, *ds;
  float *s, *dp, *lse, *dsum;
  float* end_stage;  // dQ at the end of the kernel, over everything
  __device__ __forceinline__ explicit BwdSmem(unsigned char* base)
      : q(reinterpret_cast<T*>(base + Tr::kOffQ)),
        dout(reinterpret_cast<T*>(base + Tr::kOffDO)),
        k(reinterpret_cast<T*>(base + Tr::kOffK)),
        v(reinterpret_cast<T*>(base + Tr::kOffV)),
        p(reinterpret_cast<T*>(base + Tr::kOffP)),
        ds(reinterpret_cast<T*>(base + Tr::kOffDS)),
        s(reinterpret_cast<float*>(base + Tr::kOffS)),
        dp(reinterpret_cast<float*>(base + Tr::kOffDP)),
        lse(reinterpret_cast<float*>(base + Tr::kOffLse)),
        dsum(reinterpret_cast<float*>(base + Tr::kOffDsum)),
        end_stage(reinterpret_cast<float*>(base)) {}
};

// Row of the dsum / lse_log2 / dq_accum workspace for (batch b, query head h, row i of the
// sequence); seqlen_q is the (max) query length, so varlen sequences get disjoint rows.
__device__ __forceinline__ std::int64_t ws_row(const BackwardParams& p, int b, int h, int i) {
  return (std::int64_t(b) * p.heads_q + h) * p.seqlen_q + i;
}

// Loads rows [0, rows) x cols [0, cols) of a kRows x kHeadDim tile into smem (leading dim
// Tr::kLd), zero-filling the rest, so padding rows and columns contribute exactly 0.
template <class Tr, int kRows, class T>
__device__ __forceinline__ void load_tile(T* dst, const T* src, std::int64_t row_stride,
                                          int rows, int cols, bool vec8) {
  constexpr int kHeadDim = Tr::kDim;
  if (vec8) {
    constexpr int kChunks = kHeadDim / 8;
    for (int idx = threadIdx.x; idx < kRows * kChunks; idx += Tr::kThreads) {
      const int r = idx / kChunks, c = (idx % kChunks) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows && c < cols) v = *reinterpret_cast<const uint4*>(src + r * row_stride + c);
      *reinterpret_cast<uint4*>(dst + r * Tr::kLd + c) = v;
    }
  } else {
    const T zero = from_f<T>(0.f);
    for (int idx = threadIdx.x; idx < kRows * kHeadDim; idx += Tr::kThreads) {
      const int r = idx / kHeadDim, c = idx % kHeadDim;
      dst[r * Tr::kLd + c] = (r < rows && c < cols) ? src[r * row_stride + c] : zero;
    }
  }
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
