#pragma once
// Host side of the sm90a forward seen by the planner (cuda_backend.cu): which
// instantiations this build has, whether a call is covered, the run-time switch that lets the
// automatic backend pick sm90, and the kernel names reported in RunInfo.
//
// Not covered (the planner sends these to the sm80 kernels): strides or pointers that a TMA
// descriptor cannot describe (every stride a multiple of 16 bytes, every base pointer 16-byte
// aligned; varlen tensors of 2^31 rows or more). head_dim_v != head_dim runs here only, on the
// (D, Dv) pair instantiations of FLASHCPP_HEAD_DIM_PAIRS.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cuda_runtime.h>

#include "common/params.hpp"
#include "cuda/common/intern_name.hpp"
#include "cuda/common/kernel_registry.hpp"
#include "cuda/common/fwd_kernel_params.hpp"
#include "cuda/sm90/tma_extents.hpp"
#include "cuda/sm90/fwd_tile_table.hpp"

namespace flashcpp::detail::cuda::sm90 {

// The sm90a forward kernels this build contains. The generated fwd_sm90_registry.inc holds one
// FLASHCPP_SM90_FWD(dtype, tag, hdim, hdim_v) line per instantiation (FLASHCPP_DTYPES x the
// head dims of FLASHCPP_HEAD_DIMS that have an sm90 tile, tag = hdim = hdim_v, and x the pairs
// of FLASHCPP_HEAD_DIM_PAIRS, tag = <hdim>x<hdim_v>; only when FLASHCPP_CUDA_ARCHS contains
// 90a); each has a generated TU defining its entry point.
using FwdEntry = void (*)(const FwdKernelParams&, cudaStream_t);

#define FLASHCPP_SM90_FWD(dtype, tag, hdim, hdim_v) \
  void fwd_##dtype##_hdim##tag(const FwdKernelParams& kp, cudaStream_t stream);
#include "fwd_sm90_registry.inc"
#undef FLASHCPP_SM90_FWD

using FwdKernel = PairRegistryEntry<FwdEntry>;

#define FLASHCPP_SM90_FWD(dtype, tag, hdim, hdim_v) \
  {ElementType::dtype, hdim, hdim_v, &fwd_##dtype##_hdim##tag},
inline constexpr FwdKernel kFwdKernels[] = {
#include "fwd_sm90_registry.inc"
    kPairRegistrySentinel<FwdEntry>};
#undef FLASHCPP_SM90_FWD

inline bool any_fwd_built() {
  for (const FwdKernel& k : kFwdKernels)
    if (k.entry) return true;
  return false;
}

// The smallest instantiation of this dtype whose head dims cover the call's (smaller head dims
// run zero-padded: the TMA descriptors carry the real head dims and fill the rest with zeros);
// D != Dv calls only on the D != Dv instantiations. FP8 inputs (q, k, v e4m3, `dtype` out's)
// run on the fp8_e4m3 instantiations.
inline const FwdKernel* find_fwd_kernel(const ForwardParams& p) {
  return smallest_covering_pair(kFwdKernels, p.fp8_inputs() ? ElementType::fp8_e4m3 : p.dtype,
                                p.head_dim, p.head_dim_v);
}

// The tile of an instantiation's row.
inline Sm90FwdTile fwd_tile_of(const FwdKernel& k, FwdTileRow row = FwdTileRow::table) {
  if (row == FwdTileRow::fp8_fast_accum)
    return sm90_fwd_tile_fp8_fast_accum(k.head_dim, k.head_dim_v);
  const Sm90FwdTile t = k.dtype == ElementType::fp8_e4m3
                            ? sm90_fwd_tile_fp8(k.head_dim, k.head_dim_v)
                            : sm90_fwd_tile(k.head_dim, k.head_dim_v);
  if (row == FwdTileRow::short_call) return sm90_fwd_short_tile(t);
  return row == FwdTileRow::long_call ? sm90_fwd_long_tile(t) : t;
}

// The automatic backend takes the sm90 kernels on Hopper; FLASHCPP_DISABLE_SM90=1 (read once)
// makes it take the sm80 kernels instead, e.g. to compare the two or to rule one out.
// An explicit Backend::cuda_sm90 request runs them either way.
inline bool disabled_by_env() {
  static const bool disabled = [] {
    const char* v = std::getenv("FLASHCPP_DISABLE_SM90");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return disabled;
}

// Every base pointer 16-byte aligned and every stride a multiple of 16 bytes, except the
// strides of modes with extent 1: those are never stepped and the launcher replaces them
// (fwd_launch.cuh, tma_stride), so e.g. a single-batch view with an odd batch stride still
// runs here.
inline bool tma_compatible(const void* ptr, const Strides& s, int rows, int heads, int batch,
                           std::int64_t element_bytes = 2) {
  const std::int64_t kElems = 16 / element_bytes;  // elements in 16 bytes
  // A zero stride (a broadcast view) is refused as well: a tensor map's strides are positive.
  auto ok = [kElems](std::int64_t stride, int extent) {
    return extent <= 1 || (stride > 0 && stride % kElems == 0);
  };
  return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0 && ok(s.row, rows) &&
         ok(s.head, heads) && ok(s.batch, batch);
}

// True when the sm90 forward can run this call (split-KV is decided by the planner).
// Out is fp16 or bf16, for FP8 inputs too (the epilogue converts O to out's dtype).
// FP8 (q, k, v e4m3): D == Dv, the KV split off (the planner's business), and the seqused_k
// form (the KV cache's) never comes here.
inline bool fwd_covers(const ForwardParams& p) {
  const bool fp8 = p.fp8_inputs();
  if (p.dtype != ElementType::fp16 && p.dtype != ElementType::bf16) return false;
  if (fp8 && (p.head_dim != p.head_dim_v || p.seqused_k != nullptr)) return false;
  if (find_fwd_kernel(p) == nullptr) return false;
  if (p.is_varlen() && (p.total_rows_q > INT_MAX || p.total_rows_k > INT_MAX)) return false;
  const int rows_q = tma_rows_q(p), rows_k = tma_rows_k(p), batches = tma_batches(p);
  const std::int64_t in_bytes = fp8 ? 1 : 2;
  return tma_compatible(p.q, p.q_stride, rows_q, p.heads_q, batches, in_bytes) &&
         tma_compatible(p.k, p.k_stride, rows_k, p.heads_kv, batches, in_bytes) &&
         tma_compatible(p.v, p.v_stride, rows_k, p.heads_kv, batches, in_bytes) &&
         tma_compatible(p.out, p.out_stride, rows_q, p.heads_q, batches);
}

// The paged instantiation (a KV cache's pages, kp.paged) reads K and V in boxes of 16 rows of
// one page each (fwd_traits.hpp, kPageBoxRows): pages of a multiple of 16 keys, the page pool's
// strides TMA-compatible; q and out as for any varlen call.
constexpr int kPagedBoxRows = 16;
inline bool fwd_covers_paged(const ForwardParams& p, const PagedKV& paged) {
  if (p.fp8_inputs()) return false;  // the FP8 forward has no paged instantiation
  if (p.dtype != ElementType::fp16 && p.dtype != ElementType::bf16) return false;
  if (find_fwd_kernel(p) == nullptr) return false;
  if (paged.page_size <= 0 || paged.page_size % kPagedBoxRows != 0 || paged.num_pages <= 0)
    return false;
  if (p.total_rows_q > INT_MAX) return false;
  const int rows_q = tma_rows_q(p), batches = tma_batches(p);
  return tma_compatible(p.q, p.q_stride, rows_q, p.heads_q, batches) &&
         tma_compatible(p.out, p.out_stride, rows_q, p.heads_q, batches) &&
         tma_compatible(p.k, p.k_stride, paged.page_size, p.heads_kv, paged.num_pages) &&
         tma_compatible(p.v, p.v_stride, paged.page_size, p.heads_kv, paged.num_pages);
}

// Query tiles per sequence (the longest, varlen) on the row's tile.
inline int fwd_num_m_blocks(const ForwardParams& p, const FwdKernel& k,
                            FwdTileRow row = FwdTileRow::table) {
  const int block_m = fwd_tile_of(k, row).block_m;
  return int((std::int64_t(p.seqlen_q) + block_m - 1) / block_m);
}

// The row a call runs (run_fwd, fwd_launch.cuh, makes the same choice): FP8's fast
// accumulation where asked; for fp16 and bf16 unsplit calls without a KV cache, the row's
// short-call key block (padded only) or its long-call tile (padded or varlen) where the call's
// lengths ask for them (fwd_tile_table.hpp) and the long tiles fill a wave of the sm_count
// SMs (fewer run on the table's tile: never measured on the long one, and the split
// heuristic counted table tiles); the table's tile otherwise.
inline FwdTileRow fwd_tile_row(const FwdKernel& k, const ForwardParams& p, int splits,
                               bool paged, int sm_count) {
  if (k.dtype == ElementType::fp8_e4m3)
    return p.fp8_fast_accum ? FwdTileRow::fp8_fast_accum : FwdTileRow::table;
  if (splits > 1 || paged || p.seqused_k != nullptr) return FwdTileRow::table;
  const Sm90FwdTile t = fwd_tile_of(k);
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  if (!p.is_varlen() && sm90_fwd_short_call(t, masked, p.seqlen_k)) return FwdTileRow::short_call;
  const bool local = p.window_left >= 0 || p.window_right > 0;  // beyond the causal mask
  if (sm90_fwd_long_call(t, p.seqlen_q, p.seqlen_k, local) &&
      std::int64_t(p.batch) * p.heads_q * fwd_num_m_blocks(p, k, FwdTileRow::long_call) >=
          sm_count)
    return FwdTileRow::long_call;
  return FwdTileRow::table;
}

// RunInfo::kernel, e.g. "sm90_fwd_bf16_hdim128_128x128_s2_ws" ("..._ws_splitkv" split;
// "..._hdim192x128_..." for D 192, Dv 128; "..._ws_paged..." over a paged KV cache; FP8 with
// P V chunks "sm90_fwd_fp8_e4m3_hdim256_128x96_s2_pv32x2_ws": chunk width x temporaries;
// the short-call tile "sm90_fwd_bf16_hdim256_128x64_s2_ws"; FP8's fast-accumulation row
// "sm90_fwd_fp8_e4m3_hdim256_128x128_s2_ws_fastaccum").
inline const char* fwd_kernel_name(const FwdKernel& k, bool split = false, bool paged = false,
                                   FwdTileRow row = FwdTileRow::table) {
  const Sm90FwdTile t = fwd_tile_of(k, row);
  const std::string pv_chunks =
      t.pv_chunk > 0 ? "_pv" + std::to_string(t.pv_chunk) + "x" +
                           std::to_string(std::min(t.pv_temps, t.head_dim_v / t.pv_chunk))
                     : "";
  return intern_name(std::string("sm90_fwd_") + dtype_name(k.dtype) +
                     "_hdim" + head_dim_tag(k) + "_" + std::to_string(t.block_m) +
                     "x" + std::to_string(t.block_n) + "_s" + std::to_string(t.stages) +
                     pv_chunks + "_ws" + (paged ? "_paged" : "") + (split ? "_splitkv" : "") +
                     (row == FwdTileRow::fp8_fast_accum ? "_fastaccum" : ""));
}

}  // namespace flashcpp::detail::cuda::sm90
