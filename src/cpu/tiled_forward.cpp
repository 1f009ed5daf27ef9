// FlashAttention forward on the CPU: for each (batch, head, block of query rows), stream over
// the visible key blocks with an online softmax, never materialising more than one
// (block_m x block_n) score block. fp32 accumulation for every input dtype.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cpu/amx_forward.hpp"
#include "cpu/avx512_forward.hpp"
#include "cpu/block_gemm.hpp"
#include "cpu/block_mask.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/element_io.hpp"
#include "cpu/fast_exp2.hpp"
#include "cpu/fp32_input.hpp"
#include "cpu/scores.hpp"
#include "cpu/sequence.hpp"
#include "cpu/visible_product.hpp"

namespace flashcpp::detail::cpu {
namespace {

// Query rows per task x keys per score block. One Sapphire Rapids core, D = 128, N = 4096:
// 128 x 256 ran at 84 GFLOP/s; 64 x 128 at 76, 64 x 256 at 73, 128 x 512 at 77.
constexpr int kBlockM = 128;
constexpr int kBlockN = 256;
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

struct Inputs {
  Fp32Input q, k, v;
};

// Per-thread buffers, allocated once per call.
struct Scratch {
  explicit Scratch(int dv)
      : s(kBlockM * kBlockN), o(static_cast<std::size_t>(kBlockM) * dv), m(kBlockM), l(kBlockM) {}
  std::vector<float> s;  // scores, then probabilities
  std::vector<float> o;  // unnormalised output rows
  std::vector<float> m;  // running row max (log2 domain)
  std::vector<float> l;  // running row sum of 2^(s - m)
};

// One online-softmax step: folds a score block into the running max and sum, turns the scores
// into probabilities relative to the new max and rescales the output rows accumulated so far.
// kTrackNaN: a NaN score makes the row NaN (docs/semantics.md), but the max and fast_exp2 drop
// it, so it is counted and l set to NaN, which out and lse then inherit. Only calls whose q or
// k hold NaN or Inf can have NaN scores; the others skip the count.
template <bool kTrackNaN>
void online_softmax(float* s, int rows, int cols, float* m, float* l, float* o, int dv) {
  for (int i = 0; i < rows; ++i) {
    float* row = s + static_cast<std::int64_t>(i) * cols;
    float max = m[i];
    int nan = 0;
    if constexpr (kTrackNaN) {
#pragma omp simd reduction(max : max) reduction(| : nan)
      for (int j = 0; j < cols; ++j) {
        max = row[j] > max ? row[j] : max;
        nan |= row[j] != row[j];
      }
    } else {
#pragma omp simd reduction(max : max)
      for (int j = 0; j < cols; ++j) max = row[j] > max ? row[j] : max;
    }
    if (max == kMinusInf) {  // nothing visible to this row yet: 2^(-inf - -inf) would be NaN
      if (nan) l[i] = std::numeric_limits<float>::quiet_NaN();
      std::fill(row, row + cols, 0.0f);
      continue;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < cols; ++j) {
      row[j] = fast_exp2(row[j] - max);
      sum += row[j];
    }
    const float correction = fast_exp2(m[i] - max);  // 0 on the first visible block
    l[i] = nan ? std::numeric_limits<float>::quiet_NaN() : l[i] * correction + sum;
    m[i] = max;
    if (correction != 1.0f) {
      float* o_row = o + static_cast<std::int64_t>(i) * dv;
      for (int d = 0; d < dv; ++d) o_row[d] *= correction;
    }
  }
}

template <bool kTrackNaN>
void forward_block(const ForwardParams& p, const Inputs& in, const Sequence& seq, int head,
                   std::int64_t r0, Scratch& w) {
  const int kv_head = head / (p.heads_q / p.heads_kv);
  const int dv = p.head_dim_v;
  const int rows = static_cast<int>(std::min<std::int64_t>(kBlockM, seq.nq - r0));
  const BlockMask mask(seq.nq, seq.nk, p.window_left, p.window_right);
  const ScoreTransform transform = score_transform(p);
  std::fill_n(w.m.begin(), rows, kMinusInf);
  std::fill_n(w.l.begin(), rows, 0.0f);
  std::fill_n(w.o.begin(), static_cast<std::int64_t>(rows) * dv, 0.0f);

  // Key blocks outside the rows' visible span are skipped; only blocks the span's edges cut
  // through are masked element-wise (inside block_scores).
  const KeyRange span = mask.keys_of_rows(r0, r0 + rows);
  for (std::int64_t c0 = span.begin; c0 < span.end; c0 += kBlockN) {
    const int cols = static_cast<int>(std::min<std::int64_t>(kBlockN, span.end - c0));
    block_scores(in.q.q_row(seq, r0, head), in.q.ld(), in.k.k_row(seq, c0, kv_head), in.k.ld(),
                 p.head_dim, transform, mask, r0, rows, c0, cols, w.s.data(), nullptr);
    online_softmax<kTrackNaN>(w.s.data(), rows, cols, w.m.data(), w.l.data(), w.o.data(), dv);
    visible_product(mask, r0, rows, c0, cols, dv, 1.0f, Op::none, w.s.data(), cols,
                    in.v.k_row(seq, c0, kv_head), in.v.ld(), w.o.data(), dv);
  }

  for (int i = 0; i < rows; ++i) {
    float* o_row = w.o.data() + static_cast<std::int64_t>(i) * dv;
    const bool empty = w.l[i] == 0.0f;  // no visible key: out = 0, lse = -inf (NaN stays NaN)
    const float inv_l = empty ? 0.0f : 1.0f / w.l[i];
    for (int d = 0; d < dv; ++d) o_row[d] *= inv_l;
    store_row(p.out, p.dtype, q_offset(p.out_stride, seq, r0 + i, head), o_row, dv);
    if (p.lse) {
      p.lse[lse_offset(p, seq, r0 + i, head)] =
          empty ? kMinusInf : (w.m[i] + std::log2(w.l[i])) * kLn2;
    }
  }
}

}  // namespace

void tiled_forward(const ForwardParams& p, bool non_finite_inputs) {
  if (amx_forward_usable(p)) {
    amx_forward(p);
    return;
  }
  if (avx512_forward_usable()) {
    avx512_forward(p);
    return;
  }
  const SingleThreadedBlas single_threaded;
  const Inputs in{q_input(p, p.q, p.q_stride, p.head_dim), k_input(p, p.k, p.k_stride, p.head_dim),
                  k_input(p, p.v, p.v_stride, p.head_dim_v)};
  const std::int64_t blocks_per_head = (std::int64_t{p.seqlen_q} + kBlockM - 1) / kBlockM;
  const std::int64_t tasks = std::int64_t{p.batch} * p.heads_q * blocks_per_head;

  // Tasks are (batch, head, row block), row block fastest so neighbouring tasks share K/V in
  // cache; dynamic scheduling evens out causal and varlen imbalance. Each task writes only its
  // own rows, so the result does not depend on the schedule.
#pragma omp parallel
  {
    Scratch scratch(p.head_dim_v);
#pragma omp for schedule(dynamic)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const int head = static_cast<int>(t / blocks_per_head % p.heads_q);
      const Sequence seq = sequence_of(p, static_cast<int>(t / blocks_per_head / p.heads_q));
      const std::int64_t r0 = t % blocks_per_head * kBlockM;
      if (r0 >= seq.nq) continue;
      if (non_finite_inputs)
        forward_block<true>(p, in, seq, head, r0, scratch);
      else
        forward_block<false>(p, in, seq, head, r0, scratch);
    }
  }
}

const char* tiled_kernel_name(const ForwardParams* forward) {
  static const std::string generic = std::string("cpu_tiled_") + block_gemm_name();
  if (forward && amx_forward_usable(*forward)) return "cpu_tiled_amx";
  if (avx512_forward_usable()) return "cpu_tiled_avx512";  // forward, or block_gemm in backward
  return generic.c_str();
}

}  // namespace flashcpp::detail::cpu
