// The bf16 forward on AMX tiles (Sapphire Rapids and later), detected at run time; the
// softmax runs on AVX-512 between the two tile products. Each task takes 512, 256 or 128 query
// rows of one (batch, head) as strips of 32 and streams over key blocks of 128. Everything is
// held transposed, keys (or output columns) down and query rows across, so that the online
// softmax has 16 rows in the lanes of a vector and never reduces across lanes:
//   - S^T = K Q^T: 2 x 2 tiles of 16 x 16 fp32 per 32 keys, A = K rows (a dense copy of the
//     block), B = Q^T in the tiles' pair-interleaved (VNNI) layout, packed once per task;
//   - lane-wise online softmax in fp32; P^T split into two bf16 parts (high + low), so that
//     P V keeps fp32-level accuracy (one bf16 P, as GPU kernels use, lost 2^-9; the two parts
//     2^-17). Pairs of keys are what tile B wants, so P^T is written straight in the VNNI
//     layout;
//   - O^T += V^T P^T: O^T kept in fp32 memory, A = V^T packed once per block per task.
// The tile products of the neighbouring strips run from inside a strip's softmax loop
// (TileQueue). Extra memory per thread: 2 * (512 * D + 128 * (D + Dv)) + 4 * (2 * 32 * 128 +
// 512 * Dv + 32 * Dv) bytes plus 2 * 4 * 32 * 128 (P^T): 0.52 MiB at D = Dv = 128; nothing
// input-sized.
#include "cpu/amx_forward.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "cpu/aligned_vector.hpp"
#include "cpu/amx_tiles.hpp"
#include "cpu/avx512_forward.hpp"
#include "cpu/block_mask.hpp"
#include "cpu/element_io.hpp"
#include "cpu/exp2_avx512.hpp"
#include "cpu/forward_tasks.hpp"
#include "cpu/reference_max_avx512.hpp"
#include "cpu/scores.hpp"
#include "cpu/sequence.hpp"
#include "cpu/store_avx512.hpp"

namespace flashcpp::detail::cpu {
namespace {

constexpr int kStrip = 32;         // query rows per strip: two tile columns of 16
constexpr int kTaskRows = kForwardTaskRows;  // rows per task at most (forward_tasks.hpp)
constexpr int kBlockKeys = 128;
// One bf16 part of P^T for 16 rows: [keys / 2][16] pairs.
constexpr int kPartHalf = kBlockKeys * 16;
constexpr int kPartsBuffer = 4 * kPartHalf;           // P^T of one strip: 2 parts x 2 halves
constexpr int kScoreBuffer = kBlockKeys * kStrip;     // S^T of one strip
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// A strip's share of a key block: keys [lo, hi) (32-aligned) hold every key its rows see;
// `full`: every row sees every one of them.
struct StripBlock {
  int strip, rows, lo, hi;
  std::int64_t row0;
  bool full;
};

// Per-thread buffers, allocated outside the AMX code (see avx512_forward.cpp for why), on
// cache lines (aligned_vector.hpp: unaligned tile rows cost 3x).
struct Workspace {
  Workspace(int d, int dv)
      : qt(static_cast<std::size_t>(kTaskRows) * d),
        k(static_cast<std::size_t>(kBlockKeys) * d),
        vt(static_cast<std::size_t>(dv) * kBlockKeys),
        st(static_cast<std::size_t>(2) * kScoreBuffer),
        pt(static_cast<std::size_t>(2) * kPartsBuffer),
        ot(static_cast<std::size_t>(kTaskRows) * dv),
        o(static_cast<std::size_t>(kStrip) * dv),
        m(kTaskRows),
        l(kTaskRows),
        seen_begin(kStrip),
        seen_end(kStrip) {}
  AlignedVector<std::uint16_t> qt;  // per 16 rows [D / 2][16] pairs: Q^T as tile B
  AlignedVector<std::uint16_t> k;   // [keys][D] bf16, zero past the block's keys
  AlignedVector<std::uint16_t> vt;  // [Dv][keys] bf16: V^T as tile A
  AlignedVector<float> st;          // 2 x [keys][32] a strip's scores, then fp32 probabilities
  AlignedVector<std::uint16_t> pt;  // 2 x [high, low][rows 0-15, 16-31][keys / 2][16] pairs: P^T
  AlignedVector<float> ot;          // per strip [Dv][32]: unnormalised output, transposed
  AlignedVector<float> o;           // [32][Dv]: one strip's output rows for the store
  AlignedVector<float> m, l;        // running row max (log2 domain, scaled) and sum
  AlignedVector<std::int32_t> seen_begin, seen_end;  // per strip row: visible keys in the block
  std::array<StripBlock, kTaskRows / kStrip> strips;  // the strips that see the key block
};

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma,amx-tile,amx-bf16")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The tile products of one block, issued a step at a time so that they can run from inside
// the softmax loop of another strip: the tile unit and the vector units then work at once (one
// after the other, the products took about half of the time and the softmax 40%). A step is
// 4 or 8 tile products with their loads; the queue holds at most one score product (S^T of a
// strip), then one output product (O^T += V^T P^T of another), done in that order since both
// use all eight tiles.
class TileQueue {
 public:
  // S^T[keys lo..hi)[32] (32-aligned) of one strip = K Q^T, unscaled.
  void add_scores(const std::uint16_t* k, int d, const std::uint16_t* qt, int lo, int hi,
                  float* st) {
    k_ = k, d_ = d, qt_ = qt, st_ = st, score_key_ = lo, score_end_ = hi, score_d_ = 0;
    remaining_ += (hi - lo) / 32 * (d / 32);
  }
  // O^T[Dv][32] += V^T[Dv][lo..hi) P^T[lo..hi)[32], P^T as its bf16 high part, then its low
  // part.
  void add_output(const std::uint16_t* vt, const std::uint16_t* pt, int lo, int hi, int dv,
                  float* ot) {
    vt_ = vt, pt_ = pt, ot_ = ot, out_lo_ = lo, out_hi_ = hi, dv_ = dv, out_col_ = 0,
    out_key_ = lo;
    remaining_ += dv / 32 * ((hi - lo) / 32);
  }
  int remaining() const { return remaining_; }
  void step() {
    if (score_key_ < score_end_)
      score_step();
    else
      output_step();
    --remaining_;
  }
  void drain() {
    while (remaining_ > 0) step();
  }

 private:
  static constexpr int kRowBytes = kStrip * 4;

  // 32 keys x 32 of D.
  void score_step() {
    const std::uint16_t* a0 = k_ + std::int64_t{score_key_} * d_;
    const std::uint16_t* a1 = a0 + std::int64_t{16} * d_;
    if (score_d_ == 0) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    }
    {
      // Ask for the 64 lines this chunk's scores are stored to, a share per step: they were
      // last read a strip ago and have left L1, and a tile store to lines in L2 took ~4x as
      // long as to lines in L1. Not at D 64: 32 prefetches a step made it 7% slower.
      float* c = st_ + score_key_ * kStrip;
      const int steps = d_ / 32, step = score_d_ / 32;
      for (int line = step * 64 / steps; steps >= 4 && line < (step + 1) * 64 / steps; ++line)
        _mm_prefetch(reinterpret_cast<const char*>(c + line * 16), _MM_HINT_ET0);
    }
    _tile_loadd(4, a0 + score_d_, d_ * 2);
    _tile_loadd(5, a1 + score_d_, d_ * 2);
    _tile_loadd(6, qt_ + score_d_ * 16, 64);
    _tile_loadd(7, qt_ + 16 * d_ + score_d_ * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    score_d_ += 32;
    if (score_d_ < d_) return;
    float* c = st_ + score_key_ * kStrip;
    _tile_stored(0, c, kRowBytes);
    _tile_stored(1, c + 16, kRowBytes);
    _tile_stored(2, c + 16 * kStrip, kRowBytes);
    _tile_stored(3, c + 16 * kStrip + 16, kRowBytes);
    score_d_ = 0;
    score_key_ += 32;
  }

  // 32 output columns x 32 keys, both parts of P^T.
  void output_step() {
    float* c0 = ot_ + out_col_ * kStrip;
    float* c1 = c0 + 16 * kStrip;
    if (out_key_ == out_lo_) {
      _tile_loadd(0, c0, kRowBytes);
      _tile_loadd(1, c0 + 16, kRowBytes);
      _tile_loadd(2, c1, kRowBytes);
      _tile_loadd(3, c1 + 16, kRowBytes);
    }
    const std::uint16_t* a0 = vt_ + std::int64_t{out_col_} * kBlockKeys + out_key_;
    const std::uint16_t* b = pt_ + out_key_ * 16;
    _tile_loadd(4, a0, kBlockKeys * 2);
    _tile_loadd(5, a0 + 16 * kBlockKeys, kBlockKeys * 2);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + kPartHalf, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(6, b + 2 * kPartHalf, 64);
    _tile_loadd(7, b + 3 * kPartHalf, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    out_key_ += 32;
    if (out_key_ < out_hi_) return;
    _tile_stored(0, c0, kRowBytes);
    _tile_stored(1, c0 + 16, kRowBytes);
    _tile_stored(2, c1, kRowBytes);
    _tile_stored(3, c1 + 16, kRowBytes);
    out_key_ = out_lo_;
    out_col_ += 32;
  }

  int remaining_ = 0;
  const std::uint16_t* k_ = nullptr;
  const std::uint16_t* qt_ = nullptr;
  float* st_ = nullptr;
  int d_ = 0, score_key_ = 0, score_end_ = 0, score_d_ = 0;
  const std::uint16_t* vt_ = nullptr;
  const std::uint16_t* pt_ = nullptr;
  float* ot_ = nullptr;
  int dv_ = 0, out_lo_ = 0, out_hi_ = 0, out_col_ = 0, out_key_ = 0;
};

// Spreads a queue's steps evenly over `ticks` calls of tick().
class Pacer {
 public:
  Pacer(TileQueue& queue, int ticks) : queue_(queue), steps_(queue.remaining()), ticks_(ticks) {}
  void tick() {
    credit_ += steps_;
    while (credit_ >= ticks_ && queue_.remaining() > 0) {
      queue_.step();
      credit_ -= ticks_;
    }
  }

 private:
  TileQueue& queue_;
  int steps_, ticks_, credit_ = 0;
};

// Probabilities of keys 2q and 2q + 1 (16 rows each) as the tile-B pairs of P^T's two bf16
// parts: high = p rounded to bf16, low = the rest rounded to bf16 (high + low is p to about
// 2^-17). Rounding by adding half a bf16 unit to the bits: p is at most 2^kMaxSlack (or NaN,
// which stays NaN), so a carry into the exponent is just the rounding up, never an overflow
// into inf. (One vpermt2w per part instead of the
// shift and blend, with p cut rather than rounded, measured no faster.)
inline void split_pair(__m512 p0, __m512 p1, std::uint16_t* high, std::uint16_t* low) {
  const __m512i half_unit = _mm512_set1_epi32(0x8000);
  const __m512i upper = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i h0 = _mm512_and_si512(_mm512_add_epi32(_mm512_castps_si512(p0), half_unit), upper);
  const __m512i h1 = _mm512_and_si512(_mm512_add_epi32(_mm512_castps_si512(p1), half_unit), upper);
  const __m512i l0 = _mm512_add_epi32(
      _mm512_castps_si512(_mm512_sub_ps(p0, _mm512_castsi512_ps(h0))), half_unit);
  const __m512i l1 = _mm512_add_epi32(
      _mm512_castps_si512(_mm512_sub_ps(p1, _mm512_castsi512_ps(h1))), half_unit);
  _mm512_storeu_si512(high, _mm512_or_si512(_mm512_srli_epi32(h0, 16), h1));
  _mm512_storeu_si512(low, _mm512_mask_blend_epi16(0xaaaaaaaau, _mm512_srli_epi32(l0, 16), l1));
}

// Online softmax of 16 strip rows (the lanes; st, m, l and ot point at the first) over keys
// [lo, hi) of the block (32-aligned). With `masked`, key j is hidden from lane r unless
// seen_begin[r] <= j < seen_end[r]. Writes P^T's parts (and with keep_fp32 the fp32 P^T into
// st), updates m and l and rescales the output columns. A row that sees nothing keeps P = 0.
void half_softmax(float* st, std::uint16_t* high, std::uint16_t* low, int lo, int hi,
                  bool masked, const std::int32_t* seen_begin, const std::int32_t* seen_end,
                  float alpha, bool keep_fp32, float* m, float* l, float* ot, int dv,
                  Pacer& pacer) {
  const __m512 hidden = _mm512_set1_ps(kMinusInf);
  __m512 max[4] = {hidden, hidden, hidden, hidden};
  if (!masked) {
    for (int j = lo; j < hi; j += 4) {
      for (int t = 0; t < 4; ++t)  // NaN scores do not reach the max (vmaxps keeps operand 2)
        max[t] = _mm512_max_ps(_mm512_loadu_ps(st + (j + t) * kStrip), max[t]);
    }
  } else {
    const __m512i begin = _mm512_loadu_si512(seen_begin);
    const __m512i end = _mm512_loadu_si512(seen_end);
    for (int j = lo; j < hi; j += 4) {
      for (int t = 0; t < 4; ++t) {
        const __m512i key = _mm512_set1_epi32(j + t);
        const __mmask16 seen =
            _mm512_cmple_epi32_mask(begin, key) & _mm512_cmpgt_epi32_mask(end, key);
        float* s = st + (j + t) * kStrip;
        const __m512 x = _mm512_mask_blend_ps(seen, hidden, _mm512_loadu_ps(s));
        _mm512_storeu_ps(s, x);
        max[t] = _mm512_max_ps(x, max[t]);
      }
    }
  }
  const __m512 block_max = _mm512_max_ps(_mm512_max_ps(max[0], max[1]),
                                         _mm512_max_ps(max[2], max[3]));
  const __m512 scale = _mm512_set1_ps(alpha);
  const __m512 old_max = _mm512_loadu_ps(m);
  const __m512 new_max = next_reference_max(old_max, _mm512_mul_ps(block_max, scale));
  const __m512 base = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(new_max, hidden, _CMP_NEQ_OQ),
                                          new_max);
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  for (int j = lo; j < hi; j += 2) {
    float* s = st + j * kStrip;
    const __m512 p0 = exp2_lanes(_mm512_fmsub_ps(_mm512_loadu_ps(s), scale, base));
    const __m512 p1 = exp2_lanes(_mm512_fmsub_ps(_mm512_loadu_ps(s + kStrip), scale, base));
    split_pair(p0, p1, high + j * 16, low + j * 16);
    pacer.tick();
    if (keep_fp32) {  // for the per-row product of the non-finite V fallback
      _mm512_storeu_ps(s, p0);
      _mm512_storeu_ps(s + kStrip, p1);
    }
    sum0 = _mm512_add_ps(sum0, p0);
    sum1 = _mm512_add_ps(sum1, p1);
  }
  // 2^(m - base): 0 on the first visible block, exactly 1 where the max did not move.
  const __m512 correction = exp2_lanes(_mm512_sub_ps(old_max, base));
  _mm512_storeu_ps(l, _mm512_fmadd_ps(_mm512_loadu_ps(l), correction, _mm512_add_ps(sum0, sum1)));
  _mm512_storeu_ps(m, new_max);
  if (_mm512_cmp_ps_mask(correction, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ) != 0) {
    for (int c = 0; c < dv; ++c) {
      float* o = ot + c * kStrip;
      _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), correction));
    }
  }
}

// One strip's O^T [Dv][32] as rows [32][Dv].
void transpose_output(const float* ot, int dv, float* o) {
  for (int c0 = 0; c0 < dv; c0 += 16) {
    for (int h = 0; h < kStrip; h += 16) {
      __m512i r[16];
      for (int c = 0; c < 16; ++c)
        r[c] = _mm512_castps_si512(_mm512_loadu_ps(ot + (c0 + c) * kStrip + h));
      transpose_16x16(r);
      for (int i = 0; i < 16; ++i)
        _mm512_storeu_ps(o + (h + i) * dv + c0, _mm512_castsi512_ps(r[i]));
    }
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

  pack_transposed_b(q_in + q_offset(p.q_stride, seq, r0, head), p.q_stride.row, rows, d,
                    w.qt.data());
  const int packed_rows = (rows + 15) / 16 * 16;  // pack_transposed_b zero-fills up to these
  std::memset(w.qt.data() + static_cast<std::int64_t>(packed_rows) * d, 0,
              sizeof(std::uint16_t) * (strips * kStrip - packed_rows) * d);
  for (int i = 0; i < strips * kStrip; ++i) {
    w.m[i] = kMinusInf;
    w.l[i] = 0.0f;
  }
  std::memset(w.ot.data(), 0, sizeof(float) * strips * kStrip * dv);
  const float alpha = transform.softcap_log2 > 0 ? kLog2e : transform.alpha;

  const KeyRange span = mask.keys_of_rows(r0, r0 + rows);
  for (std::int64_t c0 = span.begin; c0 < span.end; c0 += kBlockKeys) {
    const int cols = static_cast<int>(std::min<std::int64_t>(kBlockKeys, span.end - c0));
    const int padded_cols = (cols + 31) / 32 * 32;
    copy_rows(k_in + k_offset(p.k_stride, seq, c0, kv_head), p.k_stride.row, cols, d,
              padded_cols, w.k.data());
    const bool v_finite =
        pack_transposed_a(v_in + k_offset(p.v_stride, seq, c0, kv_head), p.v_stride.row, cols,
                          dv, padded_cols, w.vt.data(), kBlockKeys);
    // The strips that see some key of the block. Without the per-row fallback (below) they
    // run as a pipeline: strip i's softmax on the vector units while the tiles compute the
    // scores of strip i + 1 and the output of strip i - 1, from two score and two P^T buffers.
    int active = 0;
    bool fallback = false;
    for (int st = 0; st < strips; ++st) {
      const std::int64_t row0 = r0 + st * kStrip;
      const int strip_rows = static_cast<int>(std::min<std::int64_t>(kStrip, r0 + rows - row0));
      const KeyRange seen = mask.keys_of_rows(row0, row0 + strip_rows);
      const std::int64_t first = std::max(seen.begin, c0);
      const std::int64_t last = std::min(seen.end, c0 + cols);
      if (first >= last) continue;
      StripBlock& b = w.strips[active++];
      b.strip = st;
      b.row0 = row0;
      b.rows = strip_rows;
      b.lo = static_cast<int>(first - c0) / 32 * 32;
      b.hi = (static_cast<int>(last - c0) + 31) / 32 * 32;
      b.full = mask.is_full(row0, row0 + strip_rows, first, last) && b.lo == first - c0 &&
               b.hi == last - c0;
      fallback = fallback || !(b.full || v_finite);
    }
    const auto scores_of = [&](TileQueue& queue, int i) {
      const StripBlock& b = w.strips[i];
      queue.add_scores(w.k.data(), d, w.qt.data() + static_cast<std::int64_t>(b.strip) * kStrip * d,
                       b.lo, b.hi, w.st.data() + i % 2 * kScoreBuffer);
    };
    const auto output_of = [&](TileQueue& queue, int i) {
      const StripBlock& b = w.strips[i];
      queue.add_output(w.vt.data(), w.pt.data() + i % 2 * kPartsBuffer, b.lo, b.hi, dv,
                       w.ot.data() + static_cast<std::int64_t>(b.strip) * kStrip * dv);
    };
    TileQueue queue;
    if (active > 0) {
      scores_of(queue, 0);
      queue.drain();
    }
    for (int i = 0; i < active; ++i) {
      const StripBlock& b = w.strips[i];
      float* st = w.st.data() + i % 2 * kScoreBuffer;
      std::uint16_t* pt = w.pt.data() + i % 2 * kPartsBuffer;
      float* ot = w.ot.data() + static_cast<std::int64_t>(b.strip) * kStrip * dv;
      if (!fallback) {
        if (i + 1 < active) scores_of(queue, i + 1);
        if (i > 0) output_of(queue, i - 1);
      }
      if (!b.full) {
        for (int r = 0; r < kStrip; ++r) {
          int vis_lo = 0, vis_hi = 0;  // rows past the strip see nothing
          if (r < b.rows) {
            const KeyRange visible = mask.keys(b.row0 + r);
            vis_lo = static_cast<int>(std::clamp<std::int64_t>(visible.begin - c0, 0, cols));
            vis_hi = static_cast<int>(std::clamp<std::int64_t>(visible.end - c0, 0, cols));
          }
          w.seen_begin[r] = vis_lo;
          w.seen_end[r] = vis_hi;
        }
      }
      if (transform.softcap_log2 > 0) {
        for (int j = b.lo * kStrip; j < b.hi * kStrip; ++j)
          st[j] = p.softcap * std::tanh(st[j] * transform.alpha);
      }
      const bool keep_fp32 = !(b.full || v_finite);
      Pacer pacer(queue, b.hi - b.lo);  // one tick per pair of keys in each half
      for (int h = 0; h < kStrip; h += 16) {
        half_softmax(st + h, pt + h / 16 * kPartHalf, pt + 2 * kPartHalf + h / 16 * kPartHalf,
                     b.lo, b.hi, !b.full, w.seen_begin.data() + h, w.seen_end.data() + h, alpha,
                     keep_fp32, w.m.data() + b.strip * kStrip + h,
                     w.l.data() + b.strip * kStrip + h, ot + h, dv, pacer);
      }
      queue.drain();
      if (!fallback) continue;
      if (!keep_fp32) {
        output_of(queue, i);
        queue.drain();
      } else {
        // Masked keys must add nothing, not 0 * V (NaN when V holds NaN or Inf).
        for (int r = 0; r < b.rows; ++r) {
          const KeyRange visible = mask.keys(b.row0 + r);
          const std::int64_t begin = std::max(visible.begin, c0);
          const std::int64_t end = std::min(visible.end, c0 + cols);
          for (std::int64_t j = begin; j < end; ++j) {
            const float pj = st[(j - c0) * kStrip + r];
            const std::int64_t v_row = k_offset(p.v_stride, seq, j, kv_head);
            for (int c = 0; c < dv; ++c) ot[c * kStrip + r] += pj * bf16_to_float(v_in[v_row + c]);
          }
        }
      }
      if (i + 1 < active) {
        scores_of(queue, i + 1);
        queue.drain();
      }
    }
    if (!fallback && active > 0) {
      output_of(queue, active - 1);
      queue.drain();
    }
  }

  for (int st = 0; st < strips; ++st) {
    const std::int64_t row0 = r0 + st * kStrip;
    transpose_output(w.ot.data() + static_cast<std::int64_t>(st) * kStrip * dv, dv, w.o.data());
    store_finished_rows(p, seq, head, row0,
                        static_cast<int>(std::min<std::int64_t>(kStrip, r0 + rows - row0)),
                        w.o.data(), w.m.data() + st * kStrip, w.l.data() + st * kStrip);
  }
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
  const int task_rows = forward_task_rows(p);
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
