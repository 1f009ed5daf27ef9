// Attention step 1: unfused. Three kernels, the N x N matrices going through global memory.
//
//   S = scale * Q K^T    (masked to -inf above the diagonal when causal)   [B*H, N, N]
//   P = softmax(S)       row-wise, in place, with softmax step 3           [B*H, N, N]
//   O = P V                                                                [B*H, N, D]
//
// This is attention exactly as written on paper. Its cost is the score matrix: at B=4,
// H=16, N=2048 it holds 4 * 16 * 2048^2 floats = 1 GiB, written once, read and written by
// the softmax, and read again for P V: about 4 GiB of DRAM traffic, while Q, K, V and O
// together are 32 MiB. Memory grows with N^2, too. Step 2 (07_attention_flash_scalar.cu)
// never materialises S.
//
// The two products use one batched kernel: a 64 x 64 tile of C per block, 4 x 4 outputs per
// thread from shared-memory slices of 16 along k (step 2 of the matmul ladder at a smaller
// size), with blockIdx.z picking the head. The kernel computes the full N x N product even
// when causal; skipping masked tiles is one of the things the fused kernel gets for free.
#include <cmath>

#include "kernels/check.hpp"
#include "kernels/ladder.hpp"

namespace flashcpp::ladder {
namespace {

constexpr int kTile = 64;
constexpr int kTileK = 16;
constexpr int kThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each
constexpr int kPad = 4;        // spreads the transposing shared-memory stores over more banks

struct BatchedMatmul {
  const float* a;  // [batch, m, k]
  const float* b;  // [batch, k, n], or [batch, n, k] when kTransB
  float* c;        // [batch, m, n]
  int m, n, k;
  float alpha;  // C = alpha * A op(B)
  bool causal;  // write -inf where column > row (the score matrix's future keys)
};

// C[z] = alpha * A[z] * op(B[z]), op(B) = B^T when kTransB. Any m, n, k.
template <bool kTransB>
__global__ void __launch_bounds__(kThreads) batched_matmul_kernel(BatchedMatmul p) {
  __shared__ __align__(16) float as[kTileK][kTile + kPad];  // A slice, transposed: as[k][m]
  __shared__ __align__(16) float bs[kTileK][kTile + kPad];  // op(B) slice: bs[k][n]
  const size_t z = blockIdx.z;
  const float* a = p.a + z * p.m * p.k;
  const float* b = p.b + z * p.k * p.n;
  float* c = p.c + z * p.m * p.n;
  const int t = threadIdx.x;
  const int tx = t % 16;
  const int ty = t / 16;
  const int row0 = blockIdx.y * kTile;
  const int col0 = blockIdx.x * kTile;

  float acc[4][4] = {};
  for (int k0 = 0; k0 < p.k; k0 += kTileK) {
    // Each thread stages 4 elements of each slice; out-of-range elements are 0.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int kk = (t % 4) * 4 + i;  // A (and B^T): 64 rows x 16 k, 4 threads a row
      const int ar = row0 + t / 4;
      as[kk][t / 4] = (ar < p.m && k0 + kk < p.k) ? a[static_cast<size_t>(ar) * p.k + k0 + kk] : 0.0f;
      if constexpr (kTransB) {
        const int bc = col0 + t / 4;
        bs[kk][t / 4] = (bc < p.n && k0 + kk < p.k) ? b[static_cast<size_t>(bc) * p.k + k0 + kk] : 0.0f;
      } else {
        const int bk = k0 + t / 16;  // B: 16 k x 64 columns, 16 threads a row
        const int bc = col0 + (t % 16) * 4 + i;
        bs[t / 16][(t % 16) * 4 + i] = (bk < p.k && bc < p.n) ? b[static_cast<size_t>(bk) * p.n + bc] : 0.0f;
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      const float4 av = *reinterpret_cast<const float4*>(&as[kk][ty * 4]);
      const float4 bv = *reinterpret_cast<const float4*>(&bs[kk][tx * 4]);
      const float ar[4] = {av.x, av.y, av.z, av.w};
      const float br[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += ar[i] * br[j];
      }
    }
    __syncthreads();  // the slices are overwritten next iteration
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = row0 + ty * 4 + i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = col0 + tx * 4 + j;
      if (row < p.m && col < p.n) {
        c[static_cast<size_t>(row) * p.n + col] =
            (p.causal && col > row) ? -INFINITY : p.alpha * acc[i][j];
      }
    }
  }
}

template <bool kTransB>
void launch_batched_matmul(const BatchedMatmul& p, int batch, cudaStream_t stream) {
  const dim3 grid(ceil_div(p.n, kTile), ceil_div(p.m, kTile), batch);
  batched_matmul_kernel<kTransB><<<grid, kThreads, 0, stream>>>(p);
  check_launch("batched_matmul_kernel");
}

void check_shape(const AttentionShape& s) {
  if (s.batch < 0 || s.heads < 0 || s.seqlen < 0) throw Error("ladder attention: negative size");
  if (s.head_dim != 32 && s.head_dim != 64 && s.head_dim != 128) {
    throw Error("ladder attention: head_dim must be 32, 64 or 128, got " +
                std::to_string(s.head_dim));
  }
  if (s.batch * s.heads > 65535) throw Error("ladder attention: batch * heads must be <= 65535");
}

}  // namespace

size_t attention_unfused_workspace_bytes(const AttentionShape& s) {
  return static_cast<size_t>(s.batch) * s.heads * s.seqlen * s.seqlen * sizeof(float);
}

void attention_unfused(const float* q, const float* k, const float* v, float* o,
                       float* workspace, const AttentionShape& s, cudaStream_t stream) {
  check_shape(s);
  const int heads = s.batch * s.heads;
  const int n = s.seqlen;
  if (heads == 0 || n == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));

  // S = scale * Q K^T: m = n = N, k = D, B operand K read transposed.
  launch_batched_matmul<true>({q, k, workspace, n, n, s.head_dim, scale, s.causal}, heads, stream);
  // P = softmax(S), every one of the heads * N rows, in place.
  softmax_float4(workspace, workspace, heads * n, n, stream);
  // O = P V: m = N, n = D, k = N.
  launch_batched_matmul<false>({workspace, v, o, n, s.head_dim, n, 1.0f, false}, heads, stream);
}

}  // namespace flashcpp::ladder
