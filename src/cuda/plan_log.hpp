#pragma once
// FLASHCPP_LOG=info: the planner says on stderr which kernel serves each call shape, once per
// shape (a training loop repeats the same few shapes; one line each is enough to see them).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "api/plan.hpp"
#include "common/params.hpp"
#include "cuda/common/kernel_registry.hpp"
#include "flashcpp/options.hpp"

namespace flashcpp::detail::cuda {

inline bool plan_log_enabled() {
  static const bool enabled = [] {
    const char* level = std::getenv("FLASHCPP_LOG");
    return level && (std::strcmp(level, "info") == 0 || std::strcmp(level, "debug") == 0);
  }();
  return enabled;
}

// `call` names the entry point ("forward", "backward", "kvcache"). Returns the plan unchanged.
inline Plan log_plan(const char* call, const ForwardParams& p, Plan plan) {
  if (!plan_log_enabled()) return plan;
  char shape[256];
  std::snprintf(shape, sizeof shape,
                "%s%s B=%d Nq=%d Nk=%d Hq=%d Hkv=%d D=%d Dv=%d %s causal=%d window=(%d,%d) "
                "softcap=%g",
                call, p.is_varlen() ? " varlen" : "", p.batch, p.seqlen_q, p.seqlen_k,
                p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v, dtype_name(p.dtype),
                int(p.causal), p.window_left, p.window_right, double(p.softcap));
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::string line = std::string(shape) + " -> " + backend_name(plan.backend) + " " +
                     plan.kernel + " splits=" + std::to_string(plan.num_splits);
  const std::lock_guard<std::mutex> lock(mutex);
  if (seen.insert(line).second) std::fprintf(stderr, "flashcpp: %s\n", line.c_str());
  return plan;
}

}  // namespace flashcpp::detail::cuda
