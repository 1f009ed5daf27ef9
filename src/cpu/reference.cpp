// The float64 reference: materialises S and P for each (batch, head) and follows the contract
// literally. It is the oracle the tests compare every other implementation against, so it
// favours obviousness over speed.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/mask.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/element_io.hpp"
#include "cpu/sequence.hpp"

namespace flashcpp::detail::cpu {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Rows [first, first + rows) of one head of a [batch, row, head, dim] tensor, as float64.
// `factor` is an fp8 tensor's descale (1 otherwise); the product is exact in float64.
std::vector<double> load_rows(const void* base, ElementType type, const Strides& stride, int batch,
                              std::int64_t first, std::int64_t rows, int head, int dim,
                              double factor = 1.0) {
  std::vector<double> out(static_cast<std::size_t>(rows * dim));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t offset =
        batch * stride.batch + (first + r) * stride.row + head * stride.head;
    for (int d = 0; d < dim; ++d) out[r * dim + d] = load_element(base, type, offset + d) * factor;
  }
  return out;
}

void store_rows(void* base, ElementType type, const Strides& stride, int batch, std::int64_t first,
                std::int64_t rows, int head, int dim, const std::vector<double>& values) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t offset =
        batch * stride.batch + (first + r) * stride.row + head * stride.head;
    for (int d = 0; d < dim; ++d)
      store_element(base, type, offset + d, static_cast<float>(values[r * dim + d]));
  }
}

double dot(const double* a, const double* b, int n) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// The score matrix [nq, nk]: s = scale * q.k, softcapped, -inf where the key is not visible.
// With a softcap, `tanh_out` receives tanh(scale * q.k / c), from which backward gets the
// derivative ds/d(scale * q.k) = 1 - tanh^2.
std::vector<double> scores(const ForwardParams& p, const Sequence& seq,
                           const std::vector<double>& q, const std::vector<double>& k,
                           std::vector<double>* tanh_out) {
  const std::int64_t nq = seq.nq, nk = seq.nk;
  std::vector<double> s(static_cast<std::size_t>(nq * nk), -kInf);
  if (tanh_out) tanh_out->assign(s.size(), 0.0);
  const WindowMask mask(int(nq), int(nk), p.window_left, p.window_right);
  for (std::int64_t i = 0; i < nq; ++i) {
    const KeyRange keys = mask.keys(i);
    for (std::int64_t j = keys.begin; j < keys.end; ++j) {
      double x = double{p.scale} * dot(&q[i * p.head_dim], &k[j * p.head_dim], p.head_dim);
      if (p.softcap > 0) {
        const double t = std::tanh(x / p.softcap);
        if (tanh_out) (*tanh_out)[i * nk + j] = t;
        x = p.softcap * t;
      }
      s[i * nk + j] = x;
    }
  }
  return s;
}

void forward_head(const ForwardParams& p, const Sequence& seq, int head) {
  const int kv_head = head / (p.heads_q / p.heads_kv);
  const int dv = p.head_dim_v;
  const std::int64_t nq = seq.nq, nk = seq.nk;
  // fp8 inputs are dequantised exactly: q * q_descale, k * k_descale, v * v_descale.
  const auto q = load_rows(p.q, p.q_dtype, p.q_stride, seq.batch, seq.q_begin, nq, head,
                           p.head_dim, p.q_descale.at(seq.batch, kv_head));
  const auto k = load_rows(p.k, p.kv_dtype, p.k_stride, seq.batch, seq.k_begin, nk, kv_head,
                           p.head_dim, p.k_descale.at(seq.batch, kv_head));
  const auto v = load_rows(p.v, p.kv_dtype, p.v_stride, seq.batch, seq.k_begin, nk, kv_head, dv,
                           p.v_descale.at(seq.batch, kv_head));
  const auto s = scores(p, seq, q, k, nullptr);

  std::vector<double> out(static_cast<std::size_t>(nq * dv), 0.0);
  const WindowMask mask(int(nq), int(nk), p.window_left, p.window_right);
  for (std::int64_t i = 0; i < nq; ++i) {
    // Only the visible keys: a hidden key contributes nothing, even NaN or Inf in its v.
    const KeyRange keys = mask.keys(i);
    const double* row = s.data() + i * nk;  // nk may be 0
    double max = -kInf;
    bool nan = false;
    for (std::int64_t j = keys.begin; j < keys.end; ++j) {
      max = std::max(max, row[j]);
      nan = nan || std::isnan(row[j]);
    }
    double lse = -kInf;
    if (nan) {  // a NaN score makes the row NaN (std::max would skip it)
      lse = std::numeric_limits<double>::quiet_NaN();
      for (int d = 0; d < dv; ++d) out[i * dv + d] = lse;
    } else if (max > -kInf) {
      double sum = 0;
      for (std::int64_t j = keys.begin; j < keys.end; ++j) sum += std::exp(row[j] - max);
      lse = max + std::log(sum);
      for (std::int64_t j = keys.begin; j < keys.end; ++j) {
        const double prob = std::exp(row[j] - lse);
        for (int d = 0; d < dv; ++d) out[i * dv + d] += prob * v[j * dv + d];
      }
    }
    if (p.lse) p.lse[lse_offset(p, seq, i, head)] = static_cast<float>(lse);
  }
  store_rows(p.out, p.dtype, p.out_stride, seq.batch, seq.q_begin, nq, head, dv, out);
}

// Gradients of one kv head: its query heads' dq, and dk/dv summed over those query heads.
void backward_kv_head(const BackwardParams& p, const Sequence& seq, int kv_head) {
  const int group = p.heads_q / p.heads_kv;
  const int d = p.head_dim, dv = p.head_dim_v;
  const std::int64_t nq = seq.nq, nk = seq.nk;
  const auto k = load_rows(p.k, p.dtype, p.k_stride, seq.batch, seq.k_begin, nk, kv_head, d);
  const auto v = load_rows(p.v, p.dtype, p.v_stride, seq.batch, seq.k_begin, nk, kv_head, dv);
  std::vector<double> dk(static_cast<std::size_t>(nk * d), 0.0);
  std::vector<double> dv_acc(static_cast<std::size_t>(nk * dv), 0.0);

  for (int head = kv_head * group; head < (kv_head + 1) * group; ++head) {
    const auto q = load_rows(p.q, p.dtype, p.q_stride, seq.batch, seq.q_begin, nq, head, d);
    const auto o = load_rows(p.out, p.dtype, p.out_stride, seq.batch, seq.q_begin, nq, head, dv);
    const auto dout =
        load_rows(p.dout, p.dtype, p.dout_stride, seq.batch, seq.q_begin, nq, head, dv);
    std::vector<double> tanh_values;
    const auto s = scores(p, seq, q, k, &tanh_values);
    std::vector<double> dq(static_cast<std::size_t>(nq * d), 0.0);

    for (std::int64_t i = 0; i < nq; ++i) {
      const double lse = p.lse[lse_offset(p, seq, i, head)];
      if (lse == -kInf) continue;  // no visible key: the row contributes nothing
      const double delta = dot(&dout[i * dv], &o[i * dv], dv);  // D_i = rowsum(dO * O)
      for (std::int64_t j = 0; j < nk; ++j) {
        if (s[i * nk + j] == -kInf) continue;
        const double prob = std::exp(s[i * nk + j] - lse);
        const double dp = dot(&dout[i * dv], &v[j * dv], dv);
        double ds = prob * (dp - delta);
        if (p.softcap > 0) ds *= 1.0 - tanh_values[i * nk + j] * tanh_values[i * nk + j];
        ds *= p.scale;
        for (int c = 0; c < dv; ++c) dv_acc[j * dv + c] += prob * dout[i * dv + c];
        for (int c = 0; c < d; ++c) {
          dq[i * d + c] += ds * k[j * d + c];
          dk[j * d + c] += ds * q[i * d + c];
        }
      }
    }
    store_rows(p.dq, p.dtype, p.dq_stride, seq.batch, seq.q_begin, nq, head, d, dq);
  }
  store_rows(p.dk, p.dtype, p.dk_stride, seq.batch, seq.k_begin, nk, kv_head, d, dk);
  store_rows(p.dv, p.dtype, p.dv_stride, seq.batch, seq.k_begin, nk, kv_head, dv, dv_acc);
}

}  // namespace

void reference_forward(const ForwardParams& p) {
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads_q; ++h) forward_head(p, sequence_of(p, b), h);
}

// Parallel over (batch, kv head): each task owns its dk/dv rows and its query heads' dq rows,
// so nothing is shared between threads.
void reference_backward(const BackwardParams& p) {
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < p.batch; ++b)
    for (int g = 0; g < p.heads_kv; ++g) backward_kv_head(p, sequence_of(p, b), g);
}

}  // namespace flashcpp::detail::cpu
