// Cases whose kernel a subset build lacks (FLASHCPP_CUDA_ARCHS / FLASHCPP_DTYPES /
// FLASHCPP_HEAD_DIMS), shared by the forward and backward GPU harnesses: their check()
// records such a case instead of failing, and the suites' TearDown reports the test as
// skipped, listing them. A full build records nothing, so nothing is skipped.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "flashcpp/flashcpp.hpp"

namespace flashcpp::cuda_test {

// The cases recorded since the last report_unbuilt_cases(), described with their error.
inline std::vector<std::string>& unbuilt_cases() {
  static std::vector<std::string> cases;
  return cases;
}

// True (and the case recorded) when `e` is the dispatch's "no ... kernel ... in this build"
// error; any other error is the caller's to rethrow, so it still fails the test.
inline bool record_if_unbuilt(const std::string& what, const Error& e) {
  if (std::string(e.what()).find("in this build") == std::string::npos) return false;
  unbuilt_cases().push_back(what + ": " + e.what());
  return true;
}

// Called from the suites' TearDown: a test some of whose cases need kernels this build lacks
// is reported as skipped (listing them) when the cases that ran all passed (a failure
// outranks the skip in GoogleTest's result).
inline void report_unbuilt_cases() {
  std::vector<std::string>& cases = unbuilt_cases();
  if (cases.empty()) return;
  std::string list;
  for (const std::string& c : cases) list += "\n  " + c;
  const std::size_t n = cases.size();
  cases.clear();
  GTEST_SKIP() << n << " case(s) need kernels not in this build:" << list;
}

}  // namespace flashcpp::cuda_test
