#pragma once
// What the backward kernels (sm80 and sm90a, with their pre- and post-passes) get: the
// validated call plus the host-folded scales and the pointers into the caller's workspace (the
// fp32 dq_accum region, then dsum and lse_log2, each in the layout of the backend that runs:
// sm80 per row, sm90 in whole query blocks; then the sm90 deterministic kernel's counters;
// sizes in cuda/bwd_workspace.hpp).
#include <cstdint>

#include "common/params.hpp"

namespace flashcpp::detail::cuda {

// lse_log2 = lse * kLog2e: the backward kernels take exp2 of base-2 scores.
inline constexpr float kLog2e = 1.4426950408889634f;

struct BwdKernelParams {
  BackwardParams p;
  float scale_log2 = 0.f;        // exp2 takes s * scale_log2 - lse_log2 (softcap: tanh(.) * c * log2e)
  float softcap_in_scale = 0.f;  // softcap: tanh takes x * scale / c
  float* dq_accum = nullptr;     // fp32: sm80 [B, Hq, Nq, head_dim]; sm90 blocked (see
                                 // sm90/bwd_dq_convert.hpp). Unused by the sm80 deterministic
                                 // backward (its dq kernel writes dq directly)
  float* dsum = nullptr;         // [B, Hq, Nq]: rowsum(dO * O) (sm90: blocked, bwd_prepass.hpp)
  float* lse_log2 = nullptr;     // [B, Hq, Nq]: lse * log2(e); +inf where lse = -inf (P = 0)
  bool vec8 = false;             // q/k/v/dout loads can move 8 elements (16 bytes) at a time
  int num_n_blocks = 0;          // sm90 main kernel: key blocks per (kv head, batch) in its grid
  // sm90 deterministic backward (sm90/bwd_dq_order.hpp): one counter per dq_accum block (the
  // key blocks that have added to it), the CTA ticket counter (both zeroed by the pre-pass),
  // and how many (kv head, batch) pairs the tickets interleave.
  int* dq_semaphore = nullptr;
  int* tile_ticket = nullptr;
  int ticket_head_group = 1;
};

}  // namespace flashcpp::detail::cuda
