#pragma once
// Entry points of the CUDA backend, seen by the API layer: plan a validated call (choose the
// architecture's kernels, the instantiation, the KV splits and the workspace), then run the
// plan. Compiled only with FLASHCPP_CUDA.
#include <cstddef>

#include "api/plan.hpp"
#include "common/params.hpp"
#include "flashcpp/attention.hpp"

namespace flashcpp::detail::cuda {

// Number of usable GPUs (0 when the driver or a device is missing; never throws).
int device_count();

// `requested` is automatic, cuda_sm80 or cuda_sm90; the planner resolves automatic with the
// GPU's architecture and the kernels this build contains, and throws flashcpp::Error when the
// request cannot run (architecture too old, kernel not built, option not covered).
Plan plan_forward(const ForwardParams& params, Backend requested);
RunInfo run_forward(const Plan& plan, const ForwardParams& params, Stream stream,
                    Workspace workspace);

// The backward's workspace covers the layouts of both backends, so its size needs no plan
// (the query knows neither the gradients' strides nor, hence, which backend will run).
std::size_t backward_workspace_bytes(const ForwardParams& params);
Plan plan_backward(const BackwardParams& params, Backend requested);
RunInfo run_backward(const Plan& plan, const BackwardParams& params, Stream stream,
                     Workspace workspace);

// Attention against a KV cache: the plan depends on the shapes only (never on the lengths or
// the block table, which stay on the device), so the run can be captured and replayed.
Plan plan_kvcache(const KVCacheParams& params, Backend requested);
RunInfo run_kvcache(const Plan& plan, const KVCacheParams& params, Stream stream,
                    Workspace workspace);

}  // namespace flashcpp::detail::cuda
