#pragma once
// The attention options as the Python layer passes them (backend by name), shared by the
// DLPack entry points (module.cpp) and the XLA FFI handlers (xla_ffi.cpp).
#include <optional>
#include <string>
#include <string_view>

#include "flashcpp/flashcpp.hpp"

namespace flashcpp_python {

inline flashcpp::Backend parse_backend(std::string_view name) {
  using flashcpp::Backend;
  if (name == "auto" || name == "automatic") return Backend::automatic;
  if (name == "cpu") return Backend::cpu;
  if (name == "cpu_reference") return Backend::cpu_reference;
  if (name == "cuda_sm80") return Backend::cuda_sm80;
  if (name == "cuda_sm90") return Backend::cuda_sm90;
  throw flashcpp::Error("backend: expected one of auto, cpu, cpu_reference, cuda_sm80, "
                        "cuda_sm90, got '" + std::string(name) + "'");
}

inline flashcpp::AttentionOptions make_options(bool causal, std::optional<float> softmax_scale,
                                               int window_left, int window_right, float softcap,
                                               std::string_view backend, int num_splits,
                                               bool deterministic) {
  flashcpp::AttentionOptions options;
  options.causal = causal;
  options.softmax_scale = softmax_scale;
  options.window_left = window_left;
  options.window_right = window_right;
  options.softcap = softcap;
  options.backend = parse_backend(backend);
  options.num_splits = num_splits;
  options.deterministic = deterministic;
  return options;
}

}  // namespace flashcpp_python
