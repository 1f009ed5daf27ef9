#pragma once
// dq_accum as the sm90 backward lays it out, and the post-pass that turns it into dq.
//
// Blocked layout: query block m of (batch, query head) is one contiguous run of
// Traits::kDqBlockFloats floats at ((batch * Hq + head) * num_m_blocks + m) * kDqBlockFloats,
// and inside it dQ thread tid's accumulator element 4v + e sits at float
// 4 * (v * kDqThreads + tid) + e (tid counts the threads of the warpgroups that compute a
// block's dQ: both consumer warpgroups, or at d64 the one whose turn it is). That is the order in which the consumers stage dQ in
// shared memory (float4 stores, conflict-free), so one bulk reduction adds a whole block (the
// split_d kernel, without room for the stage, adds the same float4s with atomics: each warp
// covers 512 contiguous bytes); the post-pass undoes the permutation with the same TiledMma
// partition. Rows past the sequence
// and columns past the real head dim hold zeros there (Q and K are zero-filled by TMA) and are
// never written to dq.
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include "cuda/common/bwd_params.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Traits>
__host__ __device__ inline std::int64_t dq_block_offset(const BackwardParams& p, int batch,
                                                        int head, int m, int num_m_blocks) {
  return ((std::int64_t(batch) * p.heads_q + head) * num_m_blocks + m) * Traits::kDqBlockFloats;
}

// dq = dq_accum * scale in the element type; one CTA per (query block, query head, batch), its
// thread tid reads what consumer thread tid staged (coalesced float4 loads).
template <class Traits>
__global__ void __launch_bounds__(Traits::kDqThreads)
    bwd_dq_convert(const BwdKernelParams kp) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kThreads = Traits::kDqThreads;
  const BackwardParams& p = kp.p;
  const int m = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int tid = threadIdx.x;
  typename Traits::TiledMmaDq mma_dq;
  // (query, dim) of every element; pairs (2i, 2i + 1) are adjacent dims of one query.
  Tensor c = mma_dq.get_thread_slice(tid).partition_C(
      make_identity_tensor(Shape<Int<kBlockM>, Int<Traits::kHeadDim>>{}));
  static_assert(decltype(size(c))::value == Traits::kDqPerThread);
  const float4* src = reinterpret_cast<const float4*>(
      kp.dq_accum + dq_block_offset<Traits>(p, batch, head, m, int(gridDim.x)));
  const int m0 = m * kBlockM;
  const int rows = p.seqlen_q - m0;
  Element* dst = static_cast<Element*>(p.dq) + std::int64_t(batch) * p.dq_stride.batch +
                 std::int64_t(head) * p.dq_stride.head + std::int64_t(m0) * p.dq_stride.row;
  // Every load first: dq might alias dq_accum as far as the compiler knows, so loads after a
  // store would wait for it and each thread would pay one memory latency per float4.
  constexpr int kVecs = Traits::kDqPerThread / 4;
  float4 acc[kVecs];
  CUTE_UNROLL
  for (int v = 0; v < kVecs; ++v) acc[v] = src[v * kThreads + tid];
  CUTE_UNROLL
  for (int v = 0; v < kVecs; ++v) {
    const float vals[4] = {acc[v].x, acc[v].y, acc[v].z, acc[v].w};
    CUTE_UNROLL
    for (int e = 0; e < 4; e += 2) {
      const int row = get<0>(c(4 * v + e)), col = get<1>(c(4 * v + e));
      if (row < rows && col < p.head_dim) {
        cutlass::Array<Element, 2> pair;
        pair[0] = Element(vals[e] * p.scale);
        pair[1] = Element(vals[e + 1] * p.scale);
        *reinterpret_cast<cutlass::Array<Element, 2>*>(
            dst + std::int64_t(row) * p.dq_stride.row + col) = pair;
      }
    }
  }
}

}  // namespace flashcpp::detail::cuda::sm90
