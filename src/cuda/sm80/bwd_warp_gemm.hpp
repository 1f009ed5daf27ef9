#pragma once
// The warp-level product every step of the sm80 backward is made of: a warp's MT x NT tile of
// m16n8 fp32 accumulators += A * B, A and B read from shared memory with ldmatrix (plain or
// transposed, whichever gives the mma.sync fragment from the way the matrix is stored), and
// the accumulator element -> (row, col) rule the callers index by.
//
// mma.sync m16n8k16 fragments (PTX ISA; lane = 4 g + t):
//   A (16 x 16, m x k): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B (16 x 8,  k x n): b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C (16 x 8):         c0, c1 (g, 2t), (g, 2t+1)   c2, c3 (g+8, 2t), (g+8, 2t+1)
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i, which lands in register
// i; plain, lane (g, t) gets memory row g, elements 2t, 2t+1; .trans, it gets memory rows 2t,
// 2t+1 of element column g. So, with memory matrices M:
//   A = M[m][k] (k contiguous): plain;      A = M[k][m] (m contiguous): .trans;
//   B = M[n][k] (k contiguous): plain;      B = M[k][n] (n contiguous): .trans.
#include <cstdint>

#include "cuda/common/non_finite_rows.hpp"
#include "cuda/sm80/mma_ptx.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

// Row (h = 0: rows g, h = 1: rows g + 8) and column (e2 = 0, 1) of accumulator acc[mt][nt][2h + e2]
// within the warp's tile.
__device__ __forceinline__ int acc_row(int mt, int h) { return mt * 16 + (threadIdx.x & 31) / 4 + h * 8; }
__device__ __forceinline__ int acc_col(int nt, int e2) { return nt * 8 + (threadIdx.x & 3) * 2 + e2; }

template <int MT, int NT>
__device__ __forceinline__ void clear_acc(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// SmemMatrix's swizzled chunk index of column k0 + 8 half (k0 a multiple of 16, known at
// compile time once the k loop is unrolled; half 0 or 1) in a row r with r & 7 == lr: the
// chunk k0 / 8 + half is k0 / 8 | half, and the XOR with lr < 8 only touches its low three
// bits, so the high part stays a constant and the low part is (k0 / 8 & 7) ^ (half ^ lr).
// Row origins (m0, n0 of the callers) are multiples of 16, so the rows' r & 7 is lr.
__device__ __forceinline__ int swizzled_chunk(int k0, int half, int lr) {
  return (k0 >> 3 & ~7) + ((k0 >> 3 & 7) ^ half ^ lr);
}

// The A fragments (16 rows each, k16 slice k0) of rows [m0, m0 + 16 MT).
// kTrans: the matrix is stored as MatA[k][m], else MatA[m][k].
template <class MatA, bool kTrans, int MT, class Element>
__device__ __forceinline__ void load_a(std::uint32_t (&f)[MT][4], const Element* a, int m0, int k0) {
  const int lane = threadIdx.x & 31;
  const int lr = lane & 7, l8 = (lane >> 3) & 1, l16 = lane >> 4;
  if constexpr (!kTrans && MatA::kSwizzled) {
    // The swizzled offset of row m0 + mt 16 + lr + 8 l8, column k0 + 8 l16, taken apart so
    // that only one XOR per k slice is left at run time, shared by the MT loads.
    const Element* const row = a + (m0 + lr + l8 * 8) * MatA::kLd;
    const int chunk = swizzled_chunk(k0, l16, lr);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(f[mt], row + mt * 16 * MatA::kLd + chunk * 8);
  } else {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (kTrans)
        ldmatrix_x4_trans(f[mt], a + MatA::offset(k0 + lr + l16 * 8, m0 + mt * 16 + l8 * 8));
      else
        ldmatrix_x4(f[mt], a + MatA::offset(m0 + mt * 16 + lr + l8 * 8, k0 + l16 * 8));
    }
  }
}

// The B fragments of columns [n0, n0 + 8 NT), k16 slice k0, two n8 columns per register
// quad: f[j] = {b0, b1} of column tile 2j, then {b0, b1} of column tile 2j + 1.
// kTrans: the matrix is stored as MatB[k][n], else MatB[n][k].
template <class MatB, bool kTrans, int NT, class Element>
__device__ __forceinline__ void load_b(std::uint32_t (&f)[NT / 2][4], const Element* b, int n0, int k0) {
  const int lane = threadIdx.x & 31;
  const int lr = lane & 7, l8 = (lane >> 3) & 1, l16 = lane >> 4;
  if constexpr (!kTrans && MatB::kSwizzled) {
    // As in load_a: row n0 + j 16 + lr + 8 l16, column k0 + 8 l8.
    const Element* const row = b + (n0 + lr + l16 * 8) * MatB::kLd;
    const int chunk = swizzled_chunk(k0, l8, lr);
#pragma unroll
    for (int j = 0; j < NT / 2; ++j) ldmatrix_x4(f[j], row + j * 16 * MatB::kLd + chunk * 8);
  } else {
#pragma unroll
    for (int j = 0; j < NT / 2; ++j) {
      if constexpr (kTrans)
        ldmatrix_x4_trans(f[j], b + MatB::offset(k0 + lr + l8 * 8, n0 + j * 16 + l16 * 8));
      else
        ldmatrix_x4(f[j], b + MatB::offset(n0 + j * 16 + lr + l16 * 8, k0 + l8 * 8));
    }
  }
}

// acc (rows [m0, m0 + 16 MT) x cols [n0, n0 + 8 NT) of the product) += sum over k in [0, kK)
// of A[m][k] B[k][n]. The fragments of slice k + 16 are loaded before the mma.sync of slice k
// (the asm statements are volatile, so the compiler keeps the order written here), so the
// shared-memory latency hides behind the tensor cores.
// kFiniteB: B's non-finite elements count as 0 (the rare path of a dQ product whose K holds
// Inf: bwd_non_finite.hpp).
template <class Element, int MT, int NT, int kK, class MatA, bool kATrans, class MatB, bool kBTrans,
          bool kFiniteB = false>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], const Element* a, int m0,
                                          const Element* b, int n0) {
  static_assert(NT % 2 == 0, "B loads come in pairs of n8 columns");
  static_assert(kK % 16 == 0);
  std::uint32_t fa[2][MT][4], fb[2][NT / 2][4];
  auto finite_b = [&](std::uint32_t (&f)[NT / 2][4]) {
    if constexpr (kFiniteB) {
#pragma unroll
      for (int j = 0; j < NT / 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) f[j][e] = finite_or_zero<Element>(f[j][e]);
    }
  };
  load_a<MatA, kATrans>(fa[0], a, m0, 0);
  load_b<MatB, kBTrans, NT>(fb[0], b, n0, 0);
  finite_b(fb[0]);
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks) {
    const int cur = ks & 1;
    if (ks + 1 < kK / 16) {
      load_a<MatA, kATrans>(fa[cur ^ 1], a, m0, (ks + 1) * 16);
      load_b<MatB, kBTrans, NT>(fb[cur ^ 1], b, n0, (ks + 1) * 16);
      finite_b(fb[cur ^ 1]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        mma_16816<Element>(acc[mt][nt], fa[cur][mt], fb[cur][nt / 2][(nt & 1) * 2],
                           fb[cur][nt / 2][(nt & 1) * 2 + 1]);
  }
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
