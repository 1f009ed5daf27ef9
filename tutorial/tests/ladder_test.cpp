// Tests of the teaching-ladder kernels (tutorial/kernels) against float64 CPU computations, on
// fresh random inputs of awkward sizes, with every output poisoned with NaN first.
// GPU cases skip when no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "flashcpp/error.hpp"
#include "kernels/attention_reference.hpp"
#include "kernels/ladder.hpp"

namespace {

namespace ladder = flashcpp::ladder;

bool has_cuda_device() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!has_cuda_device()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount)"

// A device array of floats, freed on scope exit.
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(float)), cudaSuccess);
  }
  explicit DeviceArray(const std::vector<float>& host) : DeviceArray(host.size()) {
    EXPECT_EQ(cudaMemcpy(data_, host.data(), count_ * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  float* get() const { return data_; }
  void poison() { EXPECT_EQ(cudaMemset(data_, 0xff, count_ * sizeof(float)), cudaSuccess); }
  std::vector<float> download() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  float* data_ = nullptr;
  size_t count_;
};

// Fresh inputs on every run; the seed is printed with any failure so it can be replayed.
unsigned fresh_seed() { return std::random_device{}(); }

std::vector<float> random_vector(size_t count, float lo, float hi, std::mt19937& gen) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(gen);
  return v;
}

// ---- matmul ---------------------------------------------------------------------------------

using MatmulFn = void (*)(const float*, const float*, float*, int, int, int, cudaStream_t);

void check_matmul(MatmulFn fn, int m, int n, int k) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
               " seed=" + std::to_string(seed));
  std::mt19937 gen(seed);
  const std::vector<float> a = random_vector(size_t(m) * k, -1, 1, gen);
  const std::vector<float> b = random_vector(size_t(k) * n, -1, 1, gen);
  DeviceArray a_dev(a), b_dev(b), c_dev(size_t(m) * n);
  c_dev.poison();
  fn(a_dev.get(), b_dev.get(), c_dev.get(), m, n, k, nullptr);
  const std::vector<float> c = c_dev.download();
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0, magnitude = 0;
      for (int p = 0; p < k; ++p) {
        const double prod = double(a[size_t(i) * k + p]) * b[size_t(p) * n + j];
        want += prod;
        magnitude += std::abs(prod);
      }
      const double got = c[size_t(i) * n + j];
      ASSERT_LE(std::abs(got - want), 1e-5 * magnitude + 1e-6) << "C[" << i << "][" << j << "]";
    }
  }
}

const int kMatmulShapes[][3] = {{127, 65, 33}, {1, 1, 1}, {1, 300, 7}, {130, 129, 257}, {256, 128, 64}};

TEST(LadderMatmul, NaiveMatchesFloat64) {
  SKIP_WITHOUT_GPU();
  for (const auto& s : kMatmulShapes) check_matmul(ladder::matmul_naive, s[0], s[1], s[2]);
}

TEST(LadderMatmul, TiledMatchesFloat64) {
  SKIP_WITHOUT_GPU();
  for (const auto& s : kMatmulShapes) check_matmul(ladder::matmul_tiled, s[0], s[1], s[2]);
}

// ---- softmax --------------------------------------------------------------------------------

using SoftmaxFn = void (*)(const float*, float*, int, int, cudaStream_t);

void expect_softmax(const std::vector<float>& x, const std::vector<float>& y, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    const float* in = &x[size_t(r) * cols];
    double mx = -INFINITY, sum = 0;
    for (int c = 0; c < cols; ++c) mx = std::max(mx, double(in[c]));
    for (int c = 0; c < cols; ++c) sum += std::exp(in[c] - mx);
    for (int c = 0; c < cols; ++c) {
      const double want = std::exp(in[c] - mx) / sum;
      const double got = y[size_t(r) * cols + c];
      ASSERT_LE(std::abs(got - want), 1e-5 * want + 1e-9) << "row " << r << " col " << c;
    }
  }
}

// x_offset shifts the input and output by that many floats (misaligning float4 accesses).
void check_softmax(SoftmaxFn fn, int rows, int cols, bool in_place = false, int x_offset = 0) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
               (in_place ? " in place" : "") + " offset=" + std::to_string(x_offset) +
               " seed=" + std::to_string(seed));
  std::mt19937 gen(seed);
  const size_t count = size_t(rows) * cols;
  std::vector<float> x = random_vector(count + x_offset, -10, 10, gen);
  DeviceArray x_dev(x), y_dev(count + x_offset);
  y_dev.poison();
  float* out = in_place ? x_dev.get() + x_offset : y_dev.get() + x_offset;
  fn(x_dev.get() + x_offset, out, rows, cols, nullptr);
  std::vector<float> y = (in_place ? x_dev : y_dev).download();
  x.erase(x.begin(), x.begin() + x_offset);
  y.erase(y.begin(), y.begin() + x_offset);
  expect_softmax(x, y, rows, cols);
}

// 1000 and 4096: float4 register path; 1027 and 3: scalar fallback; 20000: online path.
const int kSoftmaxShapes[][2] = {{7, 1000}, {3, 1027}, {1, 1}, {4, 3}, {5, 4096}, {2, 20000}};

TEST(LadderSoftmax, SharedMemoryMatchesFloat64) {
  SKIP_WITHOUT_GPU();
  for (const auto& s : kSoftmaxShapes) check_softmax(ladder::softmax_shared, s[0], s[1]);
}

TEST(LadderSoftmax, WarpShuffleMatchesFloat64) {
  SKIP_WITHOUT_GPU();
  for (const auto& s : kSoftmaxShapes) check_softmax(ladder::softmax_warp, s[0], s[1]);
}

TEST(LadderSoftmax, Float4MatchesFloat64) {
  SKIP_WITHOUT_GPU();
  for (const auto& s : kSoftmaxShapes) check_softmax(ladder::softmax_float4, s[0], s[1]);
}

TEST(LadderSoftmax, Float4InPlaceAndMisaligned) {
  SKIP_WITHOUT_GPU();
  check_softmax(ladder::softmax_float4, 6, 1024, /*in_place=*/true);
  check_softmax(ladder::softmax_float4, 3, 1000, /*in_place=*/false, /*x_offset=*/1);
}

// ---- attention ------------------------------------------------------------------------------

// O[head, i, :] in float64 for every head and row.
std::vector<double> reference_attention(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v,
                                        const ladder::AttentionShape& s) {
  const int n = s.seqlen, d = s.head_dim;
  std::vector<double> out(q.size());
  for (size_t head = 0; head < size_t(s.batch) * s.heads; ++head)
    for (int i = 0; i < n; ++i)
      ladder::attention_row_reference(q, k, v, s, head, i, &out[(head * n + i) * d]);
  return out;
}

template <class Run>
void check_attention(const ladder::AttentionShape& s, Run run) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("B=" + std::to_string(s.batch) + " H=" + std::to_string(s.heads) +
               " N=" + std::to_string(s.seqlen) + " D=" + std::to_string(s.head_dim) +
               (s.causal ? " causal" : "") + " seed=" + std::to_string(seed));
  std::mt19937 gen(seed);
  const size_t count = size_t(s.batch) * s.heads * s.seqlen * s.head_dim;
  // Inputs up to +-2 make scores up to ~4 sqrt(D), so the softmax is far from uniform.
  const std::vector<float> q = random_vector(count, -2, 2, gen);
  const std::vector<float> k = random_vector(count, -2, 2, gen);
  const std::vector<float> v = random_vector(count, -1, 1, gen);
  DeviceArray q_dev(q), k_dev(k), v_dev(v), o_dev(count);
  o_dev.poison();
  run(q_dev.get(), k_dev.get(), v_dev.get(), o_dev.get(), s);
  const std::vector<float> o = o_dev.download();
  const std::vector<double> want = reference_attention(q, k, v, s);
  for (size_t e = 0; e < count; ++e) {
    ASSERT_LE(std::abs(o[e] - want[e]), 2e-5 + 1e-4 * std::abs(want[e])) << "element " << e;
  }
}

template <class Run>
void check_attention_shapes(Run run) {
  for (int d : {32, 64, 128}) {
    for (int n : {1, 17, 203}) {
      for (bool causal : {false, true}) check_attention({2, 3, n, d, causal}, run);
    }
  }
}

TEST(LadderAttention, UnfusedMatchesFloat64) {
  SKIP_WITHOUT_GPU();
  check_attention_shapes([](const float* q, const float* k, const float* v, float* o,
                            const ladder::AttentionShape& s) {
    DeviceArray workspace(ladder::attention_unfused_workspace_bytes(s) / sizeof(float));
    workspace.poison();
    ladder::attention_unfused(q, k, v, o, workspace.get(), s, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  });
}

TEST(LadderAttention, ScalarFlashMatchesFloat64) {
  SKIP_WITHOUT_GPU();
  check_attention_shapes([](const float* q, const float* k, const float* v, float* o,
                            const ladder::AttentionShape& s) {
    ladder::attention_flash_scalar(q, k, v, o, s, nullptr);
  });
}

// Needs no GPU: the shape is refused before anything is launched.
TEST(LadderAttention, RejectsUnsupportedHeadDim) {
  const ladder::AttentionShape s{1, 1, 16, 48, false};
  EXPECT_THROW(ladder::attention_flash_scalar(nullptr, nullptr, nullptr, nullptr, s, nullptr),
               flashcpp::Error);
  EXPECT_THROW(ladder::attention_unfused(nullptr, nullptr, nullptr, nullptr, nullptr, s, nullptr),
               flashcpp::Error);
}

}  // namespace
