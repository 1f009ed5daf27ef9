// The bf16 backward's pair step on AMX. Scores are held transposed, S^T[key][row], so that the
// softmax gradient runs with 16 query rows in the lanes (their lse and D are vectors) and P^T,
// dS^T come out row-major, which is what tile A wants for dV += P^T dO and dK += dS^T Q.
//   - S^T = K Q^T and dP^T = V dO^T: A = K, V rows read in place (a short last block from
//     zero-padded copies; copying every block was 10% slower), B = Q^T, dO^T packed once per
//     query block; both products are exact in bf16 with fp32 sums.
//   - P and dS are fp32; each enters its products as two bf16 parts, high and low (as the AMX
//     forward does with P): one rounding to bf16, as GPU kernels do, loses 2^-9 of P and dS,
//     far outside the fp32-accumulation bounds of the tests; with both parts the error is
//     about 2^-17.
//   - dQ += dS K wants dS row-major: dS^T is transposed 16 x 16 in fp32 before its split.
// A pair the mask hides contributes exactly nothing: P and dS are 0 there, and where the mask
// cuts the block and the other operand (dO, Q or K) holds NaN or Inf, that product runs as
// plain loops over the visible pairs instead (0 * NaN would be NaN).
#include "cpu/amx_backward.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/half.hpp"
#include "cpu/amx_forward.hpp"
#include "cpu/amx_tiles.hpp"
#include "cpu/exp2_avx512.hpp"

namespace flashcpp::detail::cpu {
namespace {

constexpr int kRows = AmxBackwardBlocks::kRows;
constexpr int kKeys = AmxBackwardBlocks::kKeys;
constexpr std::int64_t kPair = std::int64_t{kRows} * kKeys;  // elements of one score block
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma,amx-tile,amx-bf16")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// C[m][n] = (or +=) sum over `parts` of A_part[m][k] B[k][n], m, n, k multiples of 32. A: bf16
// rows `lda` elements apart, part t at a + t * a_part; B: tile-B layout of pack_b /
// pack_transposed_b (chunks of 16 columns, 16 * k elements each); C: fp32 rows, ldc apart.
// 2 x 2 tiles of C at a time; B's tiles are loaded once for all parts.
void tile_product(int m, int n, int k, const std::uint16_t* a, std::int64_t lda, int parts,
                  std::int64_t a_part, const std::uint16_t* b, float* c, int ldc, bool accumulate) {
  const std::int64_t a_bytes = lda * 2, c_bytes = ldc * 4;
  for (int i = 0; i < m; i += 32) {
    for (int j = 0; j < n; j += 32) {
      float* c0 = c + static_cast<std::int64_t>(i) * ldc + j;
      float* c1 = c0 + 16 * static_cast<std::int64_t>(ldc);
      if (accumulate) {
        _tile_loadd(0, c0, c_bytes);
        _tile_loadd(1, c0 + 16, c_bytes);
        _tile_loadd(2, c1, c_bytes);
        _tile_loadd(3, c1 + 16, c_bytes);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      const std::uint16_t* b0 = b + static_cast<std::int64_t>(j) * k;
      const std::uint16_t* b1 = b0 + 16 * static_cast<std::int64_t>(k);
      for (int p = 0; p < k; p += 32) {
        _tile_loadd(6, b0 + p * 16, 64);
        _tile_loadd(7, b1 + p * 16, 64);
        for (int t = 0; t < parts; ++t) {
          const std::uint16_t* a0 = a + t * a_part + i * lda + p;
          _tile_loadd(4, a0, a_bytes);
          _tile_loadd(5, a0 + 16 * lda, a_bytes);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, c0, c_bytes);
      _tile_stored(1, c0 + 16, c_bytes);
      _tile_stored(2, c1, c_bytes);
      _tile_stored(3, c1 + 16, c_bytes);
    }
  }
}

// x0, x1 (32 floats) as bf16 high parts and the bf16 rounding of the rest: high + low is x
// to about 2^-17.
inline void split_bf16(__m512 x0, __m512 x1, std::uint16_t* high, std::uint16_t* low) {
  const __m512i h = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(x1, x0));
  const __m512 h0 = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
  const __m512 h1 = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
  const __m512i l = reinterpret_cast<__m512i>(
      _mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, h1), _mm512_sub_ps(x0, h0)));
  _mm512_storeu_si512(high, h);
  _mm512_storeu_si512(low, l);
}

// dS [kRows][kKeys] as bf16 parts from dS^T [kKeys][kRows] fp32: 16 x 16 transposes.
void transpose_split(const float* dst, std::uint16_t* high, std::uint16_t* low) {
  for (int i0 = 0; i0 < kRows; i0 += 16) {
    for (int j0 = 0; j0 < kKeys; j0 += 32) {
      __m512i a[16], b[16];
      for (int t = 0; t < 16; ++t) {
        a[t] = _mm512_castps_si512(_mm512_loadu_ps(dst + (j0 + t) * kRows + i0));
        b[t] = _mm512_castps_si512(_mm512_loadu_ps(dst + (j0 + 16 + t) * kRows + i0));
      }
      transpose_16x16(a);
      transpose_16x16(b);
      for (int t = 0; t < 16; ++t) {
        const std::int64_t at = static_cast<std::int64_t>(i0 + t) * kKeys + j0;
        split_bf16(_mm512_castsi512_ps(a[t]), _mm512_castsi512_ps(b[t]), high + at, low + at);
      }
    }
  }
}

// From S^T and dP^T (fp32, [kKeys][kRows]): P^T and dS^T (times scale) as bf16 parts, and
// dS^T in fp32 in place of dP^T. 32 query rows per step, 16 in each vector.
void softmax_gradient(const float* st, float* dpt, const float* lse, const float* delta,
                      const std::int32_t* seen_begin, const std::int32_t* seen_end, float alpha,
                      float scale, std::uint16_t* pt_parts, std::uint16_t* dst_parts) {
  const __m512 va = _mm512_set1_ps(alpha), vs = _mm512_set1_ps(scale);
  for (int i0 = 0; i0 < kRows; i0 += 32) {
    __m512 l[2], dl[2];
    __m512i begin[2], end[2];
    for (int h = 0; h < 2; ++h) {
      l[h] = _mm512_loadu_ps(lse + i0 + 16 * h);
      dl[h] = _mm512_loadu_ps(delta + i0 + 16 * h);
      begin[h] = _mm512_loadu_si512(seen_begin + i0 + 16 * h);
      end[h] = _mm512_loadu_si512(seen_end + i0 + 16 * h);
    }
    for (int j = 0; j < kKeys; ++j) {
      const __m512i key = _mm512_set1_epi32(j);
      __m512 p[2], ds[2];
      for (int h = 0; h < 2; ++h) {
        const __mmask16 seen =
            _mm512_cmple_epi32_mask(begin[h], key) & _mm512_cmplt_epi32_mask(key, end[h]);
        const std::int64_t at = j * kRows + i0 + 16 * h;
        const __m512 x = exp2_lanes(_mm512_fmsub_ps(_mm512_loadu_ps(st + at), va, l[h]));
        const __m512 g = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_sub_ps(_mm512_loadu_ps(dpt + at), dl[h])), vs);
        p[h] = _mm512_maskz_mov_ps(seen, x);
        ds[h] = _mm512_maskz_mov_ps(seen, g);
        _mm512_storeu_ps(dpt + at, ds[h]);
      }
      const std::int64_t at = j * kRows + i0;
      split_bf16(p[0], p[1], pt_parts + at, pt_parts + kPair + at);
      split_bf16(ds[0], ds[1], dst_parts + at, dst_parts + kPair + at);
    }
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

bool amx_backward_usable(const BackwardParams& p) {
  return amx_forward_usable(p) && !(p.softcap > 0);
}

AmxBackwardBlocks::AmxBackwardBlocks(int head_dim, int head_dim_v, std::int64_t cached_keys)
    : d_(head_dim),
      dv_(head_dim_v),
      q_(static_cast<std::size_t>(kRows) * head_dim),
      dout_(static_cast<std::size_t>(kRows) * head_dim_v),
      q_t_(q_.size()),
      dout_t_(dout_.size()),
      q_b_(q_.size()),
      dout_b_(dout_.size()),
      k_(static_cast<std::size_t>(kKeys) * head_dim),
      v_(static_cast<std::size_t>(kKeys) * head_dim_v),
      k_b_(k_.size()),
      k_cache_(static_cast<std::size_t>((cached_keys + kKeys - 1) / kKeys * kKeys) * head_dim),
      k_cache_finite_(static_cast<std::size_t>((cached_keys + kKeys - 1) / kKeys)),
      lse_(kRows),
      delta_(kRows),
      seen_begin_(kRows),
      seen_end_(kRows),
      st_(kPair),
      dst_(kPair),
      pt_parts_(2 * kPair),
      dst_parts_(2 * kPair),
      ds_parts_(2 * kPair) {}

void AmxBackwardBlocks::load_queries(const BackwardParams& p, const Sequence& seq, int head,
                                     std::int64_t r0, int rows, const float* lse_log2,
                                     const float* delta) {
  r0_ = r0;
  rows_ = rows;
  const auto* q = static_cast<const std::uint16_t*>(p.q);
  const auto* dout = static_cast<const std::uint16_t*>(p.dout);
  copy_rows(q + q_offset(p.q_stride, seq, r0, head), p.q_stride.row, rows, d_, kRows, q_.data());
  copy_rows(dout + q_offset(p.dout_stride, seq, r0, head), p.dout_stride.row, rows, dv_, kRows,
            dout_.data());
  pack_transposed_b(q_.data(), d_, kRows, d_, q_t_.data());
  pack_transposed_b(dout_.data(), dv_, kRows, dv_, dout_t_.data());
  q_finite_ = pack_b(q_.data(), d_, kRows, d_, kRows, q_b_.data());
  dout_finite_ = pack_b(dout_.data(), dv_, kRows, dv_, kRows, dout_b_.data());
  for (int i = 0; i < kRows; ++i) {
    lse_[i] = i < rows ? lse_log2[i] : kMinusInf;
    delta_[i] = i < rows ? delta[i] : 0.0f;
  }
}

void AmxBackwardBlocks::cache_keys(const BackwardParams& p, const Sequence& seq, int kv_head) {
  cached_ = false;
  for (std::int64_t c0 = 0; c0 < seq.nk; c0 += kKeys) {
    const int cols = static_cast<int>(std::min<std::int64_t>(kKeys, seq.nk - c0));
    load_keys(p, seq, kv_head, c0, cols);
    std::memcpy(k_cache_.data() + c0 * d_, k_b_.data(), sizeof(std::uint16_t) * kKeys * d_);
    k_cache_finite_[c0 / kKeys] = k_finite_;
  }
  cached_ = true;
}

void AmxBackwardBlocks::load_keys(const BackwardParams& p, const Sequence& seq, int kv_head,
                                  std::int64_t c0, int cols) {
  c0_ = c0;
  cols_ = cols;
  const auto* k = static_cast<const std::uint16_t*>(p.k) + k_offset(p.k_stride, seq, c0, kv_head);
  const auto* v = static_cast<const std::uint16_t*>(p.v) + k_offset(p.v_stride, seq, c0, kv_head);
  if (cols == kKeys) {  // tiles read whole blocks in place
    k_rows_ = k;
    v_rows_ = v;
    ldk_ = p.k_stride.row;
    ldv_ = p.v_stride.row;
  } else {  // a short block: zero-padded copies
    copy_rows(k, p.k_stride.row, cols, d_, kKeys, k_.data());
    copy_rows(v, p.v_stride.row, cols, dv_, kKeys, v_.data());
    k_rows_ = k_.data();
    v_rows_ = v_.data();
    ldk_ = d_;
    ldv_ = dv_;
  }
  if (cached_) {
    k_b_block_ = k_cache_.data() + c0 * d_;
    k_finite_ = k_cache_finite_[c0 / kKeys] != 0;
    return;
  }
  k_finite_ = pack_b(k_rows_, ldk_, kKeys, d_, kKeys, k_b_.data());
  k_b_block_ = k_b_.data();
}

void AmxBackwardBlocks::gradients(const BlockMask& mask, float alpha, float scale) {
  full_ = mask.is_full(r0_, r0_ + rows_, c0_, c0_ + cols_);
  for (int i = 0; i < kRows; ++i) {
    // Rows past the block, and rows that see no key at all (lse -inf), see nothing here.
    std::int64_t begin = 0, end = 0;
    if (i < rows_ && lse_[i] != kMinusInf) {
      const KeyRange keys = mask.keys(r0_ + i);
      begin = std::clamp<std::int64_t>(keys.begin - c0_, 0, cols_);
      end = std::clamp<std::int64_t>(keys.end - c0_, 0, cols_);
    }
    seen_begin_[i] = static_cast<std::int32_t>(begin);
    seen_end_[i] = static_cast<std::int32_t>(end);
  }
  tile_product(kKeys, kRows, d_, k_rows_, ldk_, 1, 0, q_t_.data(), st_.data(), kRows, false);
  tile_product(kKeys, kRows, dv_, v_rows_, ldv_, 1, 0, dout_t_.data(), dst_.data(), kRows,
               false);
  softmax_gradient(st_.data(), dst_.data(), lse_.data(), delta_.data(), seen_begin_.data(),
                   seen_end_.data(), alpha, scale, pt_parts_.data(), dst_parts_.data());
  transpose_split(dst_.data(), ds_parts_.data(), ds_parts_.data() + kPair);
}

namespace {

// The fp32 value of element `at` of a matrix held as bf16 high and low parts.
float part_sum(const std::uint16_t* parts, std::int64_t at) {
  return bf16_to_float(parts[at]) + bf16_to_float(parts[kPair + at]);
}

// c[j] += sum over the rows i that see key j of a[j][i] * b[i] (a: [kKeys][kRows] as parts,
// b: bf16 rows of n): the products of a cut block whose b holds NaN or Inf.
void visible_by_key(const std::uint16_t* a, const std::uint16_t* b, int n,
                    const std::int32_t* begin, const std::int32_t* end, int rows, int cols,
                    float* c) {
  for (int j = 0; j < cols; ++j) {
    float* c_row = c + static_cast<std::int64_t>(j) * n;
    for (int i = 0; i < rows; ++i) {
      if (j < begin[i] || j >= end[i]) continue;
      const float x = part_sum(a, j * kRows + i);
      const std::uint16_t* b_row = b + static_cast<std::int64_t>(i) * n;
      for (int e = 0; e < n; ++e) c_row[e] += x * bf16_to_float(b_row[e]);
    }
  }
}

}  // namespace

void AmxBackwardBlocks::add_dv_dk(float* dv, float* dk) {
  if (full_ || dout_finite_)
    tile_product(kKeys, dv_, kRows, pt_parts_.data(), kRows, 2, kPair, dout_b_.data(), dv, dv_,
                 true);
  else
    visible_by_key(pt_parts_.data(), dout_.data(), dv_, seen_begin_.data(), seen_end_.data(), rows_,
                   cols_, dv);
  if (full_ || q_finite_)
    tile_product(kKeys, d_, kRows, dst_parts_.data(), kRows, 2, kPair, q_b_.data(), dk, d_, true);
  else
    visible_by_key(dst_parts_.data(), q_.data(), d_, seen_begin_.data(), seen_end_.data(), rows_, cols_,
                   dk);
}

void AmxBackwardBlocks::add_dq(float* dq) {
  if (full_ || k_finite_) {
    tile_product(kRows, d_, kKeys, ds_parts_.data(), kKeys, 2, kPair, k_b_block_, dq, d_, true);
    return;
  }
  for (int i = 0; i < rows_; ++i) {  // the cut block's visible pairs, K holding NaN or Inf
    float* dq_row = dq + static_cast<std::int64_t>(i) * d_;
    for (int j = seen_begin_[i]; j < seen_end_[i]; ++j) {
      const float x = part_sum(ds_parts_.data(), static_cast<std::int64_t>(i) * kKeys + j);
      const std::uint16_t* k_row = k_rows_ + j * ldk_;
      for (int e = 0; e < d_; ++e) dq_row[e] += x * bf16_to_float(k_row[e]);
    }
  }
}

}  // namespace flashcpp::detail::cpu
