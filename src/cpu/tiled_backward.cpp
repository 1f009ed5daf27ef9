// FlashAttention-2 backward on the CPU, fp32 accumulation, recomputing P from the forward's lse.
//
// fp16/bf16 inputs are converted a block at a time into per-thread buffers (Fp32Rows).
// Race-free and deterministic by construction. First the row statistics: D_i =
// rowsum(dO_i * O_i) and lse in log2 units, per (batch, q head). Then, when there are at least
// two (batch, kv head) pairs per thread, one fused task per pair: it owns dQ of the group's
// query heads and dK/dV of its keys (summing the GQA group itself), computes each score block
// once and accumulates dK/dV in per-thread rows of the sequence's length. Otherwise two passes:
//   1. dK, dV: one task per (batch, kv head, key block); it loops over the query heads of its
//      group and their query blocks, so it owns its dK/dV rows and sums GQA groups itself;
//   2. dQ: one task per (batch, q head, query block), looping over the visible key blocks,
// which recomputes S and dP in pass 2 (7 block products per score block instead of 5).
// Each output element is written by one task, and both ways add the same blocks in the same
// order, so the gradients are bitwise identical run to run whatever the thread count. The
// alternatives were dQ atomics (nondeterministic) or dQ partial buffers merged afterwards.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <omp.h>

#include "cpu/aligned_vector.hpp"
#include "cpu/amx_backward.hpp"
#include "cpu/amx_tiles.hpp"
#include "cpu/avx512_forward.hpp"
#include "cpu/block_gemm.hpp"
#include "cpu/block_mask.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/element_io.hpp"
#include "cpu/fast_exp2.hpp"
#include "cpu/fp32_rows.hpp"
#include "cpu/scores.hpp"
#include "cpu/sequence.hpp"
#include "cpu/visible_product.hpp"

namespace flashcpp::detail::cpu {
namespace {

// Query rows x keys per block. One Sapphire Rapids core, D = 128, N = 4096: 64 x 128 ran at
// 71 GFLOP/s (counted as 2.5x the forward's flops); 64 x 64 at 62, 128 x 128 at 48.
constexpr int kBlockM = 64;
constexpr int kBlockN = 128;
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// One input tensor: bf16/fp16 ones are read as fp32 a block at a time (Fp32Rows).
struct Input {
  const void* data;
  Strides stride;
  int dim;

  std::int64_t q_first(const Sequence& seq, std::int64_t row, int head) const {
    return q_offset(stride, seq, row, head);
  }
  std::int64_t k_first(const Sequence& seq, std::int64_t row, int head) const {
    return k_offset(stride, seq, row, head);
  }
};

struct Inputs {
  Input q, k, v, out, dout;
};

// Per-row statistics in a dense layout: [B, Hq, Nq] padded, [Hq, total_q] varlen.
class RowStats {
 public:
  explicit RowStats(const ForwardParams& p)
      : batch_stride_(p.is_varlen() ? 0 : std::int64_t{p.heads_q} * p.seqlen_q),
        head_stride_(p.is_varlen() ? total_rows_q(p) : p.seqlen_q),
        lse_log2_(static_cast<std::size_t>(total_rows_q(p) * p.heads_q)),
        delta_(lse_log2_.size()) {}

  // The statistics of a sequence's rows for one head (pointers, so empty sequences are fine).
  float* lse_log2(const Sequence& seq, int head) { return lse_log2_.data() + first(seq, head); }
  float* delta(const Sequence& seq, int head) { return delta_.data() + first(seq, head); }
  const float* lse_log2(const Sequence& seq, int head) const {
    return lse_log2_.data() + first(seq, head);
  }
  const float* delta(const Sequence& seq, int head) const {
    return delta_.data() + first(seq, head);
  }

 private:
  std::int64_t first(const Sequence& seq, int head) const {
    return seq.batch * batch_stride_ + head * head_stride_ + seq.q_begin;
  }

  std::int64_t batch_stride_, head_stride_;
  std::vector<float> lse_log2_, delta_;
};

// Per thread, for the fp32 block products. Besides block_gemm's own buffer, 4 bytes times
// 3 * kBlockM * kBlockN + kBlockM * (D + Dv + 3) + (kBlockM + kBlockN) * (D + Dv), the last
// for the q, dO, k, v blocks (converted from fp16/bf16, or dense copies of fp32, Fp32Rows).
struct Scratch {
  Scratch(ElementType type, int d, int dv)
      : q(type, kBlockM, d),
        dout(type, kBlockM, dv),
        k(type, kBlockN, d),
        v(type, kBlockN, dv),
        q_t(static_cast<std::size_t>(d) * kBlockM),
        dout_t(static_cast<std::size_t>(dv) * kBlockM),
        lse(kBlockM),
        delta(kBlockM),
        live(kBlockM),
        p(kBlockM * kBlockN),
        ds(kBlockM * kBlockN),
        tanh_values(kBlockM * kBlockN) {}
  Fp32Rows q, dout;                     // query-side blocks (rows)
  Fp32Rows k, v;                        // key-side blocks (cols)
  std::vector<float> q_t, dout_t;       // Q^T, dO^T: [D][kBlockM], [Dv][kBlockM]
  std::vector<float> lse, delta;        // of the query rows
  std::vector<std::uint32_t> live;      // all ones, or 0 for a row that sees no key (lse -inf)
  std::vector<float> p;                 // S^T, then P^T: [keys][kBlockM]
  std::vector<float> ds;                // dP^T, then dS^T
  std::vector<float> tanh_values;       // softcap only
};

struct Problem {
  const BackwardParams& params;
  const Inputs& in;
  const RowStats& stats;
  ScoreTransform transform;
};

// out[d * kBlockM + i] = x[i * ldx + d] for i < rows, d < dim.
void transpose_rows(const float* x, std::int64_t ldx, int rows, int dim, float* out) {
  for (int i = 0; i < rows; ++i)
    for (int d = 0; d < dim; ++d) out[d * kBlockM + i] = x[i * ldx + d];
}

// The q and dO rows of the block, also transposed (the scores are computed as S^T = K Q^T, so
// no transpose is left for the key blocks), and the rows' statistics.
void load_query_block(const Problem& pr, const Sequence& seq, int head, std::int64_t r0,
                      int rows, Scratch& w) {
  const Inputs& in = pr.in;
  const ElementType type = pr.params.dtype;
  w.q.load(in.q.data, type, in.q.q_first(seq, r0, head), in.q.stride.row, rows, in.q.dim);
  w.dout.load(in.dout.data, type, in.dout.q_first(seq, r0, head), in.dout.stride.row, rows,
              in.dout.dim);
  transpose_rows(w.q.data(), w.q.ld(), rows, in.q.dim, w.q_t.data());
  transpose_rows(w.dout.data(), w.dout.ld(), rows, in.dout.dim, w.dout_t.data());
  const float* lse_log2 = pr.stats.lse_log2(seq, head) + r0;
  const float* delta = pr.stats.delta(seq, head) + r0;
  for (int i = 0; i < rows; ++i) {
    // A row with no visible key contributes nothing (its 2^(s - lse) would be inf).
    w.live[i] = lse_log2[i] == kMinusInf ? 0u : ~0u;
    w.lse[i] = lse_log2[i];
    w.delta[i] = delta[i];
  }
}

void load_key_block(const Problem& pr, const Sequence& seq, int kv_head, std::int64_t c0, int cols,
                    Scratch& w) {
  const Inputs& in = pr.in;
  const ElementType type = pr.params.dtype;
  w.k.load(in.k.data, type, in.k.k_first(seq, c0, kv_head), in.k.stride.row, cols, in.k.dim);
  w.v.load(in.v.data, type, in.v.k_first(seq, c0, kv_head), in.v.stride.row, cols, in.v.dim);
}

// P^T = 2^(S^T - lse) and dS^T = P^T (dP^T - D) in place of S^T and dP^T ([key][row]) for
// rows < rows, keys < cols. The library is compiled for baseline x86-64, where this loop runs
// 4 lanes wide: 11% of the fp32 backward's time by timers (1 thread, N 1024, D 128); the
// AVX-512 copy below runs it 16 wide (1.4%).
[[gnu::always_inline]] inline void probabilities(Scratch& w, int rows, int cols) {
  const float* lse = w.lse.data();
  const float* delta = w.delta.data();
  const std::uint32_t* live = w.live.data();
  for (int j = 0; j < cols; ++j) {
    float* prob = w.p.data() + std::int64_t{j} * kBlockM;
    float* ds = w.ds.data() + std::int64_t{j} * kBlockM;
#pragma omp simd
    for (int i = 0; i < rows; ++i) {
      const float pr_ij = std::bit_cast<float>(std::bit_cast<std::uint32_t>(
                              fast_exp2(prob[i] - lse[i])) & live[i]);
      prob[i] = pr_ij;
      ds[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(pr_ij * (ds[i] - delta[i])) &
                                   live[i]);
    }
  }
}

[[gnu::target("avx512f,avx512bw,avx512dq,avx512vl,fma")]]
void probabilities_avx512(Scratch& w, int rows, int cols) {
  probabilities(w, rows, cols);
}

// P^T and dS^T (of the natural-log scores, softcap derivative included, without the softmax
// scale) of the loaded query rows [r0, r0 + rows) against the loaded keys [c0, c0 + cols), into
// w.p, w.ds ([key][row], kBlockM apart). A NaN lse (a row that saw a NaN score) gives NaN.
void recompute_block(const Problem& pr, const BlockMask& mask, std::int64_t r0, int rows,
                     std::int64_t c0, int cols, Scratch& w) {
  const BackwardParams& p = pr.params;
  const bool softcap = pr.transform.softcap_log2 > 0;
  block_gemm(Op::none, Op::none, cols, rows, p.head_dim, pr.transform.alpha, w.k.data(), w.k.ld(),
             w.q_t.data(), kBlockM, 0.0f, w.p.data(), kBlockM);
  if (softcap) {
    for (int j = 0; j < cols; ++j)
      for (int i = 0; i < rows; ++i) {
        const std::int64_t e = std::int64_t{j} * kBlockM + i;
        w.tanh_values[e] = std::tanh(w.p[e]);
        w.p[e] = pr.transform.softcap_log2 * w.tanh_values[e];
      }
  }
  block_gemm(Op::none, Op::none, cols, rows, p.head_dim_v, 1.0f, w.v.data(), w.v.ld(),
             w.dout_t.data(), kBlockM, 0.0f, w.ds.data(), kBlockM);

  if (avx512_forward_usable())
    probabilities_avx512(w, rows, cols);
  else
    probabilities(w, rows, cols);
  if (softcap) {
    for (int j = 0; j < cols; ++j) {
      float* ds = w.ds.data() + std::int64_t{j} * kBlockM;
      const float* t = w.tanh_values.data() + std::int64_t{j} * kBlockM;
      for (int i = 0; i < rows; ++i) ds[i] *= 1.0f - t[i] * t[i];
    }
  }
  // Hidden keys get exactly P = dS = 0 (their scores were not masked; dP = dO.V[j] is NaN when
  // V[j] is).
  if (!mask.is_full(r0, r0 + rows, c0, c0 + cols)) {
    for (int i = 0; i < rows; ++i) {
      const KeyRange keys = mask.keys(r0 + i);
      const std::int64_t begin = std::clamp<std::int64_t>(keys.begin - c0, 0, cols);
      const std::int64_t end = std::clamp<std::int64_t>(keys.end - c0, 0, cols);
      for (std::int64_t j = 0; j < cols; ++j) {
        if (j >= begin && j < end) continue;
        w.p[j * kBlockM + i] = 0.0f;
        w.ds[j * kBlockM + i] = 0.0f;
      }
    }
  }
}

// `out` and `dout` hold one row each (Dv floats).
void row_stats(const BackwardParams& p, const Inputs& in, const Sequence& seq, int head,
               RowStats& stats, Fp32Rows& out_row, Fp32Rows& dout_row) {
  float* lse_log2 = stats.lse_log2(seq, head);
  float* delta = stats.delta(seq, head);
  for (std::int64_t i = 0; i < seq.nq; ++i) {
    lse_log2[i] = p.lse[lse_offset(p, seq, i, head)] * kLog2e;
    out_row.load(in.out.data, p.dtype, in.out.q_first(seq, i, head), 0, 1, p.head_dim_v);
    dout_row.load(in.dout.data, p.dtype, in.dout.q_first(seq, i, head), 0, 1, p.head_dim_v);
    const float* o = out_row.data();
    const float* dout = dout_row.data();
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int d = 0; d < p.head_dim_v; ++d) sum += o[d] * dout[d];
    delta[i] = sum;
  }
}

// Both algorithms below walk one grid, query blocks at multiples of kBlockM and key blocks at
// multiples of kBlockN, and compute the pairs this says, in the same order for each
// accumulated block: their gradients are bitwise identical. Rows of [r0, r0 + rows) see keys
// forming one interval (keys_of_rows), so this is true exactly when some row sees some key.
bool pair_visible(const BlockMask& mask, std::int64_t r0, int rows, std::int64_t c0, int cols) {
  const KeyRange span = mask.keys_of_rows(r0, r0 + rows);
  return std::max(span.begin, c0) < std::min(span.end, c0 + cols);
}

std::int64_t first_key_block(const KeyRange& span) {
  return std::max<std::int64_t>(span.begin, 0) / kBlockN * kBlockN;
}

void store_key_rows(void* base, ElementType type, const Strides& stride, const Sequence& seq,
                    std::int64_t first, int rows, int head, const float* values, int dim) {
  for (int i = 0; i < rows; ++i)
    store_row(base, type, k_offset(stride, seq, first + i, head),
              values + static_cast<std::int64_t>(i) * dim, dim);
}

// The pair step on fp32 block products (AVX-512 microkernels or OpenBLAS): fp16/bf16 blocks
// converted to fp32 as they are loaded.
class Fp32Blocks {
 public:
  Fp32Blocks(const Problem& pr, std::int64_t /*cached_keys*/)
      : pr_(pr), w_(pr.params.dtype, pr.params.head_dim, pr.params.head_dim_v) {}

  void cache_keys(const Sequence&, int) {}  // the fp32 products read K in place

  void load_queries(const Sequence& seq, int head, std::int64_t r0, int rows) {
    load_query_block(pr_, seq, head, r0, rows, w_);
    r0_ = r0;
    rows_ = rows;
  }
  void load_keys(const Sequence& seq, int kv_head, std::int64_t c0, int cols) {
    load_key_block(pr_, seq, kv_head, c0, cols, w_);
    c0_ = c0;
    cols_ = cols;
  }
  void gradients(const BlockMask& mask) {
    mask_ = &mask;
    recompute_block(pr_, mask, r0_, rows_, c0_, cols_, w_);
  }
  // dV += P^T dO, dK += dS^T Q
  void add_dv_dk(float* dv, float* dk) {
    const int d = pr_.params.head_dim, dvd = pr_.params.head_dim_v;
    visible_product_by_key(*mask_, r0_, rows_, c0_, cols_, dvd, 1.0f, Op::transpose,
                           w_.p.data(), kBlockM, w_.dout.data(), w_.dout.ld(), dv, dvd);
    visible_product_by_key(*mask_, r0_, rows_, c0_, cols_, d, pr_.params.scale, Op::transpose,
                           w_.ds.data(), kBlockM, w_.q.data(), w_.q.ld(), dk, d);
  }
  // dQ += dS K
  void add_dq(float* dq) {
    const int d = pr_.params.head_dim;
    visible_product(*mask_, r0_, rows_, c0_, cols_, d, pr_.params.scale, Op::transpose,
                    w_.ds.data(), kBlockM, w_.k.data(), w_.k.ld(), dq, d);
  }

 private:
  const Problem& pr_;
  Scratch w_;
  const BlockMask* mask_ = nullptr;
  int rows_ = 0, cols_ = 0;
  std::int64_t r0_ = 0, c0_ = 0;
};

// The pair step on AMX tiles (bf16; amx_backward.cpp).
class AmxBlocks {
 public:
  AmxBlocks(const Problem& pr, std::int64_t cached_keys)
      : pr_(pr), blocks_(pr.params.head_dim, pr.params.head_dim_v, cached_keys) {}

  void cache_keys(const Sequence& seq, int kv_head) {
    blocks_.cache_keys(pr_.params, seq, kv_head);
  }

  void load_queries(const Sequence& seq, int head, std::int64_t r0, int rows) {
    blocks_.load_queries(pr_.params, seq, head, r0, rows, pr_.stats.lse_log2(seq, head) + r0,
                         pr_.stats.delta(seq, head) + r0);
  }
  void load_keys(const Sequence& seq, int kv_head, std::int64_t c0, int cols) {
    blocks_.load_keys(pr_.params, seq, kv_head, c0, cols);
  }
  void gradients(const BlockMask& mask) {
    blocks_.gradients(mask, pr_.transform.alpha, pr_.params.scale);
  }
  void add_dv_dk(float* dv, float* dk) { blocks_.add_dv_dk(dv, dk); }
  void add_dq(float* dq) { blocks_.add_dq(dq); }

 private:
  const Problem& pr_;
  const TileScope tiles_;  // the tile configuration is per thread
  AmxBackwardBlocks blocks_;
};

static_assert(AmxBackwardBlocks::kRows == kBlockM && AmxBackwardBlocks::kKeys == kBlockN);

// One thread's gradient accumulators: dK, dV rows of `key_rows` keys and dQ rows of one query
// block, with whole blocks of room (the AMX products write whole tiles).
struct Accumulators {
  Accumulators(const BackwardParams& p, std::int64_t key_rows)
      : dq(static_cast<std::size_t>(kBlockM) * p.head_dim),
        dk(static_cast<std::size_t>((key_rows + kBlockN - 1) / kBlockN * kBlockN) * p.head_dim),
        dv(dk.size() / p.head_dim * p.head_dim_v) {}
  AlignedVector<float> dq, dk, dv;  // on cache lines: AMX tiles load and store them
};

void store_dq(const BackwardParams& p, const Sequence& seq, int head, std::int64_t r0, int rows,
              const float* dq) {
  for (int i = 0; i < rows; ++i)
    store_row(p.dq, p.dtype, q_offset(p.dq_stride, seq, r0 + i, head),
              dq + static_cast<std::int64_t>(i) * p.head_dim, p.head_dim);
}

// Pass 1: dK and dV of keys [c0, c0 + cols) of one kv head, summed over its query heads.
template <class Blocks>
void dk_dv_block(const Problem& pr, const Sequence& seq, int kv_head, std::int64_t c0,
                 Blocks& blocks, Accumulators& acc) {
  const BackwardParams& p = pr.params;
  const int group = p.heads_q / p.heads_kv;
  const int cols = static_cast<int>(std::min<std::int64_t>(kBlockN, seq.nk - c0));
  std::fill(acc.dk.begin(), acc.dk.end(), 0.0f);
  std::fill(acc.dv.begin(), acc.dv.end(), 0.0f);
  const BlockMask mask(seq.nq, seq.nk, p.window_left, p.window_right);
  const RowRange rows_seen = mask.rows_of_keys(c0, c0 + cols);
  blocks.load_keys(seq, kv_head, c0, cols);

  for (int head = kv_head * group; head < (kv_head + 1) * group; ++head) {
    for (std::int64_t r0 = rows_seen.begin / kBlockM * kBlockM; r0 < rows_seen.end;
         r0 += kBlockM) {
      const int rows = static_cast<int>(std::min<std::int64_t>(kBlockM, seq.nq - r0));
      if (!pair_visible(mask, r0, rows, c0, cols)) continue;
      blocks.load_queries(seq, head, r0, rows);
      blocks.gradients(mask);
      blocks.add_dv_dk(acc.dv.data(), acc.dk.data());
    }
  }
  store_key_rows(p.dk, p.dtype, p.dk_stride, seq, c0, cols, kv_head, acc.dk.data(), p.head_dim);
  store_key_rows(p.dv, p.dtype, p.dv_stride, seq, c0, cols, kv_head, acc.dv.data(), p.head_dim_v);
}

// Pass 2: dQ of query rows [r0, r0 + kBlockM) of one head.
template <class Blocks>
void dq_block(const Problem& pr, const Sequence& seq, int head, std::int64_t r0, Blocks& blocks,
              Accumulators& acc) {
  const BackwardParams& p = pr.params;
  const int kv_head = head / (p.heads_q / p.heads_kv);
  const int rows = static_cast<int>(std::min<std::int64_t>(kBlockM, seq.nq - r0));
  std::fill(acc.dq.begin(), acc.dq.end(), 0.0f);
  const BlockMask mask(seq.nq, seq.nk, p.window_left, p.window_right);
  const KeyRange span = mask.keys_of_rows(r0, r0 + rows);
  blocks.load_queries(seq, head, r0, rows);

  for (std::int64_t c0 = first_key_block(span); c0 < span.end; c0 += kBlockN) {
    const int cols = static_cast<int>(std::min<std::int64_t>(kBlockN, seq.nk - c0));
    if (!pair_visible(mask, r0, rows, c0, cols)) continue;
    blocks.load_keys(seq, kv_head, c0, cols);
    blocks.gradients(mask);
    blocks.add_dq(acc.dq.data());
  }
  store_dq(p, seq, head, r0, rows, acc.dq.data());
}

// One task per (batch, kv head): dQ of its query heads and dK, dV of its keys, each score
// block computed once (5 block products, where the two passes above take 7). dK and dV
// accumulate over the whole sequence in the thread's accumulators.
template <class Blocks>
void fused_task(const Problem& pr, const Sequence& seq, int kv_head, Blocks& blocks,
                Accumulators& acc) {
  const BackwardParams& p = pr.params;
  const int d = p.head_dim, dvd = p.head_dim_v, group = p.heads_q / p.heads_kv;
  std::fill(acc.dk.begin(), acc.dk.end(), 0.0f);
  std::fill(acc.dv.begin(), acc.dv.end(), 0.0f);
  const BlockMask mask(seq.nq, seq.nk, p.window_left, p.window_right);
  blocks.cache_keys(seq, kv_head);

  for (int head = kv_head * group; head < (kv_head + 1) * group; ++head) {
    for (std::int64_t r0 = 0; r0 < seq.nq; r0 += kBlockM) {
      const int rows = static_cast<int>(std::min<std::int64_t>(kBlockM, seq.nq - r0));
      std::fill(acc.dq.begin(), acc.dq.end(), 0.0f);
      const KeyRange span = mask.keys_of_rows(r0, r0 + rows);
      blocks.load_queries(seq, head, r0, rows);
      for (std::int64_t c0 = first_key_block(span); c0 < span.end; c0 += kBlockN) {
        const int cols = static_cast<int>(std::min<std::int64_t>(kBlockN, seq.nk - c0));
        if (!pair_visible(mask, r0, rows, c0, cols)) continue;
        blocks.load_keys(seq, kv_head, c0, cols);
        blocks.gradients(mask);
        blocks.add_dv_dk(acc.dv.data() + c0 * dvd, acc.dk.data() + c0 * d);
        blocks.add_dq(acc.dq.data());
      }
      store_dq(p, seq, head, r0, rows, acc.dq.data());
    }
  }
  const int nk = static_cast<int>(seq.nk);
  store_key_rows(p.dk, p.dtype, p.dk_stride, seq, 0, nk, kv_head, acc.dk.data(), d);
  store_key_rows(p.dv, p.dtype, p.dv_stride, seq, 0, nk, kv_head, acc.dv.data(), dvd);
}

// The gradients, given the row statistics. Fused when (batch, kv head) tasks keep every thread
// busy (at least 2 each); otherwise the two passes, whose tasks are key blocks and query
// blocks. Same gradients either way.
template <class Blocks>
void walk_pairs(const Problem& problem) {
  const BackwardParams& p = problem.params;
  const std::int64_t fused_tasks = std::int64_t{p.batch} * p.heads_kv;
  if (fused_tasks >= 2 * std::int64_t{omp_get_max_threads()}) {
    std::int64_t max_nk = 0;
    for (int b = 0; b < p.batch; ++b) max_nk = std::max(max_nk, sequence_of(p, b).nk);
#pragma omp parallel
    {
      Blocks blocks(problem, max_nk);
      Accumulators acc(p, max_nk);
#pragma omp for schedule(dynamic)
      for (std::int64_t t = 0; t < fused_tasks; ++t) {
        const Sequence seq = sequence_of(p, static_cast<int>(t / p.heads_kv));
        fused_task(problem, seq, static_cast<int>(t % p.heads_kv), blocks, acc);
      }
    }
    return;
  }
  const std::int64_t key_blocks = (std::int64_t{p.seqlen_k} + kBlockN - 1) / kBlockN;
  const std::int64_t query_blocks = (std::int64_t{p.seqlen_q} + kBlockM - 1) / kBlockM;
  const std::int64_t kv_tasks = std::int64_t{p.batch} * p.heads_kv * key_blocks;
  const std::int64_t q_tasks = std::int64_t{p.batch} * p.heads_q * query_blocks;
#pragma omp parallel
  {
    Blocks blocks(problem, 0);
    Accumulators acc(p, kBlockN);
    // nowait: pass 2 does not read what pass 1 writes.
#pragma omp for schedule(dynamic) nowait
    for (std::int64_t t = 0; t < kv_tasks; ++t) {
      const int kv_head = static_cast<int>(t / key_blocks % p.heads_kv);
      const Sequence seq = sequence_of(p, static_cast<int>(t / key_blocks / p.heads_kv));
      const std::int64_t c0 = t % key_blocks * kBlockN;
      if (c0 < seq.nk) dk_dv_block(problem, seq, kv_head, c0, blocks, acc);
    }
#pragma omp for schedule(dynamic)
    for (std::int64_t t = 0; t < q_tasks; ++t) {
      const int head = static_cast<int>(t / query_blocks % p.heads_q);
      const Sequence seq = sequence_of(p, static_cast<int>(t / query_blocks / p.heads_q));
      const std::int64_t r0 = t % query_blocks * kBlockM;
      if (r0 < seq.nq) dq_block(problem, seq, head, r0, blocks, acc);
    }
  }
}

}  // namespace

void tiled_backward(const BackwardParams& p) {
  const SingleThreadedBlas single_threaded;
  const Inputs in{{p.q, p.q_stride, p.head_dim},
                  {p.k, p.k_stride, p.head_dim},
                  {p.v, p.v_stride, p.head_dim_v},
                  {p.out, p.out_stride, p.head_dim_v},
                  {p.dout, p.dout_stride, p.head_dim_v}};
  RowStats stats(p);
#pragma omp parallel
  {
    Fp32Rows out_row(p.dtype, 1, p.head_dim_v), dout_row(p.dtype, 1, p.head_dim_v);
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads_q; ++h)
        row_stats(p, in, sequence_of(p, b), h, stats, out_row, dout_row);
  }

  const Problem problem{p, in, stats, score_transform(p)};
  if (amx_backward_usable(p))
    walk_pairs<AmxBlocks>(problem);
  else
    walk_pairs<Fp32Blocks>(problem);
}

const char* tiled_backward_kernel_name(const BackwardParams& params) {
  return amx_backward_usable(params) ? "cpu_tiled_amx" : tiled_kernel_name(nullptr);
}

}  // namespace flashcpp::detail::cpu
