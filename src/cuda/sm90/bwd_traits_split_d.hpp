#pragma once
// Compile-time description of an sm90a backward instantiation split by head dim (split_d
// entries of bwd_tile_table.hpp: d256, 192 x 128): 64 keys per CTA shared by both consumer
// warpgroups.
// The same names as BwdTraits (bwd_traits.hpp), so the producer, epilogue, launch and dq
// post-pass serve both.
//
// Products per query block (the "t" layouts are the same shared memory read transposed):
//   S  = Q K^T    (64 queries x 64 keys)  SS, warpgroup w takes keys [32w, 32w + 32)
//   dP = dO V^T   (same shape)            SS
//   P, dS -> shared memory (query, key), both warpgroups meet, then with w's head-dim half
//   [wD/2, wD/2 + D/2):
//   dV += P^T dO  (64 keys x Dv)          SS, P^T from shared memory (MN-major)
//   dK += dS^T Q  (64 keys x D)           SS, dS^T likewise
//   dQ  = dS K    (64 queries x D)        SS, added to the blocked dq_accum from registers
// D is the head dim of Q and K (dQ, dK), Dv that of V and dO (dV); dP = dO V^T runs over Dv.
// With Dv == D (d256) every type is what it was before Dv existed.
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuda/sm90/bwd_non_finite.hpp"
#include "cuda/sm90/bwd_tile_table.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

// kVarlen_: the instantiation for varlen calls (per-sequence rows, tails zeroed in shared
// memory, dK and dV of a key block that reaches past its sequence stored without TMA).
// kDeterministic_: the instantiation for deterministic calls (dQ added in a fixed key-block
// order, bwd_dq_order.hpp); false compiles the atomics-in-any-order kernel unchanged.
template <class Element_, int kHeadDim_, int kHeadDimV_, bool kVarlen_ = false,
          bool kDeterministic_ = false>
struct BwdTraitsSplitD {
  static constexpr bool kVarlen = kVarlen_;
  static constexpr bool kDeterministic = kDeterministic_;
  using Element = Element_;
  static constexpr Sm90BwdTile kTile = sm90_bwd_tile(kHeadDim_, kHeadDimV_);
  static_assert(kTile.head_dim == kHeadDim_ && kTile.head_dim_v == kHeadDimV_ && kTile.split_d,
                "head dims must be a split_d sm90 backward tile entry");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * 128;
  static constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup
  static_assert(kBlockN == 64 && kBlockM == 64, "64 queries x 64 keys");
  static_assert(kStages == 2, "the P / dS buffer index is the ring index");
  static constexpr int kKeysPerWg = kBlockN / kConsumerWarpgroups;  // S, dP columns
  static constexpr int kDimsPerWg = kHeadDim / kConsumerWarpgroups;    // dK, dQ columns
  static constexpr int kDimsPerWgV = kHeadDimV / kConsumerWarpgroups;  // dV columns
  // MN-major B operands span whole swizzle atoms: 64 elements (128 B), or 32 (64 B) where a
  // warpgroup's share is not a multiple of 64 (D 192: 96 columns each).
  static_assert(kDimsPerWg % 32 == 0 && kDimsPerWgV % 32 == 0,
                "a warpgroup's head-dim share must be whole 64-byte swizzle atoms");
  // dQ of one query block: kDqPerThread fp32 accumulators per consumer thread, added to
  // dq_accum as one contiguous block of kDqBlockFloats (bwd_dq_convert.hpp).
  static constexpr int kDqBlockFloats = kBlockM * kHeadDim;
  static constexpr int kDqThreads = kConsumerThreads;  // every consumer holds part of dQ
  static constexpr int kDqPerThread = kDqBlockFloats / kDqThreads;
  static_assert(kDqPerThread % 4 == 0, "float4 reductions of dQ");

  // As BwdTraits: 24 + 2 x 240 = 504 = 3 x 168.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kProducerRegs + kConsumerWarpgroups * kConsumerRegs <= (kThreads / 128) * 168);

  // Every product has M = 64 (one wgmma atom), and the warpgroups sit side by side along N:
  // keys for S and dP, head-dim halves for dK, dV and dQ. The selectors take one atom's tile.
  using AtomLayoutN = Layout<Shape<_1, Int<kConsumerWarpgroups>, _1>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<Int<kBlockM>, Int<kKeysPerWg>, Int<kHeadDim>>>(),
      AtomLayoutN{}));
  // S = Q K^T runs over D and dP = dO V^T over Dv; the instruction (64 x kKeysPerWg x 16)
  // is the same, so one TiledMma serves both.
  using TiledMmaDk = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<Int<kBlockN>, Int<kDimsPerWg>, Int<kBlockM>>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      AtomLayoutN{}));
  using TiledMmaDv = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<Int<kBlockN>, Int<kDimsPerWgV>, Int<kBlockM>>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      AtomLayoutN{}));
  using TiledMmaDq = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<Int<kBlockM>, Int<kDimsPerWg>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomLayoutN{}));

  // Q, dO, K, V: K-major swizzle, as TMA writes them: 128-byte (atoms of 8 rows x 64
  // elements), or 64-byte (8 x 32) for Q and K (D) or dO and V (Dv) where a warpgroup's share
  // of the head dim is not a whole 128-byte atom (Q and K are read MN-major by dK and dQ with
  // kDimsPerWg columns per warpgroup, dO by dV with kDimsPerWgV).
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  template <int kShare>
  using SmemAtomFor = std::conditional_t<kShare % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                                         GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemAtomQK = SmemAtomFor<kDimsPerWg>;
  using SmemAtomV = SmemAtomFor<kDimsPerWgV>;
  using SmemLayoutQ =
      decltype(tile_to_shape(SmemAtomQK{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutDo =
      decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kStages>>{}));
  using SmemLayoutK =
      decltype(tile_to_shape(SmemAtomQK{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutV =
      decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockN>, Int<kHeadDimV>>{}));
  // Q as (D, query, stage) and dO as (Dv, query, stage): the MN-major B operands of
  // dK += dS^T Q and dV += P^T dO.
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{},
                                         Step<_2, _1, _3>{})));
  using SmemLayoutDot = decltype(composition(
      SmemLayoutDo{}, make_ordered_layout(Shape<Int<kHeadDimV>, Int<kBlockM>, Int<kStages>>{},
                                          Step<_2, _1, _3>{})));
  // K as (D, key): the MN-major B operand of dQ = dS K.
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{},
      make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // P and dS as (query, key, buffer), keys contiguous, 128-byte swizzle: dS is the K-major A
  // operand of dQ; read as (key, query, buffer) both are the MN-major A operands of dV and dK
  // (a K-major SW128 atom of 8 x 64 is the MN-major SW128 atom of 64 x 8 transposed). Each row
  // is 128 B, so a warp's paired 4-byte stores of 8 rows land in 8 different 16-byte chunks:
  // conflict-free. Two buffers, so that block i + 1 is written while block i is still read.
  using SmemLayoutPdS =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kBlockN>, _2>{}));
  using SmemLayoutPdSt = decltype(composition(
      SmemLayoutPdS{},
      make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));

  // Global tensors as TMA sees them: (row, dim, head, batch) with the real extents, so rows
  // past the sequence and columns past the real head dim come back as zeros.
  using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)),
                                          GmemShape{}, GmemStride{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaDo = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{},
                                       take<0, 2>(SmemLayoutDo{}),
                                       Shape<Int<kBlockM>, Int<kHeadDimV>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{},
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutV{},
                                      Shape<Int<kBlockN>, Int<kHeadDimV>>{}, _1{}));
  // dK and dV are stored from registers (bwd_epilogue.hpp): no shared memory is left to stage
  // them, and no descriptor is built.
  struct TmaDkv {};

  // A Q ring stage brings the block and its lse_log2 row, a dO stage the block and its dsum
  // row (bwd_producer.hpp).
  static constexpr std::uint32_t kStatsBytes = kBlockM * sizeof(float);
  static constexpr std::uint32_t kQStageBytes = kBlockM * kHeadDim * sizeof(Element) + kStatsBytes;
  static constexpr std::uint32_t kDoStageBytes =
      kBlockM * kHeadDimV * sizeof(Element) + kStatsBytes;
  static constexpr std::uint32_t kKVBytes = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  struct SharedStorage {
    // 1024-byte alignment: the 128-byte swizzle pattern repeats every 8 rows of 128 B.
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDo>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutPdS>> p;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutPdS>> ds;
    alignas(16) float lse_log2[kStages][kBlockM];
    alignas(16) float dsum[kStages][kBlockM];
    typename Pipeline::SharedStorage pipeline_q;
    typename Pipeline::SharedStorage pipeline_do;
    alignas(8) std::uint64_t kv_full;  // transaction barrier of the single K + V load
    BwdNonFiniteStorage<kStages> non_finite;  // the cut tiles' scan (bwd_non_finite.hpp)
    // Deterministic only: the warps that have issued their dQ additions, counted for the
    // announcer thread (bwd_dq_order.hpp). In the tail padding of the 1024-byte alignment.
    unsigned dq_added;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the sm90 limit");
  // The tile table's formula (sm90_bwd_smem_bytes) counts the payload by hand; the storage
  // adds only barriers and the rounding to its 1024-byte alignment, so a larger gap means the
  // two drifted.
  static_assert(kSmemBytes >= sm90_bwd_smem_bytes(kTile, int(sizeof(Element))) &&
                    kSmemBytes - sm90_bwd_smem_bytes(kTile, int(sizeof(Element))) < 2048,
                "sm90_bwd_smem_bytes (bwd_tile_table.hpp) no longer matches SharedStorage");
};

}  // namespace flashcpp::detail::cuda::sm90
