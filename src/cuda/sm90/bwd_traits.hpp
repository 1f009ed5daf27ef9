#pragma once
// Compile-time description of one sm90a backward instantiation: the tile (from the tile
// table), the four warpgroup MMAs, the swizzled shared-memory layouts that TMA writes and
// wgmma reads, the TMA copy types, the Q and dO pipelines and the shared-memory storage.
//
// Products per query block (the "T" views are the same shared memory read transposed):
//   S^T  = K Q^T     (128 keys x 64 queries)  SS, warpgroup w takes keys [64w, 64w + 64)
//   dP^T = V dO^T    (same shape)             SS
//   dV  += P^T dO    (128 keys x D)           RS, P^T straight from the S^T registers
//   dK  += dS^T Q    (128 keys x D)           RS, dS^T straight from the dP^T registers
//   dQ   = dS K      (64 queries x D)         SS, dS from shared memory; d128: warpgroup w
//                                             takes head-dim columns [wD/2, wD/2 + D/2); d64:
//                                             the warpgroups take whole blocks in turn (see
//                                             kDqAlternate); staged in shared memory, added
//                                             to dq_accum by one bulk reduction per block
//                                             (bwd_dq_convert.hpp)
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
template <class Element_, int kHeadDim_, bool kVarlen_ = false, bool kDeterministic_ = false>
struct BwdTraits {
  static constexpr bool kVarlen = kVarlen_;
  static constexpr bool kDeterministic = kDeterministic_;
  using Element = Element_;
  static constexpr Sm90BwdTile kTile = sm90_bwd_tile(kHeadDim_);
  static_assert(kTile.head_dim == kHeadDim_, "head dim must be an sm90 backward tile entry");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDim_;  // split by keys: D == Dv rows only
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr int kConsumerWarpgroups = kBlockN / 64;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * 128;
  static constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup
  static_assert(kBlockN == 128 && kBlockM == 64, "two consumer warpgroups of 64 keys, 64 queries");
  static_assert(kHeadDim % 64 == 0, "rows of 64 elements (128 B) for the 128-byte swizzle");
  // dQ = dS K of a query block. At d64 one warpgroup computes all of it, the two taking turns
  // block by block (kDqAlternate, the tile's dq_turns): each wgmma then reads 64 columns of K
  // rather than 32 (the shared-memory reads per flop of an N = 32 wgmma are 1.5x an N = 64
  // one's), and the warpgroup not on dQ duty runs ahead into the next block instead of waiting
  // for the other. Its dQ goes to dq_accum as float4 reductions straight from registers (no
  // shared-memory stage: +2% at d64 against a stage and a bulk reduction, H100).
  // At d128 the whole-D accumulator would not fit the registers: both warpgroups take half of
  // the head-dim columns of every block, staged and added by one bulk reduction per block
  // (float4 reductions from registers measured 4-8% slower there).
  static constexpr bool kDqAlternate = kTile.dq_turns;
  static_assert(!kDqAlternate || kStages == 2, "turns alternate with the two dS buffers");
  static constexpr int kDqWarpgroups = kDqAlternate ? 1 : kConsumerWarpgroups;
  static constexpr int kDqThreads = kDqWarpgroups * 128;
  static constexpr int kDqCols = kHeadDim / kDqWarpgroups;  // dQ columns per warpgroup
  // dQ of one query block: kDqPerThread fp32 accumulators per dQ thread, added to dq_accum as
  // one contiguous block of kDqBlockFloats (bwd_dq_convert.hpp).
  static constexpr int kDqBlockFloats = kBlockM * kHeadDim;
  static constexpr int kDqPerThread = kDqBlockFloats / kDqThreads;
  static_assert(kDqPerThread % 4 == 0, "float4 stores and reductions of dQ");
  // Shared-memory dQ stages: one per ring stage (a block is staged while the previous one's
  // reduction still reads); none when the warpgroups take turns.
  static constexpr int kDqStages = kDqAlternate ? 0 : kStages;

  // Producer 24 + 2 consumers x 240 = 504 = 3 x 168, the per-thread share of 64K registers at
  // 384 threads: setmaxnreg needs the totals to match the entry allocation.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kProducerRegs + kConsumerWarpgroups * kConsumerRegs <= (kThreads / 128) * 168);

  // One 64-row wgmma atom per consumer warpgroup, stacked along M (keys) for S^T, dP^T, dK, dV
  // and side by side along N (head dim) for dQ, whose M is the 64 query rows.
  using AtomLayoutKeys = Layout<Shape<Int<kConsumerWarpgroups>, _1, _1>>;
  using AtomLayoutDq = Layout<Shape<_1, Int<kDqWarpgroups>, _1>>;
  // S^T and dP^T read their A operands (this warpgroup's K and V rows) from shared memory, or,
  // with kKVInRegisters, from registers loaded once per CTA: an SS wgmma of N = 64 reads
  // 4 KB of shared memory per 32 tensor-core cycles, the whole 128 B/clk of an SM, so the
  // register-sourced A halves what S^T and dP^T take of it (d64: the main loop is
  // shared-memory-bound, not tensor-bound).
  static constexpr bool kKVInRegisters = kTile.kv_in_registers;
  using SdPShape = Shape<Int<kBlockN>, Int<kBlockM>, Int<kHeadDim>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      std::conditional_t<kKVInRegisters,
                         decltype(GMMA::rs_op_selector<Element, Element, float, SdPShape>()),
                         decltype(GMMA::ss_op_selector<Element, Element, float, SdPShape>())>{},
      AtomLayoutKeys{}));
  using TiledMmaDkv = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float,
                           Shape<Int<kBlockN>, Int<kHeadDim>, Int<kBlockM>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomLayoutKeys{}));
  using TiledMmaDk = TiledMmaDkv;  // the names the shared kernel parts use
  using TiledMmaDv = TiledMmaDkv;
  using TiledMmaDq = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kDqCols>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      AtomLayoutDq{}));

  // Q, dO, V: K-major 128-byte swizzle (atoms of 8 rows x 64 elements), as TMA writes them.
  // K: read K-major by S^T and MN-major by dQ, where each warpgroup's B slice is kDqCols wide;
  // an MN-major wgmma operand must span whole swizzle atoms, so K uses the swizzle whose atom is
  // kDqCols elements wide (64 B at D = 64, 128 B at D = 128).
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemAtomK = std::conditional_t<kDqCols % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                                       GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemLayoutQ =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutDo = SmemLayoutQ;
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomK{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // Q and dO as (D, query, stage): the B operands of dK += dS^T Q and dV += P^T dO.
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{},
                                         Step<_2, _1, _3>{})));
  using SmemLayoutDot = SmemLayoutQt;
  // K as (D, key): the B operand of dQ = dS K.
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{},
      make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // dS as (query, key, buffer), queries contiguous: the MN-major A operand of dQ = dS K. Two
  // buffers, so that one warpgroup can write block i + 1 while the other still reads block i.
  // The consumers write it through the (key, query, buffer) view, i.e. from dS^T registers.
  // Not swizzled (8 x 8 core matrices of 128 contiguous bytes): a warp's 4-byte stores of
  // one column group fill one core matrix, conflict-free, at addresses linear in the
  // register index (the 128-byte swizzle cost per-element address registers at d128).
  using SmemLayoutDs = decltype(tile_to_shape(GMMA::Layout_MN_INTER_Atom<Element>{},
                                              Shape<Int<kBlockM>, Int<kBlockN>, Int<kStages>>{}));
  using SmemLayoutDst = decltype(composition(
      SmemLayoutDs{},
      make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, Int<kStages>>{},
                                         Step<_2, _1, _3>{})));

  // Global tensors as TMA sees them: (row, dim, head, batch) with the real extents, so rows
  // past the sequence and columns past the real head dim come back as zeros.
  using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)),
                                          GmemShape{}, GmemStride{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaDo = TmaQ;
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{},
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutV{},
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  // Epilogue (bwd_epilogue.hpp): warpgroup w stages its 64 keys of dK in stage w of the Q ring
  // and of dV in stage w of the dO ring (free once both warpgroups are done with the loop), and
  // one of its threads stores each with TMA (rows past the sequence and columns past the real
  // head dim clipped by the descriptor's extents).
  static_assert(kStages == kConsumerWarpgroups, "one ring stage per warpgroup's dK, dV half");
  using GmemTensorOut = decltype(make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)),
                                             GmemShape{}, GmemStride{}));
  using TmaDkv = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensorOut{},
                                        take<0, 2>(SmemLayoutQ{}), Shape<_64, Int<kHeadDim>>{},
                                        _1{}));

  // One stage of the Q ring brings a Q block and its lse_log2 row, one of the dO ring a dO
  // block and its dsum row (bulk copies of the pre-pass's blocked statistics).
  static constexpr std::uint32_t kStatsBytes = kBlockM * sizeof(float);
  static constexpr std::uint32_t kQStageBytes = kBlockM * kHeadDim * sizeof(Element) + kStatsBytes;
  static constexpr std::uint32_t kDoStageBytes = kQStageBytes;
  static constexpr std::uint32_t kKVBytes = 2 * kBlockN * kHeadDim * sizeof(Element);

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  struct SharedStorage {
    // 1024-byte alignment: the 128-byte swizzle pattern repeats every 8 rows of 128 B.
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDo>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDs>> ds;
    alignas(128) cute::array_aligned<float, (kDqStages > 0 ? kDqStages * kDqBlockFloats : 1)> dq;
    alignas(16) float lse_log2[kStages][kBlockM];
    alignas(16) float dsum[kStages][kBlockM];
    typename Pipeline::SharedStorage pipeline_q;
    typename Pipeline::SharedStorage pipeline_do;
    alignas(8) std::uint64_t kv_full;  // transaction barrier of the single K + V load
    BwdNonFiniteStorage<kStages> non_finite;  // the cut tiles' scan (bwd_non_finite.hpp)
    // Deterministic d128 only: the dQ stages' full and empty barriers between the consumers
    // and the dQ writer thread (bwd_mainloop.hpp). Unused otherwise; they sit in the tail
    // padding of the 1024-byte alignment, so the storage's size does not change.
    alignas(8) std::uint64_t dq_full[kStages];
    alignas(8) std::uint64_t dq_empty[kStages];
    // Read by the deterministic d64 kernel only (zeroed in every one): the warps that have
    // issued their dQ additions, counted for the announcer thread (bwd_dq_order.hpp). In the
    // tail padding too.
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
