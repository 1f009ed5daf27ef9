#include "cpu/amx_tiles.hpp"

#include <cstring>

#include <sys/syscall.h>
#include <unistd.h>

#include <cpuid.h>

namespace flashcpp::detail::cpu {
namespace {

struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

}  // namespace

void copy_rows(const std::uint16_t* x, std::int64_t ldx, int rows, int dim, int padded,
               std::uint16_t* out) {
  for (int r = 0; r < padded; ++r) {
    std::uint16_t* dst = out + static_cast<std::int64_t>(r) * dim;
    if (r < rows)
      std::memcpy(dst, x + r * ldx, sizeof(std::uint16_t) * dim);
    else
      std::memset(dst, 0, sizeof(std::uint16_t) * dim);
  }
}

bool amx_present() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u;
  if (!tile || !bf16) return false;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !((a >> 5) & 1u)) return false;  // AVX512_BF16
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,amx-tile,amx-bf16")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {

void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  // GCC 12 treats ldtilecfg as reading only the first bytes and drops the stores above
  // without this barrier.
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

void release_tiles() { _tile_release(); }

}  // namespace

void pack_transposed_b(const std::uint16_t* x, std::int64_t ldx, int rows, int dim,
                       std::uint16_t* out) {
  for (int r0 = 0; r0 < rows; r0 += 16) {
    std::uint32_t* chunk = reinterpret_cast<std::uint32_t*>(out) + std::int64_t{r0} * (dim / 2);
    for (int w0 = 0; w0 < dim / 2; w0 += 16) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j)
        r[j] = r0 + j < rows ? _mm512_loadu_si512(x + (r0 + j) * ldx + 2 * w0)
                             : _mm512_setzero_si512();
      transpose_16x16(r);
      for (int w = 0; w < 16; ++w) _mm512_storeu_si512(chunk + (w0 + w) * 16, r[w]);
    }
  }
}

bool pack_b(const std::uint16_t* x, std::int64_t ldx, int rows, int dim, int padded_rows,
            std::uint16_t* out) {
  const __m512i interleave = _mm512_set_epi16(
      47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4,
      35, 3, 34, 2, 33, 1, 32, 0);
  const __m256i exponent = _mm256_set1_epi16(0x7f80);
  __mmask16 bad = 0;
  for (int q = 0; q < padded_rows / 2; ++q) {
    for (int c = 0; c < dim; c += 16) {
      const __m256i a = 2 * q < rows ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                           x + 2 * q * ldx + c))
                                     : _mm256_setzero_si256();
      const __m256i b = 2 * q + 1 < rows ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                               x + (2 * q + 1) * ldx + c))
                                         : _mm256_setzero_si256();
      bad |= _mm256_cmpeq_epi16_mask(_mm256_and_si256(a, exponent), exponent);
      bad |= _mm256_cmpeq_epi16_mask(_mm256_and_si256(b, exponent), exponent);
      const __m512i pairs = _mm512_permutex2var_epi16(_mm512_castsi256_si512(a), interleave,
                                                      _mm512_castsi256_si512(b));
      _mm512_storeu_si512(out + (std::int64_t{c} * (padded_rows / 2) + q * 16) * 2, pairs);
    }
  }
  return bad == 0;
}

bool pack_transposed_a(const std::uint16_t* x, std::int64_t ldx, int rows, int dim,
                       int padded_rows, std::uint16_t* out, std::int64_t ldo) {
  const __m512i interleave_low = _mm512_set_epi16(
      47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4,
      35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i interleave_high = _mm512_add_epi16(interleave_low, _mm512_set1_epi16(16));
  const __m512i exponent = _mm512_set1_epi16(0x7f80);
  __mmask32 bad = 0;
  // Each 64-byte piece of a row is read once, whole: rows of an input tensor are often a
  // multiple of 2 KiB apart and share a few L1 sets, so a piece read half at a time (one pass
  // per 16 columns) came from L2 twice (the packing took ~10% of the forward at D 128).
  for (int r0 = 0; r0 < padded_rows; r0 += 32) {
    for (int c0 = 0; c0 < dim; c0 += 32) {
      // low[t] / high[t]: the 32-bit pairs (x[r0 + 2t][c], x[r0 + 2t + 1][c]) for the columns
      // c0 .. c0 + 15 / c0 + 16 .. c0 + 31.
      __m512i low[16], high[16];
      for (int t = 0; t < 16; ++t) {
        const int r = r0 + 2 * t;
        const __m512i a = r < rows ? _mm512_loadu_si512(x + r * ldx + c0) : _mm512_setzero_si512();
        const __m512i b =
            r + 1 < rows ? _mm512_loadu_si512(x + (r + 1) * ldx + c0) : _mm512_setzero_si512();
        bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(a, exponent), exponent);
        bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(b, exponent), exponent);
        low[t] = _mm512_permutex2var_epi16(a, interleave_low, b);
        high[t] = _mm512_permutex2var_epi16(a, interleave_high, b);
      }
      transpose_16x16(low);  // low[c]: rows r0 .. r0 + 31 of column c0 + c
      for (int c = 0; c < 16; ++c) _mm512_storeu_si512(out + (c0 + c) * ldo + r0, low[c]);
      transpose_16x16(high);
      for (int c = 0; c < 16; ++c) _mm512_storeu_si512(out + (c0 + 16 + c) * ldo + r0, high[c]);
    }
  }
  return bad == 0;
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

TileScope::TileScope() { configure_tiles(); }
TileScope::~TileScope() { release_tiles(); }

}  // namespace flashcpp::detail::cpu
