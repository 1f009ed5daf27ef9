#pragma once
// Options of an attention call, the backends that can run it, and what ran.
#include <cstdint>
#include <optional>

namespace flashcpp {

struct TensorView;

// Which implementation runs a call. `automatic` picks the fastest one present for the
// tensors' device: the CPU backend for CPU tensors; sm90 kernels on Hopper, sm80 kernels on
// Ampere/Ada (and as the fallback for what sm90 does not cover) for CUDA tensors.
enum class Backend : std::uint8_t {
  automatic,
  cpu_reference,  // float64 reference that materialises S and P: the test oracle
  cpu,            // tiled online-softmax (FlashAttention on the CPU), threaded
  cuda_sm80,      // mma.sync kernels, sm80 and newer
  cuda_sm90,      // TMA + wgmma kernels, sm90a
};

const char* backend_name(Backend backend);

// Dequantisation factors of fp8_e4m3 inputs (FlashAttention-3's q_descale / k_descale /
// v_descale): the call computes with q * q_descale, k * k_descale, v * v_descale. Each is a
// float32 tensor on the inputs' device, [B, Hkv] (one factor per sequence and kv head; any
// strides, 0 broadcasts) or [1] (one per tensor), read on the device only (CUDA-graph safe).
// Null means 1. Given for a tensor that is not fp8_e4m3, it is an error. For the KV cache, k
// and v are the caches (and k_new / v_new are quantised with these factors when appended).
struct Descales {
  const TensorView* q = nullptr;
  const TensorView* k = nullptr;
  const TensorView* v = nullptr;
};

struct AttentionOptions {
  // Multiplies q.k before the softmax; defaults to 1/sqrt(head dim).
  std::optional<float> softmax_scale;
  // Bottom-right aligned causal mask: key j is visible to query i iff j <= i + Nk - Nq.
  bool causal = false;
  // Sliding window (left, right) around the diagonal i + Nk - Nq; -1 means unbounded.
  // Causal is window (-1, 0); with both set, causal caps `window_right` at 0.
  int window_left = -1;
  int window_right = -1;
  // Softcap c > 0 replaces the score s by c * tanh(s / c); 0 turns it off.
  float softcap = 0.0f;
  Backend backend = Backend::automatic;
  // Backward only: bitwise-identical gradients run to run.
  bool deterministic = false;
  // Forward on CUDA: number of KV splits (flash-decoding); 0 lets a heuristic choose.
  int num_splits = 0;
  // fp8_e4m3 inputs only (forward and KV cache; the backward takes no fp8).
  Descales descale;
  // Forward with fp8_e4m3 q, k, v only: lets the CUDA FP8 forward carry O in the tensor cores'
  // accumulator along the whole row, as FlashAttention-3 and cuDNN do (torch's
  // `use_fast_accum`): faster (D 256 +18-21% on an H100), but the tensor cores' FP8 adder
  // keeps ~13 bits below the running sum, so once O is large against one key block's terms
  // those terms are lost: a row of flat attention (P = 1, v = 1) stops growing at ~2^14 keys.
  // Off (the default), each key block's P V is added to O in fp32. docs/semantics.md, "FP8".
  // The CPU backends compute exactly either way; set for any other call it is an error.
  bool fp8_fast_accum = false;
};

// What a call ran: the backend and the kernel's name, so tests and benchmarks know.
struct RunInfo {
  Backend backend = Backend::automatic;
  const char* kernel = "";
  int num_splits = 1;
};

}  // namespace flashcpp
