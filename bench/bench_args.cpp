// Flag parsing for flashcpp-bench: "--name value" or "--name=value"; errors exit with code 2.
#include "bench_args.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "common/mask.hpp"

namespace flashcpp::bench {
namespace {

constexpr const char* kUsage = R"(flashcpp-bench: run one attention problem, check it against the float64
reference, and report the median time and throughput.

usage: flashcpp-bench [flags]

problem (defaults: CPU B=1 H=8 N=1024 D=64 bf16; GPU B=4 H=16 N=4096 D=128 bf16)
  --batch B             batch size
  --seqlen-q N          query length (default: --seqlen-k, else the device default)
  --seqlen-k N          key length (default: --seqlen-q)
  --heads H             query heads
  --heads-kv H          key/value heads (default: --heads; must divide it)
  --head-dim D          q/k head dim (multiple of 8, <= 256)
  --head-dim-v D        v/out head dim (default: --head-dim)
  --dtype T             fp32 | fp16 | bf16 (fp32: CPU backends only)
  --causal              bottom-right aligned causal mask
  --window L,R          sliding window, -1 = unbounded (e.g. 128,0)
  --softcap C           softcap (0 = off)
  --deterministic       deterministic backward (bitwise-repeatable dq; --mode bwd)
run
  --backend B           auto | cpu | cpu_reference | cuda_sm80 | cuda_sm90 (default auto: the
                        GPU when one is usable, else the CPU backend)
  --mode M              fwd | bwd (bwd times the backward; out and lse from one forward)
  --reps N              timed repetitions (default: CPU 10, GPU 50)
  --warmup N            untimed repetitions first (default: CPU 2, GPU 10)
  --seed S              seed of the random inputs (default 0)
  --no-check            skip the comparison with the float64 reference
  --gemm-baseline       also time OpenBLAS cblas_sgemm at M=Nq, N=Nk, K=D on the same threads
                        and print the CPU backend's ratio to it
  --json                print one JSON object (problem, kernel, times, check) instead of text
  --help                this text

Exit codes: 0 ok, 1 a failed run or check, 2 a bad flag.
)";

[[noreturn]] void bad_flag(std::string_view flag, const std::string& why) {
  std::fprintf(stderr, "flashcpp-bench: %.*s: %s (see --help)\n", static_cast<int>(flag.size()),
               flag.data(), why.c_str());
  std::exit(2);
}

long long parse_int(std::string_view flag, std::string_view text, long long min, long long max) {
  long long value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    bad_flag(flag, "expected an integer, got '" + std::string(text) + "'");
  if (value < min || value > max)
    bad_flag(flag, "expected a value in [" + std::to_string(min) + ", " + std::to_string(max) +
                       "], got " + std::string(text));
  return value;
}

float parse_float(std::string_view flag, std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const float value = std::strtof(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(value))
    bad_flag(flag, "expected a number, got '" + s + "'");
  return value;
}

}  // namespace

const char* mode_name(Mode mode) { return mode == Mode::fwd ? "fwd" : "bwd"; }

Args parse_args(int argc, char** argv) {
  Args a;
  constexpr int kMaxDim = 1 << 30;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view flag = arg, value;
    bool has_value = false;
    if (const auto eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    const auto need_value = [&]() -> std::string_view {
      if (has_value) return value;
      if (i + 1 >= argc) bad_flag(flag, "missing value");
      return argv[++i];
    };
    const auto no_value = [&] {
      if (has_value) bad_flag(flag, "takes no value");
    };
    const auto dim = [&](long long min) {
      return static_cast<int>(parse_int(flag, need_value(), min, kMaxDim));
    };

    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (flag == "--batch") {
      a.batch = dim(0);
    } else if (flag == "--seqlen-q") {
      a.seqlen_q = dim(0);
    } else if (flag == "--seqlen-k") {
      a.seqlen_k = dim(0);
    } else if (flag == "--heads") {
      a.heads = dim(1);
    } else if (flag == "--heads-kv") {
      a.heads_kv = dim(1);
    } else if (flag == "--head-dim") {
      a.head_dim = dim(1);
    } else if (flag == "--head-dim-v") {
      a.head_dim_v = dim(1);
    } else if (flag == "--dtype") {
      const std::string_view v = need_value();
      if (v == "fp32") a.dtype = DType::fp32;
      else if (v == "fp16") a.dtype = DType::fp16;
      else if (v == "bf16") a.dtype = DType::bf16;
      else bad_flag(flag, "expected fp32, fp16 or bf16, got '" + std::string(v) + "'");
    } else if (flag == "--causal") {
      no_value();
      a.causal = true;
    } else if (flag == "--window") {
      const std::string_view v = need_value();
      const auto comma = v.find(',');
      if (comma == std::string_view::npos)
        bad_flag(flag, "expected L,R (e.g. 128,0), got '" + std::string(v) + "'");
      a.window_left = static_cast<int>(parse_int(flag, v.substr(0, comma), -1, kMaxDim));
      a.window_right = static_cast<int>(parse_int(flag, v.substr(comma + 1), -1, kMaxDim));
    } else if (flag == "--softcap") {
      a.softcap = parse_float(flag, need_value());
      if (a.softcap < 0) bad_flag(flag, "must be >= 0");
    } else if (flag == "--deterministic") {
      no_value();
      a.deterministic = true;
    } else if (flag == "--backend") {
      const std::string_view v = need_value();
      if (v == "auto") a.backend = Backend::automatic;
      else if (v == "cpu") a.backend = Backend::cpu;
      else if (v == "cpu_reference") a.backend = Backend::cpu_reference;
      else if (v == "cuda_sm80") a.backend = Backend::cuda_sm80;
      else if (v == "cuda_sm90") a.backend = Backend::cuda_sm90;
      else
        bad_flag(flag, "expected auto, cpu, cpu_reference, cuda_sm80 or cuda_sm90, got '" +
                           std::string(v) + "'");
    } else if (flag == "--mode") {
      const std::string_view v = need_value();
      if (v == "fwd") a.mode = Mode::fwd;
      else if (v == "bwd") a.mode = Mode::bwd;
      else bad_flag(flag, "expected fwd or bwd, got '" + std::string(v) + "'");
    } else if (flag == "--reps") {
      a.reps = dim(1);
    } else if (flag == "--warmup") {
      a.warmup = dim(0);
    } else if (flag == "--seed") {
      a.seed = static_cast<std::uint64_t>(parse_int(flag, need_value(), 0, INT64_MAX));
    } else if (flag == "--no-check") {
      no_value();
      a.check = false;
    } else if (flag == "--gemm-baseline") {
      no_value();
      a.gemm_baseline = true;
    } else if (flag == "--json") {
      no_value();
      a.json = true;
    } else {
      bad_flag(flag, "unknown flag");
    }
  }
  return a;
}

Problem apply_defaults(const Args& a, bool gpu) {
  Problem p;
  // CPU: 2.1 GFLOP per forward, ~0.1 s a rep on 2 cores. GPU: 275 GFLOP, a few ms.
  p.batch = a.batch.value_or(gpu ? 4 : 1);
  const int n = gpu ? 4096 : 1024;
  p.seqlen_q = a.seqlen_q.value_or(a.seqlen_k.value_or(n));
  p.seqlen_k = a.seqlen_k.value_or(a.seqlen_q.value_or(n));
  p.heads = a.heads.value_or(gpu ? 16 : 8);
  p.heads_kv = a.heads_kv.value_or(p.heads);
  p.head_dim = a.head_dim.value_or(gpu ? 128 : 64);
  p.head_dim_v = a.head_dim_v.value_or(p.head_dim);
  p.dtype = a.dtype.value_or(DType::bf16);
  p.causal = a.causal;
  p.window_left = a.window_left;
  p.window_right = a.window_right;
  p.softcap = a.softcap;
  p.deterministic = a.deterministic;
  p.mode = a.mode;
  p.reps = a.reps.value_or(gpu ? 50 : 10);
  p.warmup = a.warmup.value_or(gpu ? 10 : 2);
  p.seed = a.seed;
  return p;
}

AttentionOptions Problem::options(Backend backend) const {
  AttentionOptions o;
  o.backend = backend;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = softcap;
  o.deterministic = deterministic;
  return o;
}

float Problem::scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

std::int64_t Problem::visible_pairs() const {
  const int right = causal ? 0 : window_right;
  const detail::WindowMask mask(seqlen_q, seqlen_k, window_left, right);
  std::int64_t pairs = 0;
  for (int i = 0; i < seqlen_q; ++i) {
    const auto r = mask.keys(i);
    pairs += std::max<std::int64_t>(0, r.end - r.begin);
  }
  return pairs * batch * heads;
}

double Problem::flops() const {
  const double fwd = 2.0 * static_cast<double>(visible_pairs()) * (head_dim + head_dim_v);
  return mode == Mode::fwd ? fwd : 2.5 * fwd;
}

}  // namespace flashcpp::bench
