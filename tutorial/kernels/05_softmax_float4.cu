// Softmax step 3: float4 loads, and each element read from global memory once.
//
// Softmax is memory-bound: per element it reads 4 bytes, writes 4 bytes and does a handful
// of arithmetic. So the fastest kernel is the one that moves the fewest bytes in the fewest
// memory instructions. Two changes over step 2:
//
//  1. 16-byte loads and stores. One float4 instruction moves what four scalar ones did, so a
//     warp keeps more bytes in flight per instruction issued.
//  2. One read of the row. For rows of up to 16384 floats, each thread keeps its share of
//     the row in registers (kVecs float4 each, 256 threads a block): read once, reduce the
//     maximum, exponentiate in registers, reduce the sum, write. 8 bytes of DRAM traffic per
//     element, the minimum. For longer rows the registers run out, so the statistics are
//     gathered in one pass with an online max/sum (when a larger maximum turns up, the
//     running sum is rescaled by exp(old_max - new_max)) and a second pass writes the output:
//     two reads instead of step 2's three.
//
// The float4 path needs cols % 4 == 0 and 16-byte-aligned rows; otherwise the launcher falls
// back to step 2's scalar kernel.
#include <cmath>
#include <cstdint>

#include "kernels/block_reduce.cuh"
#include "kernels/check.hpp"
#include "kernels/ladder.hpp"

namespace flashcpp::ladder {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVecs = 16;  // 16 float4 = 64 registers a thread, rows up to 16384 floats

__device__ inline float max4(float4 v) { return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)); }

// One block per row; the row lives in registers between the read and the write.
template <int kVecs>
__global__ void __launch_bounds__(kThreads) softmax_registers_kernel(const float* x, float* y,
                                                                     int cols) {
  const int vecs = cols / 4;
  const float4* in = reinterpret_cast<const float4*>(x + static_cast<size_t>(blockIdx.x) * cols);
  float4* out = reinterpret_cast<float4*>(y + static_cast<size_t>(blockIdx.x) * cols);

  // Element i of thread t is float4 number t + i * kThreads: neighbouring threads read
  // neighbouring 16-byte words, so each warp load is 512 contiguous bytes. Past the end of
  // the row we hold -inf, which adds nothing to the max and exp(-inf) = 0 to the sum.
  float4 v[kVecs];
  float row_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    v[i] = idx < vecs ? in[idx] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    row_max = fmaxf(row_max, max4(v[i]));
  }
  row_max = block_max<kThreads>(row_max);

  float row_sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    v[i].x = expf(v[i].x - row_max);
    v[i].y = expf(v[i].y - row_max);
    v[i].z = expf(v[i].z - row_max);
    v[i].w = expf(v[i].w - row_max);
    row_sum += (v[i].x + v[i].y) + (v[i].z + v[i].w);
  }
  row_sum = block_sum<kThreads>(row_sum);

  const float inv_sum = 1.0f / row_sum;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    if (idx < vecs) {
      out[idx] = make_float4(v[i].x * inv_sum, v[i].y * inv_sum, v[i].z * inv_sum,
                             v[i].w * inv_sum);
    }
  }
}

// Rows too long for registers: online statistics in one pass, the output in a second.
__global__ void __launch_bounds__(kThreads) softmax_online_kernel(const float* x, float* y,
                                                                  int cols) {
  const int vecs = cols / 4;
  const float4* in = reinterpret_cast<const float4*>(x + static_cast<size_t>(blockIdx.x) * cols);
  float4* out = reinterpret_cast<float4*>(y + static_cast<size_t>(blockIdx.x) * cols);

  // Invariant: sum == sum over the elements seen so far of exp(x - m).
  float m = -INFINITY;
  float sum = 0.0f;
  for (int idx = threadIdx.x; idx < vecs; idx += kThreads) {
    const float4 v = in[idx];
    const float m_new = fmaxf(m, max4(v));
    sum = sum * expf(m - m_new) + (expf(v.x - m_new) + expf(v.y - m_new)) +
          (expf(v.z - m_new) + expf(v.w - m_new));
    m = m_new;
  }
  // Merge the threads' (m, sum) pairs: bring each sum to the common maximum, then add.
  const float row_max = block_max<kThreads>(m);
  const float row_sum = block_sum<kThreads>(sum * expf(m - row_max));

  const float inv_sum = 1.0f / row_sum;
  for (int idx = threadIdx.x; idx < vecs; idx += kThreads) {
    const float4 v = in[idx];
    out[idx] = make_float4(expf(v.x - row_max) * inv_sum, expf(v.y - row_max) * inv_sum,
                           expf(v.z - row_max) * inv_sum, expf(v.w - row_max) * inv_sum);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

void softmax_float4(const float* x, float* y, int rows, int cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  if (cols % 4 != 0 || !aligned16(x) || !aligned16(y)) {
    softmax_warp(x, y, rows, cols, stream);  // scalar fallback
    return;
  }
  // The smallest register budget that holds the row; each kVecs is its own kernel so the
  // array v[] has a compile-time size and stays in registers.
  const int vecs_per_thread = ceil_div(cols / 4, kThreads);
  if (vecs_per_thread <= 1) {
    softmax_registers_kernel<1><<<rows, kThreads, 0, stream>>>(x, y, cols);
  } else if (vecs_per_thread <= 2) {
    softmax_registers_kernel<2><<<rows, kThreads, 0, stream>>>(x, y, cols);
  } else if (vecs_per_thread <= 4) {
    softmax_registers_kernel<4><<<rows, kThreads, 0, stream>>>(x, y, cols);
  } else if (vecs_per_thread <= 8) {
    softmax_registers_kernel<8><<<rows, kThreads, 0, stream>>>(x, y, cols);
  } else if (vecs_per_thread <= kMaxVecs) {
    softmax_registers_kernel<kMaxVecs><<<rows, kThreads, 0, stream>>>(x, y, cols);
  } else {
    softmax_online_kernel<<<rows, kThreads, 0, stream>>>(x, y, cols);
  }
  check_launch("softmax_float4");
}

}  // namespace flashcpp::ladder
