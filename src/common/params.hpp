#pragma once
// Plain-old-data descriptions of one attention call, filled by the API layer after validation
// and read by every backend. No framework or CUDA types here. Strides are in elements, int64.
#include <cstdint>

#include "common/host_device.hpp"

namespace flashcpp::detail {

enum class ElementType : std::uint8_t { fp32, fp16, bf16, fp8_e4m3 };

// Element strides of a [batch, row, head, dim] tensor (dim has stride 1). For varlen tensors
// `batch` is 0 and rows are addressed through cu_seqlens.
struct Strides {
  std::int64_t batch = 0;
  std::int64_t row = 0;
  std::int64_t head = 0;
};

// One fp8 descale factor per (sequence, kv head): data[b * batch_stride + h * head_stride],
// or 1 when data is null. Strides 0 broadcast a per-tensor factor.
struct Descale {
  const float* data = nullptr;
  std::int64_t batch_stride = 0;
  std::int64_t head_stride = 0;

  FLASHCPP_HOST_DEVICE float at(int b, int kv_head) const {
    return data == nullptr ? 1.0f : data[b * batch_stride + kv_head * head_stride];
  }
};

struct ForwardParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // optional; [B, Hq, Nq] or, varlen, [Hq, total_q]
  // Element types: `dtype` is out's, and q's, k's and v's too unless FP8 says otherwise: an
  // fp8 forward has q, k and v in fp8_e4m3 (q_dtype, kv_dtype) and out in bf16 or fp16; an fp8
  // KV cache has k and v (the caches) in fp8_e4m3 and q, k_new, v_new and out in `dtype`.
  // Only the paths that check fp8_inputs() may read fp8 calls (validation routes the rest away).
  ElementType dtype = ElementType::fp32;
  ElementType q_dtype = ElementType::fp32;
  ElementType kv_dtype = ElementType::fp32;

  int batch = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int head_dim = 0;    // D
  int head_dim_v = 0;  // Dv
  // Padded: Nq and Nk. Varlen: the max_seqlen bounds given by the caller.
  int seqlen_q = 0;
  int seqlen_k = 0;

  Strides q_stride, k_stride, v_stride, out_stride;
  std::int64_t lse_batch_stride = 0;  // 0 for varlen
  std::int64_t lse_head_stride = 0;   // rows have stride 1

  // Varlen when non-null: sequence b owns rows [cu[b], cu[b+1]) (device memory for CUDA).
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  // Varlen: rows of the packed q (out, dout, dq) and k (v, dk, dv) tensors. CUDA kernels clamp
  // what device-side offsets say to these and to seqlen_q/k (cuda/common/seqlen_info.hpp).
  std::int64_t total_rows_q = 0;
  std::int64_t total_rows_k = 0;

  float scale = 1.0f;    // softmax scale
  float softcap = 0.0f;  // 0: off
  bool causal = false;   // window_right == 0 and window_left == -1 after folding
  int window_left = -1;  // -1: unbounded
  int window_right = -1;

  int device = 0;      // CUDA ordinal
  int num_splits = 0;  // 0: heuristic

  // fp8 inputs: q * q_descale, k * k_descale, v * v_descale (last: the fields above keep the
  // offsets the kernels were tuned with).
  Descale q_descale, k_descale, v_descale;
  // fp8 forward: O may stay in the tensor cores' accumulator (AttentionOptions::fp8_fast_accum).
  bool fp8_fast_accum = false;

  // Per-sequence key counts on the device (a KV cache's lengths): sequence b of an otherwise
  // padded batch sees keys [0, min(seqused_k[b] + seqused_k_add, seqlen_k)). CUDA runs such a
  // call as varlen over rows packed sequence after sequence (q row b * seqlen_q + i, k row
  // b * seqlen_k + j), so the batch strides must be seqlen times the row strides.
  const std::int32_t* seqused_k = nullptr;
  int seqused_k_add = 0;

  FLASHCPP_HOST_DEVICE bool is_varlen() const {
    return cu_seqlens_q != nullptr || seqused_k != nullptr;
  }
  FLASHCPP_HOST_DEVICE bool fp8_inputs() const {
    return q_dtype == ElementType::fp8_e4m3 || kv_dtype == ElementType::fp8_e4m3;
  }
};

struct BackwardParams : ForwardParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides dout_stride, dq_stride, dk_stride, dv_stride;
  bool deterministic = false;
};

// A paged KV cache as the forward kernels read it (prefill with a cache): key r of sequence b
// lives on page block_table[b * block_table_stride + r / page_size], row r % page_size; the
// page stride is the cache's batch stride (k_stride.batch, v_stride.batch).
struct PagedKV {
  const std::int32_t* block_table = nullptr;  // null: not paged
  std::int64_t block_table_stride = 0;
  int page_size = 0;
  int page_shift = -1;  // log2(page_size) when it is a power of two
  int num_pages = 0;
};

// Attention against a KV cache (flashcpp/kvcache.hpp). The ForwardParams part describes q,
// out, lse and the caches as k and v: seqlen_q is Nnew and seqlen_k the capacity of one
// sequence; for a paged cache k_stride.batch / v_stride.batch step from page to page.
struct KVCacheParams : ForwardParams {
  const std::int32_t* cache_seqlens = nullptr;  // [B]: keys held before the call
  // Paged when non-null: block_table[b * block_table_stride + p] is page p of sequence b.
  const std::int32_t* block_table = nullptr;
  std::int64_t block_table_stride = 0;
  int page_size = 0;  // keys per page (paged); 0 for a contiguous cache
  int page_shift = -1;  // log2(page_size) when it is a power of two: shifts instead of divisions
  int num_pages = 0;  // pages in the pool (paged)
  // Appended when non-null: [B, Nnew, Hkv, D|Dv], written at rows cache_seqlens[b]...
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  Strides k_new_stride, v_new_stride;

  FLASHCPP_HOST_DEVICE bool paged() const { return block_table != nullptr; }
  FLASHCPP_HOST_DEVICE bool appends() const { return k_new != nullptr; }
};

}  // namespace flashcpp::detail
