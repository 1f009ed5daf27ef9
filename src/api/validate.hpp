#pragma once
// Argument checking for the public calls: every rule of the contract's "Errors" section, turned
// into ForwardParams / BackwardParams for the backends. Throws flashcpp::Error naming the
// argument; does no work on the tensors' data except reading host-side cu_seqlens.
#include <cstdint>
#include <vector>

#include "common/params.hpp"
#include "flashcpp/attention.hpp"
#include "flashcpp/kvcache.hpp"

namespace flashcpp::detail {

// The tensors of one forward call; `lse`, `cu_seqlens_*` may be null.
struct ForwardTensors {
  const TensorView& q;
  const TensorView& k;
  const TensorView& v;
  const TensorView& out;
  const TensorView* lse;
  const TensorView* cu_seqlens_q;  // both null, or both set (varlen)
  const TensorView* cu_seqlens_k;
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;
};

struct BackwardTensors {
  ForwardTensors forward;  // lse is required here
  const TensorView& dout;
  const TensorView& dq;
  const TensorView& dk;
  const TensorView& dv;
};

// Checks the backend request against the tensors' device; returns the concrete backend
// family (automatic becomes cpu for CPU tensors; CUDA tensors keep automatic, refined by the
// CUDA dispatcher that knows the GPU).
Backend check_backend(const TensorView& q, const AttentionOptions& options);

// Host memory validation reads and the backends then use: the params point into it, so it must
// outlive the run. Varlen offsets, KV-cache lengths and block tables in host memory are copied
// here before they are checked, so a thread that changes the caller's arrays during the call
// cannot break what was validated.
struct HostCopies {
  std::vector<std::int32_t> cu_seqlens_q, cu_seqlens_k;
  std::vector<std::int32_t> cache_seqlens, block_table;  // block_table: rows of its own width
};

// `given`: out and lse are the call's outputs and must not overlap the inputs or each other;
// `stand_in`: they are placeholders (a workspace query, the forward part of a backward call).
enum class Outputs { given, stand_in };

// select_backend's arguments: q of rank 4 (3 for varlen), the options.
void validate_select(const TensorView& q, const AttentionOptions& options);

ForwardParams validate_forward(const ForwardTensors& t, const AttentionOptions& options,
                               Backend backend, HostCopies& copies,
                               Outputs outputs = Outputs::given);
BackwardParams validate_backward(const BackwardTensors& t, const AttentionOptions& options,
                                 Backend backend, HostCopies& copies);
// On the CPU the lengths and the block table are host memory and are checked too (every
// length plus the appended rows within the capacity, every page of a sequence's keys in
// range); on CUDA they are device memory and are never read on the host.
KVCacheParams validate_kvcache(const KVCacheTensors& t, const AttentionOptions& options,
                               Backend backend, HostCopies& copies);

}  // namespace flashcpp::detail
