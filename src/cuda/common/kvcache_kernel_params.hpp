#pragma once
// What the KV-cache kernels (append, decode) receive: the validated call plus the host's
// decisions (split count, workspace pointers, folded scales). Plain data, passed by value.
#include <cstdint>

#include "common/params.hpp"

namespace flashcpp::detail::cuda {

struct KVCacheKernelParams {
  KVCacheParams p;
  int group = 1;        // query heads per kv head (Hq / Hkv)
  int rows = 0;         // rows of one (batch, kv head): Nnew * group, token-major
  int num_m_tiles = 0;  // ceil(rows / the kernel's rows per CTA)
  // Split-KV: num_splits > 1 writes fp32 partial O [split, b, h, token, Dv] and partial lse
  // [split, b, h, token] for the combine kernel; each split takes an equal share of the key
  // blocks of its sequence's real length (read on the device).
  int num_splits = 1;
  float* o_accum = nullptr;
  float* lse_accum = nullptr;
  bool overlap_combine = false;  // sm90+: the combine is a programmatic dependent launch
  // As FwdKernelParams: exp2 takes s * scale_log2 - max * scale_log2; with softcap tanh takes
  // s * softcap_in_scale first; lse_scale converts a row max back to natural-log units.
  float scale_log2 = 0.f;
  float lse_scale = 0.f;
  float softcap_in_scale = 0.f;
};

}  // namespace flashcpp::detail::cuda
