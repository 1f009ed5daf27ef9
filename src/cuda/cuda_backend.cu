// The CUDA backend seen by the API layer: device queries, backend choice, split-KV decision,
// workspace layout and dispatch to the generated sm80 and sm90a instantiations.
#include "cuda/cuda_backend.hpp"

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/fwd_params.hpp"
#include "cuda/common/split_heuristic.hpp"
#include "cuda/common/tile_table.hpp"
#include "cuda/common/bwd_params.hpp"
#include "cuda/sm80/bwd_registry.hpp"
#include "cuda/sm80/fwd_registry.hpp"
#include "cuda/common/intern_name.hpp"
#include "cuda/common/kernel_registry.hpp"
#include "cuda/sm90/bwd_dispatch.hpp"
#include "cuda/sm90/fwd_dispatch.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda {
namespace {

const char* element_name(ElementType t) {
  switch (t) {
    case ElementType::fp16: return "fp16";
    case ElementType::bf16: return "bf16";
    default: return "fp32";
  }
}

// ---- device properties, queried once per device ----
struct DeviceInfo {
  int major = 0, minor = 0, sm_count = 0;
  std::string name;
};

const DeviceInfo& device_info(int device) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<DeviceInfo>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) (void)cudaGetLastError();
  if (device < 0 || device >= count)
    throw Error("q is on cuda:" + std::to_string(device) + " but " + std::to_string(count) +
                " CUDA device(s) are present");
  if (cache.size() <= std::size_t(device)) cache.resize(device + 1);
  if (!cache[device]) {
    cudaDeviceProp prop{};
    FLASHCPP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    auto info = std::make_unique<DeviceInfo>();
    info->major = prop.major;
    info->minor = prop.minor;
    info->sm_count = prop.multiProcessorCount;
    info->name = prop.name;
    cache[device] = std::move(info);
  }
  return *cache[device];
}

// Runs `launch` with `device` current and gives the caller back its own device, on error too.
template <class Launch>
void launch_on_device(int device, Launch&& launch) {
  int current = 0;
  FLASHCPP_CUDA_CHECK(cudaGetDevice(&current));
  if (current == device) return launch();
  FLASHCPP_CUDA_CHECK(cudaSetDevice(device));
  try {
    launch();
  } catch (...) {
    cudaSetDevice(current);
    throw;
  }
  FLASHCPP_CUDA_CHECK(cudaSetDevice(current));
}

// ---- the sm80 forward registry ----
struct Sm80Kernel {
  ElementType dtype;
  int head_dim;
  sm80::FwdEntry entry;
};

#define FLASHCPP_SM80_FWD(dtype, hdim) {ElementType::dtype, hdim, &sm80::fwd_##dtype##_hdim##hdim},
constexpr Sm80Kernel kSm80Kernels[] = {
#include "fwd_sm80_registry.inc"
    {ElementType::fp32, 0, nullptr}  // sentinel: keeps the array valid in an empty build
};
#undef FLASHCPP_SM80_FWD

// The smallest instantiation of this dtype whose head dim covers the call's (smaller head
// dims run zero-padded).
const Sm80Kernel& find_sm80_kernel(const ForwardParams& p) {
  const Sm80Kernel* best = smallest_covering(kSm80Kernels, p.dtype, p.head_dim);
  if (!best)
    throw Error("cuda: no sm80 kernel for head dim " + std::to_string(p.head_dim) + " " +
                element_name(p.dtype) + " in this build (built head dims for " +
                element_name(p.dtype) + ": " + built_head_dims(kSm80Kernels, p.dtype) +
                "); configure with -DFLASHCPP_HEAD_DIMS=... and -DFLASHCPP_DTYPES=...");
  return *best;
}

// Kernel names for RunInfo, e.g. "sm80_fwd_bf16_hdim128_128x64_4w_splitkv".
const char* kernel_name(const Sm80Kernel& k, bool split) {
  const FwdTile t = sm80_fwd_tile(k.head_dim);
  return intern_name(std::string("sm80_fwd_") + element_name(k.dtype) + "_hdim" +
                     std::to_string(k.head_dim) + "_" + std::to_string(t.block_m) + "x" +
                     std::to_string(t.block_n) + "_" + std::to_string(t.warps) + "w" +
                     (split ? "_splitkv" : ""));
}

int num_m_blocks(const ForwardParams& p, const FwdTile& t) {
  return int((std::int64_t(p.seqlen_q) + t.block_m - 1) / t.block_m);
}
int num_n_blocks(const ForwardParams& p, const FwdTile& t) {
  return int((std::int64_t(p.seqlen_k) + t.block_n - 1) / t.block_n);
}

std::size_t split_workspace_bytes(const ForwardParams& p, int splits) {
  if (splits <= 1) return 0;
  return std::size_t(split_o_accum_elems(p, splits) + split_lse_accum_elems(p, splits)) *
         sizeof(float);
}

// Splits the heuristic wants, ignoring how much workspace the caller has.
int heuristic_splits(const ForwardParams& p, const FwdTile& t) {
  const int n_blocks = num_n_blocks(p, t);
  const int s = split_heuristic(std::int64_t(p.batch) * p.heads_q * num_m_blocks(p, t),
                                n_blocks, device_info(p.device).sm_count);
  if (s <= 1) return 1;
  const int per_split = (n_blocks + s - 1) / s;
  return (n_blocks + per_split - 1) / per_split;  // no split left without blocks
}

void check_sm80_supported(const ForwardParams& p) {
  if (p.head_dim_v != p.head_dim)
    throw Error("cuda sm80 forward: head_dim_v (" + std::to_string(p.head_dim_v) +
                ") different from head_dim (" + std::to_string(p.head_dim) +
                ") is not supported yet");
  if (p.dtype != ElementType::fp16 && p.dtype != ElementType::bf16)
    throw Error(std::string("cuda sm80 forward: dtype ") + element_name(p.dtype) +
                " is not supported (supported: fp16, bf16)");
  (void)find_sm80_kernel(p);
}

// Softmax scales folded on the host (shared by every forward kernel): exp2 takes
// s * scale_log2 - max * scale_log2; with softcap, tanh already consumed scale / softcap.
void fold_scales(FwdKernelParams& kp) {
  constexpr float kLog2e = 1.4426950408889634f;
  if (kp.p.softcap > 0.f) {
    kp.softcap_in_scale = kp.p.scale / kp.p.softcap;
    kp.lse_scale = kp.p.softcap;
  } else {
    kp.lse_scale = kp.p.scale;
  }
  kp.scale_log2 = kp.lse_scale * kLog2e;
}

bool is_sm90(const DeviceInfo& dev) { return dev.major == 9 && dev.minor == 0; }

// The sm90 kernels do not split KV yet: calls the sm80 path would split go there.
bool sm90_runs(const ForwardParams& p) {
  if (!sm90::covers(p)) return false;
  if (p.num_splits > 1) return false;
  return p.num_splits == 1 || heuristic_splits(p, sm80_fwd_tile(p.head_dim)) <= 1;
}

RunInfo forward_sm90(const ForwardParams& params, Stream stream) {
  const sm90::Kernel& kernel = *sm90::find_kernel(params);
  FwdKernelParams kp;
  kp.p = params;
  kp.num_m_blocks = sm90::num_m_blocks(params, kernel);
  fold_scales(kp);
  launch_on_device(params.device,
                   [&] { kernel.entry(kp, reinterpret_cast<cudaStream_t>(stream)); });
  return {Backend::cuda_sm90, sm90::kernel_name(kernel), 1};
}

// ---- the sm80 backward registry ----
struct Sm80BwdKernel {
  ElementType dtype;
  int head_dim;
  sm80::BwdEntry entry;
};

#define FLASHCPP_SM80_BWD(dtype, hdim) {ElementType::dtype, hdim, &sm80::bwd_##dtype##_hdim##hdim},
constexpr Sm80BwdKernel kSm80BwdKernels[] = {
#include "bwd_sm80_registry.inc"
    {ElementType::fp32, 0, nullptr}  // sentinel: keeps the array valid in an empty build
};
#undef FLASHCPP_SM80_BWD

// The error for a backward call that no built kernel runs. When the sm90a backward was asked
// for (cuda_sm90, or automatic on Hopper) it lists the sm90a head dims too: the call reached
// sm80 only as the fallback, and a message naming sm80 alone would puzzle a cuda_sm90 caller.
Error unbuilt_backward_error(const BackwardParams& p, bool sm90_asked) {
  const std::string dtype = element_name(p.dtype);
  std::string built;
  if (sm90_asked) {
    built = "sm90a backward head dims for " + dtype + ": " +
            built_head_dims(sm90::kBwdKernels, p.dtype);
    // One of them covers the head dim: the call is of a kind the sm90a backward does not take.
    if (sm90::find_bwd_kernel(p) != nullptr)
      built += " (which do not take varlen, deterministic, Nq = 0 or odd head dim calls, nor "
               "TMA-incompatible strides)";
    built += "; ";
  }
  built += "sm80 backward head dims for " + dtype + ": " +
           built_head_dims(kSm80BwdKernels, p.dtype);
  return Error(std::string("cuda backward: no ") + (sm90_asked ? "" : "sm80 ") +
               "backward kernel for head dim " + std::to_string(p.head_dim) + " " + dtype +
               " in this build (" + built +
               "); configure with -DFLASHCPP_HEAD_DIMS=... and -DFLASHCPP_DTYPES=...");
}

// A caller's workspace must hold `need` bytes from a 16-byte aligned address (the kernels
// accumulate into it with vector atomics and stores).
void check_workspace(Workspace workspace, std::uint64_t need, const std::string& what) {
  if (need == 0) return;
  if (workspace.data == nullptr || workspace.bytes < need)
    throw Error("workspace: needs " + std::to_string(need) + " bytes" + what + ", got " +
                std::to_string(workspace.data ? workspace.bytes : 0));
  if (reinterpret_cast<std::uintptr_t>(workspace.data) % 16 != 0)
    throw Error("workspace: data pointer is not 16-byte aligned");
}

bool nothing_to_do_backward(const BackwardParams& p) {
  return p.batch == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0);
}

// The tile of this build's sm90 backward instantiation for the call's head dim ({0, ...} when
// there is none): it sizes the dq_accum region on every device and backend, so a workspace
// from backward_workspace_size always fits.
Sm90BwdTile sm90_bwd_tile_of_build(const ForwardParams& params) {
  const sm90::BwdKernel* k = sm90::find_bwd_kernel(params);
  return k != nullptr ? sm90_bwd_tile(k->head_dim) : Sm90BwdTile{0, 0, 0, 0, false};
}

// The backward kernel parameters every backward path shares: folded scales and the workspace
// carve-up (checked against what the call needs).
BwdKernelParams bwd_kernel_params(const BackwardParams& params, Workspace workspace) {
  const Sm90BwdTile sm90 = sm90_bwd_tile_of_build(params);
  check_workspace(workspace, bwd_workspace_bytes(params, sm90), "");

  BwdKernelParams kp;
  kp.p = params;
  if (params.softcap > 0.f) {
    kp.softcap_in_scale = params.scale / params.softcap;
    kp.scale_log2 = params.softcap * kLog2e;
  } else {
    kp.scale_log2 = params.scale * kLog2e;
  }
  kp.dq_accum = static_cast<float*>(workspace.data);
  kp.dsum = kp.dq_accum + bwd_dq_accum_floats(params, sm90);
  kp.lse_log2 = kp.dsum + bwd_stats_floats(params, sm90);
  auto aligned = [](const void* ptr) { return (reinterpret_cast<std::uintptr_t>(ptr) & 15) == 0; };
  auto strided8 = [](const Strides& st) {
    return st.batch % 8 == 0 && st.row % 8 == 0 && st.head % 8 == 0;
  };
  kp.vec8 = params.head_dim % 8 == 0 && aligned(params.q) && aligned(params.k) &&
            aligned(params.v) && aligned(params.dout) && strided8(params.q_stride) &&
            strided8(params.k_stride) && strided8(params.v_stride) &&
            strided8(params.dout_stride);
  return kp;
}

// The sm90a entry runs its own pre-pass, main kernel and dq post-pass on the workspace's
// blocked layouts (bwd_params.hpp).
RunInfo backward_sm90(const BackwardParams& params, Stream stream, Workspace workspace) {
  const sm90::BwdKernel& kernel = *sm90::find_bwd_kernel(params);
  const char* kname = sm90::bwd_kernel_name(kernel);
  if (nothing_to_do_backward(params)) return {Backend::cuda_sm90, kname, 1};
  BwdKernelParams kp = bwd_kernel_params(params, workspace);
  kp.num_n_blocks = sm90::bwd_num_n_blocks(params, kernel);
  launch_on_device(params.device,
                   [&] { kernel.entry(kp, reinterpret_cast<cudaStream_t>(stream)); });
  return {Backend::cuda_sm90, kname, 1};
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver/device" error
    return 0;
  }
  return n;
}

Backend choose_forward_backend(const ForwardParams& params, Backend requested) {
  const DeviceInfo& dev = device_info(params.device);
  if (dev.major < 8)
    throw Error("cuda: device " + std::to_string(params.device) + " (" + dev.name + ", sm_" +
                std::to_string(dev.major) + std::to_string(dev.minor) +
                ") is older than sm80; flashcpp's CUDA kernels need sm80 or newer");
  // sm90a kernels run on Hopper for an explicit request, and for automatic unless
  // FLASHCPP_DISABLE_SM90=1; what they do not cover falls back to sm80.
  if (requested == Backend::cuda_sm90) {
    if (!is_sm90(dev))
      throw Error("cuda_sm90 backend: device " + std::to_string(params.device) + " (" + dev.name +
                  ", sm_" + std::to_string(dev.major) + std::to_string(dev.minor) +
                  ") is not sm90; the sm90a kernels need a Hopper GPU");
    if (!sm90::any_built())
      throw Error("cuda_sm90 backend: no sm90a forward kernel in this build "
                  "(configure with 90a in FLASHCPP_CUDA_ARCHS)");
  }
  if ((requested == Backend::cuda_sm90 ||
       (requested == Backend::automatic && !sm90::disabled_by_env())) &&
      is_sm90(dev) && sm90_runs(params))
    return Backend::cuda_sm90;
  // What sm90 does not cover runs on the sm80 (mma.sync) kernels, which carry sm_90 SASS.
  check_sm80_supported(params);
  return Backend::cuda_sm80;
}

std::size_t forward_workspace_size(const ForwardParams& params, Backend backend) {
  if (backend == Backend::cuda_sm90) return 0;
  const FwdTile t = sm80_fwd_tile(find_sm80_kernel(params).head_dim);
  const int splits = params.num_splits > 0 ? params.num_splits : heuristic_splits(params, t);
  return split_workspace_bytes(params, splits);
}

RunInfo forward(const ForwardParams& params, Backend backend, Stream stream, Workspace workspace) {
  if (backend == Backend::cuda_sm90) return forward_sm90(params, stream);
  if (backend != Backend::cuda_sm80) throw Error("cuda forward: unknown backend");
  const Sm80Kernel& kernel = find_sm80_kernel(params);
  const FwdTile t = sm80_fwd_tile(kernel.head_dim);

  int splits = 1;
  if (params.num_splits > 0) {
    splits = params.num_splits;
    if (splits > 1)
      check_workspace(workspace, split_workspace_bytes(params, splits),
                      " for " + std::to_string(splits) + " splits");
  } else {
    splits = heuristic_splits(params, t);
    // No (too little, misaligned) workspace: run unsplit rather than fail; same result.
    if (splits > 1 && (workspace.data == nullptr ||
                       workspace.bytes < split_workspace_bytes(params, splits) ||
                       reinterpret_cast<std::uintptr_t>(workspace.data) % 16 != 0))
      splits = 1;
  }

  FwdKernelParams kp;
  kp.p = params;
  kp.num_splits = splits;
  kp.num_m_blocks = num_m_blocks(params, t);
  const int n_blocks = num_n_blocks(params, t);
  kp.n_blocks_per_split = (n_blocks + splits - 1) / splits;
  if (splits > 1) {
    kp.o_accum = static_cast<float*>(workspace.data);
    kp.lse_accum = kp.o_accum + split_o_accum_elems(params, splits);
  }
  fold_scales(kp);

  launch_on_device(params.device,
                   [&] { kernel.entry(kp, reinterpret_cast<cudaStream_t>(stream)); });
  return {Backend::cuda_sm80, kernel_name(kernel, splits > 1), splits};
}

std::size_t backward_workspace_size(const ForwardParams& params, Backend backend) {
  (void)backend;
  return std::size_t(bwd_workspace_bytes(params, sm90_bwd_tile_of_build(params)));
}

RunInfo backward(const BackwardParams& params, Backend backend, Stream stream,
                 Workspace workspace) {
  const DeviceInfo& dev = device_info(params.device);
  if (dev.major < 8)
    throw Error("cuda: device " + std::to_string(params.device) + " (" + dev.name + ", sm_" +
                std::to_string(dev.major) + std::to_string(dev.minor) +
                ") is older than sm80; flashcpp's CUDA kernels need sm80 or newer");
  // As in the forward: the sm90a backward runs on Hopper for an explicit request, and for
  // automatic unless FLASHCPP_DISABLE_SM90=1; what it does not cover (including head dims this
  // build has no sm90a backward for) runs on sm80.
  if (backend == Backend::cuda_sm90) {
    if (!is_sm90(dev))
      throw Error("cuda_sm90 backend: device " + std::to_string(params.device) + " (" + dev.name +
                  ", sm_" + std::to_string(dev.major) + std::to_string(dev.minor) +
                  ") is not sm90; the sm90a kernels need a Hopper GPU");
  }
  // The pre/post passes (and the sm80 kernels) put heads and batch in grid y and z.
  constexpr int kGridYZ = 65535;
  if (params.batch > kGridYZ)
    throw Error("q: batch " + std::to_string(params.batch) +
                " exceeds the CUDA backward's limit of 65535");
  if (params.heads_q > kGridYZ)
    throw Error("q: " + std::to_string(params.heads_q) +
                " heads exceed the CUDA backward's limit of 65535");
  const bool sm90_asked = (backend == Backend::cuda_sm90 ||
                           (backend == Backend::automatic && !sm90::disabled_by_env())) &&
                          is_sm90(dev);
  if (sm90_asked && sm90::bwd_covers(params)) return backward_sm90(params, stream, workspace);
  if (params.head_dim_v != params.head_dim)
    throw Error("cuda backward: head_dim_v (" + std::to_string(params.head_dim_v) +
                ") different from head_dim (" + std::to_string(params.head_dim) +
                ") is not supported yet");
  if (params.dtype != ElementType::fp16 && params.dtype != ElementType::bf16)
    throw Error(std::string("cuda backward: dtype ") + element_name(params.dtype) +
                " is not supported (supported: fp16, bf16)");
  const Sm80BwdKernel* kernel =
      smallest_covering(kSm80BwdKernels, params.dtype, params.head_dim);
  if (!kernel) throw unbuilt_backward_error(params, sm90_asked);
  const BwdTile t = sm80_bwd_tile(kernel->head_dim);
  const std::string name = std::string("sm80_bwd_") + element_name(params.dtype) + "_hdim" +
                           std::to_string(kernel->head_dim) + "_" + std::to_string(t.block_m) +
                           "x" + std::to_string(t.block_n) + "_" + std::to_string(t.warps) + "w" +
                           (params.deterministic ? "_deterministic" : "");
  const char* kname = intern_name(name);
  if (nothing_to_do_backward(params)) return {Backend::cuda_sm80, kname, 1};

  const BwdKernelParams kp = bwd_kernel_params(params, workspace);
  launch_on_device(params.device,
                   [&] { kernel->entry(kp, reinterpret_cast<cudaStream_t>(stream)); });
  return {Backend::cuda_sm80, kname, 1};
}

}  // namespace flashcpp::detail::cuda
