#include "bench_json.hpp"

#include <cmath>
#include <cstdio>

namespace flashcpp::bench {
namespace {

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

// Appends "name": value pairs; values are JSON text already (numbers, quoted strings, objects).
class Object {
 public:
  Object& add(const char* name, const std::string& value) {
    text_ += text_.size() > 1 ? ", \"" : "\"";
    text_ += name;
    text_ += "\": ";
    text_ += value;
    return *this;
  }
  Object& add(const char* name, long long value) { return add(name, std::to_string(value)); }
  std::string close() { return text_ + "}"; }

 private:
  std::string text_ = "{";
};

const char* boolean(bool value) { return value ? "true" : "false"; }

}  // namespace

std::string to_json(const JsonReport& r) {
  const Problem& p = r.problem;
  const double flops = p.flops();
  const double rate = r.median_ms > 0 ? flops / (r.median_ms * 1e-3) : 0;
  std::string window = "[";
  window += std::to_string(p.window_left);
  window += ", ";
  window += std::to_string(p.window_right);
  window += "]";
  const std::string problem = Object()
                                  .add("mode", quoted(mode_name(p.mode)))
                                  .add("batch", p.batch)
                                  .add("heads", p.heads)
                                  .add("heads_kv", p.heads_kv)
                                  .add("seqlen_q", p.seqlen_q)
                                  .add("seqlen_k", p.seqlen_k)
                                  .add("head_dim", p.head_dim)
                                  .add("head_dim_v", p.head_dim_v)
                                  .add("dtype", quoted(dtype_name(p.dtype)))
                                  .add("causal", boolean(p.causal))
                                  .add("window", window)
                                  .add("softcap", number(p.softcap))
                                  .add("deterministic", boolean(p.deterministic))
                                  .add("scale", number(p.scale()))
                                  .add("seed", static_cast<long long>(p.seed))
                                  .close();
  std::string check = "null";
  if (r.check)
    check = Object()
                .add("ok", boolean(r.check->ok))
                .add("scope", quoted(r.check->scope))
                .add("details", quoted(r.check->details))
                .add("max_abs_err", number(r.check->max_abs_err))
                .close();
  return Object()
             .add("problem", problem)
             .add("device", quoted(r.gpu ? "gpu" : "cpu"))
             .add("backend", quoted(backend_name(r.timing.info.backend)))
             .add("kernel", quoted(r.timing.info.kernel))
             .add("num_splits", r.timing.info.num_splits)
             .add("cpu_threads", r.gpu ? std::string("null") : std::to_string(r.cpu_threads))
             .add("reps", p.reps)
             .add("warmup", p.warmup)
             .add("median_ms", number(r.median_ms))
             .add("min_ms", number(r.min_ms))
             .add("gflop_per_call", number(flops * 1e-9))
             .add("tflops_per_s", number(rate * 1e-12))
             .add("visible_pairs", static_cast<long long>(p.visible_pairs()))
             .add("sgemm_gflops", r.sgemm_gflops ? number(*r.sgemm_gflops) : "null")
             .add("check", check)
             .close() +
         "\n";
}

}  // namespace flashcpp::bench
