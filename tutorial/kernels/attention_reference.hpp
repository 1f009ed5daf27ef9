#pragma once
// Float64 attention for one query row of the ladder's [B, H, N, D] fp32 layout: the check the
// ladder's tests (every row) and its benchmark (sampled rows) compare the kernels against.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/ladder.hpp"

namespace flashcpp::ladder {

// Writes O[head, i, 0:D] into out_row (D values); causal keys are j <= i.
inline void attention_row_reference(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, const AttentionShape& s,
                                    std::size_t head, int i, double* out_row) {
  const int n = s.seqlen, d = s.head_dim;
  const double scale = 1.0 / std::sqrt(double(d));
  const std::size_t base = head * n * d;
  const int keys = s.causal ? i + 1 : n;
  std::vector<double> p(keys);
  double mx = -INFINITY, sum = 0;
  for (int j = 0; j < keys; ++j) {
    double dot = 0;
    for (int c = 0; c < d; ++c)
      dot += double(q[base + std::size_t(i) * d + c]) * k[base + std::size_t(j) * d + c];
    p[j] = dot * scale;
    mx = std::max(mx, p[j]);
  }
  for (int j = 0; j < keys; ++j) sum += (p[j] = std::exp(p[j] - mx));
  for (int c = 0; c < d; ++c) {
    double acc = 0;
    for (int j = 0; j < keys; ++j) acc += p[j] * v[base + std::size_t(j) * d + c];
    out_row[c] = acc / sum;
  }
}

}  // namespace flashcpp::ladder
