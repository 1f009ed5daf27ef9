// Public entry points: validate, choose the backend, run it.
#include "flashcpp/attention.hpp"

#include "api/validate.hpp"
#include "cpu/cpu_backend.hpp"
#include "flashcpp/error.hpp"

#ifdef FLASHCPP_WITH_CUDA
#include "cuda/cuda_backend.hpp"
#endif

namespace flashcpp {
namespace {

using detail::BackwardParams;
using detail::ForwardParams;

bool nothing_to_do(const ForwardParams& p) { return p.batch == 0 || p.seqlen_q == 0; }

// With no queries but some keys, dk and dv are still outputs: they are zero, and get written.
bool nothing_to_do_backward(const ForwardParams& p) {
  return p.batch == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0);
}

#ifdef FLASHCPP_WITH_CUDA
// The validated problem of a workspace query, where only q, k, v (and the varlen offsets) are
// known: `out` is stood in for by q's shape with v's head dim, so validation sees a
// consistent call.
ForwardParams workspace_problem(const detail::ForwardTensors& known, const AttentionOptions& options,
                                Backend family) {
  TensorView out = known.q;
  if (out.rank > 0 && known.v.rank > 0) out.shape[out.rank - 1] = known.v.shape[known.v.rank - 1];
  if (out.dtype == DType::fp8_e4m3) out.dtype = DType::bf16;  // fp8 inputs give a 16-bit out
  detail::HostCopies unused;  // CUDA offsets are never read on the host
  return detail::validate_forward({known.q, known.k, known.v, out, nullptr, known.cu_seqlens_q,
                                   known.cu_seqlens_k, known.max_seqlen_q, known.max_seqlen_k},
                                  options, family, unused, detail::Outputs::stand_in);
}
#endif

// Bytes of scratch memory a forward (or backward) call with these tensors needs.
std::size_t workspace_size(const detail::ForwardTensors& known, const AttentionOptions& options,
                           bool for_backward) {
  const Backend family = detail::check_backend(known.q, options);
  if (family == Backend::cpu || family == Backend::cpu_reference) return 0;
#ifdef FLASHCPP_WITH_CUDA
  const ForwardParams params = workspace_problem(known, options, family);
  if (for_backward) return detail::cuda::backward_workspace_bytes(params);
  return detail::cuda::plan_forward(params, family).workspace_bytes;
#else
  (void)for_backward;
  return 0;
#endif
}

RunInfo run_forward(const detail::ForwardTensors& tensors, const AttentionOptions& options,
                    Stream stream, Workspace workspace) {
  const Backend family = detail::check_backend(tensors.q, options);
  detail::HostCopies copies;
  const ForwardParams params = detail::validate_forward(tensors, options, family, copies);
  if (family == Backend::cpu_reference || family == Backend::cpu) {
    // fp8 inputs: the reference only (validation refused an explicit `cpu`).
    const bool reference = family == Backend::cpu_reference || params.fp8_inputs();
    if (!nothing_to_do(params)) {
      const bool non_finite = !params.fp8_inputs() && detail::cpu::check_scores(params);
      reference ? detail::cpu::reference_forward(params)
                : detail::cpu::tiled_forward(params, non_finite);
    }
    if (params.is_varlen()) detail::cpu::clear_varlen_tails(params, tensors.q.shape[0]);
    if (reference) return {Backend::cpu_reference, "cpu_reference_f64", 1};
    return {Backend::cpu, detail::cpu::tiled_kernel_name(&params), 1};
  }
#ifdef FLASHCPP_WITH_CUDA
  const detail::Plan plan = detail::cuda::plan_forward(params, family);
  if (nothing_to_do(params)) return {plan.backend, "none (empty problem)", 1};
  return detail::cuda::run_forward(plan, params, stream, workspace);
#else
  (void)stream;
  (void)workspace;
  throw Error("flashcpp was built without CUDA");
#endif
}

RunInfo run_backward(const detail::BackwardTensors& tensors, const AttentionOptions& options,
                     Stream stream, Workspace workspace) {
  const Backend family = detail::check_backend(tensors.forward.q, options);
  detail::HostCopies copies;
  const BackwardParams params = detail::validate_backward(tensors, options, family, copies);
  if (family == Backend::cpu_reference || family == Backend::cpu) {
    const bool reference = family == Backend::cpu_reference;
    if (!nothing_to_do_backward(params)) {
      detail::cpu::check_scores(params);
      reference ? detail::cpu::reference_backward(params) : detail::cpu::tiled_backward(params);
    }
    if (params.is_varlen())
      detail::cpu::clear_varlen_tails(params, tensors.forward.q.shape[0],
                                      tensors.forward.k.shape[0]);
    if (reference) return {Backend::cpu_reference, "cpu_reference_f64", 1};
    return {Backend::cpu, detail::cpu::tiled_backward_kernel_name(params), 1};
  }
#ifdef FLASHCPP_WITH_CUDA
  return detail::cuda::run_backward(detail::cuda::plan_backward(params, family), params, stream,
                                    workspace);
#else
  (void)stream;
  (void)workspace;
  throw Error("flashcpp was built without CUDA");
#endif
}

}  // namespace

bool cuda_available() {
#ifdef FLASHCPP_WITH_CUDA
  return detail::cuda::device_count() > 0;
#else
  return false;
#endif
}

Backend select_backend(const TensorView& q, const AttentionOptions& options) {
  detail::validate_select(q, options);
  const Backend family = detail::check_backend(q, options);
  if (family == Backend::cpu || family == Backend::cpu_reference) return family;
#ifdef FLASHCPP_WITH_CUDA
  ForwardParams probe;
  probe.device = q.device.index;
  probe.dtype = q.dtype == DType::bf16 ? detail::ElementType::bf16 : detail::ElementType::fp16;
  probe.head_dim = probe.head_dim_v = q.rank > 0 ? static_cast<int>(q.shape[q.rank - 1]) : 0;
  probe.causal = options.causal;
  probe.window_left = options.window_left;
  probe.window_right = options.causal ? 0 : options.window_right;
  probe.softcap = options.softcap;
  return detail::cuda::plan_forward(probe, family).backend;
#else
  return family;
#endif
}

std::size_t forward_workspace_size(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AttentionOptions& options) {
  return workspace_size({q, k, v, q, nullptr, nullptr, nullptr}, options, false);
}

std::size_t forward_varlen_workspace_size(const TensorView& q, const TensorView& k,
                                          const TensorView& v, const TensorView& cu_seqlens_q,
                                          const TensorView& cu_seqlens_k, int max_seqlen_q,
                                          int max_seqlen_k, const AttentionOptions& options) {
  return workspace_size(
      {q, k, v, q, nullptr, &cu_seqlens_q, &cu_seqlens_k, max_seqlen_q, max_seqlen_k}, options,
      false);
}

std::size_t backward_workspace_size(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const AttentionOptions& options) {
  return workspace_size({q, k, v, q, nullptr, nullptr, nullptr}, options, true);
}

std::size_t backward_varlen_workspace_size(const TensorView& q, const TensorView& k,
                                           const TensorView& v, const TensorView& cu_seqlens_q,
                                           const TensorView& cu_seqlens_k, int max_seqlen_q,
                                           int max_seqlen_k, const AttentionOptions& options) {
  return workspace_size(
      {q, k, v, q, nullptr, &cu_seqlens_q, &cu_seqlens_k, max_seqlen_q, max_seqlen_k}, options,
      true);
}

RunInfo forward(const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& out, const TensorView* lse, const AttentionOptions& options,
                Stream stream, Workspace workspace) {
  return run_forward({q, k, v, out, lse, nullptr, nullptr}, options, stream, workspace);
}

RunInfo forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView* lse,
                       const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                       int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options,
                       Stream stream, Workspace workspace) {
  return run_forward(
      {q, k, v, out, lse, &cu_seqlens_q, &cu_seqlens_k, max_seqlen_q, max_seqlen_k}, options,
      stream, workspace);
}

RunInfo backward(const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& out, const TensorView& dout, const TensorView& lse,
                 const TensorView& dq, const TensorView& dk, const TensorView& dv,
                 const AttentionOptions& options, Stream stream, Workspace workspace) {
  return run_backward({{q, k, v, out, &lse, nullptr, nullptr}, dout, dq, dk, dv}, options,
                      stream, workspace);
}

RunInfo backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                        int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options,
                        Stream stream, Workspace workspace) {
  return run_backward({{q, k, v, out, &lse, &cu_seqlens_q, &cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k},
                       dout, dq, dk, dv},
                      options, stream, workspace);
}

}  // namespace flashcpp
