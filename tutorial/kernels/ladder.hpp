// The teaching ladder: the steps that lead from a naive matmul to a tiled flash-attention
// kernel, kept as real, tested kernels so a reader can see what each step buys.
//
// Every launcher takes device pointers, sizes and a stream; it checks the launch and throws
// flashcpp::Error on any CUDA failure. Everything is fp32 and row-major (contiguous).
//
//   step                         file                          what it adds
//   matmul 1  naive              01_matmul_naive.cu            one thread per output element
//   matmul 2  tiled              02_matmul_tiled.cu            shared-memory tiles + 8x8 register tiles
//   softmax 1 shared memory      03_softmax_shared.cu          one block per row, tree reductions
//   softmax 2 warp shuffles      04_softmax_warp.cu            reductions in registers
//   softmax 3 float4 + 1 pass    05_softmax_float4.cu          16-byte loads, row kept in registers
//   attention 1 unfused          06_attention_unfused.cu       QK^T, softmax, PV through global memory
//   attention 2 scalar flash     07_attention_flash_scalar.cu  tiles + online softmax, no N x N matrix
#pragma once

#include <cuda_runtime.h>

namespace flashcpp::ladder {

// ---- matmul: C[M, N] = A[M, K] * B[K, N], any sizes ----------------------------------------
void matmul_naive(const float* a, const float* b, float* c, int m, int n, int k,
                  cudaStream_t stream);
void matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k,
                  cudaStream_t stream);

// ---- softmax over each row of x[rows, cols] into y (x == y is allowed), any cols ------------
void softmax_shared(const float* x, float* y, int rows, int cols, cudaStream_t stream);
void softmax_warp(const float* x, float* y, int rows, int cols, cudaStream_t stream);
// Uses 16-byte loads when cols % 4 == 0 and both pointers are 16-byte aligned; otherwise it
// falls back to softmax_warp.
void softmax_float4(const float* x, float* y, int rows, int cols, cudaStream_t stream);

// ---- attention: O = softmax(Q K^T / sqrt(D)) V on [B, H, N, D] tensors ----------------------
// head_dim must be 32, 64 or 128. causal masks key j > query i.
struct AttentionShape {
  int batch = 0;
  int heads = 0;
  int seqlen = 0;
  int head_dim = 0;
  bool causal = false;
};

// Bytes of device workspace attention_unfused needs: the N x N score matrix of every head.
size_t attention_unfused_workspace_bytes(const AttentionShape& shape);
void attention_unfused(const float* q, const float* k, const float* v, float* o,
                       float* workspace, const AttentionShape& shape, cudaStream_t stream);
void attention_flash_scalar(const float* q, const float* k, const float* v, float* o,
                            const AttentionShape& shape, cudaStream_t stream);

}  // namespace flashcpp::ladder
