#pragma once
// Command-line flags of flashcpp-bench and the problem they describe.
#include <cstdint>
#include <optional>
#include <string>

#include "flashcpp/flashcpp.hpp"

namespace flashcpp::bench {

enum class Mode { fwd, bwd };

struct Args {
  // Shape: unset values take the device's defaults (see apply_defaults).
  std::optional<int> batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, head_dim_v;
  std::optional<DType> dtype;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  bool deterministic = false;
  Backend backend = Backend::automatic;
  Mode mode = Mode::fwd;
  std::optional<int> reps, warmup;
  std::uint64_t seed = 0;
  bool gemm_baseline = false;
  bool check = true;
  bool json = false;  // one JSON object on stdout instead of the text report
};

// The problem after defaults: every field set.
struct Problem {
  int batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, head_dim_v;
  DType dtype;
  bool causal;
  int window_left, window_right;
  float softcap;
  bool deterministic;
  Mode mode;
  int reps, warmup;
  std::uint64_t seed;

  AttentionOptions options(Backend backend) const;
  float scale() const;
  // Exact number of visible (query, key) pairs over batch and query heads, by the mask rule.
  std::int64_t visible_pairs() const;
  // fwd: 2 * pairs * (D + Dv) (QK^T and PV); bwd: 2.5x the forward.
  double flops() const;
};

// Parses argv; on --help prints the usage and exits 0; on an unknown or malformed flag prints
// an error naming the flag and exits 2.
Args parse_args(int argc, char** argv);

// Fills unset fields: a problem that runs in well under a minute on a 2-core CPU, or a larger
// one on a GPU.
Problem apply_defaults(const Args& args, bool gpu);

const char* mode_name(Mode mode);

}  // namespace flashcpp::bench
