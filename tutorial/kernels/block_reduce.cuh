// Warp-shuffle reductions shared by softmax steps 2 and 3.
//
// __shfl_xor_sync lets the 32 threads of a warp read each other's registers. Five rounds of
// "add the value of the lane whose index differs in bit b" (b = 16, 8, 4, 2, 1) leave the
// full reduction in every lane, with no shared memory and no barrier. A block reduction is
// then: reduce inside each warp, one value per warp through shared memory, reduce those.
#pragma once

#include <cmath>

namespace flashcpp::ladder {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ inline float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Every thread of the block gets the result. kThreads is the block size, a multiple of 32
// and at most 1024. Two barriers: one before reading the per-warp values, one so the next
// call may overwrite them.
template <int kThreads>
__device__ float block_max(float v) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float per_warp[kWarps];
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x % 32 < kWarps ? per_warp[threadIdx.x % 32] : -INFINITY;
  v = warp_max(v);
  __syncthreads();
  return v;
}

template <int kThreads>
__device__ float block_sum(float v) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float per_warp[kWarps];
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x % 32 < kWarps ? per_warp[threadIdx.x % 32] : 0.0f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}

}  // namespace flashcpp::ladder
