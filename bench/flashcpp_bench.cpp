// flashcpp-bench: one attention problem on the best backend present (the GPU when
// flashcpp::cuda_available(), else the CPU backend), checked against the float64 reference,
// with the median time, the throughput (visible (query, key) pairs only) and the max error.
// --gemm-baseline adds OpenBLAS sgemm at a comparable size on the same threads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench_args.hpp"
#include "bench_json.hpp"
#include "bench_run.hpp"
#include "bench_tensors.hpp"

#ifdef FLASHCPP_BENCH_WITH_CBLAS
#include <cblas.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace flashcpp::bench {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Progress::Progress(int total) : total_(total), start_(now_seconds()) {}

void Progress::step(int done) {
  // A terminal only: carriage returns would be glued into piped or logged output.
  if (now_seconds() - start_ < 2.0 || !isatty(STDERR_FILENO)) return;
  shown_ = true;
  std::fprintf(stderr, "\rrep %d/%d", done, total_);
  std::fflush(stderr);
}

Progress::~Progress() {
  if (shown_) std::fprintf(stderr, "\r%*s\r", 24, "");
}

Timing run_cpu(const Problem& p, Backend backend, Tensors& t) {
  const TensorView q = t.q.view(), k = t.k.view(), v = t.v.view(), out = t.out.view(),
                   lse = t.lse.view();
  const AttentionOptions options = p.options(backend);
  Timing timing;
  if (p.mode == Mode::bwd) forward(q, k, v, out, &lse, options);  // out and lse for backward
  const auto step = [&] {
    if (p.mode == Mode::fwd) return forward(q, k, v, out, &lse, options);
    return backward(q, k, v, out, t.dout.view(), lse, t.dq.view(), t.dk.view(), t.dv.view(),
                    options);
  };
  for (int i = 0; i < p.warmup; ++i) timing.info = step();
  Progress progress(p.reps);
  for (int i = 0; i < p.reps; ++i) {
    const double start = now_seconds();
    timing.info = step();
    timing.ms.push_back(1e3 * (now_seconds() - start));
    progress.step(i + 1);
  }
  return timing;
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int cpu_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

std::string rate(double flops, double ms) {
  char buf[64];
  const double per_second = ms > 0 ? flops / (ms * 1e-3) : 0;
  if (per_second >= 1e12) std::snprintf(buf, sizeof buf, "%.2f TFLOP/s", per_second * 1e-12);
  else std::snprintf(buf, sizeof buf, "%.2f GFLOP/s", per_second * 1e-9);
  return buf;
}

// OpenBLAS sgemm C[M, N] = A[M, K] B[N, K]^T (the shape of S = Q K^T), on all OpenMP threads;
// returns GFLOP/s from the median of `reps` calls, or a negative value without BLAS.
double sgemm_gflops(int m, int n, int kdim, int reps, int threads) {
#ifdef FLASHCPP_BENCH_WITH_CBLAS
  // The CPU backend pins OpenBLAS to 1 thread (it threads with OpenMP itself); give the
  // baseline the same threads the backend used.
  openblas_set_num_threads(threads);
  std::vector<float> a(static_cast<std::size_t>(m) * kdim, 0.5f), b(static_cast<std::size_t>(n) * kdim, 0.25f),
      c(static_cast<std::size_t>(m) * n);
  const auto call = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, kdim, 1.0f, a.data(), kdim,
                b.data(), kdim, 0.0f, c.data(), n);
  };
  call();  // warm-up: thread pool start, page faults
  std::vector<double> ms;
  for (int i = 0; i < std::max(reps, 3); ++i) {
    const double start = now_seconds();
    call();
    ms.push_back(1e3 * (now_seconds() - start));
  }
  openblas_set_num_threads(1);
  return 2.0 * m * n * kdim / (median(ms) * 1e-3) * 1e-9;
#else
  (void)m, (void)n, (void)kdim, (void)reps, (void)threads;
  return -1;
#endif
}

const char* yes_no(bool b) { return b ? "yes" : "no"; }

void print_problem(const Problem& p) {
  std::printf("flashcpp-bench\n");
  std::printf("  problem     %s B=%d Hq=%d Hkv=%d Nq=%d Nk=%d D=%d Dv=%d %s\n", mode_name(p.mode),
              p.batch, p.heads, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim, p.head_dim_v,
              dtype_name(p.dtype));
  std::printf(
      "  options     causal=%s window=(%d,%d) softcap=%g deterministic=%s scale=%.6g seed=%llu\n",
      yes_no(p.causal), p.window_left, p.window_right, p.softcap, yes_no(p.deterministic),
      p.scale(), static_cast<unsigned long long>(p.seed));
  std::fflush(stdout);
}

void print_timing(const JsonReport& r) {
  const Problem& p = r.problem;
  const RunInfo& info = r.timing.info;
  if (r.gpu)
    std::printf("  backend     %s, kernel %s, splits %d (GPU)\n", backend_name(info.backend),
                info.kernel, info.num_splits);
  else
    std::printf("  backend     %s, kernel %s, %d threads\n", backend_name(info.backend),
                info.kernel, r.cpu_threads);
  std::printf("  time        median %.3f ms over %d reps (warmup %d), min %.3f ms%s\n",
              r.median_ms, p.reps, p.warmup, r.min_ms, r.gpu ? " (cudaEvent)" : "");
  std::printf("  throughput  %s (%.4g GFLOP per call: %lld visible (query, key) pairs%s)\n",
              rate(p.flops(), r.median_ms).c_str(), p.flops() * 1e-9,
              static_cast<long long>(p.visible_pairs()), p.mode == Mode::bwd ? ", bwd = 2.5x fwd" : "");
  std::fflush(stdout);
}

void print_check(const CheckResult& check, double seconds) {
  std::printf("  check       %s vs the float64 reference (%s, %.1f s): %s\n",
              check.ok ? "PASS" : "FAIL", check.scope.c_str(), seconds,
              check.details.empty() ? "-" : check.details.c_str());
  std::printf("  max abs err %.3g\n", check.max_abs_err);
}

// attention_gflops: the run's own rate, compared with sgemm's on CPU runs.
void print_sgemm(int m, int n, int kdim, int threads, double gemm, double attention_gflops,
                 const Problem& p, bool gpu) {
  if (gemm < 0) {
    std::printf("  sgemm       unavailable: flashcpp-bench was built without OpenBLAS\n");
    return;
  }
  std::printf("  sgemm       OpenBLAS cblas_sgemm M=%d N=%d K=%d, %d threads: %.2f GFLOP/s\n", m, n,
              kdim, threads, gemm);
  if (gpu)
    std::printf("  ratio       (the ratio is reported for CPU runs; this run was on the GPU)\n");
  else
    std::printf("  ratio       CPU %s reaches %.1f%% of sgemm's GFLOP/s\n", mode_name(p.mode),
                100.0 * attention_gflops / gemm);
}

int run(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  const bool want_gpu = args.backend == Backend::cuda_sm80 || args.backend == Backend::cuda_sm90 ||
                        (args.backend == Backend::automatic && cuda_available());
  if (want_gpu && !cuda_available()) {
    std::fprintf(stderr, "flashcpp-bench: --backend %s needs a usable GPU and a CUDA build\n",
                 backend_name(args.backend));
    return 1;
  }
  const Problem p = apply_defaults(args, want_gpu);
  const Backend backend =
      args.backend == Backend::automatic && !want_gpu ? Backend::cpu : args.backend;
  const bool text = !args.json;
  if (text) print_problem(p);

  Tensors t(p);
  const Timing timing = want_gpu ? run_gpu(p, backend, t) : run_cpu(p, backend, t);
  const double ms = median(timing.ms);
  const double min_ms =
      timing.ms.empty() ? 0.0 : *std::min_element(timing.ms.begin(), timing.ms.end());
  JsonReport report{p, timing, want_gpu, cpu_threads(), ms, min_ms, {}, {}};
  if (text) print_timing(report);

  int status = 0;
  if (args.check) {
    // Whole problem up to 2e9 float64 multiply-adds (a second or two on 2 cores), else ~3e7
    // worth of sampled rows (one small reference call each).
    const double start = now_seconds();
    report.check = check_against_reference(p, t, 2e9, 3e7);
    if (text) print_check(*report.check, now_seconds() - start);
    if (!report.check->ok) status = 1;
  } else if (text) {
    std::printf("  check       skipped (--no-check)\n");
  }

  if (args.gemm_baseline) {
    const int threads = cpu_threads();
    const int m = std::max(p.seqlen_q, 1), n = std::max(p.seqlen_k, 1), kdim = p.head_dim;
    const double gemm = sgemm_gflops(m, n, kdim, std::max(p.reps, 5), threads);
    if (gemm >= 0) report.sgemm_gflops = gemm;
    const double attention_gflops = ms > 0 ? p.flops() / (ms * 1e-3) * 1e-9 : 0;
    if (text) print_sgemm(m, n, kdim, threads, gemm, attention_gflops, p, want_gpu);
  }
  if (!text) std::fputs(to_json(report).c_str(), stdout);
  return status;
}

}  // namespace
}  // namespace flashcpp::bench

int main(int argc, char** argv) {
  try {
    return flashcpp::bench::run(argc, argv);
  } catch (const flashcpp::Error& e) {
    std::fprintf(stderr, "flashcpp-bench: flashcpp error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashcpp-bench: error: %s\n", e.what());
  }
  return 1;
}
