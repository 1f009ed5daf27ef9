#pragma once
// Attention against a KV cache: decode, speculative verification and chunked prefill.
//
//   q          [B, Nnew, Hq, D]     the new tokens' queries
//   k_cache    [B, Nmax, Hkv, D]    contiguous cache, or
//              [num_pages, page_size, Hkv, D] paged cache with `block_table`
//   v_cache    as k_cache with Dv
//   block_table  int32 [B, max_pages_per_seq]: page p of sequence b holds its keys
//                [p * page_size, (p + 1) * page_size); null for a contiguous cache
//   cache_seqlens int32 [B]: the keys each sequence holds before this call (device memory for
//                CUDA; they are read on the device only, so a CUDA graph can replay the call
//                with new lengths and block-table contents)
//   k_new, v_new [B, Nnew, Hkv, D|Dv] (optional, both or neither): written into the cache at
//                rows cache_seqlens[b] ... + Nnew - 1 before attending; cache_seqlens itself
//                is not changed (the caller advances it)
//   out        [B, Nnew, Hq, Dv];  lse [B, Hq, Nnew] float32 (optional)
// Sequence b attends over its first cache_seqlens[b] (+ Nnew when k_new is given) keys, with
// the options of forward(): causal is bottom-right aligned, so new token i sees the cache and
// the new tokens up to i; window, softcap, GQA/MQA and the softmax scale as in
// docs/semantics.md. Keys past a sequence's length, unused pages and whatever they hold (NaN
// included) never reach the output.
// Capacity: Nmax (contiguous) or max_pages_per_seq * page_size (paged). On the GPU a length
// beyond the capacity is clamped to it (the append writes no row past the capacity); on the
// CPU, where the lengths and the block table are host memory, it is an error, as is a block
// table entry outside [0, num_pages).
#include <cstddef>

#include "flashcpp/attention.hpp"
#include "flashcpp/options.hpp"
#include "flashcpp/tensor.hpp"

namespace flashcpp {

struct KVCacheTensors {
  TensorView q;
  TensorView k_cache;
  TensorView v_cache;
  TensorView cache_seqlens;
  TensorView out;
  const TensorView* block_table = nullptr;  // null: contiguous cache
  const TensorView* k_new = nullptr;        // null: nothing appended
  const TensorView* v_new = nullptr;
  const TensorView* lse = nullptr;
};

// What a call with these shapes runs, decided on the host from the shapes alone (never from
// the lengths or page contents): the backend, the kernel, the number of KV splits and the
// workspace the run needs. Plan once per batch shape; every call with the same shapes and
// options runs the same plan, so it can be captured in a CUDA graph and replayed.
struct KVCachePlan {
  Backend backend = Backend::automatic;
  const char* kernel = "";
  int num_splits = 1;
  std::size_t workspace_bytes = 0;
};

KVCachePlan plan_attention_with_kvcache(const KVCacheTensors& tensors,
                                        const AttentionOptions& options = {});

// Runs the call (validating it and planning it as plan_attention_with_kvcache does). On the GPU
// it is asynchronous on `stream`, allocates nothing and never synchronises with the host:
// `workspace` must hold the plan's workspace_bytes (16-byte aligned).
RunInfo attention_with_kvcache(const KVCacheTensors& tensors, const AttentionOptions& options = {},
                               Stream stream = nullptr, Workspace workspace = {});

}  // namespace flashcpp
