// The CUDA backend seen by the API layer: device queries and the planner, which chooses for a
// validated call the architecture's kernels (sm90a on Hopper, sm80 elsewhere and for what sm90a
// does not cover), the instantiation, the KV split count and the workspace; then runs the plan
// through the per-architecture dispatch headers.
#include "cuda/cuda_backend.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/bwd_workspace.hpp"
#include "cuda/common/bwd_kernel_params.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/fwd_kernel_params.hpp"
#include "cuda/common/kvcache_append.hpp"
#include "cuda/common/kvcache_kernel_params.hpp"
#include "cuda/common/split_heuristic.hpp"
#include "cuda/plan_log.hpp"
#include "cuda/sm80/bwd_dispatch.hpp"
#include "cuda/sm80/decode_dispatch.hpp"
#include "cuda/sm90/decode_dispatch.hpp"
#include "cuda/sm80/fwd_dispatch.hpp"
#include "cuda/sm90/bwd_dispatch.hpp"
#include "cuda/sm90/fp8_vt_layout.hpp"
#include "cuda/sm90/fwd_dispatch.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda {
namespace {

// ---- device properties, queried once per device ----
struct DeviceInfo {
  int major = 0, minor = 0, sm_count = 0;
  std::int64_t l2_bytes = 0;
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
    info->l2_bytes = prop.l2CacheSize;
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

bool is_sm90(const DeviceInfo& dev) { return dev.major == 9 && dev.minor == 0; }

// The device of a call, refused below sm80; a cuda_sm90 request needs a Hopper GPU.
const DeviceInfo& checked_device(int device, Backend requested) {
  const DeviceInfo& dev = device_info(device);
  if (dev.major < 8)
    throw Error("cuda: device " + std::to_string(device) + " (" + dev.name + ", sm_" +
                std::to_string(dev.major) + std::to_string(dev.minor) +
                ") is older than sm80; flashcpp's CUDA kernels need sm80 or newer");
  if (requested == Backend::cuda_sm90 && !is_sm90(dev))
    throw Error("cuda_sm90 backend: device " + std::to_string(device) + " (" + dev.name +
                ", sm_" + std::to_string(dev.major) + std::to_string(dev.minor) +
                ") is not sm90; the sm90a kernels need a Hopper GPU");
  return dev;
}

// sm90a kernels run on Hopper for an explicit request, and for automatic unless
// FLASHCPP_DISABLE_SM90=1; what they do not cover runs on sm80.
bool sm90_asked(const DeviceInfo& dev, Backend requested) {
  return (requested == Backend::cuda_sm90 ||
          (requested == Backend::automatic && !sm90::disabled_by_env())) &&
         is_sm90(dev);
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

// The splits a run makes: the plan's, or one when the heuristic chose them and the caller's
// workspace cannot hold them (too small, misaligned, none): unsplit gives the same result. An
// explicit split count needs its workspace.
int splits_to_run(const Plan& plan, Workspace workspace) {
  if (plan.num_splits <= 1) return 1;
  const std::size_t need = plan.workspace_bytes;
  if (plan.splits_optional &&
      (workspace.data == nullptr || workspace.bytes < need ||
       reinterpret_cast<std::uintptr_t>(workspace.data) % 16 != 0))
    return 1;
  check_workspace(workspace, need, " for " + std::to_string(plan.num_splits) + " splits");
  return plan.num_splits;
}

// ---- forward ----

std::size_t split_workspace_bytes(const ForwardParams& p, int splits) {
  if (splits <= 1) return 0;
  return std::size_t(split_o_accum_elems(p, splits) + split_lse_accum_elems(p, splits)) *
         sizeof(float);
}

// Splits the heuristic wants for the sm80 split-KV kernel of tile `t`, whatever workspace the
// caller has.
int heuristic_splits(const ForwardParams& p, const Sm80FwdTile& t) {
  const int n_blocks = sm80::fwd_num_n_blocks(p, t);
  const int s = split_heuristic(std::int64_t(p.batch) * p.heads_q * sm80::fwd_num_m_blocks(p, t),
                                n_blocks, device_info(p.device).sm_count);
  if (s <= 1) return 1;
  const int per_split = (n_blocks + s - 1) / s;
  return (n_blocks + per_split - 1) / per_split;  // no split left without blocks
}

// Whether the sm90a forward runs a call on Hopper: whatever it covers. Split calls too, down
// to one query row: measured on an H100 (B1, Hq 32, Hkv 8, Nk 16k, d128, 4 splits), its
// nearly empty 128-row tiles still ran 2.0-2.3x faster than the sm80 split kernel for Nq 1-128.
bool sm90_forward_runs(const ForwardParams& p) { return sm90::fwd_covers(p); }

// Varlen on sm90a deals its tiles from a counter in the workspace (fwd_tile_scheduler.hpp),
// after the split-KV partials. Optional: without a workspace that holds it the tiles are dealt
// statically (same result).
constexpr std::size_t kTileCounterBytes = 16;

// Splits the heuristic wants for the sm90a forward of kernel `k` (its 128-row query tiles and
// key blocks), whatever workspace the caller has.
int sm90_heuristic_splits(const ForwardParams& p, const sm90::FwdKernel& k) {
  const Sm90FwdTile t = sm90::fwd_tile_of(k);
  const int n_blocks = int((std::int64_t(p.seqlen_k) + t.block_n - 1) / t.block_n);
  const int s = split_heuristic(std::int64_t(p.batch) * p.heads_q * sm90::fwd_num_m_blocks(p, k),
                                n_blocks, device_info(p.device).sm_count);
  if (s <= 1) return 1;
  const int per_split = (n_blocks + s - 1) / s;
  return (n_blocks + per_split - 1) / per_split;  // no split left without blocks
}

// FP8 inputs: the V^T the pre-pass writes and its NaN key bits (fp8_vt_layout.hpp) lead the
// workspace, rounded to 16 bytes; 0 otherwise.
std::size_t fp8_vt_workspace_bytes(const ForwardParams& p) {
  if (!p.fp8_inputs()) return 0;
  return std::size_t(sm90::fp8_vt_bytes(p) + sm90::fp8_v_nan_key_bytes(p) + 15) / 16 * 16;
}

// dynamic_deal: a varlen call's workspace also holds the tile counter. FP8 runs unsplit (its
// kernel has no split-KV form); its workspace (V^T) is required.
Plan plan_sm90_forward(const ForwardParams& p, bool dynamic_deal = true) {
  const sm90::FwdKernel& k = *sm90::find_fwd_kernel(p);
  const bool fp8 = p.fp8_inputs();
  Plan plan;
  plan.backend = Backend::cuda_sm90;
  plan.kernel_index = int(&k - sm90::kFwdKernels);
  plan.splits_optional = p.num_splits <= 0;
  plan.num_splits = fp8 ? 1 : plan.splits_optional ? sm90_heuristic_splits(p, k) : p.num_splits;
  plan.kernel = sm90::fwd_kernel_name(
      k, plan.num_splits > 1, false,
      sm90::fwd_tile_row(k, p, plan.num_splits, false, device_info(p.device).sm_count));
  plan.workspace_bytes = fp8_vt_workspace_bytes(p) + split_workspace_bytes(p, plan.num_splits) +
                         (p.is_varlen() && dynamic_deal ? kTileCounterBytes : 0);
  return plan;
}

Plan plan_sm80_forward(const ForwardParams& p) {
  const sm80::FwdKernel& k = sm80::fwd_kernel_for(p);
  Plan plan;
  plan.backend = Backend::cuda_sm80;
  plan.kernel_index = int(&k - sm80::kFwdKernels);
  plan.tile_index = sm80::fwd_tile_for(p, k);
  plan.splits_optional = p.num_splits <= 0;
  plan.num_splits = plan.splits_optional ? heuristic_splits(p, kSm80FwdTiles[plan.tile_index])
                                         : p.num_splits;
  plan.kernel = sm80::fwd_kernel_name(k, plan.tile_index, plan.num_splits > 1);
  plan.workspace_bytes = split_workspace_bytes(p, plan.num_splits);
  plan.overlap_combine = device_info(p.device).major >= 9;
  return plan;
}

// The error for a `pass` ("forward", "backward") call with head_dim_v != head_dim that the
// sm90a kernels do not run: only their (D, Dv) pair instantiations take such calls. `kernels`
// is the pass's sm90a registry; `limits` says which calls a built pair still refuses.
template <class Kernel, std::size_t N>
Error unrun_pair_error(const std::string& pass, const ForwardParams& p, bool sm90_asked,
                       const Kernel (&kernels)[N], const std::string& limits) {
  const std::string dims = "head_dim " + std::to_string(p.head_dim) + " with head_dim_v " +
                           std::to_string(p.head_dim_v);
  if (!sm90_asked)
    return Error("cuda " + pass + ": " + dims + " (D != Dv) runs only on the sm90a " + pass +
                 ": a Hopper GPU, backend automatic (FLASHCPP_DISABLE_SM90 unset) or cuda_sm90");
  if (smallest_covering_pair(kernels, p.dtype, p.head_dim, p.head_dim_v) == nullptr)
    return Error("cuda " + pass + ": no sm90a " + pass + " kernel for " + dims + " " +
                 dtype_name(p.dtype) + " in this build (sm90a " + pass + " head dims for " +
                 dtype_name(p.dtype) + ": " + built_head_dim_pairs(kernels, p.dtype) +
                 "); configure with -DFLASHCPP_HEAD_DIM_PAIRS=DxDv (and 90a in "
                 "FLASHCPP_CUDA_ARCHS)");
  return Error("cuda " + pass + ": " + dims + " (D != Dv) runs only on the sm90a " + pass +
               ", which " + limits);
}

// Softmax scales folded on the host (shared by every forward and decode kernel): exp2 takes
// s * scale_log2 - max * scale_log2; with softcap, tanh already consumed scale / softcap.
template <class KernelParams>
void fold_scales(KernelParams& kp) {
  if (kp.p.softcap > 0.f) {
    kp.softcap_in_scale = kp.p.scale / kp.p.softcap;
    kp.lse_scale = kp.p.softcap;
  } else {
    kp.lse_scale = kp.p.scale;
  }
  kp.scale_log2 = kp.lse_scale * kLog2e;
}

// `paged`: a paged KV cache's block table (prefill with a cache), run by the paged
// instantiation; none for every other call.
RunInfo run_sm90_forward(const Plan& plan, const ForwardParams& params, Stream stream,
                         Workspace workspace, const PagedKV& paged = {}) {
  const sm90::FwdKernel& kernel = sm90::kFwdKernels[plan.kernel_index];
  FwdKernelParams kp;
  kp.p = params;
  // FP8: V^T first (required), then what an unsplit call may have (the tile counter).
  const std::size_t vt_bytes = fp8_vt_workspace_bytes(params);
  if (vt_bytes > 0) {
    check_workspace(workspace, vt_bytes, " for the fp8 forward's transposed V");
    kp.fp8_v_t = static_cast<std::uint8_t*>(workspace.data);
    kp.fp8_v_nan_keys = reinterpret_cast<std::uint32_t*>(kp.fp8_v_t + sm90::fp8_vt_bytes(params));
    workspace.data = static_cast<char*>(workspace.data) + vt_bytes;
    workspace.bytes -= vt_bytes;
  }
  Plan rest = plan;
  rest.workspace_bytes -= vt_bytes;
  const int splits = splits_to_run(rest, workspace);
  kp.num_splits = splits;
  kp.paged = paged;
  const bool is_paged = paged.block_table != nullptr;
  const FwdTileRow row =
      sm90::fwd_tile_row(kernel, params, splits, is_paged, device_info(params.device).sm_count);
  kp.short_tile = row == FwdTileRow::short_call;
  kp.long_tile = row == FwdTileRow::long_call;
  kp.num_m_blocks = sm90::fwd_num_m_blocks(params, kernel, row);
  const std::size_t split_bytes = split_workspace_bytes(params, splits);
  if (splits > 1) {
    kp.o_accum = static_cast<float*>(workspace.data);
    kp.lse_accum = kp.o_accum + split_o_accum_elems(params, splits);
  }
  // The tile counter, where the plan asked for one and the workspace holds it.
  if (rest.workspace_bytes >= split_bytes + kTileCounterBytes && workspace.data != nullptr &&
      workspace.bytes >= split_bytes + kTileCounterBytes &&
      reinterpret_cast<std::uintptr_t>(workspace.data) % 16 == 0)
    kp.tile_counter = reinterpret_cast<int*>(static_cast<char*>(workspace.data) + split_bytes);
  fold_scales(kp);
  launch_on_device(params.device,
                   [&] { kernel.entry(kp, reinterpret_cast<cudaStream_t>(stream)); });
  return {Backend::cuda_sm90,
          sm90::fwd_kernel_name(kernel, splits > 1, is_paged, row), splits};
}

RunInfo run_sm80_forward(const Plan& plan, const ForwardParams& params, Stream stream,
                         Workspace workspace, const PagedKV& paged = {}) {
  const sm80::FwdKernel& kernel = sm80::kFwdKernels[plan.kernel_index];
  const Sm80FwdTile t = kSm80FwdTiles[plan.tile_index];
  const int splits = splits_to_run(plan, workspace);

  FwdKernelParams kp;
  kp.p = params;
  kp.num_splits = splits;
  kp.overlap_combine = plan.overlap_combine;
  kp.num_m_blocks = sm80::fwd_num_m_blocks(params, t);
  kp.paged = paged;
  const int n_blocks = sm80::fwd_num_n_blocks(params, t);
  kp.n_blocks_per_split = (n_blocks + splits - 1) / splits;
  if (splits > 1) {
    kp.o_accum = static_cast<float*>(workspace.data);
    kp.lse_accum = kp.o_accum + split_o_accum_elems(params, splits);
  }
  fold_scales(kp);

  launch_on_device(params.device, [&] {
    kernel.entry(kp, plan.tile_index, reinterpret_cast<cudaStream_t>(stream));
  });
  return {Backend::cuda_sm80,
          sm80::fwd_kernel_name(kernel, plan.tile_index, splits > 1, paged.block_table != nullptr),
          splits};
}

// ---- KV-cache decode ----

std::size_t decode_workspace_bytes(const KVCacheParams& p, int splits) {
  if (splits <= 1) return 0;
  const std::size_t rows = std::size_t(splits) * p.batch * p.heads_q * p.seqlen_q;
  return rows * (std::size_t(p.head_dim_v) + 1) * sizeof(float);
}

// ---- KV cache on the forward kernels (prefill with a cache) ----
// The decode kernel reads the cache once per 16 rows of (new token, query head of the group),
// the forward kernels once per 128 new tokens and query head: from a few dozen new tokens on
// (chunked prefill) the forward kernels read far less. FLASHCPP_KVCACHE_FORWARD_MIN_NNEW
// (read once; default 64) moves the threshold, e.g. to compare the two.
int kvcache_forward_min_nnew() {
  static const int threshold = [] {
    const char* v = std::getenv("FLASHCPP_KVCACHE_FORWARD_MIN_NNEW");
    return v != nullptr && *v != '\0' ? std::atoi(v) : 64;
  }();
  return threshold;
}

// The call as a forward over per-sequence key counts (ForwardParams::seqused_k): q, out and a
// contiguous cache are read as rows packed sequence after sequence, which their strides must
// allow; a paged cache is read through its block table (paged_kv).
ForwardParams kvcache_forward_params(const KVCacheParams& p) {
  ForwardParams f = p;
  f.seqused_k = p.cache_seqlens;
  f.seqused_k_add = p.appends() ? p.seqlen_q : 0;
  f.total_rows_q = std::int64_t(p.batch) * p.seqlen_q;
  f.total_rows_k = std::int64_t(p.batch) * p.seqlen_k;
  return f;
}

PagedKV paged_kv(const KVCacheParams& p) {
  if (!p.paged()) return {};
  return {p.block_table, p.block_table_stride, p.page_size, p.page_shift, p.num_pages};
}

// D != Dv (MLA chunked prefill) runs here only on an sm90a pair instantiation (plan_kvcache);
// a paged cache's pages are read through its block table, whatever their stride.
bool kvcache_runs_forward(const KVCacheParams& p) {
  if (p.num_splits > 1) return false;
  if (p.seqlen_q < kvcache_forward_min_nnew() || p.seqlen_k == 0) return false;
  if (p.dtype != ElementType::fp16 && p.dtype != ElementType::bf16) return false;
  if (p.fp8_inputs()) return false;  // fp8 caches: the decode kernel only
  const auto packs = [&](const Strides& s, int rows) {
    return p.batch <= 1 || s.batch == std::int64_t(rows) * s.row;
  };
  if (!packs(p.q_stride, p.seqlen_q) || !packs(p.out_stride, p.seqlen_q)) return false;
  return p.paged() || (packs(p.k_stride, p.seqlen_k) && packs(p.v_stride, p.seqlen_k));
}

// ---- backward ----

// The error for a backward call that no built kernel runs. When the sm90a backward was asked
// for (cuda_sm90, or automatic on Hopper) it lists the sm90a head dims too: the call reached
// sm80 only as the fallback, and a message naming sm80 alone would puzzle a cuda_sm90 caller.
Error unbuilt_backward_error(const BackwardParams& p, bool sm90_asked) {
  const std::string dtype = dtype_name(p.dtype);
  std::string built;
  if (sm90_asked) {
    built = "sm90a backward head dims for " + dtype + ": " +
            built_head_dim_pairs(sm90::kBwdKernels, p.dtype);
    // One of them covers the head dim: the call is of a kind the sm90a backward does not take.
    if (sm90::find_bwd_kernel(p) != nullptr)
      built += " (which do not take Nq = 0 or odd head dim calls, nor TMA-incompatible "
               "strides)";
    built += "; ";
  }
  built += "sm80 backward head dims for " + dtype + ": " +
           built_head_dims(sm80::kBwdKernels, p.dtype);
  return Error(std::string("cuda backward: no ") + (sm90_asked ? "" : "sm80 ") +
               "backward kernel for head dim " + std::to_string(p.head_dim) + " " + dtype +
               " in this build (" + built +
               "); configure with -DFLASHCPP_HEAD_DIMS=... and -DFLASHCPP_DTYPES=...");
}

// The tile of this build's sm90 backward instantiation for the call's head dim ({0, ...} when
// there is none): it sizes the dq_accum region on every device and backend, so a workspace
// from backward_workspace_size always fits.
Sm90BwdTile sm90_bwd_tile_of_build(const ForwardParams& params) {
  const sm90::BwdKernel* k = sm90::find_bwd_kernel(params);
  return k != nullptr ? sm90::bwd_tile_of(*k) : Sm90BwdTile{0, 0, 0, 0, 0, false};
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
  if (bwd_counter_ints(params, sm90) > 0) {  // the sm90 deterministic kernel's counters
    kp.tile_ticket = reinterpret_cast<int*>(kp.lse_log2 + bwd_stats_floats(params, sm90));
    kp.dq_semaphore = kp.tile_ticket + kBwdTicketInts;
  }
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

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver/device" error
    return 0;
  }
  return n;
}

// FP8 inputs run on the sm90a fp8 forward only (no sm80 kernel reads e4m3 q, k, v): every
// other case is an error that says which condition failed.
Plan plan_fp8_forward(const ForwardParams& p, const DeviceInfo& dev, Backend requested) {
  const std::string what = "cuda forward: fp8_e4m3 q, k, v ";
  if (!sm90_asked(dev, requested))
    throw Error(what + "run only on the sm90a forward: a Hopper GPU with backend automatic "
                "(FLASHCPP_DISABLE_SM90 unset) or cuda_sm90");
  if (p.dtype != ElementType::bf16 && p.dtype != ElementType::fp16)
    throw Error("out: expected dtype bf16 or fp16 for fp8_e4m3 inputs on cuda, got " +
                std::string(dtype_name(p.dtype)));
  if (p.head_dim != p.head_dim_v)
    throw Error(what + "need head_dim == head_dim_v (got " + std::to_string(p.head_dim) + " and " +
                std::to_string(p.head_dim_v) + ")");
  if (p.num_splits > 1)
    throw Error("num_splits: the fp8 forward does not split the keys (pass 0 or 1), got " +
                std::to_string(p.num_splits));
  if (sm90::find_fwd_kernel(p) == nullptr)
    throw Error(what + "with head_dim " + std::to_string(p.head_dim) +
                ": no sm90a fp8 forward kernel in this build covers it (fp8_e4m3 forward head "
                "dims: " + built_head_dim_pairs(sm90::kFwdKernels, ElementType::fp8_e4m3) +
                "; configure with fp8_e4m3 in FLASHCPP_DTYPES and 90a in FLASHCPP_CUDA_ARCHS)");
  if (!sm90::fwd_covers(p))
    throw Error(what + "need 16-byte aligned pointers and strides that are multiples of 16 bytes "
                "(varlen: under 2^31 rows)");
  return plan_sm90_forward(p);
}

Plan plan_forward(const ForwardParams& params, Backend requested) {
  const DeviceInfo& dev = checked_device(params.device, requested);
  if (requested == Backend::cuda_sm90 && !sm90::any_fwd_built())
    throw Error("cuda_sm90 backend: no sm90a forward kernel in this build "
                "(configure with 90a in FLASHCPP_CUDA_ARCHS)");
  if (params.fp8_inputs()) return log_plan("forward", params, plan_fp8_forward(params, dev, requested));
  if (sm90_asked(dev, requested) && sm90_forward_runs(params))
    return log_plan("forward", params, plan_sm90_forward(params));
  if (params.head_dim_v != params.head_dim)
    throw unrun_pair_error("forward", params, sm90_asked(dev, requested), sm90::kFwdKernels,
                           "needs every stride of q, k, v and out a multiple of 16 bytes and "
                           "16-byte aligned pointers (varlen: under 2^31 rows)");
  // What sm90 does not cover runs on the sm80 (mma.sync) kernels, which carry sm_90 SASS.
  return log_plan("forward", params, plan_sm80_forward(params));
}

RunInfo run_forward(const Plan& plan, const ForwardParams& params, Stream stream,
                    Workspace workspace) {
  if (plan.backend == Backend::cuda_sm90)
    return run_sm90_forward(plan, params, stream, workspace);
  return run_sm80_forward(plan, params, stream, workspace);
}

Plan plan_kvcache(const KVCacheParams& params, Backend requested) {
  const DeviceInfo& dev = checked_device(params.device, requested);
  if (kvcache_runs_forward(params)) {
    const ForwardParams f = kvcache_forward_params(params);
    Plan plan;
    // A paged cache: the paged sm90a forward for pages of whole 16-row boxes, the paged sm80
    // forward (a block-table lookup per row: any page size) otherwise.
    const bool sm90_runs = params.paged() ? sm90::fwd_covers_paged(f, paged_kv(params))
                                          : sm90_forward_runs(f);
    if (sm90_asked(dev, requested) && sm90_runs) {
      plan = plan_sm90_forward(f, false);  // tiles dealt statically: no counter to zero
      if (params.paged())
        plan.kernel = sm90::fwd_kernel_name(sm90::kFwdKernels[plan.kernel_index],
                                            plan.num_splits > 1, true);
    } else if (f.head_dim == f.head_dim_v &&
               smallest_covering(sm80::kFwdKernels, f.dtype, f.head_dim) != nullptr) {
      plan = plan_sm80_forward(f);
      if (params.paged())
        plan.kernel = sm80::fwd_kernel_name(sm80::kFwdKernels[plan.kernel_index],
                                            plan.tile_index, plan.num_splits > 1, true);
    }
    if (plan.kernel_index >= 0) {
      plan.kvcache_on_forward = true;
      return log_plan("kvcache", params, plan);
    }
  }
  // The decode kernel is an sm80-family kernel (it carries sm_90 SASS): it serves explicit
  // cuda_sm90 requests too, as the sm80 forward does for what sm90a does not cover. On sm90a
  // a split call runs the same kernel with its splits merged in a cluster (no combine kernel).
  const sm80::DecodeKernel& k = sm80::decode_kernel_for(params);
  Plan plan;
  plan.backend = Backend::cuda_sm80;
  plan.kernel_index = int(&k - sm80::kDecodeKernels);
  plan.splits_optional = params.num_splits <= 0;
  plan.num_splits = plan.splits_optional
                        ? sm80::decode_splits(params, sm80::decode_tile_of(k), dev.sm_count)
                        : params.num_splits;
  plan.kernel = sm80::decode_kernel_name(k, plan.num_splits > 1);
  const bool fp8 = k.dtype == ElementType::fp8_e4m3;
  const int cluster_splits =
      sm90::decode_cluster_splits(plan.num_splits, plan.splits_optional, fp8);
  // An fp8 cache takes the sm90a instantiation whether or not the cluster applies.
  if ((cluster_splits > 0 || fp8) && sm90_asked(dev, requested)) {
    if (const sm90::DecodeClusterKernel* c = sm90::find_decode_cluster_kernel(k.dtype, k.head_dim)) {
      plan.backend = Backend::cuda_sm90;
      plan.kernel_index = int(c - sm90::kDecodeClusterKernels);
      plan.decode_cluster = cluster_splits > 0;
      if (plan.decode_cluster) plan.num_splits = cluster_splits;
      plan.kernel = sm90::decode_cluster_kernel_name(*c, plan.num_splits, plan.decode_cluster);
    }
  }
  plan.workspace_bytes = decode_workspace_bytes(params, plan.num_splits);
  plan.overlap_combine = dev.major >= 9;
  return log_plan("kvcache", params, plan);
}

RunInfo run_kvcache(const Plan& plan, const KVCacheParams& params, Stream stream,
                    Workspace workspace) {
  if (params.batch == 0 || params.seqlen_q == 0) return plan.run_info();
  if (plan.kvcache_on_forward) {
    if (params.appends()) {
      KVCacheKernelParams kp;
      kp.p = params;
      launch_on_device(params.device, [&] {
        launch_kvcache_append<std::uint16_t>(kp, reinterpret_cast<cudaStream_t>(stream));
      });
    }
    const ForwardParams f = kvcache_forward_params(params);
    if (plan.backend == Backend::cuda_sm90)
      return run_sm90_forward(plan, f, stream, workspace, paged_kv(params));
    return run_sm80_forward(plan, f, stream, workspace, paged_kv(params));
  }
  const int splits = splits_to_run(plan, workspace);
  KVCacheKernelParams kp;
  kp.p = params;
  kp.group = params.heads_q / params.heads_kv;
  kp.rows = sm80::decode_rows(params);
  kp.num_m_tiles = sm80::decode_m_tiles(params);
  kp.num_splits = splits;
  kp.overlap_combine = plan.overlap_combine;
  if (splits > 1) {
    kp.o_accum = static_cast<float*>(workspace.data);
    kp.lse_accum = kp.o_accum + std::size_t(splits) * params.batch * params.heads_q *
                                    params.seqlen_q * params.head_dim_v;
  }
  fold_scales(kp);
  if (plan.backend == Backend::cuda_sm90) {
    const sm90::DecodeClusterKernel& kernel = sm90::kDecodeClusterKernels[plan.kernel_index];
    sm90::DecodeSm90Ran ran = sm90::DecodeSm90Ran::nothing;
    launch_on_device(params.device, [&] {
      ran = kernel.entry(kp, plan.decode_cluster, reinterpret_cast<cudaStream_t>(stream));
    });
    if (ran != sm90::DecodeSm90Ran::nothing)
      return {Backend::cuda_sm90,
              sm90::decode_cluster_kernel_name(kernel, splits, ran == sm90::DecodeSm90Ran::cluster), splits};
    // Unsplit after all (too little workspace) or no room for the cluster: the sm80-family
    // kernel and the combine kernel, same splits.
  }
  const sm80::DecodeKernel& kernel = sm80::decode_kernel_for(params);
  launch_on_device(params.device,
                   [&] { kernel.entry(kp, reinterpret_cast<cudaStream_t>(stream)); });
  return {Backend::cuda_sm80, sm80::decode_kernel_name(kernel, splits > 1), splits};
}

std::size_t backward_workspace_bytes(const ForwardParams& params) {
  return std::size_t(bwd_workspace_bytes(params, sm90_bwd_tile_of_build(params)));
}

Plan plan_backward(const BackwardParams& params, Backend requested) {
  const DeviceInfo& dev = checked_device(params.device, requested);
  // The pre/post passes (and the sm80 kernels) put heads and batch in grid y and z.
  constexpr int kGridYZ = 65535;
  if (params.batch > kGridYZ)
    throw Error("q: batch " + std::to_string(params.batch) +
                " exceeds the CUDA backward's limit of 65535");
  if (params.heads_q > kGridYZ)
    throw Error("q: " + std::to_string(params.heads_q) +
                " heads exceed the CUDA backward's limit of 65535");
  Plan plan;
  plan.workspace_bytes = backward_workspace_bytes(params);
  const bool sm90 = sm90_asked(dev, requested);
  if (sm90 && sm90::bwd_covers(params)) {
    const sm90::BwdKernel& k = *sm90::find_bwd_kernel(params);
    plan.backend = Backend::cuda_sm90;
    plan.kernel = sm90::bwd_kernel_name(k, params.deterministic);
    plan.kernel_index = int(&k - sm90::kBwdKernels);
    return log_plan("backward", params, plan);
  }
  if (params.head_dim_v != params.head_dim)
    throw unrun_pair_error("backward", params, sm90, sm90::kBwdKernels,
                           "does not take deterministic or Nq = 0 calls, odd head dims, nor "
                           "strides that are not multiples of 16 bytes or pointers not 16-byte "
                           "aligned (of q, k, v, out, dout, dq, dk, dv)");
  if (params.dtype != ElementType::fp16 && params.dtype != ElementType::bf16)
    throw Error(std::string("cuda backward: dtype ") + dtype_name(params.dtype) +
                " is not supported (supported: fp16, bf16)");
  const sm80::BwdKernel* k = sm80::find_bwd_kernel(params);
  if (!k) throw unbuilt_backward_error(params, sm90);
  plan.backend = Backend::cuda_sm80;
  plan.kernel = sm80::bwd_kernel_name(*k, params.deterministic, params.device);
  plan.kernel_index = int(k - sm80::kBwdKernels);
  return log_plan("backward", params, plan);
}

// The sm90a entry runs its own pre-pass, main kernel and dq post-pass on the workspace's
// blocked layouts (bwd_workspace.hpp); the sm80 entry its pre-pass, main and dq kernels.
RunInfo run_backward(const Plan& plan, const BackwardParams& params, Stream stream,
                     Workspace workspace) {
  // With no queries but some keys, dk and dv are still outputs (zero) and get written.
  if (params.batch == 0 || (params.seqlen_q == 0 && params.seqlen_k == 0))
    return plan.run_info();
  BwdKernelParams kp = bwd_kernel_params(params, workspace);
  const auto cuda_stream = reinterpret_cast<cudaStream_t>(stream);
  if (plan.backend == Backend::cuda_sm90) {
    const sm90::BwdKernel& kernel = sm90::kBwdKernels[plan.kernel_index];
    kp.num_n_blocks = sm90::bwd_num_n_blocks(params, kernel);
    kp.ticket_head_group =
        sm90::bwd_ticket_head_group(params, kernel, device_info(params.device).sm_count,
                                    device_info(params.device).l2_bytes);
    launch_on_device(params.device, [&] { kernel.entry(kp, cuda_stream); });
  } else {
    const sm80::BwdKernel& kernel = sm80::kBwdKernels[plan.kernel_index];
    launch_on_device(params.device, [&] { kernel.entry(kp, cuda_stream); });
  }
  return plan.run_info();
}

}  // namespace flashcpp::detail::cuda
