// The GPU runner: device copies with cudaMalloc/cudaMemcpy, cudaEvent timing on one stream,
// every CUDA call checked.
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "bench_run.hpp"

#ifdef FLASHCPP_BENCH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashcpp::bench {

#ifndef FLASHCPP_BENCH_WITH_CUDA

Timing run_gpu(const Problem&, Backend, Tensors&) {
  throw std::runtime_error("this flashcpp-bench was built without CUDA (-DFLASHCPP_CUDA=ON)");
}

#else

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}
#define BENCH_CUDA(call) check((call), #call)

// A device copy of a host buffer, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes_) BENCH_CUDA(cudaMalloc(&ptr_, bytes_));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  Workspace workspace() const { return {ptr_, bytes_}; }
  void upload(const HostBuffer& h) {
    if (bytes_) BENCH_CUDA(cudaMemcpy(ptr_, h.data(), bytes_, cudaMemcpyHostToDevice));
  }
  void download(HostBuffer& h) const {
    if (bytes_) BENCH_CUDA(cudaMemcpy(h.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

}  // namespace

Timing run_gpu(const Problem& p, Backend backend, Tensors& t) {
  const Device gpu = Device::cuda(0);
  BENCH_CUDA(cudaSetDevice(0));
  DeviceBuffer q(t.q.bytes()), k(t.k.bytes()), v(t.v.bytes()), out(t.out.bytes()),
      lse(t.lse.bytes());
  q.upload(t.q);
  k.upload(t.k);
  v.upload(t.v);
  const TensorView qv = t.q.view(q.get(), gpu), kv = t.k.view(k.get(), gpu),
                   vv = t.v.view(v.get(), gpu), ov = t.out.view(out.get(), gpu),
                   lv = t.lse.view(lse.get(), gpu);
  const AttentionOptions options = p.options(backend);
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t begin = nullptr, end = nullptr;
  BENCH_CUDA(cudaEventCreate(&begin));
  BENCH_CUDA(cudaEventCreate(&end));

  DeviceBuffer fwd_ws(forward_workspace_size(qv, kv, vv, options));
  Timing timing;
  const auto run_forward = [&] {
    return forward(qv, kv, vv, ov, &lv, options, stream, fwd_ws.workspace());
  };
  std::function<RunInfo()> step = run_forward;

  // bwd: one forward for out and lse, then the backward is what is timed.
  std::unique_ptr<DeviceBuffer> dout, dq, dk, dv, bwd_ws;
  TensorView dov, dqv, dkv, dvv;
  if (p.mode == Mode::bwd) {
    run_forward();
    dout = std::make_unique<DeviceBuffer>(t.dout.bytes());
    dq = std::make_unique<DeviceBuffer>(t.dq.bytes());
    dk = std::make_unique<DeviceBuffer>(t.dk.bytes());
    dv = std::make_unique<DeviceBuffer>(t.dv.bytes());
    bwd_ws = std::make_unique<DeviceBuffer>(backward_workspace_size(qv, kv, vv, options));
    dout->upload(t.dout);
    dov = t.dout.view(dout->get(), gpu);
    dqv = t.dq.view(dq->get(), gpu);
    dkv = t.dk.view(dk->get(), gpu);
    dvv = t.dv.view(dv->get(), gpu);
    step = [&] {
      return backward(qv, kv, vv, ov, dov, lv, dqv, dkv, dvv, options, stream,
                      bwd_ws->workspace());
    };
  }
  for (int i = 0; i < p.warmup; ++i) timing.info = step();
  BENCH_CUDA(cudaStreamSynchronize(stream));
  Progress progress(p.reps);
  for (int i = 0; i < p.reps; ++i) {
    BENCH_CUDA(cudaEventRecord(begin, stream));
    timing.info = step();
    BENCH_CUDA(cudaEventRecord(end, stream));
    BENCH_CUDA(cudaEventSynchronize(end));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, begin, end));
    timing.ms.push_back(ms);
    progress.step(i + 1);
  }
  BENCH_CUDA(cudaGetLastError());
  out.download(t.out);
  lse.download(t.lse);
  if (p.mode == Mode::bwd) {
    dq->download(t.dq);
    dk->download(t.dk);
    dv->download(t.dv);
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaStreamDestroy(stream);
  return timing;
}

#endif

}  // namespace flashcpp::bench
