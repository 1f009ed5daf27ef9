#pragma once
// The online softmax's per-row reference max, moved lazily: a row keeps the max it has unless
// a block's max passes it by more than kMaxSlack (log2 units), or it had none (-inf). The
// probabilities then stay below 2^kMaxSlack (no overflow: p * V and the row sums stay far
// inside fp32), and the output, whose rescaling is a pass over all its columns, is rescaled
// only where the reference moved. lse = reference + log2(sum) holds for any reference.
#include <immintrin.h>

namespace flashcpp::detail::cpu {

inline constexpr float kMaxSlack = 8.0f;

// old_max: the rows' references (-inf: none yet); block_max: the block's scaled max (-inf
// where the rows see nothing, never NaN).
[[gnu::target("avx512f")]] inline __m512 next_reference_max(__m512 old_max, __m512 block_max) {
  const __mmask16 moved = _mm512_cmp_ps_mask(
      block_max, _mm512_add_ps(old_max, _mm512_set1_ps(kMaxSlack)), _CMP_GT_OQ);
  return _mm512_mask_mov_ps(old_max, moved, block_max);
}

}  // namespace flashcpp::detail::cpu
