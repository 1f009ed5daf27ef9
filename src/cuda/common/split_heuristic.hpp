#pragma once
// How many KV splits a forward call should use (flash-decoding). Host only.
// Splitting pays when batch * heads * query tiles leaves SMs idle (decode: one query tile per
// head). Pick the smallest split count whose wave efficiency (CTAs / (waves * SMs)) is within
// 85% of the best achievable, so we do not pay the combine for a marginal gain.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace flashcpp::detail::cuda {

inline int split_heuristic(std::int64_t batch_heads_mblocks, int n_blocks, int num_sms,
                           int max_splits = 128) {
  if (num_sms <= 0 || batch_heads_mblocks >= std::int64_t(0.8 * num_sms)) return 1;
  // Few key blocks: each split would do too little work to hide its launch and combine cost.
  if (n_blocks <= 4) return 1;
  max_splits = std::min({max_splits, num_sms, n_blocks});
  auto efficiency = [&](int s) {
    const double waves = double(batch_heads_mblocks) * s / num_sms;
    return waves / std::ceil(waves);
  };
  auto eligible = [&](int s) {  // s splits that each get a distinct block count
    const int per_split = (n_blocks + s - 1) / s;
    return s == 1 || per_split != (n_blocks + s - 2) / (s - 1);
  };
  double best = 0.0;
  for (int s = 1; s <= max_splits; ++s)
    if (eligible(s)) best = std::max(best, efficiency(s));
  for (int s = 1; s <= max_splits; ++s)
    if (eligible(s) && efficiency(s) >= 0.85 * best) return s;
  return 1;
}

}  // namespace flashcpp::detail::cuda
