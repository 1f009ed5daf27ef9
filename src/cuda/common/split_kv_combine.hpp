#pragma once
// Split-KV combine: merges the fp32 partial O and lse of every split by their lse
//   lse = m + log(sum_s exp(lse_s - m)),  O = sum_s exp(lse_s - lse) * O_s
// with m = max_s lse_s. Splits that saw no key have lse_s = -inf and weight 0; a row no
// split saw gets O = 0 and lse = -inf; a split with a NaN lse makes the row NaN. One warp per (batch, head, row, 32 columns): lanes run
// along the head dim, so the partial-O reads are coalesced, and a few rows (decode) still
// spread over many warps.
#include <climits>
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/dependent_launch.hpp"
#include "cuda/common/fwd_kernel_params.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda {

inline constexpr int kCombineWarps = 4;

// Warps of the combine: one per (row, 32 columns of the head dim).
inline std::int64_t combine_warps(const ForwardParams& p) {
  return std::int64_t(p.batch) * p.heads_q * p.seqlen_q * ((p.head_dim_v + 31) / 32);
}

// kSm90Code: instantiated by an sm90a translation unit. The sm80 ones compile it from
// compute_80 PTX, where wait_for_kernel_ahead() is a no-op; the distinct template argument
// keeps the two codes apart as symbols (decode_kernel.hpp, kSm90Code).
template <class Element, bool kSm90Code>
__global__ void __launch_bounds__(kCombineWarps * 32)
    fwd_combine_kernel(const __grid_constant__ FwdKernelParams kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static_assert(!kSm90Code, "an sm90a instantiation compiled for an older architecture");
#endif
  const ForwardParams& p = kp.p;
  const int lane = threadIdx.x % 32;
  const int col_groups = (p.head_dim_v + 31) / 32;
  const std::int64_t warp = std::int64_t(blockIdx.x) * kCombineWarps + threadIdx.x / 32;
  const std::int64_t rows_per_split = std::int64_t(p.batch) * p.heads_q * p.seqlen_q;
  const std::int64_t row_id = warp / col_groups;
  if (row_id >= rows_per_split) return;
  const int d = int(warp % col_groups) * 32 + lane;
  const int i = int(row_id % p.seqlen_q);
  const std::int64_t bh = row_id / p.seqlen_q;
  const int head = int(bh % p.heads_q);
  const int b = int(bh / p.heads_q);
  const SeqlenInfo seq(p, b);
  if (i >= seq.seqlen_q) return;
  wait_for_kernel_ahead();  // the partials are the main kernel's output

  const float* lse_s = kp.lse_accum + row_id;  // split s at lse_s[s * rows_per_split]
  float m = -INFINITY;
  for (int s = lane; s < kp.num_splits; s += 32) m = fmaxf(m, lse_s[s * rows_per_split]);
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  // A NaN lse_s (the split saw a NaN score; fmaxf skipped it in m) makes the sum NaN, and the
  // row NaN: only splits with lse_s = -inf count as empty.
  float sum = 0.f;
  for (int s = lane; s < kp.num_splits; s += 32) {
    const float l = lse_s[s * rows_per_split];
    sum += l == -INFINITY ? 0.f : expf(l - m);
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const bool empty = sum == 0.f;
  const float lse = empty ? -INFINITY : m + logf(sum);

  // Lane j of a 32-split chunk computes split j's weight once; the warp then walks the chunk
  // with the weight broadcast. The loads of different splits do not depend on each other, so
  // unrolling keeps several in flight (a plain loop waited for each L2 load in turn). A split
  // that saw no key has weight 0 and its partial O is never multiplied (it may be unwritten).
  const float* o_s = kp.o_accum + row_id * p.head_dim_v + d;
  const std::int64_t split_stride = rows_per_split * p.head_dim_v;
  float acc = 0.f;
  if (!empty) {
    for (int s0 = 0; s0 < kp.num_splits; s0 += 32) {
      const int s = s0 + lane;
      const float l = s < kp.num_splits ? lse_s[s * rows_per_split] : -INFINITY;
      const float w = l == -INFINITY ? 0.f : expf(l - lse);
      const int chunk = min(32, kp.num_splits - s0);
#pragma unroll 8
      for (int j = 0; j < chunk; ++j) {
        const float wj = __shfl_sync(0xffffffffu, w, j);
        if (d < p.head_dim_v && wj != 0.f) acc = fmaf(wj, o_s[(s0 + j) * split_stride], acc);
      }
    }
  }
  if (d < p.head_dim_v)
    static_cast<Element*>(p.out)[seq.offset(p.out_stride, seq.batch_q, seq.row_q + i, head) + d] =
        Element(acc);
  if (d == 0 && p.lse != nullptr)
    p.lse[seq.lse_row0 + std::int64_t(head) * p.lse_head_stride + i] = lse;
}

// Launches the combine after the kernel that wrote the partials. With `overlap` (sm90+) it is
// a programmatic dependent of that kernel: its CTAs launch while the main kernel drains and
// wait in the kernel for its results, which hides the launch gap of split calls. Only code
// compiled for sm90a can wait (kSm90Code): the sm80 translation units' combine, which also
// runs on Hopper (compiled from compute_80 PTX), is launched in stream order.
template <class Element, bool kSm90Code>
void launch_combine(const FwdKernelParams& kp, bool overlap, cudaStream_t stream) {
  const std::int64_t blocks = (combine_warps(kp.p) + kCombineWarps - 1) / kCombineWarps;
  if (blocks > INT_MAX) throw Error("cuda split-KV combine: grid too large");
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(kCombineWarps * 32);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = overlap && kSm90Code ? 1 : 0;
  FLASHCPP_CUDA_CHECK(cudaLaunchKernelEx(&config, fwd_combine_kernel<Element, kSm90Code>, kp));
}

}  // namespace flashcpp::detail::cuda
