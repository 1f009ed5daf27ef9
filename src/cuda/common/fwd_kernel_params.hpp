#pragma once
// What a forward kernel receives: the validated ForwardParams plus the launch decisions taken on
// the host (split count, workspace pointers, folded scales). Plain data, passed by value.
#include <cstdint>

#include "common/params.hpp"

namespace flashcpp::detail::cuda {

struct FwdKernelParams {
  ForwardParams p;
  // Split-KV: num_splits > 1 writes fp32 partial O [split, b, h, row, Dv] and partial lse
  // [split, b, h, row] (row < seqlen_q, the max for varlen) that the combine kernel merges.
  int num_splits = 1;
  int n_blocks_per_split = 0;  // key blocks each split covers (from the max seqlen_k)
  float* o_accum = nullptr;
  float* lse_accum = nullptr;
  bool overlap_combine = false;  // sm90+: the combine is a programmatic dependent launch
  int num_m_blocks = 0;
  // sm90a: the call runs its tile row's short-call key block (sm90_fwd_short_call) or its
  // long-call tile (sm90_fwd_long_call).
  bool short_tile = false;
  bool long_tile = false;
  // sm90a varlen: the dynamic tile deal's counter (one int of the workspace, zeroed before the
  // launch); null deals the tiles statically.
  int* tile_counter = nullptr;
  // exp2 is applied to s * scale_log2 - max * scale_log2 (one FFMA). Without softcap
  // scale_log2 = scale * log2(e); with softcap the tanh already consumed scale/softcap and
  // scale_log2 = softcap * log2(e). lse_scale is the same factor in natural-log units.
  float scale_log2 = 0.f;
  float lse_scale = 0.f;
  float softcap_in_scale = 0.f;  // scale / softcap, 0 without softcap
  // sm90a FP8: the workspace's V^T (sm90/fp8_vt_layout.hpp), written by the pre-pass.
  std::uint8_t* fp8_v_t = nullptr;
  // sm90a FP8: the NaN key bits after V^T (same file), written by the pre-pass.
  std::uint32_t* fp8_v_nan_keys = nullptr;
  // A paged KV cache's block table (prefill with a cache on the forward kernels); unused by the
  // other instantiations. Last, so the members above keep their offsets.
  PagedKV paged;
};

// Element counts of the split-KV workspace (floats).
inline std::int64_t split_o_accum_elems(const ForwardParams& p, int splits) {
  return std::int64_t(splits) * p.batch * p.heads_q * std::int64_t(p.seqlen_q) * p.head_dim_v;
}
inline std::int64_t split_lse_accum_elems(const ForwardParams& p, int splits) {
  return std::int64_t(splits) * p.batch * p.heads_q * std::int64_t(p.seqlen_q);
}

}  // namespace flashcpp::detail::cuda
