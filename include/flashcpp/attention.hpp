#pragma once
// Exact attention: forward, backward, and their variable-length (packed) forms.
//
// Layouts (docs/semantics.md has the full semantics: masks, errors, workspace, accuracy):
//   q [B, Nq, Hq, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv], out [B, Nq, Hq, Dv],
//   lse [B, Hq, Nq] float32 (natural log of the softmax denominator, scale included).
// Varlen: q [total_q, Hq, D], k/v [total_k, Hkv, D|Dv], cu_seqlens_q/k int32 [B + 1],
//   lse [Hq, total_q].
// Every call validates its arguments before doing any work and throws flashcpp::Error naming
// the offending argument. GPU calls are asynchronous on `stream` and allocate nothing: any
// scratch memory is queried with *_workspace_size and passed in.
// A KV-cache decode entry point (contiguous and paged caches) will join these with the same
// tensor, option and stream conventions.
#include <cstddef>

#include "flashcpp/options.hpp"
#include "flashcpp/tensor.hpp"

struct CUstream_st;  // same type as cudaStream_t, without including CUDA headers

namespace flashcpp {

using Stream = CUstream_st*;

// Caller-owned scratch memory on the tensors' device, 16-byte aligned (size it with the
// *_workspace_size queries).
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// The backend family q's device and the options point to (no work is done): cpu for CPU
// tensors; on CUDA, cuda_sm90 on Hopper, else cuda_sm80. A hint: cases the sm90 kernels do not
// cover (varlen, split-KV, D != Dv) still run on sm80; the RunInfo a call returns is exact.
Backend select_backend(const TensorView& q, const AttentionOptions& options = {});

// True when flashcpp was built with CUDA and a usable GPU is present.
bool cuda_available();

// ---- forward ----
std::size_t forward_workspace_size(const TensorView& q, const TensorView& k,
                                   const TensorView& v, const AttentionOptions& options = {});

// The same for a varlen call (cu_seqlens on the tensors' device; nothing is read from them).
std::size_t forward_varlen_workspace_size(const TensorView& q, const TensorView& k,
                                          const TensorView& v, const TensorView& cu_seqlens_q,
                                          const TensorView& cu_seqlens_k, int max_seqlen_q,
                                          int max_seqlen_k, const AttentionOptions& options = {});

// `lse` may be null. Rows with no visible key get out = 0 and lse = -inf.
// Varlen on CUDA: max_seqlen_q/k must bound every sequence's length (the offsets stay on the
// device and are not checked there; on the CPU they are).
RunInfo forward(const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& out, const TensorView* lse = nullptr,
                const AttentionOptions& options = {}, Stream stream = nullptr,
                Workspace workspace = {});

RunInfo forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView* lse,
                       const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                       int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options = {},
                       Stream stream = nullptr, Workspace workspace = {});

// ---- backward ----
// Given the forward's out and lse and the gradient dout, writes dq, dk, dv (dk and dv of a KV
// head sum over the query heads that share it).
std::size_t backward_workspace_size(const TensorView& q, const TensorView& k,
                                    const TensorView& v, const AttentionOptions& options = {});

std::size_t backward_varlen_workspace_size(const TensorView& q, const TensorView& k,
                                           const TensorView& v, const TensorView& cu_seqlens_q,
                                           const TensorView& cu_seqlens_k, int max_seqlen_q,
                                           int max_seqlen_k, const AttentionOptions& options = {});

RunInfo backward(const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& out, const TensorView& dout, const TensorView& lse,
                 const TensorView& dq, const TensorView& dk, const TensorView& dv,
                 const AttentionOptions& options = {}, Stream stream = nullptr,
                 Workspace workspace = {});

RunInfo backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                        int max_seqlen_q, int max_seqlen_k,
                        const AttentionOptions& options = {}, Stream stream = nullptr,
                        Workspace workspace = {});

}  // namespace flashcpp
