#pragma once
// Host side of the sm80 forward of one dtype and head dim: the tile row the host chose, grid,
// shared memory opt-in, launch, and the split-KV combine when the call was split. Included
// only by the generated per-head-dim translation units (one head dim per TU keeps compile
// time and memory per nvcc process low).
#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include <cuda_runtime.h>

#include "cuda/common/split_kv_combine.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/sm80/fwd_kernel.hpp"
#include "cuda/sm80/fwd_traits.hpp"

namespace flashcpp::detail::cuda::sm80 {

// Tile row kTileIndex; a paged KV cache (kp.paged) runs the kPaged kernels.
template <class Element, int kTileIndex>
void launch_fwd(const FwdKernelParams& kp, cudaStream_t stream) {
  using Traits = FwdTraits<Element, kTileIndex>;
  const bool softcap = kp.softcap_in_scale != 0.f;
  const auto kernel =
      kp.paged.block_table != nullptr
          ? (softcap ? &fwd_kernel<Traits, true, true> : &fwd_kernel<Traits, false, true>)
          : (softcap ? &fwd_kernel<Traits, true> : &fwd_kernel<Traits, false>);
  constexpr int smem = Traits::kSmemBytes;
  // Above 48 KB of shared memory, dynamic plus any static arrays, a kernel must opt in (once
  // per device is enough, but the attribute call is cheap and keeps this free of per-device
  // state).
  if constexpr (smem > 40 * 1024)
    FLASHCPP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const std::int64_t blocks = std::int64_t(kp.num_m_blocks) * kp.num_splits * kp.p.heads_q * kp.p.batch;
  if (blocks > INT_MAX)
    throw Error("cuda sm80 forward: " + std::to_string(blocks) +
                " thread blocks exceed the grid limit (2^31 - 1)");
  kernel<<<unsigned(blocks), Traits::kNThreads, smem, stream>>>(kp);
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
  if (kp.num_splits > 1) launch_combine<Element, false>(kp, kp.overlap_combine, stream);
}

// The forward of head dim kHeadDim with tile row `tile` (one of that head dim's rows, chosen
// by the host: fwd_dispatch.hpp); every row of the head dim is instantiated here.
template <class Element, int kHeadDim>
void run_fwd(const FwdKernelParams& kp, int tile, cudaStream_t stream) {
  static_assert(sm80_fwd_tile_index_nth(kHeadDim, 0) >= 0, "head dim must be a tile table entry");
  static_assert(sm80_fwd_tile_index_nth(kHeadDim, kSm80FwdMaxRowsPerHeadDim) < 0);
  bool launched = false;
  [&]<int... k>(std::integer_sequence<int, k...>) {
    (([&] {
       constexpr int kRow = sm80_fwd_tile_index_nth(kHeadDim, k);
       if constexpr (kRow >= 0) {
         if (tile == kRow) {
           launch_fwd<Element, kRow>(kp, stream);
           launched = true;
         }
       }
     }()),
     ...);
  }(std::make_integer_sequence<int, kSm80FwdMaxRowsPerHeadDim>{});
  if (!launched)
    throw Error("cuda sm80 forward: tile row " + std::to_string(tile) + " is not a row of head dim " +
                std::to_string(kHeadDim));
}

}  // namespace flashcpp::detail::cuda::sm80
