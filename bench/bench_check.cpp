// The benchmark's correctness check: the float64 reference (Backend::cpu_reference) on exact
// fp32 copies of the inputs. Small problems are checked whole; large ones on sampled rows:
// a query row i sees keys [begin, end) by the mask rule, so its out/lse/dq equal those of an
// unmasked problem with that one row and those keys; a key j is seen by an interval of rows,
// and its dk/dv follow from those rows given the true lse (the reference backward uses lse).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>

#include "bench_tensors.hpp"
#include "common/mask.hpp"

namespace flashcpp::bench {
namespace {

// Max error allowed, times max(1, max |ref|): fp32 accumulation (1e-4), or the output dtype's
// rounding with margin (fp16 2^-11 -> 4e-3, bf16 2^-8 -> 3e-2).
double tolerance(DType dtype) {
  return dtype == DType::fp32 ? 1e-4 : dtype == DType::fp16 ? 4e-3 : 3e-2;
}

struct Stat {
  double max_err = 0;
  double ref_max = 0;
  std::int64_t non_finite = 0;
  void add(double x, double ref) {
    if (std::isinf(ref) && x == ref) return;  // -inf lse of a row with no visible key
    if (!std::isfinite(x)) {
      ++non_finite;
      return;
    }
    max_err = std::max(max_err, std::fabs(x - ref));
    ref_max = std::max(ref_max, std::fabs(ref));
  }
  bool ok(double tol) const { return non_finite == 0 && max_err <= tol * std::max(1.0, ref_max); }
};

HostBuffer fp32_copy(const HostBuffer& src) {
  HostBuffer dst(DType::fp32, src.shape());
  for (std::int64_t i = 0; i < src.numel(); ++i) dst.set(i, src.get(i));
  return dst;
}

// Copies rows [r0, r0 + n) and heads [h0, h0 + nh) of batch b of a [B, N, H, X] tensor into a
// fresh fp32 [1, n, nh, X] tensor.
HostBuffer gather(const HostBuffer& src, std::int64_t b, std::int64_t r0, std::int64_t n,
                  std::int64_t h0, std::int64_t nh) {
  const auto& s = src.shape();
  HostBuffer dst(DType::fp32, {1, n, nh, s[3]});
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t x = 0; x < s[3]; ++x)
        dst.set((r * nh + h) * s[3] + x, src.get(((b * s[1] + r0 + r) * s[2] + h0 + h) * s[3] + x));
  return dst;
}

std::string stat_text(const char* name, const Stat& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s max abs err %.3g (max |ref| %.3g%s)", name, s.max_err,
                s.ref_max, s.non_finite ? ", NON-FINITE values" : "");
  return buf;
}

void finish(CheckResult& r, double tol, std::initializer_list<std::pair<const char*, Stat>> stats) {
  r.done = true;
  std::string details;
  for (const auto& [name, s] : stats) {
    r.ok = r.ok && s.ok(name[0] == 'l' ? 1e-3 : tol);  // lse is fp32 in every dtype
    r.max_abs_err = std::max(r.max_abs_err, name[0] == 'l' ? 0.0 : s.max_err);
    details += (details.empty() ? "" : ", ") + stat_text(name, s);
  }
  r.details = details;
}

CheckResult check_forward_full(const Problem& p, const Tensors& t) {
  HostBuffer q = fp32_copy(t.q), k = fp32_copy(t.k), v = fp32_copy(t.v);
  HostBuffer out(DType::fp32, t.out.shape()), lse(DType::fp32, t.lse.shape());
  const TensorView lse_view = lse.view();
  forward(q.view(), k.view(), v.view(), out.view(), &lse_view, p.options(Backend::cpu_reference));
  Stat so, sl;
  for (std::int64_t i = 0; i < out.numel(); ++i) so.add(t.out.get(i), out.get(i));
  for (std::int64_t i = 0; i < lse.numel(); ++i) sl.add(t.lse.get(i), lse.get(i));
  CheckResult r;
  r.scope = "every output";
  finish(r, tolerance(p.dtype), {{"out", so}, {"lse", sl}});
  return r;
}

CheckResult check_backward_full(const Problem& p, const Tensors& t) {
  HostBuffer q = fp32_copy(t.q), k = fp32_copy(t.k), v = fp32_copy(t.v);
  HostBuffer out = fp32_copy(t.out), dout = fp32_copy(t.dout), lse = t.lse;
  HostBuffer dq(DType::fp32, q.shape()), dk(DType::fp32, k.shape()), dv(DType::fp32, v.shape());
  backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(),
           dv.view(), p.options(Backend::cpu_reference));
  Stat sq, sk, sv;
  for (std::int64_t i = 0; i < dq.numel(); ++i) sq.add(t.dq.get(i), dq.get(i));
  for (std::int64_t i = 0; i < dk.numel(); ++i) sk.add(t.dk.get(i), dk.get(i));
  for (std::int64_t i = 0; i < dv.numel(); ++i) sv.add(t.dv.get(i), dv.get(i));
  CheckResult r;
  r.scope = "every gradient";
  finish(r, tolerance(p.dtype), {{"dq", sq}, {"dk", sk}, {"dv", sv}});
  return r;
}

// Unmasked options with the problem's scale and softcap: the mask is applied by slicing.
AttentionOptions unmasked(const Problem& p) {
  AttentionOptions o;
  o.backend = Backend::cpu_reference;
  o.softcap = p.softcap;
  o.softmax_scale = p.scale();
  return o;
}

CheckResult check_sampled(const Problem& p, const Tensors& t, std::int64_t samples) {
  const int right = p.causal ? 0 : p.window_right;
  const int group = p.heads / p.heads_kv;
  std::mt19937_64 rng(p.seed + 12345);
  const auto pick = [&rng](std::int64_t n, std::int64_t s, std::int64_t last) {
    // corner samples first (the first and last row of the first and last slice), then random
    if (s == 0) return std::int64_t{0};
    if (s == 1) return last;
    return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n));
  };
  Stat so, sl, sq, sk, sv;
  const std::int64_t rows = std::int64_t{p.batch} * p.heads * p.seqlen_q;
  for (std::int64_t s = 0; s < samples; ++s) {
    const std::int64_t flat = pick(rows, s, rows - 1);
    const std::int64_t b = flat / (std::int64_t{p.heads} * p.seqlen_q);
    const int h = static_cast<int>(flat / p.seqlen_q % p.heads);
    const std::int64_t i = flat % p.seqlen_q;
    const int g = h / group;
    const auto keys = detail::WindowMask(p.seqlen_q, p.seqlen_k, p.window_left, right).keys(i);
    const std::int64_t n = std::max<std::int64_t>(0, keys.end - keys.begin);
    const std::int64_t lse_index = (b * p.heads + h) * p.seqlen_q + i;
    if (n == 0) {  // contract: out = 0, lse = -inf, dq = 0
      for (int d = 0; d < p.head_dim_v; ++d)
        so.add(t.out.get(((b * p.seqlen_q + i) * p.heads + h) * p.head_dim_v + d), 0.0);
      sl.add(t.lse.get(lse_index), -INFINITY);
      if (p.mode == Mode::bwd)
        for (int d = 0; d < p.head_dim; ++d)
          sq.add(t.dq.get(((b * p.seqlen_q + i) * p.heads + h) * p.head_dim + d), 0.0);
      continue;
    }
    HostBuffer q = gather(t.q, b, i, 1, h, 1);
    HostBuffer k = gather(t.k, b, keys.begin, n, g, 1);
    HostBuffer v = gather(t.v, b, keys.begin, n, g, 1);
    HostBuffer out(DType::fp32, {1, 1, 1, p.head_dim_v}), lse(DType::fp32, {1, 1, 1});
    if (p.mode == Mode::fwd) {
      const TensorView lse_view = lse.view();
      forward(q.view(), k.view(), v.view(), out.view(), &lse_view, unmasked(p));
      for (int d = 0; d < p.head_dim_v; ++d)
        so.add(t.out.get(((b * p.seqlen_q + i) * p.heads + h) * p.head_dim_v + d), out.get(d));
      sl.add(t.lse.get(lse_index), lse.get(0));
      continue;
    }
    // bwd: dq of row i, given the backend's out, lse and dout for that row.
    out = gather(t.out, b, i, 1, h, 1);
    HostBuffer dout = gather(t.dout, b, i, 1, h, 1);
    lse.set(0, t.lse.get(lse_index));
    HostBuffer dq(DType::fp32, q.shape()), dk(DType::fp32, k.shape()), dv(DType::fp32, v.shape());
    backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(),
             dk.view(), dv.view(), unmasked(p));
    for (int d = 0; d < p.head_dim; ++d)
      sq.add(t.dq.get(((b * p.seqlen_q + i) * p.heads + h) * p.head_dim + d), dq.get(d));
    // dk/dv of a key j of the same slice: the rows that see j form an interval [r0, r1).
    const std::int64_t j = pick(p.seqlen_k, s, p.seqlen_k - 1);
    std::int64_t r0 = p.seqlen_q, r1 = 0;
    for (std::int64_t r = 0; r < p.seqlen_q; ++r) {
      const auto kr = detail::WindowMask(p.seqlen_q, p.seqlen_k, p.window_left, right).keys(r);
      if (kr.begin <= j && j < kr.end) {
        r0 = std::min(r0, r);
        r1 = r + 1;
      }
    }
    const std::int64_t dk_index = ((b * p.seqlen_k + j) * p.heads_kv + g);
    if (r0 >= r1) {  // a key nobody sees: zero gradients
      for (int d = 0; d < p.head_dim; ++d) sk.add(t.dk.get(dk_index * p.head_dim + d), 0.0);
      for (int d = 0; d < p.head_dim_v; ++d) sv.add(t.dv.get(dk_index * p.head_dim_v + d), 0.0);
      continue;
    }
    const std::int64_t m = r1 - r0;
    HostBuffer qs = gather(t.q, b, r0, m, std::int64_t{g} * group, group);
    HostBuffer ks = gather(t.k, b, j, 1, g, 1), vs = gather(t.v, b, j, 1, g, 1);
    HostBuffer os = gather(t.out, b, r0, m, std::int64_t{g} * group, group);
    HostBuffer dos = gather(t.dout, b, r0, m, std::int64_t{g} * group, group);
    HostBuffer ls(DType::fp32, {1, group, m});
    for (int hh = 0; hh < group; ++hh)
      for (std::int64_t r = 0; r < m; ++r)
        ls.set(hh * m + r, t.lse.get((b * p.heads + g * group + hh) * p.seqlen_q + r0 + r));
    HostBuffer dqs(DType::fp32, qs.shape()), dks(DType::fp32, ks.shape()), dvs(DType::fp32, vs.shape());
    backward(qs.view(), ks.view(), vs.view(), os.view(), dos.view(), ls.view(), dqs.view(),
             dks.view(), dvs.view(), unmasked(p));
    for (int d = 0; d < p.head_dim; ++d) sk.add(t.dk.get(dk_index * p.head_dim + d), dks.get(d));
    for (int d = 0; d < p.head_dim_v; ++d) sv.add(t.dv.get(dk_index * p.head_dim_v + d), dvs.get(d));
  }
  CheckResult r;
  std::ostringstream scope;
  if (p.mode == Mode::fwd)
    scope << samples << " sampled (batch, head, query) rows of " << rows << " (out and lse)";
  else
    scope << samples << " sampled query rows (dq) and key rows (dk, dv) of " << rows;
  r.scope = scope.str();
  if (p.mode == Mode::fwd)
    finish(r, tolerance(p.dtype), {{"out", so}, {"lse", sl}});
  else
    finish(r, tolerance(p.dtype), {{"dq", sq}, {"dk", sk}, {"dv", sv}});
  return r;
}

}  // namespace

CheckResult check_against_reference(const Problem& p, const Tensors& t, double full_budget,
                                    double sample_budget) {
  const double per_row = static_cast<double>(p.seqlen_k) * (p.head_dim + p.head_dim_v) *
                         (p.mode == Mode::fwd ? 1.0 : 3.0);
  const double rows = static_cast<double>(p.batch) * p.heads * p.seqlen_q;
  if (rows == 0) {
    CheckResult r;
    r.done = true;
    r.scope = "nothing (empty problem)";
    return r;
  }
  if (rows * per_row <= full_budget)
    return p.mode == Mode::fwd ? check_forward_full(p, t) : check_backward_full(p, t);
  // Each sampled row costs one row of the reference (plus, bwd, the rows that see one key).
  const double key_cost = 3.0 * p.seqlen_q * (p.heads / p.heads_kv) * (p.head_dim + p.head_dim_v);
  const double cost = p.mode == Mode::fwd ? per_row : per_row + key_cost;
  const auto samples = static_cast<std::int64_t>(std::clamp(sample_budget / cost, 64.0, rows));
  return check_sampled(p, t, samples);
}

}  // namespace flashcpp::bench
