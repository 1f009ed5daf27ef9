// flashcpp-ladder: times every step of the teaching ladder (tutorial/README.md) on fixed problems
// and prints, per step, the median time, the throughput and the speed-up over the previous
// step. Every kernel's output is first checked against a float64 CPU computation (sampled
// rows or entries on the big problems); a mismatch stops the program with exit code 1.
//
//   flashcpp-ladder [--csv out.csv] [--reps 20] [--warmup 3]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention_reference.hpp"
#include "kernels/check.hpp"
#include "kernels/ladder.hpp"

namespace ladder = flashcpp::ladder;
using ladder::check_cuda;

namespace {

struct Options {
  std::string csv;
  int reps = 20;
  int warmup = 3;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--csv" && has_value) {
      o.csv = argv[++i];
    } else if (arg == "--reps" && has_value) {
      o.reps = std::max(20, std::atoi(argv[++i]));
    } else if (arg == "--warmup" && has_value) {
      o.warmup = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: flashcpp-ladder [--csv out.csv] [--reps N>=20] [--warmup N]\n");
      std::exit(arg == "--help" ? 0 : 2);
    }
  }
  return o;
}

// A cudaMalloc'd array of floats, freed on scope exit.
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    check_cuda(cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(float)), "cudaMalloc");
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  float* get() const { return data_; }
  void upload(const std::vector<float>& host) {
    check_cuda(cudaMemcpy(data_, host.data(), count_ * sizeof(float), cudaMemcpyHostToDevice),
               "cudaMemcpy H2D");
  }
  std::vector<float> download() const {
    std::vector<float> host(count_);
    check_cuda(cudaMemcpy(host.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost),
               "cudaMemcpy D2H");
    return host;
  }
  // All bits set is a NaN: a kernel that skips an element leaves it visible.
  void poison() { check_cuda(cudaMemset(data_, 0xff, count_ * sizeof(float)), "cudaMemset"); }

 private:
  float* data_ = nullptr;
  size_t count_;
};

std::vector<float> random_vector(size_t count, float lo, float hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(gen);
  return v;
}

[[noreturn]] void mismatch(const std::string& step, const std::string& where, double got,
                           double want) {
  std::fprintf(stderr, "\nMISMATCH in %s at %s: got %.9g, expected %.9g\n", step.c_str(),
               where.c_str(), got, want);
  std::exit(1);
}

// Median of `reps` event-timed runs after `warmup` untimed ones, in milliseconds.
double time_ms(const std::function<void()>& run, const Options& opt) {
  for (int i = 0; i < opt.warmup; ++i) run();
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> times;
  for (int i = 0; i < opt.reps; ++i) {
    check_cuda(cudaEventRecord(start), "cudaEventRecord");
    run();
    check_cuda(cudaEventRecord(stop), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Row {
  std::string problem, step, shape, metric;
  double ms, value, speedup;  // speedup over the previous step of the same problem; 0 = first
};

class Report {
 public:
  void add(const std::string& problem, const std::string& step, const std::string& shape,
           double ms, const std::string& metric, double value) {
    double speedup = 0;
    if (!rows_.empty() && rows_.back().problem == problem) speedup = rows_.back().ms / ms;
    rows_.push_back({problem, step, shape, metric, ms, value, speedup});
    const Row& r = rows_.back();
    std::printf("  %-26s %10.4f ms %10.1f %-8s", r.step.c_str(), r.ms, r.value, r.metric.c_str());
    if (r.speedup > 0) std::printf(" %7.2fx vs previous", r.speedup);
    std::printf("\n");
    std::fflush(stdout);
  }
  void write_csv(const std::string& path, const std::string& device) const {
    std::ofstream f(path);
    if (!f) throw std::runtime_error("cannot write " + path);
    f << "problem,step,shape,time_ms,metric,value,speedup_vs_prev,device\n";
    for (const Row& r : rows_) {
      f << r.problem << ',' << r.step << ',' << r.shape << ',' << r.ms << ',' << r.metric << ','
        << r.value << ',' << r.speedup << ',' << device << '\n';
    }
  }

 private:
  std::vector<Row> rows_;
};

// ---- softmax --------------------------------------------------------------------------------

void check_softmax(const std::string& step, const std::vector<float>& x,
                   const std::vector<float>& y, int rows, int cols) {
  const int samples = std::min(rows, 64);
  for (int s = 0; s < samples; ++s) {
    const size_t r = static_cast<size_t>(s) * (rows - 1) / std::max(samples - 1, 1);
    const float* in = &x[r * cols];
    double mx = -INFINITY, sum = 0;
    for (int c = 0; c < cols; ++c) mx = std::max(mx, double(in[c]));
    for (int c = 0; c < cols; ++c) sum += std::exp(in[c] - mx);
    for (int c = 0; c < cols; ++c) {
      const double want = std::exp(in[c] - mx) / sum;
      const double got = y[r * cols + c];
      if (!(std::abs(got - want) <= 1e-4 * want + 1e-9)) {
        mismatch(step, "row " + std::to_string(r) + " col " + std::to_string(c), got, want);
      }
    }
  }
}

void bench_softmax(int rows, int cols, Report& report, const Options& opt) {
  const std::string problem = "softmax " + std::to_string(rows) + "x" + std::to_string(cols);
  std::printf("\n%s fp32\n", problem.c_str());
  const size_t count = static_cast<size_t>(rows) * cols;
  const std::vector<float> x_host = random_vector(count, -8.0f, 8.0f, 1);
  DeviceArray x(count), y(count);
  x.upload(x_host);
  const double bytes = 2.0 * count * sizeof(float);  // read x once, write y once

  using Fn = void (*)(const float*, float*, int, int, cudaStream_t);
  const std::pair<const char*, Fn> steps[] = {{"1 shared-memory reduce", ladder::softmax_shared},
                                              {"2 warp shuffles", ladder::softmax_warp},
                                              {"3 float4 one pass", ladder::softmax_float4}};
  for (const auto& [name, fn] : steps) {
    const auto run = [&] { fn(x.get(), y.get(), rows, cols, nullptr); };
    y.poison();
    run();
    check_cuda(cudaDeviceSynchronize(), name);
    check_softmax(name, x_host, y.download(), rows, cols);
    const double ms = time_ms(run, opt);
    report.add(problem, name, std::to_string(rows) + "x" + std::to_string(cols), ms, "GB/s",
               bytes / (ms * 1e-3) / 1e9);
  }
}

// ---- matmul ---------------------------------------------------------------------------------

void check_matmul(const std::string& step, const std::vector<float>& a, const std::vector<float>& b,
                  const std::vector<float>& c, int m, int n, int k) {
  std::mt19937 gen(7);
  for (int s = 0; s < 256; ++s) {
    const int i = static_cast<int>(gen() % m);
    const int j = static_cast<int>(gen() % n);
    double want = 0, magnitude = 0;
    for (int p = 0; p < k; ++p) {
      const double prod = double(a[static_cast<size_t>(i) * k + p]) * b[static_cast<size_t>(p) * n + j];
      want += prod;
      magnitude += std::abs(prod);
    }
    const double got = c[static_cast<size_t>(i) * n + j];
    // fp32 accumulation of k terms; a TF32 product (10-bit mantissa) would fail this.
    if (!(std::abs(got - want) <= 1e-5 * magnitude + 1e-6)) {
      mismatch(step, "C[" + std::to_string(i) + "][" + std::to_string(j) + "]", got, want);
    }
  }
}

void bench_matmul(int size, Report& report, const Options& opt) {
  const int m = size, n = size, k = size;
  const std::string problem = "matmul " + std::to_string(size) + "^3";
  std::printf("\n%s fp32\n", problem.c_str());
  const size_t elems = static_cast<size_t>(size) * size;
  const std::vector<float> a_host = random_vector(elems, -1.0f, 1.0f, 2);
  const std::vector<float> b_host = random_vector(elems, -1.0f, 1.0f, 3);
  DeviceArray a(elems), b(elems), c(elems);
  a.upload(a_host);
  b.upload(b_host);
  const double flops = 2.0 * m * n * k;

  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate");
  // Plain fp32: no TF32 tensor cores, the same arithmetic as the ladder kernels.
  cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
  // Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
  const auto sgemm = [&] {
    const float one = 1.0f, zero = 0.0f;
    if (cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b.get(), n, a.get(), k,
                    &zero, c.get(), n) != CUBLAS_STATUS_SUCCESS) {
      throw std::runtime_error("cublasSgemm failed");
    }
  };
  const std::pair<const char*, std::function<void()>> steps[] = {
      {"1 naive", [&] { ladder::matmul_naive(a.get(), b.get(), c.get(), m, n, k, nullptr); }},
      {"2 tiled 128x128 + 8x8 regs", [&] { ladder::matmul_tiled(a.get(), b.get(), c.get(), m, n, k, nullptr); }},
      {"ref cuBLAS sgemm", sgemm}};
  for (const auto& [name, run] : steps) {
    c.poison();
    run();
    check_cuda(cudaDeviceSynchronize(), name);
    check_matmul(name, a_host, b_host, c.download(), m, n, k);
    const double ms = time_ms(run, opt);
    report.add(problem, name, std::to_string(size) + "^3", ms, "TFLOP/s", flops / (ms * 1e-3) / 1e12);
  }
  cublasDestroy(handle);
}

// ---- attention ------------------------------------------------------------------------------

// Checks 64 sampled (head, query row) outputs against a float64 computation.
void check_attention(const std::string& step, const std::vector<float>& q,
                     const std::vector<float>& k, const std::vector<float>& v,
                     const std::vector<float>& o, const ladder::AttentionShape& s) {
  const int n = s.seqlen, d = s.head_dim;
  std::mt19937 gen(11);
  std::vector<double> want(d);
  for (int sample = 0; sample < 64; ++sample) {
    const size_t head = gen() % (static_cast<size_t>(s.batch) * s.heads);
    const int i = static_cast<int>(gen() % n);
    ladder::attention_row_reference(q, k, v, s, head, i, want.data());
    for (int c = 0; c < d; ++c) {
      const double got = o[(head * n + i) * d + c];
      if (!(std::abs(got - want[c]) <= 2e-4 + 1e-3 * std::abs(want[c]))) {
        mismatch(step, "head " + std::to_string(head) + " row " + std::to_string(i) + " col " +
                           std::to_string(c), got, want[c]);
      }
    }
  }
}

void bench_attention(const ladder::AttentionShape& s, Report& report, const Options& opt) {
  const std::string shape = "B" + std::to_string(s.batch) + " H" + std::to_string(s.heads) +
                            " N" + std::to_string(s.seqlen) + " D" + std::to_string(s.head_dim) +
                            (s.causal ? " causal" : "");
  const std::string problem = "attention " + shape;
  std::printf("\n%s fp32\n", problem.c_str());
  const size_t elems = static_cast<size_t>(s.batch) * s.heads * s.seqlen * s.head_dim;
  const std::vector<float> q_host = random_vector(elems, -1.0f, 1.0f, 4);
  const std::vector<float> k_host = random_vector(elems, -1.0f, 1.0f, 5);
  const std::vector<float> v_host = random_vector(elems, -1.0f, 1.0f, 6);
  DeviceArray q(elems), k(elems), v(elems), o(elems);
  DeviceArray workspace(ladder::attention_unfused_workspace_bytes(s) / sizeof(float));
  q.upload(q_host);
  k.upload(k_host);
  v.upload(v_host);
  // Two N x N x D products per head; causal does half the useful work.
  const double flops = 4.0 * s.batch * s.heads * double(s.seqlen) * s.seqlen * s.head_dim /
                       (s.causal ? 2.0 : 1.0);

  const std::pair<const char*, std::function<void()>> steps[] = {
      {"1 unfused (N x N in HBM)",
       [&] { ladder::attention_unfused(q.get(), k.get(), v.get(), o.get(), workspace.get(), s, nullptr); }},
      {"2 scalar flash",
       [&] { ladder::attention_flash_scalar(q.get(), k.get(), v.get(), o.get(), s, nullptr); }}};
  for (const auto& [name, run] : steps) {
    o.poison();
    run();
    check_cuda(cudaDeviceSynchronize(), name);
    check_attention(name, q_host, k_host, v_host, o.download(), s);
    const double ms = time_ms(run, opt);
    report.add(problem, name, shape, ms, "TFLOP/s", flops / (ms * 1e-3) / 1e12);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  try {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    std::printf("flashcpp-ladder on %s (sm_%d%d), median of %d runs after %d warm-up\n",
                prop.name, prop.major, prop.minor, opt.reps, opt.warmup);

    Report report;
    bench_softmax(1024, 1024, report, opt);
    bench_softmax(8192, 8192, report, opt);
    bench_matmul(4096, report, opt);
    bench_attention({4, 16, 2048, 64, false}, report, opt);
    bench_attention({4, 16, 2048, 64, true}, report, opt);  // what skipping masked tiles buys
    if (!opt.csv.empty()) {
      report.write_csv(opt.csv, prop.name);
      std::printf("\nwrote %s\n", opt.csv.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashcpp-ladder: %s\n", e.what());
    return 1;
  }
  return 0;
}
