#pragma once
// Host tensors of one benchmark problem (dense BSHD, in the problem's dtype), and the pieces
// shared by the CPU and GPU runners and the reference check.
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "bench_args.hpp"
#include "common/half.hpp"
#include "flashcpp/flashcpp.hpp"

namespace flashcpp::bench {

// A dense row-major host tensor of up to rank 4.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(DType dtype, std::vector<std::int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    bytes_.assign(static_cast<std::size_t>(numel()) * dtype_size(dtype_), 0);
  }

  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const {
    if (shape_.empty()) return 0;  // a default (absent) tensor
    std::int64_t n = 1;
    for (auto s : shape_) n *= s;
    return n;
  }
  std::size_t bytes() const { return bytes_.size(); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

  float get(std::int64_t i) const {
    std::uint16_t h;
    float f;
    switch (dtype_) {
      case DType::fp16: std::memcpy(&h, &bytes_[i * 2], 2); return detail::fp16_to_float(h);
      case DType::bf16: std::memcpy(&h, &bytes_[i * 2], 2); return detail::bf16_to_float(h);
      default: std::memcpy(&f, &bytes_[i * 4], 4); return f;
    }
  }
  void set(std::int64_t i, float x) {
    std::uint16_t h;
    switch (dtype_) {
      case DType::fp16: h = detail::float_to_fp16(x); std::memcpy(&bytes_[i * 2], &h, 2); return;
      case DType::bf16: h = detail::float_to_bf16(x); std::memcpy(&bytes_[i * 2], &h, 2); return;
      default: std::memcpy(&bytes_[i * 4], &x, 4); return;
    }
  }

  // A view of this memory, or of `device_data` (same layout) when given.
  TensorView view(void* device_data = nullptr, Device device = {}) {
    TensorView v;
    v.data = device_data ? device_data : (numel() ? data() : nullptr);
    v.dtype = dtype_;
    v.rank = static_cast<int>(shape_.size());
    v.device = device;
    std::int64_t stride = 1;
    for (int d = v.rank - 1; d >= 0; --d) {
      v.shape[d] = shape_[d];
      v.stride[d] = stride;
      stride *= shape_[d];
    }
    return v;
  }

 private:
  DType dtype_ = DType::fp32;
  std::vector<std::int64_t> shape_;
  std::vector<std::uint8_t> bytes_;
};

// q [B, Nq, Hq, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv], out/dout [B, Nq, Hq, Dv],
// lse [B, Hq, Nq]; the gradients only in bwd mode.
struct Tensors {
  HostBuffer q, k, v, out, lse, dout, dq, dk, dv;

  explicit Tensors(const Problem& p) {
    const DType t = p.dtype;
    q = HostBuffer(t, {p.batch, p.seqlen_q, p.heads, p.head_dim});
    k = HostBuffer(t, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim});
    v = HostBuffer(t, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v});
    out = HostBuffer(t, {p.batch, p.seqlen_q, p.heads, p.head_dim_v});
    lse = HostBuffer(DType::fp32, {p.batch, p.heads, p.seqlen_q});
    if (p.mode == Mode::bwd) {
      dout = out;
      dq = q;
      dk = k;
      dv = v;
    }
    std::mt19937_64 rng(p.seed * 0x9e3779b97f4a7c15ull + 1);
    std::normal_distribution<float> normal;
    for (HostBuffer* x : {&q, &k, &v, &dout})
      for (std::int64_t i = 0; i < x->numel(); ++i) x->set(i, normal(rng));
  }
};

// Result of comparing against the float64 reference.
struct CheckResult {
  bool done = false;
  bool ok = true;
  std::string scope;     // what was checked
  std::string details;   // per-tensor errors
  double max_abs_err = 0;
};

// Compares t's outputs (out and lse for fwd; dq, dk, dv for bwd) with the reference, on the
// whole problem when that costs at most `full_budget` multiply-adds, else on a sample of rows
// costing about `sample_budget` (one reference call per sampled row: slower per MAC).
CheckResult check_against_reference(const Problem& p, const Tensors& t, double full_budget,
                                    double sample_budget);

}  // namespace flashcpp::bench
