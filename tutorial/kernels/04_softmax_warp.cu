// Softmax step 2: the same three passes as step 1, with warp-shuffle reductions.
//
// Step 1's tree reduction costs 9 barriers and 8 rounds through shared memory per
// reduction, most of them with half or fewer of the threads doing work. Here each warp
// reduces in registers (block_reduce.cuh), and only the 8 per-warp values go through shared
// memory: 2 barriers per reduction instead of 9.
//
// The row is still read three times from global memory (the later reads mostly hit the
// caches); step 3 reads it once.
#include <cmath>

#include "kernels/block_reduce.cuh"
#include "kernels/check.hpp"
#include "kernels/ladder.hpp"

namespace flashcpp::ladder {
namespace {

constexpr int kThreads = 256;

// x and y may alias (see 03_softmax_shared.cu).
__global__ void __launch_bounds__(kThreads) softmax_warp_kernel(const float* x, float* y,
                                                                int cols) {
  const float* in = x + static_cast<size_t>(blockIdx.x) * cols;
  float* out = y + static_cast<size_t>(blockIdx.x) * cols;

  float row_max = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += kThreads) row_max = fmaxf(row_max, in[c]);
  row_max = block_max<kThreads>(row_max);

  float row_sum = 0.0f;
  for (int c = threadIdx.x; c < cols; c += kThreads) row_sum += expf(in[c] - row_max);
  row_sum = block_sum<kThreads>(row_sum);

  const float inv_sum = 1.0f / row_sum;
  for (int c = threadIdx.x; c < cols; c += kThreads) out[c] = expf(in[c] - row_max) * inv_sum;
}

}  // namespace

void softmax_warp(const float* x, float* y, int rows, int cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  softmax_warp_kernel<<<rows, kThreads, 0, stream>>>(x, y, cols);
  check_launch("softmax_warp_kernel");
}

}  // namespace flashcpp::ladder
