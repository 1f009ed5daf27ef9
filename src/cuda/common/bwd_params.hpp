#pragma once
// What the sm80 backward kernels get: the validated call plus the host-folded scales and the
// workspace carve-up (dq_accum [B, Hq, Nq, D] fp32, then dsum and lse_log2 [B, Hq, Nq] fp32).
#include <cstdint>

#include "common/params.hpp"

namespace flashcpp::detail::cuda {

struct BwdKernelParams {
  BackwardParams p;
  float scale_log2 = 0.f;        // exp2 takes s * scale_log2 - lse_log2 (softcap: tanh(.) * c * log2e)
  float softcap_in_scale = 0.f;  // softcap: tanh takes x * scale / c
  float* dq_accum = nullptr;     // [B, Hq, Nq, head_dim] fp32, zeroed by the pre-pass
  float* dsum = nullptr;         // [B, Hq, Nq]: rowsum(dO * O)
  float* lse_log2 = nullptr;     // [B, Hq, Nq]: lse * log2(e); +inf where lse = -inf (P = 0)
  int num_n_blocks = 0;
  bool vec8 = false;             // q/k/v/dout loads can move 8 elements (16 bytes) at a time
};

// Elements of each workspace array (the byte size is their sum times 4).
inline std::int64_t bwd_rows(const ForwardParams& p) {
  return std::int64_t(p.batch) * p.heads_q * p.seqlen_q;
}
inline std::uint64_t bwd_workspace_bytes(const ForwardParams& p) {
  return std::uint64_t(bwd_rows(p)) * std::uint64_t(p.head_dim + 2) * sizeof(float);
}

}  // namespace flashcpp::detail::cuda
