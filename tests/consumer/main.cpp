// One small forward on the CPU through an installed flashcpp: the output must be finite and the
// call must report the CPU backend. Exit code 0 on success.
#include <cmath>
#include <cstdio>
#include <vector>

#include "flashcpp/flashcpp.hpp"

int main() {
  constexpr int kBatch = 1, kSeq = 16, kHeads = 2, kDim = 32;
  std::vector<float> q(kBatch * kSeq * kHeads * kDim), k(q.size()), v(q.size()), out(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) {
    q[i] = std::sin(0.37f * static_cast<float>(i));
    k[i] = std::cos(0.11f * static_cast<float>(i));
    v[i] = std::sin(0.05f * static_cast<float>(i) + 1.0f);
  }
  using flashcpp::DType;
  using flashcpp::TensorView;
  const auto view = [](std::vector<float>& data) {
    return TensorView::contiguous(data.data(), DType::fp32, {kBatch, kSeq, kHeads, kDim});
  };
  flashcpp::AttentionOptions options;
  options.causal = true;
  try {
    const flashcpp::RunInfo info =
        flashcpp::forward(view(q), view(k), view(v), view(out), nullptr, options);
    if (info.backend != flashcpp::Backend::cpu) {
      std::fprintf(stderr, "consumer: expected the cpu backend, got %s\n",
                   flashcpp::backend_name(info.backend));
      return 1;
    }
    for (float x : out) {
      if (!std::isfinite(x)) {
        std::fprintf(stderr, "consumer: non-finite output %f\n", static_cast<double>(x));
        return 1;
      }
    }
    std::printf("consumer: flashcpp %d.%d.%d forward on %s (%s) ok\n", FLASHCPP_VERSION_MAJOR,
                FLASHCPP_VERSION_MINOR, FLASHCPP_VERSION_PATCH,
                flashcpp::backend_name(info.backend), info.kernel);
  } catch (const flashcpp::Error& e) {
    std::fprintf(stderr, "consumer: flashcpp error: %s\n", e.what());
    return 1;
  }
  return 0;
}
