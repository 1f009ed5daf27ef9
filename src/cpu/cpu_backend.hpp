#pragma once
// The CPU backends: a float64 reference (the test oracle) and the tiled online-softmax
// implementation (FlashAttention on the CPU). Both take validated params from the API layer.
#include <cstdint>

#include "common/params.hpp"

namespace flashcpp::detail::cpu {

// Materialises S and P per (batch, head) in float64. Slow; for tests and checks.
void reference_forward(const ForwardParams& params);
void reference_backward(const BackwardParams& params);

// Tiled forward/backward with fp32 accumulation, threaded over (batch, head, row block).
// `non_finite_inputs`: q or k holds NaN or Inf (check_scores), so scores may be NaN and the
// forward tracks them; the other calls take the loop without that bookkeeping.
void tiled_forward(const ForwardParams& params, bool non_finite_inputs);
void tiled_backward(const BackwardParams& params);

// Throws flashcpp::Error when finite q and k could give a score that overflows float32 (the
// CPU backends refuse such inputs before writing anything; with a softcap none can). Returns
// whether q or k holds NaN or Inf.
bool check_scores(const ForwardParams& params);

// Varlen: writes the output rows past cu_seqlens[B] (up to rows_q / rows_k, the tensors' row
// counts): out 0 and lse -inf; dq, dk, dv 0.
void clear_varlen_tails(const ForwardParams& params, std::int64_t rows_q);
void clear_varlen_tails(const BackwardParams& params, std::int64_t rows_q, std::int64_t rows_k);

// Attention against a KV cache (host memory): appends k_new / v_new into the cache, then runs
// each sequence over its keys with the float64 reference (`reference`) or the tiled backend.
void kvcache_forward(const KVCacheParams& params, bool reference);

// Name of the kernel tiled_forward runs for `forward` ("cpu_tiled_amx", "cpu_tiled_avx512",
// "cpu_tiled_openblas", ...), or tiled_backward's fp32 block products when `forward` is null
// ("cpu_tiled_avx512", else "cpu_tiled_openblas").
const char* tiled_kernel_name(const ForwardParams* forward);

// Name of what tiled_backward runs for `params`: "cpu_tiled_amx" (bf16 on AMX tiles), else as
// tiled_kernel_name(nullptr).
const char* tiled_backward_kernel_name(const BackwardParams& params);

}  // namespace flashcpp::detail::cpu
