#pragma once
// One plan per call: what runs a validated problem (the backend, the kernel instantiation, the
// KV split count and the workspace it needs), computed once and then read by the workspace
// query, select_backend, the run and the RunInfo it returns.
#include <cstddef>

#include "flashcpp/options.hpp"

namespace flashcpp::detail {

struct Plan {
  Backend backend = Backend::automatic;  // concrete: cpu_reference, cpu, cuda_sm80, cuda_sm90
  const char* kernel = "";               // RunInfo::kernel
  int kernel_index = -1;                 // the backend's registry entry that runs the call
  int tile_index = -1;                   // CUDA sm80 forward: its tile row (fwd_tile_table.hpp)
  int num_splits = 1;
  // The split count came from the heuristic: a run without enough workspace for it runs
  // unsplit instead (same result), where an explicit num_splits > 1 is an error.
  bool splits_optional = false;
  std::size_t workspace_bytes = 0;
  // CUDA sm90+: a split call's combine launches as a programmatic dependent of the main kernel.
  bool overlap_combine = false;
  // CUDA KV cache: the call runs the forward kernels (prefill with a cache), not the decode one.
  bool kvcache_on_forward = false;
  // CUDA KV cache on sm90a: the decode kernel's splits merge in a thread-block cluster.
  bool decode_cluster = false;

  RunInfo run_info() const { return {backend, kernel, num_splits}; }
};

}  // namespace flashcpp::detail
