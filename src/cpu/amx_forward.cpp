// The bf16 forward on AMX tiles (Sapphire Rapids and later), detected at run time; the
// softmax runs on AVX-512 between the two tile products. Each task takes 256 (or 128) query
// rows of one (batch, head) as strips of 32 and streams over key blocks of 128:
//   - S = Q K^T: 2 x 2 tiles of 16 x 16 fp32 per 32 keys, A = Q rows (copied once per task),
//     B = K^T in the tiles' pair-interleaved (VNNI) layout, which is a 16 x 16 transpose of
//     K's 32-bit words, packed once per block per task;
//   - row-wise online softmax in fp32 on AVX-512; P split into two bf16 parts (high + low),
//     so that P V keeps fp32-level accuracy (one bf16 P, as GPU kernels use, lost 2^-9);
//   - O += P V: O rows kept in fp32 memory, V packed as interleaved row pairs.
// Extra memory per thread: 2 * (256 * D + 128 * (D + Dv)) + 4 * (32 * 128 + 256 * Dv) bytes
// plus 4 * 32 * 128 (P): about 0.3 MiB at D = Dv = 128; nothing input-sized.
#include "cpu/amx_forward.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "cpu/amx_tiles.hpp"
#include "cpu/avx512_forward.hpp"
#include "cpu/block_mask.hpp"
#include "cpu/element_io.hpp"
#include "cpu/exp2_avx512.hpp"
#include "cpu/scores.hpp"
#include "cpu/sequence.hpp"
#include "cpu/store_avx512.hpp"

namespace flashcpp::detail::cpu {
namespace {

constexpr int kStrip = 32;         // query rows per strip: two tile rows of 16
// Query rows per task: they share each packed key block, whose packing is about a fifth of
// the time at 128 rows (1 thread, N 2048, D 128). 256 when that still leaves 4 tasks a thread.
constexpr int kTaskRows = 256;
constexpr int kSmallTaskRows = 128;
constexpr int kBlockKeys = 128;
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// Per-thread buffers, allocated outside the AMX code (see avx512_forward.cpp for why).
struct Workspace {
  Workspace(int d, int dv)
      : q(static_cast<std::size_t>(kTaskRows) * d),
        k(static_cast<std::size_t>(kBlockKeys) * d),
        v(static_cast<std::size_t>(kBlockKeys) * dv),
        s(static_cast<std::size_t>(kStrip) * kBlockKeys),
        p(static_cast<std::size_t>(2) * kStrip * kBlockKeys),
        o(static_cast<std::size_t>(kTaskRows) * dv),
        m(kTaskRows),
        l(kTaskRows) {}
  std::vector<std::uint16_t> q;  // [rows][D] bf16, rows past the task 0
  std::vector<std::uint16_t> k;  // per 16 keys [D / 2][16] pairs: K^T as tile B
  std::vector<std::uint16_t> v;  // per 16 columns [keys / 2][16] pairs: V as tile B
  std::vector<float> s;          // [32][keys] scores, then fp32 probabilities
  std::vector<std::uint16_t> p;  // [2][32][keys]: P as bf16 high and low parts (tile A)
  std::vector<float> o;          // [rows][Dv] unnormalised output rows
  std::vector<float> m, l;       // running row max (log2 domain, scaled) and sum
};

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma,amx-tile,amx-bf16")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// S[32][keys lo..hi) (32-aligned) of one strip = Q K^T, unscaled.
void strip_scores(const std::uint16_t* q, int d, const std::uint16_t* k_packed, int lo, int hi,
                  float* s) {
  const int q_stride = d * 2;
  for (int c = lo; c < hi; c += 32) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const std::uint16_t* b0 = k_packed + std::int64_t{c} * d;
    const std::uint16_t* b1 = b0 + std::int64_t{16} * d;
    for (int d0 = 0; d0 < d; d0 += 32) {
      _tile_loadd(4, q + d0, q_stride);
      _tile_loadd(5, q + 16 * d + d0, q_stride);
      _tile_loadd(6, b0 + d0 * 16, 64);
      _tile_loadd(7, b1 + d0 * 16, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    constexpr int kRowBytes = kBlockKeys * 4;
    _tile_stored(0, s + c, kRowBytes);
    _tile_stored(1, s + c + 16, kRowBytes);
    _tile_stored(2, s + 16 * kBlockKeys + c, kRowBytes);
    _tile_stored(3, s + 16 * kBlockKeys + c + 16, kRowBytes);
  }
}

// O[32][Dv] += P[32][lo..hi) V[lo..hi)[Dv], P as its bf16 high part, then its low part.
void strip_output(const std::uint16_t* p, const std::uint16_t* v_packed, int lo, int hi, int dv,
                  float* o) {
  const int o_stride = dv * 4;
  for (int n = 0; n < dv; n += 32) {
    _tile_loadd(0, o + n, o_stride);
    _tile_loadd(1, o + n + 16, o_stride);
    _tile_loadd(2, o + 16 * dv + n, o_stride);
    _tile_loadd(3, o + 16 * dv + n + 16, o_stride);
    const std::uint16_t* b0 = v_packed + std::int64_t{n} * kBlockKeys;
    const std::uint16_t* b1 = b0 + 16 * kBlockKeys;
    for (int k0 = lo; k0 < hi; k0 += 32) {
      _tile_loadd(4, p + k0, kBlockKeys * 2);
      _tile_loadd(5, p + 16 * kBlockKeys + k0, kBlockKeys * 2);
      _tile_loadd(6, b0 + k0 * 16, 64);
      _tile_loadd(7, b1 + k0 * 16, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
      _tile_loadd(4, p + kStrip * kBlockKeys + k0, kBlockKeys * 2);
      _tile_loadd(5, p + (kStrip + 16) * kBlockKeys + k0, kBlockKeys * 2);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, o + n, o_stride);
    _tile_stored(1, o + n + 16, o_stride);
    _tile_stored(2, o + 16 * dv + n, o_stride);
    _tile_stored(3, o + 16 * dv + n + 16, o_stride);
  }
}

// Online softmax of row i over keys [lo, hi) of the block (32-aligned); keys of the row
// outside [vis_lo, vis_hi) are hidden. Writes P (fp32 into s, bf16 into p), updates m and l
// and rescales the output row. An empty row keeps P = 0.
void row_softmax(float* s, std::uint16_t* p, int lo, int hi, int vis_lo, int vis_hi, float alpha,
                 bool keep_fp32, float& m, float& l, float* o, int dv) {
  const __m512 hidden = _mm512_set1_ps(kMinusInf);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 max = _mm512_set1_ps(kMinusInf);
  if (vis_lo <= lo && vis_hi >= hi) {  // the row sees every key of [lo, hi): no mask
    for (int j = lo; j < hi; j += 16) max = _mm512_max_ps(_mm512_loadu_ps(s + j), max);
  }
  for (int j = lo; j < hi && !(vis_lo <= lo && vis_hi >= hi); j += 16) {
    const __m512i key = _mm512_add_epi32(iota, _mm512_set1_epi32(j));
    const __mmask16 seen = _mm512_cmpge_epi32_mask(key, _mm512_set1_epi32(vis_lo)) &
                           _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(vis_hi));
    const __m512 x = _mm512_mask_blend_ps(seen, hidden, _mm512_loadu_ps(s + j));
    _mm512_storeu_ps(s + j, x);
    max = _mm512_max_ps(x, max);
  }
  const float block_max = _mm512_reduce_max_ps(max) * alpha;
  const float new_max = std::max(m, block_max);  // NaN scores do not reach the max
  const float base = new_max == kMinusInf ? 0.0f : new_max;
  const __m512 scale = _mm512_set1_ps(alpha);
  const __m512 offset = _mm512_set1_ps(base);
  __m512 sum = _mm512_setzero_ps();
  for (int j = lo; j < hi; j += 32) {
    const __m512 p0 = exp2_lanes(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), scale, offset));
    const __m512 p1 = exp2_lanes(_mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), scale, offset));
    // P = high + low, both bf16: the product then loses about 2^-17 of P, not 2^-9.
    const __m512i high = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0));
    const __m512 high0 = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm512_castsi512_si256(high)), 16));
    const __m512 high1 = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(high, 1)), 16));
    const __m512i low = reinterpret_cast<__m512i>(
        _mm512_cvtne2ps_pbh(_mm512_sub_ps(p1, high1), _mm512_sub_ps(p0, high0)));
    _mm512_storeu_si512(p + j, high);
    _mm512_storeu_si512(p + kStrip * kBlockKeys + j, low);
    if (keep_fp32) {  // for the per-row product of strip_output's fallback
      _mm512_storeu_ps(s + j, p0);
      _mm512_storeu_ps(s + j + 16, p1);
    }
    sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
  }
  // 2^(m - base): 0 on the first visible block; exactly 1 when the max did not move.
  const float correction = m == new_max ? 1.0f : (m == kMinusInf ? 0.0f : std::exp2(m - base));
  l = l * correction + _mm512_reduce_add_ps(sum);
  m = new_max;
  if (correction != 1.0f) {
    const __m512 factor = _mm512_set1_ps(correction);
    for (int c = 0; c < dv; c += 16)
      _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), factor));
  }
}

void forward_task(const ForwardParams& p, const Sequence& seq, int head, std::int64_t r0,
                  int rows, Workspace& w) {
  const int kv_head = head / (p.heads_q / p.heads_kv);
  const int d = p.head_dim;
  const int dv = p.head_dim_v;
  const int strips = (rows + kStrip - 1) / kStrip;
  const BlockMask mask(seq.nq, seq.nk, p.window_left, p.window_right);
  const ScoreTransform transform = score_transform(p);
  const auto* q_in = static_cast<const std::uint16_t*>(p.q);
  const auto* k_in = static_cast<const std::uint16_t*>(p.k);
  const auto* v_in = static_cast<const std::uint16_t*>(p.v);

  for (int r = 0; r < strips * kStrip; ++r) {
    std::uint16_t* dst = w.q.data() + static_cast<std::int64_t>(r) * d;
    if (r < rows)
      std::memcpy(dst, q_in + q_offset(p.q_stride, seq, r0 + r, head), sizeof(std::uint16_t) * d);
    else
      std::memset(dst, 0, sizeof(std::uint16_t) * d);
  }
  for (int i = 0; i < strips * kStrip; ++i) {
    w.m[i] = kMinusInf;
    w.l[i] = 0.0f;
  }
  std::memset(w.o.data(), 0, sizeof(float) * strips * kStrip * dv);

  const KeyRange span = mask.keys_of_rows(r0, r0 + rows);
  for (std::int64_t c0 = span.begin; c0 < span.end; c0 += kBlockKeys) {
    const int cols = static_cast<int>(std::min<std::int64_t>(kBlockKeys, span.end - c0));
    pack_transposed_b(k_in + k_offset(p.k_stride, seq, c0, kv_head), p.k_stride.row, cols, d,
                      w.k.data());
    const bool v_finite = pack_b(v_in + k_offset(p.v_stride, seq, c0, kv_head), p.v_stride.row,
                                 cols, dv, kBlockKeys, w.v.data());
    for (int st = 0; st < strips; ++st) {
      const std::int64_t row0 = r0 + st * kStrip;
      const int strip_rows = static_cast<int>(std::min<std::int64_t>(kStrip, r0 + rows - row0));
      const KeyRange seen = mask.keys_of_rows(row0, row0 + strip_rows);
      const std::int64_t first = std::max(seen.begin, c0);
      const std::int64_t last = std::min(seen.end, c0 + cols);
      if (first >= last) continue;
      const int lo = static_cast<int>(first - c0) / 32 * 32;
      const int hi = (static_cast<int>(last - c0) + 31) / 32 * 32;
      float* o = w.o.data() + static_cast<std::int64_t>(st) * kStrip * dv;
      strip_scores(w.q.data() + static_cast<std::int64_t>(st) * kStrip * d, d, w.k.data(), lo, hi,
                   w.s.data());
      const bool full = mask.is_full(row0, row0 + strip_rows, first, last) && lo == first - c0 &&
                        hi == last - c0;
      for (int i = 0; i < kStrip; ++i) {
        float* s_row = w.s.data() + i * kBlockKeys;
        std::uint16_t* p_row = w.p.data() + i * kBlockKeys;
        int vis_lo = 0, vis_hi = 0;  // rows past the strip see nothing
        if (i < strip_rows) {
          const KeyRange visible = mask.keys(row0 + i);
          vis_lo = static_cast<int>(std::clamp<std::int64_t>(visible.begin - c0, 0, cols));
          vis_hi = static_cast<int>(std::clamp<std::int64_t>(visible.end - c0, 0, cols));
        }
        if (transform.softcap_log2 > 0) {
          for (int j = lo; j < hi; ++j)
            s_row[j] = p.softcap * std::tanh(s_row[j] * transform.alpha);
        }
        const float alpha = transform.softcap_log2 > 0 ? kLog2e : transform.alpha;
        row_softmax(s_row, p_row, lo, hi, vis_lo, vis_hi, alpha, !(full || v_finite),
                    w.m[st * kStrip + i],
                    w.l[st * kStrip + i], o + static_cast<std::int64_t>(i) * dv, dv);
      }
      if (full || v_finite) {
        strip_output(w.p.data(), w.v.data(), lo, hi, dv, o);
        continue;
      }
      // Masked keys must add nothing, not 0 * V (NaN when V holds NaN or Inf).
      for (int i = 0; i < strip_rows; ++i) {
        const KeyRange visible = mask.keys(row0 + i);
        const std::int64_t begin = std::max(visible.begin, c0), end = std::min(visible.end, c0 + cols);
        float* o_row = o + static_cast<std::int64_t>(i) * dv;
        for (std::int64_t j = begin; j < end; ++j) {
          const float pj = w.s[i * kBlockKeys + (j - c0)];
          const std::int64_t v_row = k_offset(p.v_stride, seq, j, kv_head);
          for (int c = 0; c < dv; ++c) o_row[c] += pj * bf16_to_float(v_in[v_row + c]);
        }
      }
    }
  }

  store_finished_rows(p, seq, head, r0, rows, w.o.data(), w.m.data(), w.l.data());
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

bool amx_forward_usable(const ForwardParams& p) {
  static const bool present = [] {
    const char* choice = std::getenv("FLASHCPP_CPU_KERNEL");
    const std::string_view kernel = choice ? choice : "";
    return kernel != "generic" && kernel != "avx512" && avx512_forward_usable() && amx_present();
  }();
  return present && p.dtype == ElementType::bf16 && p.head_dim % 32 == 0 &&
         p.head_dim_v % 32 == 0;
}

void amx_forward(const ForwardParams& p) {
  const std::int64_t heads = std::int64_t{p.batch} * p.heads_q;
  const int task_rows =
      heads * ((p.seqlen_q + kTaskRows - 1) / kTaskRows) >= 4 * omp_get_max_threads()
          ? kTaskRows
          : kSmallTaskRows;
  const std::int64_t blocks_per_head = (std::int64_t{p.seqlen_q} + task_rows - 1) / task_rows;
  const std::int64_t tasks = std::int64_t{p.batch} * p.heads_q * blocks_per_head;
#pragma omp parallel
  {
    Workspace w(p.head_dim, p.head_dim_v);
    const TileScope tiles;
#pragma omp for schedule(dynamic)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const int head = static_cast<int>(t / blocks_per_head % p.heads_q);
      const Sequence seq = sequence_of(p, static_cast<int>(t / blocks_per_head / p.heads_q));
      const std::int64_t r0 = t % blocks_per_head * task_rows;
      if (r0 >= seq.nq) continue;
      forward_task(p, seq, head, r0,
                   static_cast<int>(std::min<std::int64_t>(task_rows, seq.nq - r0)), w);
    }
  }
}

}  // namespace flashcpp::detail::cpu
