#pragma once
// Split-KV merge inside a thread-block cluster (sm90): the splits of one (sequence, kv head,
// row tile) run as one cluster, each CTA leaves its normalised partial O and its lse in its
// own shared memory, and after a cluster barrier every CTA merges a share of the tile's
// elements by reading all the splits' partials through distributed shared memory. The same
// merge as the combine kernel (common/split_kv_combine.hpp):
//   lse = m + log(sum_s exp(lse_s - m)),  O = sum_s exp(lse_s - lse) * O_s,  m = max_s lse_s,
// splits with lse_s = -inf weigh 0, a row no split saw gets O = 0 and lse = -inf, a NaN lse_s
// makes the row NaN. No second kernel and no round trip of the partials through global
// memory: at B = 1 the combine kernel was a fixed 3-5 us of a 30 us call.
#include <cmath>
#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#endif

#include "common/params.hpp"
#include "cuda/common/kvcache_kernel_params.hpp"
#include "cuda/sm80/decode_tile_table.hpp"

namespace flashcpp::detail::cuda::sm90 {

// Splits a cluster may hold: 8, the portable cluster size (16-CTA clusters at one CTA per SM
// did not all fit on an H100 at once, and 8 splits at one CTA per SM measured as fast as 16
// packed two per SM).
inline constexpr int kDecodeClusterMaxSplits = 8;

// part_o [kDecodeRows][kHeadDim] fp32 and part_lse [kDecodeRows]: this CTA's split, in shared
// memory, written by every thread before the call. Rows (token-major) r < rows_here of the
// tile starting at row0; the output goes to p.out / p.lse.
template <class Element, int kHeadDim>
__device__ void cluster_combine_store(const float* part_o, const float* part_lse, int rows_here,
                                      int row0, int b, int head_kv, const KVCacheKernelParams& kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's partials are in its shared memory
  const KVCacheParams& p = kp.p;
  const int splits = int(cluster.num_blocks());
  const int rank = int(cluster.block_rank());
  const int threads = int(blockDim.x);
  for (int e = rank * threads + int(threadIdx.x); e < rows_here * kHeadDim; e += splits * threads) {
    const int r = e / kHeadDim, col = e % kHeadDim;
    if (col >= p.head_dim_v) continue;
    // Every split's lse and O element is loaded before any is used, so the remote reads
    // overlap: one distributed-shared-memory round trip per element instead of one per split
    // (the O reads waited behind a branch on the weight). A split that saw none of the row's
    // keys holds O = 0 (the kernel writes exact zeros) and weighs 0.
    float l[kDecodeClusterMaxSplits], o[kDecodeClusterMaxSplits];
#pragma unroll
    for (int s = 0; s < kDecodeClusterMaxSplits; ++s) {
      l[s] = s < splits ? cluster.map_shared_rank(part_lse, s)[r] : -INFINITY;
      o[s] = s < splits ? cluster.map_shared_rank(part_o, s)[r * kHeadDim + col] : 0.f;
    }
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < kDecodeClusterMaxSplits; ++s) m = fmaxf(m, l[s]);
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < kDecodeClusterMaxSplits; ++s) sum += l[s] == -INFINITY ? 0.f : expf(l[s] - m);
    const bool empty = sum == 0.f;
    const float lse = empty ? -INFINITY : m + logf(sum);
    float acc = 0.f;
    if (!empty) {
#pragma unroll
      for (int s = 0; s < kDecodeClusterMaxSplits; ++s)
        acc = fmaf(l[s] == -INFINITY ? 0.f : expf(l[s] - lse), o[s], acc);
    }
    const int row = row0 + r, t = row / kp.group, h = head_kv * kp.group + row % kp.group;
    static_cast<Element*>(p.out)[b * p.out_stride.batch + std::int64_t(t) * p.out_stride.row +
                                 std::int64_t(h) * p.out_stride.head + col] = Element(acc);
    if (col == 0 && p.lse != nullptr)
      p.lse[b * p.lse_batch_stride + std::int64_t(h) * p.lse_head_stride + t] = lse;
  }
  cluster.sync();  // no CTA leaves while another reads its shared memory
#endif
}

}  // namespace flashcpp::detail::cuda::sm90
