#pragma once
// AMX tile helpers shared by the bf16 forward (amx_forward.cpp) and backward
// (amx_backward.cpp): the run-time check, the per-thread tile configuration, and packing of
// bf16 rows into tile B's pair-interleaved (VNNI) layout. Every tile is 16 rows x 64 bytes.
#include <immintrin.h>

#include <cstdint>

namespace flashcpp::detail::cpu {

// AMX-TILE, AMX-BF16 and AVX512-BF16 in CPUID, and Linux's permission for this process to
// use the tile data state (asked for once per process).
bool amx_present();

// Loads the tile configuration on the calling thread (it is per thread) and releases the tile
// state when it goes out of scope: one per thread of an OpenMP region that uses tiles.
class TileScope {
 public:
  TileScope();
  ~TileScope();
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// Rows [0, rows) of x (bf16, row stride ldx elements, `dim` a multiple of 32) as tile B of
// a product with X^T (B[d][r] = x[r][d]): for each 16 rows, [dim / 2][16] 32-bit words (a
// 16 x 16 transpose of the rows' words). Rows past `rows` up to the next 16 are 0.
void pack_transposed_b(const std::uint16_t* x, std::int64_t ldx, int rows, int dim,
                       std::uint16_t* out);

// Rows [0, rows) of one head into dense rows of `dim` elements, zero past `rows` up to `padded`.
void copy_rows(const std::uint16_t* x, std::int64_t ldx, int rows, int dim, int padded,
               std::uint16_t* out);

// Rows [0, rows) of x as tile B of a product with X (B[r][c] = x[r][c]): for each 16 columns,
// [padded_rows / 2][16] pairs (x[2q][c], x[2q + 1][c]); rows from `rows` to `padded_rows`
// (even) are 0. Returns whether every element of the rows is finite.
bool pack_b(const std::uint16_t* x, std::int64_t ldx, int rows, int dim, int padded_rows,
            std::uint16_t* out);

// Rows [0, rows) of x as tile A of a product with X^T on the left (A[c][r] = x[r][c]): out
// is X^T, `dim` (a multiple of 32) rows of `ldo` bf16 (columns r of x; those from `rows` to
// `padded_rows`, a multiple of 32, are 0). Returns whether every element of the rows is finite.
bool pack_transposed_a(const std::uint16_t* x, std::int64_t ldx, int rows, int dim,
                       int padded_rows, std::uint16_t* out, std::int64_t ldo);

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// Transposes 16 rows of 16 32-bit words in place: r[i] word j -> r[j] word i.
inline void transpose_16x16(__m512i r[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // b[4g + c], lane L: column 4L + c of rows 4g .. 4g + 3.
  for (int g = 0; g < 4; ++g) {
    b[4 * g + 0] = _mm512_unpacklo_epi64(a[4 * g], a[4 * g + 2]);
    b[4 * g + 1] = _mm512_unpackhi_epi64(a[4 * g], a[4 * g + 2]);
    b[4 * g + 2] = _mm512_unpacklo_epi64(a[4 * g + 1], a[4 * g + 3]);
    b[4 * g + 3] = _mm512_unpackhi_epi64(a[4 * g + 1], a[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i s0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44);
    const __m512i s1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xee);
    const __m512i s2 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44);
    const __m512i s3 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace flashcpp::detail::cpu
