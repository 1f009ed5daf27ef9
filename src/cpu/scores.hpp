#pragma once
// Score blocks of the tiled backend, shared by forward and backward: S = Q K^T through a block
// product, then softcap and mask. Scores are kept in the log2 domain (multiplied by log2(e))
// so the softmax uses exp2, which folds into the product's alpha when there is no softcap.
#include <cstdint>

#include "common/params.hpp"
#include "cpu/block_mask.hpp"

namespace flashcpp::detail::cpu {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

struct ScoreTransform {
  float alpha;         // applied to q.k by the product: scale * log2(e), or scale / softcap
  float softcap_log2;  // softcap * log2(e); 0 when there is no softcap
};

inline ScoreTransform score_transform(const ForwardParams& p) {
  if (p.softcap > 0) return {p.scale / p.softcap, p.softcap * kLog2e};
  return {p.scale * kLog2e, 0.0f};
}

// The scores of query rows [r0, r0 + rows) against keys [c0, c0 + cols) into s (row-major,
// leading dimension cols), -inf where masked. `q` and `k` point at the first row of each block.
// With a softcap, `tanh_out` (if not null) receives tanh(scale * q.k / softcap), whose
// 1 - tanh^2 is the softcap's derivative in backward.
void block_scores(const float* q, std::int64_t ldq, const float* k, std::int64_t ldk, int dim,
                  const ScoreTransform& transform, const BlockMask& mask, std::int64_t r0, int rows,
                  std::int64_t c0, int cols, float* s, float* tanh_out);

}  // namespace flashcpp::detail::cpu
