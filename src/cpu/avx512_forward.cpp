// The tiled forward on AVX-512, without a BLAS: each task takes 512, 256 or 128 query rows of
// one (batch, head) as strips of 32, and streams over key blocks of 128. Scores are held
// transposed, S^T[key][row], so that a strip's 32 rows are the lanes of two registers:
//   - S^T = K Q^T: K elements are broadcast from the key block, copied (converted from
//     fp16/bf16) once per task into dense fp32 rows; Q^T is packed once per task;
//   - the online softmax is then lane-wise (max, exp2 and sum run down the keys, no
//     horizontal reductions) and works on a 16 KiB strip while it is in L1;
//   - O += P V broadcasts P^T elements against the V rows of the block, copied the same way.
// No input-sized copies: the extra memory is per thread, about
// 4 * ((512 + 128) * (D + Dv) + 128 * 32) bytes (Q^T and O rows of a task, a key block of K
// and V, one strip of scores: 0.64 MiB at D = Dv = 128).
// docs/design/cpu_kernels.md has the measurements behind the shapes.
#include "cpu/avx512_forward.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu/block_mask.hpp"
#include "cpu/element_io.hpp"
#include "cpu/exp2_avx512.hpp"
#include "cpu/forward_tasks.hpp"
#include "cpu/reference_max_avx512.hpp"
#include "cpu/scores.hpp"
#include "cpu/sequence.hpp"
#include "cpu/load_avx512.hpp"
#include "cpu/store_avx512.hpp"

namespace flashcpp::detail::cpu {
namespace {

constexpr int kStrip = 32;          // query rows per strip: the lanes of two zmm registers
constexpr int kTaskRows = kForwardTaskRows;  // rows per task at most (forward_tasks.hpp)
constexpr int kBlockKeys = 128;     // keys per block
constexpr int kQkKeys = 6;          // keys per S^T microkernel call: 6 x 2 x 2 accumulators
constexpr int kPvRows = 8;          // rows per P V microkernel call: 8 x 3 accumulators
constexpr int kPvRegs = 3;

// Per-thread buffers, allocated outside the AVX-512 code (so no standard-library template is
// instantiated with AVX-512 enabled and shared with callers built for the baseline ISA).
struct Workspace {
  Workspace(int d, int dv)
      : q_t(static_cast<std::size_t>(kTaskRows) * d),
        k(static_cast<std::size_t>(kBlockKeys) * d),
        v(static_cast<std::size_t>(kBlockKeys) * dv),
        s(static_cast<std::size_t>(kBlockKeys) * kStrip),
        o(static_cast<std::size_t>(kTaskRows) * dv),
        m(kTaskRows),
        l(kTaskRows),
        row(static_cast<std::size_t>(std::max(d, dv))) {}
  std::vector<float> q_t;  // per strip [D][32]: Q^T
  std::vector<float> k;    // [keys][D]: the key block as fp32 (fp16/bf16 inputs)
  std::vector<float> v;    // [keys][Dv]
  std::vector<float> s;    // [keys][32]: S^T of one strip, then P^T
  std::vector<float> o;    // per strip [32][Dv]: unnormalised output rows
  std::vector<float> m;    // running row max (log2 domain)
  std::vector<float> l;    // running row sum
  std::vector<float> row;  // one converted row
};

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,fma")
// GCC 12 reports its own masked-load intrinsics as maybe-uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Mask of the first n (< 16) lanes.
inline __mmask16 first_lanes(int n) { return static_cast<__mmask16>((1u << n) - 1u); }

// S^T rows for kKeys keys: s[j][0..32) = sum_d k[j][d] * q_t[d][0..32). Even and odd d go to
// separate accumulators, summed at the end: two chains of D / 2 round less than one of D (the
// fp32 gradient tests of tests/python/test_torch.py need that margin).
template <int kKeys>
void scores_microkernel(const float* k, std::int64_t ldk, const float* q_t, int dim, float* s) {
  __m512 acc[2][kKeys][2];
#pragma GCC unroll 16
  for (int j = 0; j < kKeys; ++j)
    acc[0][j][0] = acc[0][j][1] = acc[1][j][0] = acc[1][j][1] = _mm512_setzero_ps();
  int d = 0;
  for (; d + 2 <= dim; d += 2) {
#pragma GCC unroll 2
    for (int e = 0; e < 2; ++e) {
      const __m512 q0 = _mm512_loadu_ps(q_t + (d + e) * kStrip);
      const __m512 q1 = _mm512_loadu_ps(q_t + (d + e) * kStrip + 16);
#pragma GCC unroll 16
      for (int j = 0; j < kKeys; ++j) {
        const __m512 kj = _mm512_set1_ps(k[j * ldk + d + e]);
        acc[e][j][0] = _mm512_fmadd_ps(kj, q0, acc[e][j][0]);
        acc[e][j][1] = _mm512_fmadd_ps(kj, q1, acc[e][j][1]);
      }
    }
  }
  if (d < dim) {  // D is a multiple of 8, so this never runs; kept for any D
    const __m512 q0 = _mm512_loadu_ps(q_t + d * kStrip);
    const __m512 q1 = _mm512_loadu_ps(q_t + d * kStrip + 16);
#pragma GCC unroll 16
    for (int j = 0; j < kKeys; ++j) {
      const __m512 kj = _mm512_set1_ps(k[j * ldk + d]);
      acc[0][j][0] = _mm512_fmadd_ps(kj, q0, acc[0][j][0]);
      acc[0][j][1] = _mm512_fmadd_ps(kj, q1, acc[0][j][1]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < kKeys; ++j) {
    _mm512_storeu_ps(s + j * kStrip, _mm512_add_ps(acc[0][j][0], acc[1][j][0]));
    _mm512_storeu_ps(s + j * kStrip + 16, _mm512_add_ps(acc[0][j][1], acc[1][j][1]));
  }
}

template <int... kKeys>
void scores_tail(int keys, const float* k, std::int64_t ldk, const float* q_t, int dim, float* s,
                 std::integer_sequence<int, kKeys...>) {
  ((keys == kKeys + 1 ? scores_microkernel<kKeys + 1>(k, ldk, q_t, dim, s) : void()), ...);
}

// S^T for `keys` keys starting at k.
void strip_scores(const float* k, std::int64_t ldk, const float* q_t, int dim, int keys,
                  float* s) {
  int j = 0;
  for (; j + kQkKeys <= keys; j += kQkKeys)
    scores_microkernel<kQkKeys>(k + j * ldk, ldk, q_t, dim, s + j * kStrip);
  if (j < keys)
    scores_tail(keys - j, k + j * ldk, ldk, q_t, dim, s + j * kStrip,
                std::make_integer_sequence<int, kQkKeys - 1>());
}

// o[r][0..16 * kRegs) += sum_j p_t[j][r] * v[j][..] for kRows rows; the last register takes
// the lanes of `last`.
template <int kRows, int kRegs>
void output_microkernel(const float* p_t, int keys, const float* v, std::int64_t ldv, float* o,
                        std::int64_t ldo, __mmask16 last) {
  __m512 acc[kRows][kRegs];
  #pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < kRegs; ++c)
      acc[r][c] = _mm512_maskz_loadu_ps(c == kRegs - 1 ? last : __mmask16(0xffff),
                                        o + r * ldo + 16 * c);
  for (int j = 0; j < keys; ++j) {
    __m512 vj[kRegs];
    #pragma GCC unroll 16
    for (int c = 0; c < kRegs; ++c)
      vj[c] = _mm512_maskz_loadu_ps(c == kRegs - 1 ? last : __mmask16(0xffff),
                                    v + j * ldv + 16 * c);
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const __m512 pj = _mm512_set1_ps(p_t[j * kStrip + r]);
      #pragma GCC unroll 16
      for (int c = 0; c < kRegs; ++c) acc[r][c] = _mm512_fmadd_ps(pj, vj[c], acc[r][c]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < kRegs; ++c)
      _mm512_mask_storeu_ps(o + r * ldo + 16 * c, c == kRegs - 1 ? last : __mmask16(0xffff),
                            acc[r][c]);
}

template <int kRows>
void output_rows(const float* p_t, int keys, const float* v, std::int64_t ldv, float* o, int dv) {
  for (int c0 = 0; c0 < dv; c0 += 16 * kPvRegs) {
    const int width = std::min(16 * kPvRegs, dv - c0);
    const int regs = (width + 15) / 16;
    const __mmask16 last = width % 16 == 0 ? __mmask16(0xffff) : first_lanes(width % 16);
    if (regs == 3)
      output_microkernel<kRows, 3>(p_t, keys, v + c0, ldv, o + c0, dv, last);
    else if (regs == 2)
      output_microkernel<kRows, 2>(p_t, keys, v + c0, ldv, o + c0, dv, last);
    else
      output_microkernel<kRows, 1>(p_t, keys, v + c0, ldv, o + c0, dv, last);
  }
}

template <int... kRows>
void output_tail(int rows, const float* p_t, int keys, const float* v, std::int64_t ldv, float* o,
                 int dv, std::integer_sequence<int, kRows...>) {
  ((rows == kRows + 1 ? output_rows<kRows + 1>(p_t, keys, v, ldv, o, dv) : void()), ...);
}

// O[0..rows) += P V over `keys` keys; p_t is [keys][32].
void strip_output(const float* p_t, int keys, const float* v, std::int64_t ldv, float* o, int dv,
                  int rows) {
  int r = 0;
  for (; r + kPvRows <= rows; r += kPvRows)
    output_rows<kPvRows>(p_t + r, keys, v, ldv, o + r * dv, dv);
  if (r < rows)
    output_tail(rows - r, p_t + r, keys, v, ldv, o + r * dv, dv,
                std::make_integer_sequence<int, kPvRows - 1>());
}

// The same product restricted to the keys each row sees: masked keys must add exactly
// nothing, not 0 * V (NaN when V holds NaN or Inf). Only for blocks the mask cuts through
// whose V rows are not all finite.
void strip_output_visible(const BlockMask& mask, std::int64_t row0, std::int64_t key0,
                          const float* p_t, int keys, const float* v, std::int64_t ldv, float* o,
                          int dv, int rows) {
  for (int r = 0; r < rows; ++r) {
    const KeyRange visible = mask.keys(row0 + r);
    const std::int64_t begin = std::max<std::int64_t>(visible.begin - key0, 0);
    const std::int64_t end = std::min<std::int64_t>(visible.end - key0, keys);
    float* o_row = o + r * dv;
    for (std::int64_t j = begin; j < end; ++j) {
      const float pj = p_t[j * kStrip + r];
      const float* v_row = v + j * ldv;
      for (int c = 0; c < dv; ++c) o_row[c] += pj * v_row[c];
    }
  }
}

bool rows_finite(const float* v, std::int64_t ldv, int keys, int dv) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  __mmask16 bad = 0;
  for (int j = 0; j < keys; ++j)
    for (int c = 0; c < dv; c += 16) {
      const __mmask16 lanes = dv - c >= 16 ? __mmask16(0xffff) : first_lanes(dv - c);
      const __m512i x = _mm512_maskz_loadu_epi32(lanes, v + j * ldv + c);
      bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(x, exponent), exponent);
    }
  return bad == 0;
}

// -inf where key key0 + j is hidden from row row0 + r (r < rows; lanes past rows hide all).
void mask_strip(const BlockMask& mask, std::int64_t row0, int rows, std::int64_t key0, int keys,
                float* s) {
  alignas(64) std::int32_t begin[kStrip], end[kStrip];
  for (int r = 0; r < kStrip; ++r) {
    if (r < rows) {
      const KeyRange visible = mask.keys(row0 + r);
      begin[r] = static_cast<std::int32_t>(std::clamp<std::int64_t>(visible.begin - key0, 0, keys));
      end[r] = static_cast<std::int32_t>(std::clamp<std::int64_t>(visible.end - key0, 0, keys));
    } else {
      begin[r] = end[r] = 0;
    }
  }
  const __m512 hidden = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int h = 0; h < 2; ++h) {
    const __m512i b = _mm512_load_si512(begin + 16 * h);
    const __m512i e = _mm512_load_si512(end + 16 * h);
    for (int j = 0; j < keys; ++j) {
      const __m512i jj = _mm512_set1_epi32(j);
      const __mmask16 seen =
          _mm512_cmple_epi32_mask(b, jj) & _mm512_cmplt_epi32_mask(jj, e);
      float* x = s + j * kStrip + 16 * h;
      _mm512_storeu_ps(x, _mm512_mask_blend_ps(seen, hidden, _mm512_loadu_ps(x)));
    }
  }
}

// Folds S^T (keys x 32) into the reference max m (reference_max_avx512.hpp) and sum l of the
// strip's rows, turns it into P^T relative to the new reference and rescales the output rows o
// where it moved. A row with nothing visible yet
// (max -inf) takes max 0 for the exponent, so its P is 0 rather than 2^(-inf + inf) = NaN.
// NaN scores are not dropped: they make P, l and so the row's out and lse NaN.
void strip_softmax(float* s, int keys, float alpha, float* m, float* l, float* o, int dv,
                   int rows) {
  alignas(64) float correction[kStrip];
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int h = 0; h < 2; ++h) {
    const __m512 factor = _mm512_set1_ps(alpha);
    const __m512 m_old = _mm512_loadu_ps(m + 16 * h);
    __m512 raw_max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int j = 0; j < keys; ++j)
      raw_max = _mm512_max_ps(_mm512_loadu_ps(s + j * kStrip + 16 * h), raw_max);
    const __m512 max = next_reference_max(m_old, _mm512_mul_ps(raw_max, factor));  // alpha > 0
    const __m512 base =
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask(max, minus_inf, _CMP_EQ_OQ), max,
                             _mm512_setzero_ps());
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    int j = 0;
    for (; j + 2 <= keys; j += 2) {
      float* x0 = s + j * kStrip + 16 * h;
      float* x1 = x0 + kStrip;
      const __m512 p0 = exp2_lanes(_mm512_fmsub_ps(_mm512_loadu_ps(x0), factor, base));
      const __m512 p1 = exp2_lanes(_mm512_fmsub_ps(_mm512_loadu_ps(x1), factor, base));
      _mm512_storeu_ps(x0, p0);
      _mm512_storeu_ps(x1, p1);
      sum0 = _mm512_add_ps(sum0, p0);
      sum1 = _mm512_add_ps(sum1, p1);
    }
    if (j < keys) {
      float* x0 = s + j * kStrip + 16 * h;
      const __m512 p0 = exp2_lanes(_mm512_fmsub_ps(_mm512_loadu_ps(x0), factor, base));
      _mm512_storeu_ps(x0, p0);
      sum0 = _mm512_add_ps(sum0, p0);
    }
    const __m512 scale = exp2_lanes(_mm512_sub_ps(m_old, base));  // 0 on the first visible block
    _mm512_storeu_ps(l + 16 * h, _mm512_fmadd_ps(_mm512_loadu_ps(l + 16 * h), scale,
                                                 _mm512_add_ps(sum0, sum1)));
    _mm512_storeu_ps(m + 16 * h, max);
    _mm512_store_ps(correction + 16 * h, scale);
  }
  for (int r = 0; r < rows; ++r) {
    if (correction[r] == 1.0f) continue;
    const __m512 factor = _mm512_set1_ps(correction[r]);
    float* o_row = o + r * dv;
    for (int c = 0; c < dv; c += 16) {
      const __mmask16 lanes = dv - c >= 16 ? __mmask16(0xffff) : first_lanes(dv - c);
      _mm512_mask_storeu_ps(o_row + c, lanes,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, o_row + c), factor));
    }
  }
}

// One task: query rows [r0, r0 + rows) of `head` in sequence `seq`.
void forward_task(const ForwardParams& p, const Sequence& seq, int head, std::int64_t r0,
                  int rows, Workspace& w) {
  const int kv_head = head / (p.heads_q / p.heads_kv);
  const int d = p.head_dim;
  const int dv = p.head_dim_v;
  const int strips = (rows + kStrip - 1) / kStrip;
  const BlockMask mask(seq.nq, seq.nk, p.window_left, p.window_right);
  const ScoreTransform transform = score_transform(p);

  // Q^T per strip; rows past the task are 0. The scale is applied to the finished scores (in
  // the softmax's fused multiply-subtract): scaling Q first cost the fp32 backward test
  // (test_torch.py, dV through the lse) its margin.
  for (int s = 0; s < strips; ++s) {
    float* q_t = w.q_t.data() + static_cast<std::int64_t>(s) * d * kStrip;
    for (int r = 0; r < kStrip; ++r) {
      const std::int64_t row = r0 + s * kStrip + r;
      if (row < r0 + rows)
        load_scaled_row(p.q, p.dtype, q_offset(p.q_stride, seq, row, head), d, 1.0f,
                        w.row.data());
      else
        std::memset(w.row.data(), 0, sizeof(float) * d);
      for (int c = 0; c < d; ++c) q_t[c * kStrip + r] = w.row[c];
    }
  }
  std::fill_n(w.m.data(), strips * kStrip, -std::numeric_limits<float>::infinity());
  std::fill_n(w.l.data(), strips * kStrip, 0.0f);
  std::fill_n(w.o.data(), static_cast<std::int64_t>(strips) * kStrip * dv, 0.0f);

  const KeyRange span = mask.keys_of_rows(r0, r0 + rows);
  for (std::int64_t c0 = span.begin; c0 < span.end; c0 += kBlockKeys) {
    const int cols = static_cast<int>(std::min<std::int64_t>(kBlockKeys, span.end - c0));
    // The key block as dense fp32 rows, also for fp32 inputs: read in place, rows H * D
    // apart (4 KiB at H 8, D 128) shared L1 sets and pages, and at N 8192 (1 thread) the
    // forward ran 95 GFLOP/s against 114 with the copy (N 1024: 105 against 107).
    for (int j = 0; j < cols; ++j) {
      load_scaled_row(p.k, p.dtype, k_offset(p.k_stride, seq, c0 + j, kv_head), d, 1.0f,
                      w.k.data() + static_cast<std::int64_t>(j) * d);
      load_scaled_row(p.v, p.dtype, k_offset(p.v_stride, seq, c0 + j, kv_head), dv, 1.0f,
                      w.v.data() + static_cast<std::int64_t>(j) * dv);
    }
    const float* k = w.k.data();
    const float* v = w.v.data();
    const std::int64_t ldk = d, ldv = dv;
    int v_finite = -1;  // whether V rows of the block are all finite; -1: not looked at yet

    for (int s = 0; s < strips; ++s) {
      const std::int64_t row0 = r0 + s * kStrip;
      const int strip_rows = static_cast<int>(std::min<std::int64_t>(kStrip, r0 + rows - row0));
      // The keys of this block some row of the strip sees.
      const KeyRange seen = mask.keys_of_rows(row0, row0 + strip_rows);
      const std::int64_t lo = std::max(seen.begin, c0);
      const std::int64_t hi = std::min(seen.end, c0 + cols);
      if (lo >= hi) continue;
      const int keys = static_cast<int>(hi - lo);
      const float* q_t = w.q_t.data() + static_cast<std::int64_t>(s) * d * kStrip;
      float* o = w.o.data() + static_cast<std::int64_t>(s) * kStrip * dv;
      float* sc = w.s.data();
      strip_scores(k + (lo - c0) * ldk, ldk, q_t, d, keys, sc);
      if (transform.softcap_log2 > 0) {
        for (int e = 0; e < keys * kStrip; ++e)
          sc[e] = transform.softcap_log2 * std::tanh(sc[e] * transform.alpha);
      }
      const bool full = mask.is_full(row0, row0 + strip_rows, lo, hi);
      if (!full) mask_strip(mask, row0, strip_rows, lo, keys, sc);
      strip_softmax(sc, keys, transform.softcap_log2 > 0 ? 1.0f : transform.alpha,
                    w.m.data() + s * kStrip, w.l.data() + s * kStrip, o, dv,
                    strip_rows);
      const float* v_lo = v + (lo - c0) * ldv;
      if (!full && v_finite < 0) v_finite = rows_finite(v, ldv, cols, dv) ? 1 : 0;
      if (full || v_finite == 1)
        strip_output(sc, keys, v_lo, ldv, o, dv, strip_rows);
      else
        strip_output_visible(mask, row0, lo, sc, keys, v_lo, ldv, o, dv, strip_rows);
    }
  }

  store_finished_rows(p, seq, head, r0, rows, w.o.data(), w.m.data(), w.l.data());
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

bool avx512_forward_usable() {
  static const bool usable = [] {
    const char* choice = std::getenv("FLASHCPP_CPU_KERNEL");
    if (choice && std::string_view(choice) == "generic") return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  return usable;
}

void avx512_forward(const ForwardParams& p) {
  const int task_rows = forward_task_rows(p);
  const std::int64_t blocks_per_head = (std::int64_t{p.seqlen_q} + task_rows - 1) / task_rows;
  const std::int64_t tasks = std::int64_t{p.batch} * p.heads_q * blocks_per_head;
  // Tasks are (batch, head, row block), row block fastest so neighbouring tasks share K/V in
  // cache; each task writes only its own rows, so the result does not depend on the schedule.
#pragma omp parallel
  {
    Workspace w(p.head_dim, p.head_dim_v);
#pragma omp for schedule(dynamic)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const int head = static_cast<int>(t / blocks_per_head % p.heads_q);
      const Sequence seq = sequence_of(p, static_cast<int>(t / blocks_per_head / p.heads_q));
      const std::int64_t r0 = t % blocks_per_head * task_rows;
      if (r0 >= seq.nq) continue;
      forward_task(p, seq, head, r0, static_cast<int>(std::min<std::int64_t>(task_rows, seq.nq - r0)),
                   w);
    }
  }
}

}  // namespace flashcpp::detail::cpu
