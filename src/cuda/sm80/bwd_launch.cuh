#pragma once
// Host side of one sm80 backward instantiation: tile choice, grids, shared-memory opt-in,
// launches.
//   default:       pre-pass -> main (dK, dV, atomic dQ_accum) -> post-pass (dq)
//   deterministic: pre-pass -> main (dK, dV)                  -> dq kernel (dq)
// Grids cover the (max) sequence lengths; varlen CTAs past their sequence return at once.
// Included only by the generated per-instantiation translation units.
#include <string>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/sm80/bwd_dq_kernel.hpp"
#include "cuda/sm80/bwd_kernel.hpp"
#include "cuda/sm80/bwd_main_traits.hpp"
#include "cuda/sm80/bwd_prepost.hpp"
#include "cuda/sm80/smem_budget.hpp"
#include "cuda/sm80/bwd_traits.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

// Consumer Ampere/Ada parts (sm86/sm89) allow 99 KB per block: say so instead of failing the
// launch with "invalid argument".
inline void check_smem_fits(std::size_t bytes, int head_dim, const char* kernel) {
  int device = 0, optin = 0;
  FLASHCPP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHCPP_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > std::size_t(optin))
    throw Error("q: head dim " + std::to_string(head_dim) + ": the sm80 backward " + kernel +
                " needs " + std::to_string(bytes) +
                " bytes of shared memory per block, this GPU allows " + std::to_string(optin));
}

template <class E, int kTileIndex>
void launch_bwd_main(const BwdKernelParams& kp, int n_blocks, cudaStream_t stream) {
  using Tr = BwdMainTraits<E, kTileIndex>;
  auto kernel = bwd_main<E, kTileIndex>;
  FLASHCPP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           Tr::kSmemBytes));
  const dim3 grid(n_blocks, kp.p.heads_kv, kp.p.batch);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(kp);
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
}

// The post-pass in the main kernel's query blocks and threads (it reads dq_accum in the order
// that kernel wrote it).
template <class E, int kTileIndex>
void launch_bwd_postprocess(const BwdKernelParams& kp, cudaStream_t stream) {
  using Tr = BwdMainTraits<E, kTileIndex>;
  const int m_blocks = int((std::int64_t(kp.p.seqlen_q) + Tr::kBlockM - 1) / Tr::kBlockM);
  const dim3 grid(m_blocks, kp.p.heads_q, kp.p.batch);
  bwd_postprocess<E, kTileIndex><<<grid, Tr::kThreads, 0, stream>>>(kp);
}

template <class E, int kHeadDim>
void run_bwd(const BwdKernelParams& kp, cudaStream_t stream) {
  using T = typename NativeOf<E>::type;
  using Tr = BwdTraits<T, kHeadDim>;  // the deterministic dq kernel's
  const BackwardParams& p = kp.p;
  // The main kernel's tile: the first row of this head dim that fits the budget.
  constexpr int kTile0 = sm80_bwd_tile_index_nth(kHeadDim, 0);
  constexpr int kTile1 = sm80_bwd_tile_index_nth(kHeadDim, 1);
  constexpr int kTile2 = sm80_bwd_tile_index_nth(kHeadDim, 2);
  constexpr int kLastTile = kTile2 >= 0 ? kTile2 : kTile1 >= 0 ? kTile1 : kTile0;
  static_assert(kTile0 >= 0, "every instantiated head dim has a main-kernel tile row");
  static_assert(sm80_bwd_tile_index_nth(kHeadDim, 3) < 0, "at most three rows per head dim");
  int device = 0;
  FLASHCPP_CUDA_CHECK(cudaGetDevice(&device));
  const int budget = sm80_smem_budget(device);
  const int tile = sm80_bwd_tile_index(kHeadDim, budget);
  if (tile < 0) {
    const int smallest = sm80_bwd_smem_bytes(kSm80BwdTiles[kLastTile]);
    throw Error("q: head dim " + std::to_string(p.head_dim) +
                ": the sm80 backward needs " + std::to_string(smallest) +
                " bytes of shared memory per block, this GPU (or FLASHCPP_SM80_SMEM_BUDGET) allows " +
                std::to_string(budget));
  }
  if (p.deterministic) check_smem_fits(Tr::kSmemBytes, p.head_dim, "dq kernel");

  // Block counts in int64: seqlen + block - 1 overflows int near 2^31.
  const int row_ctas = int((std::int64_t(p.seqlen_q) + kRowsPerCta - 1) / kRowsPerCta);
  const dim3 row_grid(row_ctas, p.heads_q, p.batch);
  if (p.seqlen_q > 0) {
    bwd_preprocess<T><<<row_grid, 32 * kRowsPerCta, 0, stream>>>(kp);
    FLASHCPP_CUDA_CHECK(cudaGetLastError());
  }
  const int block_n = kSm80BwdTiles[tile].block_n;
  const int n_blocks = int((std::int64_t(p.seqlen_k) + block_n - 1) / block_n);
  if (n_blocks > 0) {
    if (tile == kTile0)
      launch_bwd_main<E, kTile0>(kp, n_blocks, stream);
    else if constexpr (kTile1 >= 0) {
      if (tile == kTile1)
        launch_bwd_main<E, kTile1>(kp, n_blocks, stream);
      else if constexpr (kTile2 >= 0)
        launch_bwd_main<E, kTile2>(kp, n_blocks, stream);
    }
  }
  if (p.seqlen_q == 0) return;
  if (p.deterministic) {
    auto kernel = bwd_dq_deterministic<T, kHeadDim>;
    FLASHCPP_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::kSmemBytes)));
    const int m_blocks = int((std::int64_t(p.seqlen_q) + Tr::kBlockM - 1) / Tr::kBlockM);
    const dim3 grid(m_blocks, p.heads_q, p.batch);
    kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(kp);
  } else if (tile == kTile0) {
    launch_bwd_postprocess<E, kTile0>(kp, stream);
  } else if constexpr (kTile1 >= 0) {
    if (tile == kTile1)
      launch_bwd_postprocess<E, kTile1>(kp, stream);
    else if constexpr (kTile2 >= 0)
      launch_bwd_postprocess<E, kTile2>(kp, stream);
  }
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
