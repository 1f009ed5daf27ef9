// Matmul step 1: the naive kernel. One thread computes one element of C by walking a row of
// A and a column of B straight from global memory.
//
// Threads that are neighbours in x compute neighbouring columns of C, so a warp reads one
// A element (the same address for all 32 threads: a broadcast) and 32 consecutive B
// elements (one coalesced 128-byte line) per step of k. That is the whole of its
// optimisation: every product needs two loads, so the kernel waits on memory and caches
// rather than on arithmetic. 02_matmul_tiled.cu fixes that.
#include "kernels/check.hpp"
#include "kernels/ladder.hpp"

namespace flashcpp::ladder {
namespace {

constexpr int kBlock = 16;  // 16 x 16 = 256 threads, one C element each

__global__ void matmul_naive_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                    float* __restrict__ c, int m, int n, int k) {
  const int row = blockIdx.y * kBlock + threadIdx.y;
  const int col = blockIdx.x * kBlock + threadIdx.x;
  if (row >= m || col >= n) return;
  float sum = 0.0f;
  for (int i = 0; i < k; ++i) {
    sum += a[static_cast<size_t>(row) * k + i] * b[static_cast<size_t>(i) * n + col];
  }
  c[static_cast<size_t>(row) * n + col] = sum;
}

}  // namespace

void matmul_naive(const float* a, const float* b, float* c, int m, int n, int k,
                  cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  const dim3 block(kBlock, kBlock);
  const dim3 grid(ceil_div(n, kBlock), ceil_div(m, kBlock));
  matmul_naive_kernel<<<grid, block, 0, stream>>>(a, b, c, m, n, k);
  check_launch("matmul_naive_kernel");
}

}  // namespace flashcpp::ladder
