// block_gemm on AVX-512 (the backward's block products on CPUs that have it): C rows are
// vectorised over their columns, 8 rows x 48 columns of accumulators, A elements broadcast
// from A in place (either orientation) and B rows read in place. A transposed B (the Q K^T and
// dO V^T blocks) is first transposed into a per-thread buffer, 16 x 16 at a time; that buffer
// is the only packing. OpenBLAS packed both operands on every call: a quarter of the fp32
// backward's time (1 thread, N 1024, D 128) was its copy routines.
#include "cpu/block_gemm_avx512.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace flashcpp::detail::cpu {
namespace {

constexpr int kRows = 8;  // C rows per microkernel call
constexpr int kRegs = 3;  // zmm registers of C columns per call (48 columns)

// The transposed B of the current call (per thread; allocated outside the AVX-512 code).
std::vector<float>& transpose_buffer(std::size_t size) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < size) buffer.resize(size);
  return buffer;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,fma")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

inline __mmask16 lanes_of(int n) {
  return n >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

// out[p][j] = b[j][p] for j < n, p < k (b rows have stride ldb; out rows stride n).
void transpose(const float* b, std::int64_t ldb, int n, int k, float* out) {
  for (int j0 = 0; j0 < n; j0 += 16) {
    const int jn = std::min(16, n - j0);
    for (int p0 = 0; p0 < k; p0 += 16) {
      const int pn = std::min(16, k - p0);
      if (jn < 16 || pn < 16) {
        for (int j = 0; j < jn; ++j)
          for (int p = 0; p < pn; ++p) out[(p0 + p) * std::int64_t{n} + j0 + j] = b[(j0 + j) * ldb + p0 + p];
        continue;
      }
      __m512i r[16], a[16], t[16];
      for (int j = 0; j < 16; ++j) r[j] = _mm512_castps_si512(_mm512_loadu_ps(b + (j0 + j) * ldb + p0));
      for (int i = 0; i < 8; ++i) {
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
      }
      for (int g = 0; g < 4; ++g) {
        t[4 * g + 0] = _mm512_unpacklo_epi64(a[4 * g], a[4 * g + 2]);
        t[4 * g + 1] = _mm512_unpackhi_epi64(a[4 * g], a[4 * g + 2]);
        t[4 * g + 2] = _mm512_unpacklo_epi64(a[4 * g + 1], a[4 * g + 3]);
        t[4 * g + 3] = _mm512_unpackhi_epi64(a[4 * g + 1], a[4 * g + 3]);
      }
      for (int c = 0; c < 4; ++c) {
        const __m512i s0 = _mm512_shuffle_i32x4(t[c], t[4 + c], 0x44);
        const __m512i s1 = _mm512_shuffle_i32x4(t[c], t[4 + c], 0xee);
        const __m512i s2 = _mm512_shuffle_i32x4(t[8 + c], t[12 + c], 0x44);
        const __m512i s3 = _mm512_shuffle_i32x4(t[8 + c], t[12 + c], 0xee);
        r[c] = _mm512_shuffle_i32x4(s0, s2, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
        r[8 + c] = _mm512_shuffle_i32x4(s1, s3, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
      }
      for (int p = 0; p < 16; ++p)
        _mm512_storeu_ps(out + (p0 + p) * std::int64_t{n} + j0, _mm512_castsi512_ps(r[p]));
    }
  }
}

void copy_rows(const float* b, std::int64_t ldb, int rows, int n, float* out, std::int64_t ldo) {
  for (int p = 0; p < rows; ++p)
    for (int j = 0; j < n; j += 16) {
      const __mmask16 lanes = lanes_of(n - j);
      _mm512_mask_storeu_ps(out + p * ldo + j, lanes, _mm512_maskz_loadu_ps(lanes, b + p * ldb + j));
    }
}

// C[r][0..16 * regs) = beta * C + alpha * sum_p A(r, p) * B[p][..] for r < rows (<= kRows),
// the last register on the lanes of `last`. A(r, p) = a[r * a_row + p * a_col].
template <int kR, int kC>
void microkernel(const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
                 std::int64_t ldb, int k, float alpha, float beta, float* c, std::int64_t ldc,
                 __mmask16 last) {
  __m512 acc[kR][kC];
#pragma GCC unroll 8
  for (int r = 0; r < kR; ++r)
#pragma GCC unroll 3
    for (int q = 0; q < kC; ++q) acc[r][q] = _mm512_setzero_ps();
  for (int p = 0; p < k; ++p) {
    __m512 bp[kC];
#pragma GCC unroll 3
    for (int q = 0; q < kC; ++q)
      bp[q] = _mm512_maskz_loadu_ps(q == kC - 1 ? last : __mmask16(0xffff), b + p * ldb + 16 * q);
#pragma GCC unroll 8
    for (int r = 0; r < kR; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * a_row + p * a_col]);
#pragma GCC unroll 3
      for (int q = 0; q < kC; ++q) acc[r][q] = _mm512_fmadd_ps(ar, bp[q], acc[r][q]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < kR; ++r)
#pragma GCC unroll 3
    for (int q = 0; q < kC; ++q) {
      const __mmask16 lanes = q == kC - 1 ? last : __mmask16(0xffff);
      float* cq = c + r * ldc + 16 * q;
      __m512 x = _mm512_mul_ps(acc[r][q], va);
      if (beta != 0.0f) x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes, cq), vb, x);
      _mm512_mask_storeu_ps(cq, lanes, x);
    }
}

template <int kR>
void row_group(const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
               std::int64_t ldb, int n, int k, float alpha, float beta, float* c,
               std::int64_t ldc) {
  for (int c0 = 0; c0 < n; c0 += 16 * kRegs) {
    const int width = std::min(16 * kRegs, n - c0);
    const int regs = (width + 15) / 16;
    const __mmask16 last = lanes_of(width - 16 * (regs - 1));
    if (regs == 3)
      microkernel<kR, 3>(a, a_row, a_col, b + c0, ldb, k, alpha, beta, c + c0, ldc, last);
    else if (regs == 2)
      microkernel<kR, 2>(a, a_row, a_col, b + c0, ldb, k, alpha, beta, c + c0, ldc, last);
    else
      microkernel<kR, 1>(a, a_row, a_col, b + c0, ldb, k, alpha, beta, c + c0, ldc, last);
  }
}

template <int... kR>
void tail_rows(int rows, const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
               std::int64_t ldb, int n, int k, float alpha, float beta, float* c, std::int64_t ldc,
               std::integer_sequence<int, kR...>) {
  ((rows == kR + 1 ? row_group<kR + 1>(a, a_row, a_col, b, ldb, n, k, alpha, beta, c, ldc)
                   : void()),
   ...);
}

void gemm_rows(Op op_a, int m, int n, int k, float alpha, const float* a, std::int64_t lda,
               const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  // A(i, p): row-major a[i * lda + p], or transposed a[p * lda + i].
  const std::int64_t a_row = op_a == Op::none ? lda : 1;
  const std::int64_t a_col = op_a == Op::none ? 1 : lda;
  int i = 0;
  for (; i + kRows <= m; i += kRows)
    row_group<kRows>(a + i * a_row, a_row, a_col, b, ldb, n, k, alpha, beta, c + i * ldc, ldc);
  if (i < m)
    tail_rows(m - i, a + i * a_row, a_row, a_col, b, ldb, n, k, alpha, beta, c + i * ldc, ldc,
              std::make_integer_sequence<int, kRows - 1>());
}

// Long sums over k in two halves, the second added onto the first: shorter chains of fp32
// additions (the fp32 gradient tests of tests/python/test_torch.py need the margin; one chain
// over 64 products failed them by 40%).
void gemm(Op op_a, int m, int n, int k, float alpha, const float* a, std::int64_t lda,
          const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (k < 32) {
    gemm_rows(op_a, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const int half = k / 2;
  const std::int64_t a_col = op_a == Op::none ? 1 : lda;
  gemm_rows(op_a, m, n, half, alpha, a, lda, b, ldb, beta, c, ldc);
  gemm_rows(op_a, m, n, k - half, alpha, a + half * a_col, lda, b + half * ldb, ldb, 1.0f, c, ldc);
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

void block_gemm_avx512(Op op_a, Op op_b, int m, int n, int k, float alpha, const float* a,
                       std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                       std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (op_b == Op::transpose) {
    std::vector<float>& bt = transpose_buffer(static_cast<std::size_t>(n) * std::max(k, 1));
    transpose(b, ldb, n, k, bt.data());
    gemm(op_a, m, n, k, alpha, a, lda, bt.data(), n, beta, c, ldc);
    return;
  }
  if (ldb % 1024 == 0 && k > 16) {
    // B rows 4 KiB (or a multiple) apart all fall into the same L1 sets: the microkernel's
    // walk down k rows then missed L1 on every row. A dense copy is cheaper than those misses.
    std::vector<float>& dense = transpose_buffer(static_cast<std::size_t>(k) * (n + 16));
    copy_rows(b, ldb, k, n, dense.data(), n + 16);
    gemm(op_a, m, n, k, alpha, a, lda, dense.data(), n + 16, beta, c, ldc);
    return;
  }
  gemm(op_a, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace flashcpp::detail::cpu
