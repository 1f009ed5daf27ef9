#pragma once
// Entry points of the CUDA backend, seen by the API layer. Compiled only with FLASHCPP_CUDA.
#include <cstddef>

#include "common/params.hpp"
#include "flashcpp/attention.hpp"

namespace flashcpp::detail::cuda {

// Number of usable GPUs (0 when the driver or a device is missing; never throws).
int device_count();

// `requested` is automatic, cuda_sm80 or cuda_sm90; the dispatcher resolves automatic with the
// GPU's architecture and the kernels this build contains, and throws flashcpp::Error when the
// request cannot run (architecture too old, kernel not built, option not covered).
Backend choose_forward_backend(const ForwardParams& params, Backend requested);

std::size_t forward_workspace_size(const ForwardParams& params, Backend backend);
RunInfo forward(const ForwardParams& params, Backend backend, Stream stream, Workspace workspace);

std::size_t backward_workspace_size(const ForwardParams& params, Backend backend);
RunInfo backward(const BackwardParams& params, Backend backend, Stream stream,
                 Workspace workspace);

}  // namespace flashcpp::detail::cuda
