#pragma once
// Host side of the sm90a backward seen by the planner (cuda_backend.cu): which
// instantiations this build has, whether a call is covered, and the kernel names reported in
// RunInfo. The run-time switch FLASHCPP_DISABLE_SM90 is the forward's (fwd_dispatch.hpp).
//
// Not covered (the planner sends these to the sm80 backward): Nq = 0, deterministic calls with
// head_dim_v != head_dim, head_dim_v != head_dim without a pair instantiation
// (FLASHCPP_HEAD_DIM_PAIRS), head dims above the largest sm90 backward tile, and strides or
// pointers that a TMA descriptor cannot describe (every stride a multiple of 16 bytes, every
// base pointer 16-byte aligned; required of out, dq, dk and dv too, which the pre- and
// post-pass and the epilogue read and write in element pairs).
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <cuda_runtime.h>

#include "common/params.hpp"
#include "cuda/common/intern_name.hpp"
#include "cuda/common/kernel_registry.hpp"
#include "cuda/common/bwd_kernel_params.hpp"
#include "cuda/sm90/bwd_tile_scheduler.hpp"
#include "cuda/sm90/bwd_tile_table.hpp"
#include "cuda/sm90/fwd_dispatch.hpp"

namespace flashcpp::detail::cuda::sm90 {

// The sm90a backward main kernels this build contains. The generated bwd_sm90_registry.inc
// holds one FLASHCPP_SM90_BWD(dtype, hdim) line per instantiation (FLASHCPP_DTYPES x the head
// dims of FLASHCPP_HEAD_DIMS that have an sm90 backward tile, and only when
// FLASHCPP_CUDA_ARCHS contains 90a); each has a generated TU defining its entry point, which
// launches the sm90 pre-pass, the main kernel and the dq post-pass.
using BwdEntry = void (*)(const BwdKernelParams&, cudaStream_t);

#define FLASHCPP_SM90_BWD(dtype, tag, hdim, hdim_v) \
  void bwd_##dtype##_hdim##tag(const BwdKernelParams& kp, cudaStream_t stream);
#include "bwd_sm90_registry.inc"
#undef FLASHCPP_SM90_BWD

using BwdKernel = PairRegistryEntry<BwdEntry>;

#define FLASHCPP_SM90_BWD(dtype, tag, hdim, hdim_v) \
  {ElementType::dtype, hdim, hdim_v, &bwd_##dtype##_hdim##tag},
inline constexpr BwdKernel kBwdKernels[] = {
#include "bwd_sm90_registry.inc"
    kPairRegistrySentinel<BwdEntry>};
#undef FLASHCPP_SM90_BWD

// The smallest instantiation of this dtype whose head dims cover the call's (smaller head dims
// run zero-padded: the TMA descriptors carry the real head dims and fill the rest with zeros);
// D != Dv calls only on the D != Dv instantiations.
inline const BwdKernel* find_bwd_kernel(const ForwardParams& p) {
  return smallest_covering_pair(kBwdKernels, p.dtype, p.head_dim, p.head_dim_v);
}

// The tile of an instantiation.
inline Sm90BwdTile bwd_tile_of(const BwdKernel& k) {
  return sm90_bwd_tile(k.head_dim, k.head_dim_v);
}

// True when the sm90 backward main kernel can run this call.
inline bool bwd_covers(const BackwardParams& p) {
  if (p.dtype != ElementType::fp16 && p.dtype != ElementType::bf16) return false;
  if (p.deterministic && p.head_dim_v != p.head_dim) return false;  // not built for pairs yet
  if (p.is_varlen() && (p.total_rows_q > INT_MAX || p.total_rows_k > INT_MAX)) return false;
  // No query rows: nothing for TMA to describe (q may have no storage); sm80 writes the zero
  // dk, dv.
  if (p.seqlen_q <= 0) return false;
  // dq, dk and dv take paired (4-byte) stores: even head dims keep them aligned.
  if (p.head_dim % 2 != 0 || p.head_dim_v % 2 != 0 || find_bwd_kernel(p) == nullptr)
    return false;
  const int nq = tma_rows_q(p), nk = tma_rows_k(p), hq = p.heads_q, hk = p.heads_kv,
            b = tma_batches(p);
  return tma_compatible(p.q, p.q_stride, nq, hq, b) &&
         tma_compatible(p.k, p.k_stride, nk, hk, b) &&
         tma_compatible(p.v, p.v_stride, nk, hk, b) &&
         tma_compatible(p.dout, p.dout_stride, nq, hq, b) &&
         tma_compatible(p.out, p.out_stride, nq, hq, b) &&
         tma_compatible(p.dq, p.dq_stride, nq, hq, b) &&
         tma_compatible(p.dk, p.dk_stride, nk, hk, b) &&
         tma_compatible(p.dv, p.dv_stride, nk, hk, b);
}

inline int bwd_num_n_blocks(const ForwardParams& p, const BwdKernel& k) {
  const int block_n = bwd_tile_of(k).block_n;
  return int((std::int64_t(p.seqlen_k) + block_n - 1) / block_n);
}

// FLASHCPP_SM90_BWD_TICKET_GROUP=G (read once; G >= 1) replaces the rule below, for tuning it.
// The bits of dq do not depend on the group: it orders the CTAs' start, not the additions.
inline int bwd_ticket_group_from_env() {
  static const int group = [] {
    const char* v = std::getenv("FLASHCPP_SM90_BWD_TICKET_GROUP");
    return v != nullptr ? std::atoi(v) : 0;
  }();
  return group;
}

// The (kv head, batch) pairs the deterministic kernel's tickets interleave
// (bwd_tile_scheduler.hpp); the backward's elements are fp16 or bf16.
inline int bwd_ticket_head_group(const ForwardParams& p, const BwdKernel& k, int sm_count,
                                 std::int64_t l2_bytes) {
  if (const int forced = bwd_ticket_group_from_env(); forced >= 1) {
    const std::int64_t pairs = std::int64_t(p.heads_kv) * p.batch;
    return int(forced < pairs ? forced : pairs);
  }
  return ticket_head_group(
      p.heads_q, p.heads_kv, p.batch, p.seqlen_q, bwd_tile_of(k).block_m, sm_count,
      ticket_pair_bytes(p.heads_q, p.heads_kv, p.seqlen_q, p.head_dim, /*element_bytes=*/2),
      l2_bytes);
}

// RunInfo::kernel, e.g. "sm90_bwd_bf16_hdim128_64x128_s2_ws" ("..._hdim192x128_..." for D 192,
// Dv 128) or, deterministic, "sm90_bwd_bf16_hdim128_64x128_s2_ws_deterministic".
inline const char* bwd_kernel_name(const BwdKernel& k, bool deterministic) {
  const Sm90BwdTile t = bwd_tile_of(k);
  return intern_name(std::string("sm90_bwd_") + dtype_name(k.dtype) +
                     "_hdim" + head_dim_tag(k) + "_" + std::to_string(t.block_m) +
                     "x" + std::to_string(t.block_n) + "_s" + std::to_string(t.stages) + "_ws" +
                     (deterministic ? "_deterministic" : ""));
}

}  // namespace flashcpp::detail::cuda::sm90
