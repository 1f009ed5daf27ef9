// Forward throughput of the CUDA sm80 backend through the public API: bf16, H=2048/D,
// B=16384/N (BENCH.md's training grid; N=4096 gives the issue's B=4), D in {64, 128, 256},
// causal and not. CUDA events, median of 30 timed runs after 5 warm-ups, on random normal
// inputs (constant inputs make every row max equal and skip work real data does not).
// FLOPs = 4 * B * H * N * N * D, halved for causal.
// Usage: [FLASHCPP_PROBE_N=1024,4096] flashcpp_fwd_tflops [D ...]   (default: N=4096,
// D = 64 128 256). Output: one CSV line per shape.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "flashcpp/flashcpp.hpp"

namespace {

// Standard normal bf16 from a counter hash (Box-Muller): no host copy of 200 MB of inputs.
__global__ void fill_normal(__nv_bfloat16* x, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t h = std::uint32_t(i) * 0x9E3779B9u ^ seed ^ std::uint32_t(i >> 32) * 0x85EBCA6Bu;
    h ^= h >> 16; h *= 0x7FEB352Du; h ^= h >> 15; h *= 0x846CA68Bu; h ^= h >> 16;
    const float u1 = (float(h >> 8) + 1.f) * (1.f / 16777217.f);
    const float u2 = float(h & 0xFFu) * (1.f / 256.f) + float((h >> 20) & 0xFFu) * (1.f / 65536.f);
    x[i] = __float2bfloat16(sqrtf(-2.f * logf(u1)) * cospif(2.f * u2));
  }
}

bool ok(cudaError_t e) {
  if (e == cudaSuccess) return true;
  std::printf("error: %s\n", cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flashcpp;
  std::vector<int> dims;
  for (int i = 1; i < argc; ++i) dims.push_back(std::atoi(argv[i]));
  if (dims.empty()) dims = {64, 128, 256};
  std::vector<int> lengths;
  if (const char* env = std::getenv("FLASHCPP_PROBE_N"))
    for (const char* c = env; *c;) {
      lengths.push_back(std::atoi(c));
      while (*c && *c != ',') ++c;
      if (*c == ',') ++c;
    }
  if (lengths.empty()) lengths = {4096};
  std::printf("dtype,B,H,N,D,causal,ms,tflops,kernel\n");
  for (int N : lengths) {
    for (int D : dims)
      for (bool causal : {false, true}) {
        const int B = 16384 / N;
        const int H = 2048 / D;
        const std::size_t elems = std::size_t(B) * N * H * D;
        void *q, *k, *v, *o;
        if (!ok(cudaMalloc(&q, elems * 2)) || !ok(cudaMalloc(&k, elems * 2)) ||
            !ok(cudaMalloc(&v, elems * 2)) || !ok(cudaMalloc(&o, elems * 2)))
          return 1;
        fill_normal<<<1024, 256>>>(static_cast<__nv_bfloat16*>(q), elems, 1u);
        fill_normal<<<1024, 256>>>(static_cast<__nv_bfloat16*>(k), elems, 2u);
        fill_normal<<<1024, 256>>>(static_cast<__nv_bfloat16*>(v), elems, 3u);
        if (!ok(cudaDeviceSynchronize())) return 1;
        const Device dev = Device::cuda(0);
        auto tq = TensorView::contiguous(q, DType::bf16, {B, N, H, D}, dev);
        auto tk = TensorView::contiguous(k, DType::bf16, {B, N, H, D}, dev);
        auto tv = TensorView::contiguous(v, DType::bf16, {B, N, H, D}, dev);
        auto to = TensorView::contiguous(o, DType::bf16, {B, N, H, D}, dev);
        AttentionOptions opt;
        opt.causal = causal;
        opt.backend = Backend::cuda_sm80;
        RunInfo info;
        for (int i = 0; i < 5; ++i) info = forward(tq, tk, tv, to, nullptr, opt);
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        std::vector<float> ms;
        for (int i = 0; i < 30; ++i) {
          cudaEventRecord(a);
          forward(tq, tk, tv, to, nullptr, opt);
          cudaEventRecord(b);
          cudaEventSynchronize(b);
          float t = 0;
          cudaEventElapsedTime(&t, a, b);
          ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        const double flops = 4.0 * B * H * double(N) * N * D * (causal ? 0.5 : 1.0);
        std::printf("bf16,%d,%d,%d,%d,%d,%.4f,%.1f,%s\n", B, H, N, D, int(causal), med,
                    flops / (med * 1e-3) / 1e12, info.kernel);
        cudaEventDestroy(a);
        cudaEventDestroy(b);
        cudaFree(q);
        cudaFree(k);
        cudaFree(v);
        cudaFree(o);
      }
  }
  return ok(cudaDeviceSynchronize()) ? 0 : 1;
}
