#pragma once
// flashcpp-bench --json: the run's problem and results as one JSON object on stdout, for
// scripts (the text report is for people).
#include <optional>
#include <string>

#include "bench_args.hpp"
#include "bench_run.hpp"
#include "bench_tensors.hpp"

namespace flashcpp::bench {

struct JsonReport {
  const Problem& problem;
  const Timing& timing;
  bool gpu = false;
  int cpu_threads = 1;
  double median_ms = 0;
  double min_ms = 0;
  std::optional<CheckResult> check;  // absent with --no-check
  std::optional<double> sgemm_gflops;  // with --gemm-baseline (and OpenBLAS)
};

std::string to_json(const JsonReport& report);

}  // namespace flashcpp::bench
