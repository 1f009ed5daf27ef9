#pragma once
// Runners: time one problem on the CPU or the GPU and leave the results in the host tensors.
#include <vector>

#include "bench_tensors.hpp"

namespace flashcpp::bench {

struct Timing {
  RunInfo info;
  std::vector<double> ms;  // one per timed repetition
};

// Prints "rep i/n" on stderr, in place, once the run has taken more than ~2 s.
class Progress {
 public:
  explicit Progress(int total);
  void step(int done);
  ~Progress();

 private:
  int total_;
  double start_;
  bool shown_ = false;
};

double now_seconds();

// CPU backends (cpu, cpu_reference): runs on the host tensors directly.
Timing run_cpu(const Problem& p, Backend backend, Tensors& t);

// CUDA backends: copies the inputs to the GPU, times with cudaEvents on one stream, and copies
// out/lse (and, bwd, the gradients) back. Throws std::runtime_error when built without CUDA.
Timing run_gpu(const Problem& p, Backend backend, Tensors& t);

}  // namespace flashcpp::bench
