// Softmax step 1: one block per row, reductions through shared memory.
//
//   y[c] = exp(x[c] - max) / sum_c' exp(x[c'] - max)
//
// Subtracting the row maximum keeps exp() from overflowing and does not change the result.
// The row needs two reductions (max, then sum), and each is done the textbook way: every
// thread reduces its strided share of the row, writes its partial to shared memory, and the
// block halves the array log2(256) = 8 times with a __syncthreads between halvings.
//
// It reads the row three times (max, sum, output) and spends 2 x 9 barriers per row on
// reductions; step 2 removes most of the barriers, step 3 the extra reads.
#include <cmath>

#include "kernels/check.hpp"
#include "kernels/ladder.hpp"

namespace flashcpp::ladder {
namespace {

constexpr int kThreads = 256;  // a power of two, which the halving loop relies on

// Combines the kThreads values of the block with `op`; every thread gets the result.
template <class Op>
__device__ float tree_reduce(float value, float* scratch, Op op) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      scratch[threadIdx.x] = op(scratch[threadIdx.x], scratch[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  const float result = scratch[0];
  __syncthreads();  // scratch is reused by the next reduction
  return result;
}

struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// x and y may alias: every element is read for the last time by the thread that writes it.
__global__ void __launch_bounds__(kThreads) softmax_shared_kernel(const float* x, float* y,
                                                                  int cols) {
  __shared__ float scratch[kThreads];
  const float* in = x + static_cast<size_t>(blockIdx.x) * cols;
  float* out = y + static_cast<size_t>(blockIdx.x) * cols;

  float row_max = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += kThreads) row_max = fmaxf(row_max, in[c]);
  row_max = tree_reduce(row_max, scratch, Max{});

  float row_sum = 0.0f;
  for (int c = threadIdx.x; c < cols; c += kThreads) row_sum += expf(in[c] - row_max);
  row_sum = tree_reduce(row_sum, scratch, Sum{});

  const float inv_sum = 1.0f / row_sum;
  for (int c = threadIdx.x; c < cols; c += kThreads) out[c] = expf(in[c] - row_max) * inv_sum;
}

}  // namespace

void softmax_shared(const float* x, float* y, int rows, int cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  softmax_shared_kernel<<<rows, kThreads, 0, stream>>>(x, y, cols);
  check_launch("softmax_shared_kernel");
}

}  // namespace flashcpp::ladder
