// Forward throughput of the CUDA backend through the public API: bf16, B=4, H=2048/D, N=4096,
// D in {64, 128, 256}, causal and not. CUDA events, median of 30 timed runs after 5 warm-ups.
// FLOPs = 4 * B * H * N * N * D, halved for causal. Output: one CSV line per shape.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "flashcpp/flashcpp.hpp"

int main() {
  using namespace flashcpp;
  const int B = 4, N = 4096;
  std::printf("dtype,B,H,N,D,causal,ms,tflops,kernel\n");
  for (int D : {64, 128, 256})
    for (bool causal : {false, true}) {
      const int H = 2048 / D;
      const std::size_t elems = std::size_t(B) * N * H * D;
      void *q, *k, *v, *o;
      cudaMalloc(&q, elems * 2);
      cudaMalloc(&k, elems * 2);
      cudaMalloc(&v, elems * 2);
      cudaMalloc(&o, elems * 2);
      cudaMemset(q, 0x3c, elems * 2);  // small finite bf16 values
      cudaMemset(k, 0x3c, elems * 2);
      cudaMemset(v, 0x3c, elems * 2);
      const Device dev = Device::cuda(0);
      auto tq = TensorView::contiguous(q, DType::bf16, {B, N, H, D}, dev);
      auto tk = TensorView::contiguous(k, DType::bf16, {B, N, H, D}, dev);
      auto tv = TensorView::contiguous(v, DType::bf16, {B, N, H, D}, dev);
      auto to = TensorView::contiguous(o, DType::bf16, {B, N, H, D}, dev);
      AttentionOptions opt;
      opt.causal = causal;
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
      cudaFree(q);
      cudaFree(k);
      cudaFree(v);
      cudaFree(o);
    }
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
