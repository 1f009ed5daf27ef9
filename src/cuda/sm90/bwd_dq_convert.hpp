#pragma once
// dq_accum as the sm90 backward lays it out, and the post-pass that turns it into dq.
//
// Blocked layout: query block m of (batch, query head) is one contiguous run of
// Traits::kDqBlockFloats floats at ((batch * Hq + head) * num_m_blocks + m) * kDqBlockFloats,
// and inside it dQ thread tid's accumulator element 4v + e sits at float
// 4 * (v * kDqThreads + tid) + e (tid counts the threads of the warpgroups that compute a
// block's dQ: both consumer warpgroups, or at d64 the one whose turn it is). At d128 that is
// the order in which the consumers stage dQ in shared memory (float4 stores, conflict-free),
// so one bulk reduction adds a whole block; d64 and the split_d kernel add the same float4s
// from registers with atomics (each warp covers 512 contiguous bytes). The post-pass undoes
// the permutation with the same TiledMma partition. Rows past the sequence and columns past
// the real head dim hold zeros there (Q and K are zero-filled by TMA) and are
// never written to dq.
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include "cuda/common/bwd_kernel_params.hpp"
#include "cuda/common/seqlen_info.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

template <class Traits>
__host__ __device__ inline std::int64_t dq_block_offset(const BackwardParams& p, int batch,
                                                        int head, int m, int num_m_blocks) {
  return ((std::int64_t(batch) * p.heads_q + head) * num_m_blocks + m) * Traits::kDqBlockFloats;
}

constexpr int kDqConvertThreads = 256;

// dq = dq_accum * scale in the element type; one CTA per (query block, query head, batch).
// Reads are coalesced float4s of the blocked layout (post-pass thread t takes dQ thread
// t % kDqThreads's accumulators, or a share of them when fewer threads computed dQ); the
// scaled values go to a shared-memory tile in (row, dim) order, from which every row leaves as
// 16-byte stores (bwd_covers makes dq rows 16-byte aligned).
template <class Traits>
__global__ void __launch_bounds__(kDqConvertThreads) bwd_dq_convert(const BwdKernelParams kp) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kDqThreads = Traits::kDqThreads;
  static_assert(kDqConvertThreads % kDqThreads == 0);
  constexpr int kParts = kDqConvertThreads / kDqThreads;  // post-pass threads per dQ thread
  constexpr int kVecs = Traits::kDqPerThread / 4 / kParts;  // float4s per post-pass thread
  static_assert(kVecs * 4 * kParts == Traits::kDqPerThread);
  // 8 elements of padding per row: a warp's 4-byte writes of one accumulator register (8 rows
  // x 4 column pairs) land in 32 different banks.
  constexpr int kRowStride = kHeadDim + 8;
  __shared__ alignas(16) Element tile[kBlockM * kRowStride];

  const BackwardParams& p = kp.p;
  const int m = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int dq_tid = threadIdx.x % kDqThreads, part = threadIdx.x / kDqThreads;
  typename Traits::TiledMmaDq mma_dq;
  // (query, dim) of every element; pairs (2i, 2i + 1) are adjacent dims of one query.
  Tensor c = mma_dq.get_thread_slice(dq_tid).partition_C(
      make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  static_assert(decltype(size(c))::value == Traits::kDqPerThread);
  const float4* src = reinterpret_cast<const float4*>(
      kp.dq_accum + dq_block_offset<Traits>(p, batch, head, m, int(gridDim.x)));
  float4 acc[kVecs];
  CUTE_UNROLL
  for (int j = 0; j < kVecs; ++j) acc[j] = src[(part * kVecs + j) * kDqThreads + dq_tid];
  CUTE_UNROLL
  for (int j = 0; j < kVecs; ++j) {
    const int v = part * kVecs + j;
    const float vals[4] = {acc[j].x, acc[j].y, acc[j].z, acc[j].w};
    CUTE_UNROLL
    for (int e = 0; e < 4; e += 2) {
      cutlass::Array<Element, 2> pair;
      pair[0] = Element(vals[e] * p.scale);
      pair[1] = Element(vals[e + 1] * p.scale);
      const int row = get<0>(c(4 * v + e)), col = get<1>(c(4 * v + e));
      *reinterpret_cast<cutlass::Array<Element, 2>*>(&tile[row * kRowStride + col]) = pair;
    }
  }
  __syncthreads();

  // 16-byte chunks of the tile's rows, predicated on the sequence and the real head dim.
  constexpr int kChunk = 16 / sizeof(Element);
  constexpr int kChunksPerRow = kHeadDim / kChunk;
  const int m0 = m * kBlockM;
  const SeqlenInfo seq(p, batch);  // varlen: this sequence's rows of the packed dq
  const int rows = seq.seqlen_q - m0;
  Element* dst = static_cast<Element*>(p.dq) +
                 seq.offset(p.dq_stride, seq.batch_q, seq.row_q + m0, head);
  CUTE_UNROLL
  for (int i = threadIdx.x; i < kBlockM * kChunksPerRow; i += kDqConvertThreads) {
    const int row = i / kChunksPerRow, col = i % kChunksPerRow * kChunk;
    if (row >= rows || col >= p.head_dim) continue;
    const Element* from = &tile[row * kRowStride + col];
    Element* to = dst + std::int64_t(row) * p.dq_stride.row + col;
    if (col + kChunk <= p.head_dim) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
    } else {  // the last, partial chunk of a head dim that is not a multiple of 8
      for (int e = 0; e < p.head_dim - col; ++e) to[e] = from[e];
    }
  }
}

}  // namespace flashcpp::detail::cuda::sm90
