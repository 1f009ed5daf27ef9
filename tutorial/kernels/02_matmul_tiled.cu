// Matmul step 2: shared-memory tiles plus register tiles.
//
// The naive kernel does two global loads per multiply-add. This one cuts loads twice over:
//
//  1. Block tile. A block of 256 threads owns a 128 x 128 tile of C. It walks K in slices of
//     8: each slice of A (128 x 8) and B (8 x 128) is loaded from global memory once, into
//     shared memory, and then used by every thread of the block. Global traffic drops by
//     the tile size.
//  2. Register tile. Each thread computes an 8 x 8 patch of the C tile. Per step of k it
//     reads 8 values of A and 8 of B from shared memory into registers and does 8 x 8 = 64
//     multiply-adds with them: 16 shared loads (4 of them as float4) feed 64 FMAs, so the
//     arithmetic units, not the loads, set the pace.
//
// Two smaller touches keep the pipes busy:
//  - Double buffering: while the block computes on one shared-memory slice, the next slice
//    is already on its way from global memory into registers, and is written into the other
//    shared buffer afterwards. One __syncthreads per slice is then enough.
//  - Bank-conflict-free layouts: A is stored transposed (As[k][m]) so a thread's 4
//    consecutive rows are one float4; its row is padded by 4 floats so the transposing
//    stores of neighbouring threads land in different banks.
//
// Each thread's 8 x 8 patch is two 4-row bands (ty*4 and 64 + ty*4) times two 4-column
// bands (tx*4 and 64 + tx*4) rather than one contiguous 8 x 8 square: then the 16 threads
// of a half-warp read 16 consecutive float4 of a B row, which shared memory serves without
// conflicts.
#include "kernels/check.hpp"
#include "kernels/ladder.hpp"

namespace flashcpp::ladder {
namespace {

constexpr int kTileM = 128;
constexpr int kTileN = 128;
constexpr int kTileK = 8;
constexpr int kThreads = 256;       // 16 x 16 threads, each an 8 x 8 patch of the tile
constexpr int kPadA = 4;            // keeps the transposed stores into As conflict-free
constexpr int kHalfM = kTileM / 2;  // the second band of rows starts here
constexpr int kHalfN = kTileN / 2;

struct SharedTiles {
  float a[2][kTileK][kTileM + kPadA];  // A slice, transposed: a[buffer][k][m]
  float b[2][kTileK][kTileN];          // B slice: b[buffer][k][n]
};

// The 4 + 4 global values one thread loads per slice, before they go to shared memory.
struct Staged {
  float a[4];
  float b[4];
};

// Thread t loads A[row0 + t/2][k0 + (t%2)*4 + 0..3] and B[k0 + t/32][col0 + (t%32)*4 + 0..3];
// out-of-range elements read as 0 so the tile arithmetic needs no bounds checks.
__device__ Staged load_slice(const float* __restrict__ a, const float* __restrict__ b, int m,
                             int n, int k, int row0, int col0, int k0) {
  const int t = threadIdx.x;
  Staged s;
  const int a_row = row0 + t / 2;
  const int a_col = k0 + (t % 2) * 4;
  const int b_row = k0 + t / 32;
  const int b_col = col0 + (t % 32) * 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s.a[i] = (a_row < m && a_col + i < k) ? a[static_cast<size_t>(a_row) * k + a_col + i] : 0.0f;
    s.b[i] = (b_row < k && b_col + i < n) ? b[static_cast<size_t>(b_row) * n + b_col + i] : 0.0f;
  }
  return s;
}

__device__ void store_slice(SharedTiles& tiles, int buffer, const Staged& s) {
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) tiles.a[buffer][(t % 2) * 4 + i][t / 2] = s.a[i];
  *reinterpret_cast<float4*>(&tiles.b[buffer][t / 32][(t % 32) * 4]) =
      make_float4(s.b[0], s.b[1], s.b[2], s.b[3]);
}

__global__ void __launch_bounds__(kThreads, 2)
    matmul_tiled_kernel(const float* __restrict__ a, const float* __restrict__ b,
                        float* __restrict__ c, int m, int n, int k) {
  __shared__ __align__(16) SharedTiles tiles;
  const int tx = threadIdx.x % 16;  // column band of this thread
  const int ty = threadIdx.x / 16;  // row band of this thread
  const int row0 = blockIdx.y * kTileM;
  const int col0 = blockIdx.x * kTileN;

  float acc[8][8] = {};
  const int slices = ceil_div(k, kTileK);
  store_slice(tiles, 0, load_slice(a, b, m, n, k, row0, col0, 0));
  __syncthreads();

  for (int s = 0; s < slices; ++s) {
    const int cur = s % 2;
    const bool has_next = s + 1 < slices;
    Staged next;
    if (has_next) next = load_slice(a, b, m, n, k, row0, col0, (s + 1) * kTileK);

#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float av[8], bv[8];
      const float4 a_lo = *reinterpret_cast<const float4*>(&tiles.a[cur][kk][ty * 4]);
      const float4 a_hi = *reinterpret_cast<const float4*>(&tiles.a[cur][kk][kHalfM + ty * 4]);
      const float4 b_lo = *reinterpret_cast<const float4*>(&tiles.b[cur][kk][tx * 4]);
      const float4 b_hi = *reinterpret_cast<const float4*>(&tiles.b[cur][kk][kHalfN + tx * 4]);
      av[0] = a_lo.x; av[1] = a_lo.y; av[2] = a_lo.z; av[3] = a_lo.w;
      av[4] = a_hi.x; av[5] = a_hi.y; av[6] = a_hi.z; av[7] = a_hi.w;
      bv[0] = b_lo.x; bv[1] = b_lo.y; bv[2] = b_lo.z; bv[3] = b_lo.w;
      bv[4] = b_hi.x; bv[5] = b_hi.y; bv[6] = b_hi.z; bv[7] = b_hi.w;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] += av[i] * bv[j];
      }
    }

    // The other buffer was last read in iteration s - 1, which every thread finished
    // before the __syncthreads that ended it, so it is free to overwrite now.
    if (has_next) store_slice(tiles, 1 - cur, next);
    __syncthreads();
  }

  // acc[i][j] belongs to row band i / 4 (0: ty*4, 1: 64 + ty*4) and column band j / 4.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = row0 + (i < 4 ? ty * 4 + i : kHalfM + ty * 4 + i - 4);
    if (row >= m) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int col = col0 + (j < 4 ? tx * 4 + j : kHalfN + tx * 4 + j - 4);
      if (col < n) c[static_cast<size_t>(row) * n + col] = acc[i][j];
    }
  }
}

}  // namespace

void matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k,
                  cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  const dim3 grid(ceil_div(n, kTileN), ceil_div(m, kTileM));
  matmul_tiled_kernel<<<grid, kThreads, 0, stream>>>(a, b, c, m, n, k);
  check_launch("matmul_tiled_kernel");
}

}  // namespace flashcpp::ladder
