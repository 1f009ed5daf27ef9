#pragma once
// Compile-time description of one sm90a forward instantiation: the tile (from the tile table),
// the two warpgroup MMAs, the 128-byte-swizzled shared-memory layouts both TMA and wgmma read,
// the TMA copy types, the K and V pipelines and the shared-memory storage.
#include <type_traits>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/mask.hpp"
#include "cuda/sm90/fwd_tile_scheduler.hpp"
#include "cuda/sm90/fwd_tile_table.hpp"

namespace flashcpp::detail::cuda::sm90 {

using namespace cute;

// kHeadDim_ is the head dim of Q and K, kHeadDimV_ that of V and O (a tile table row each;
// D == Dv for all but the pair rows such as 192 x 128). The QK^T product and the Q, K tiles use
// D; the PV product, the V tiles, the O accumulator and the O epilogue use Dv. With
// kHeadDimV_ == kHeadDim_ every type below is what it was before Dv existed.
// kVarlen_: the instantiation for varlen calls (per-sequence rows and tiles, the dynamic tile
// deal, V tails zeroed, TMA stores only inside a sequence). Padded calls run the other one,
// which carries none of that code: in one kernel it cost 3-17% at d64 and d128.
// Element_ cutlass::float_e4m3_t: the FP8 forward (q, k, v e4m3, out bf16 or fp16). Its
// differences: every wgmma operand K-major, so V is read as V^T [Dv, keys] that the pre-pass
// wrote into the workspace (fwd_fp8_vt_prepass.cuh) with its own TMA descriptor; P is packed
// into the e4m3 A fragment in the accumulator's key order (fp8_pv_order.hpp); its own tile
// table rows; the 16-bit types (ElementOut) for O. For fp16 and bf16 every type below is what
// it was before.
// kPaged_: the varlen instantiation over a paged KV cache (prefill with a cache): K and V
// arrive in boxes of kPageBoxRows rows, each from its own page (fwd_mainloop.hpp); Q, O and
// the rest are the varlen instantiation's. fp16/bf16 only (the FP8 forward has no paged form).
// kRow_: which tile of the head dims (fwd_tile_table.hpp): the table's; short_call, the padded,
// unsplit instantiation of the row's short-call key block (sm90_fwd_short_call); long_call,
// the unsplit, unpaged instantiations of its long-call tile (sm90_fwd_long_call);
// fp8_fast_accum, the FP8 row without the per-block P V sum (O on the tensor cores).
template <class Element_, int kHeadDim_, int kHeadDimV_, bool kVarlen_ = false,
          bool kPaged_ = false, FwdTileRow kRow_ = FwdTileRow::table>
struct FwdTraits {
  using Element = Element_;
  static constexpr bool kFp8 = std::is_same_v<Element, cutlass::float_e4m3_t>;
  using ElementOut = std::conditional_t<kFp8, cutlass::bfloat16_t, Element>;
  static constexpr bool kVarlen = kVarlen_;
  static constexpr bool kPaged = kPaged_;
  static_assert(kVarlen || !kPaged, "a paged cache runs as varlen over per-sequence key counts");
  static_assert(!(kFp8 && kPaged), "the FP8 forward has no paged instantiation");
  static_assert(kRow_ != FwdTileRow::fp8_fast_accum || kFp8, "the fast-accumulation rows are FP8's");
  static constexpr Sm90FwdTile kTableTile =
      kRow_ == FwdTileRow::fp8_fast_accum ? sm90_fwd_tile_fp8_fast_accum(kHeadDim_, kHeadDimV_)
      : kFp8                              ? sm90_fwd_tile_fp8(kHeadDim_, kHeadDimV_)
                                          : sm90_fwd_tile(kHeadDim_, kHeadDimV_);
  static constexpr bool kShort = kRow_ == FwdTileRow::short_call;
  static_assert(!kShort || (kTableTile.short_block_n > 0 && !kVarlen_),
                "a short-call instantiation: padded, of a row that has a short key block");
  static constexpr bool kLong = kRow_ == FwdTileRow::long_call;
  static_assert(!kLong || (kTableTile.long_block_m > 0 && kTableTile.long_block_n > 0 && !kPaged_),
                "a long-call instantiation: unpaged, of a row that has a long-call tile");
  static constexpr Sm90FwdTile kTile = kShort ? sm90_fwd_short_tile(kTableTile)
                                       : kLong ? sm90_fwd_long_tile(kTableTile)
                                               : kTableTile;
  static_assert(kTile.head_dim == kHeadDim_ && kTile.head_dim_v == kHeadDimV_,
                "head dims must be an sm90 tile table entry");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  // FP8: each key block's P V summed apart from O in chunks of kPvChunk Dv columns
  // (fp8_pv_chunks.hpp); 0 (and fp16/bf16): O is the P V accumulator of the tensor cores.
  static constexpr int kPvChunk = kFp8 ? kTile.pv_chunk : 0;
  static_assert(kPvChunk >= 0 && kPvChunk % 8 == 0 && kPvChunk <= kHeadDimV_ &&
                    kHeadDimV_ % (kPvChunk > 0 ? kPvChunk : 1) == 0,
                "the P V chunk width: a multiple of 8 (wgmma N) that divides Dv, or 0");
  static constexpr int kPvTemps = kFp8 ? kTile.pv_temps : 0;
  static_assert(kPvChunk == 0 || kPvTemps == 1 || kPvTemps == 2,
                "1 or 2 P V chunk temporaries in flight");
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * 128;
  static constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup
  static_assert(kBlockM == 128 || kBlockM == 192, "two or three consumer warpgroups of 64 rows");
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0,
                "rows of 64 elements (128 B) for the 128-byte swizzle");
  static_assert(kBlockN % (kFp8 ? 32 : 16) == 0, "kBlockN is the k extent of O += P V");
  static_assert(!kFp8 || kBlockN <= 128,
                "a sequence's last FP8 key block reads at most 128 zero V^T columns past it "
                "(fp8_vt_layout.hpp)");

  // Consumer warpgroups take turns issuing their GEMMs (fwd_mainloop.hpp) where the softmax is
  // as long as the products; at d256 the products dominate and FA3 finds no gain either.
  // Measured within run-to-run noise on an H200 so far (d64 N=4k 453 -> 442, d128 N=16k
  // causal 676 -> 676 TFLOP/s; cuDNN moved by 3-5% between the same two runs):
  // docs/design/sm90-kernels.md.
  static constexpr bool kPingPong = kHeadDim <= 128;

  // Rebuild Q's wgmma descriptors in every main-loop iteration (fwd_mainloop.hpp) from this
  // head dim up: at d256 the compiler otherwise keeps all 16 descriptors live and spills them
  // (H100: +2-9% TFLOP/s with O through Q's buffer, the epilogue of the time). FLASHCPP_SM90_FWD_Q_DESC_MIN_HDIM is the
  // configure-time A/B switch (cmake -DFLASHCPP_SM90_FWD_Q_DESC_MIN_HDIM=512: never).
#ifndef FLASHCPP_SM90_FWD_Q_DESC_MIN_HDIM
#define FLASHCPP_SM90_FWD_Q_DESC_MIN_HDIM 256
#endif
  static constexpr bool kQDescPerIteration = kHeadDim >= FLASHCPP_SM90_FWD_Q_DESC_MIN_HDIM;

  // Producer 24 + 2 consumers x 240 = 504 = 3 x 168, the per-thread share of 64K registers
  // at 384 threads (3 consumers: 24 + 3 x 160 = 504 <= 4 x 128 at 512 threads): setmaxnreg
  // needs the totals to match the entry allocation.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumerWarpgroups == 3 ? 160 : 240;
  static_assert(kProducerRegs + kConsumerWarpgroups * kConsumerRegs <=
                (kThreads / 128) * (65536 / kThreads / 8 * 8));

  using TileShapeQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;  // S = Q K^T
  using TileShapePV = Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kBlockN>>;  // O = P V
  // One 64-row wgmma atom per consumer warpgroup, stacked along M.
  using AtomLayout = Layout<Shape<Int<kConsumerWarpgroups>, _1, _1>>;
  // S = Q K^T: both operands from shared memory (Q stays there: register bandwidth, not
  // shared-memory bandwidth, limits this loop). O += P V: P from registers (the converted S
  // accumulator), V from shared memory read "MN-major" (V is stored key-major, D contiguous).
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, TileShapeQK>(), AtomLayout{}));
  // FP8: V^T from the workspace is K-major too (e4m3 wgmma has no MN-major operand).
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, TileShapePV, GMMA::Major::K,
                           kFp8 ? GMMA::Major::K : GMMA::Major::MN>(),
      AtomLayout{}));
  // FP8 with kPvChunk: one chunk of P V (N = kPvChunk), the same A (P) and B (V^T) majors.
  // (fp16/bf16 and kPvChunk 0: a placeholder of N = 8, never used.)
  using TiledMmaPVChunk = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float,
                           Shape<Int<kBlockM>, Int<kPvChunk ? kPvChunk : 8>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::K>(),
      AtomLayout{}));

  // K-major 128-byte swizzle: atoms of 8 rows x 64 elements; TMA writes exactly this pattern.
  // FP8 rows of 64 bytes (d64) take the 64-byte swizzle.
  using SmemAtom = std::conditional_t<
      kFp8 && kHeadDim % 128 != 0, GMMA::Layout_K_SW64_Atom<Element>,
      GMMA::Layout_K_SW128_Atom<Element>>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  // V viewed as (Dv, kBlockN, stage): the B operand of O += P V (no data movement). FP8: V^T
  // stored (Dv, kBlockN) K-major (kBlockN a multiple of 128 bytes), loaded so by TMA.
  using SmemLayoutVtOf16Bit = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{},
                                         Step<_2, _1, _3>{})));
  // (For fp16/bf16 a placeholder shape keeps the unused type well-formed.)
  static constexpr int kVtKeys = kFp8 ? kBlockN : 128;
  // The widest swizzle whose row (128, 64 or 32 bytes) divides kBlockN keys.
  using SmemAtomVt = std::conditional_t<
      kVtKeys % 128 == 0, GMMA::Layout_K_SW128_Atom<Element>,
      std::conditional_t<kVtKeys % 64 == 0, GMMA::Layout_K_SW64_Atom<Element>,
                         GMMA::Layout_K_SW32_Atom<Element>>>;
  using SmemLayoutVtFp8 = decltype(tile_to_shape(
      SmemAtomVt{}, Shape<Int<kHeadDimV>, Int<kVtKeys>, Int<kStages>>{}));
  using SmemLayoutVt = std::conditional_t<kFp8, SmemLayoutVtFp8, SmemLayoutVtOf16Bit>;

  // Global tensors as TMA sees them: (row, dim, head, batch) with the real extents, so rows
  // past the sequence and columns past the real head dim come back as zeros.
  using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)),
                                          GmemShape{}, GmemStride{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaKBlock = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{},
                                           take<0, 2>(SmemLayoutK{}),
                                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  // FP8: the (Dv, key, kv head, 1) view of the workspace's V^T, tiles of Dv x kBlockN.
  using TmaVBlock = std::conditional_t<
      kFp8,
      decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutVtFp8{}),
                             Shape<Int<kHeadDimV>, Int<kVtKeys>>{}, _1{})),
      decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutV{}),
                             Shape<Int<kBlockN>, Int<kHeadDimV>>{}, _1{}))>;

  // Paged: a K (V) stage as kBlockN / kRows boxes of kRows rows, (row, dim, box, stage), over
  // the same swizzled bytes. A box starts at a multiple of 16 rows, so at a multiple of the
  // 8-row (1024-byte) swizzle period: each box is swizzled as a box of its own would be, which
  // is what TMA writes. The descriptors view the page pool as (row in page, dim, head, page),
  // so any page stride works; a page holds whole boxes. Boxes of 16 rows (kPageBoxRows) take
  // any page size that is a multiple of 16; boxes of kPageBoxRowsWide rows (64 where kBlockN
  // is a multiple of 64, else 16 again) the multiples of 64.
  static constexpr int kPageBoxRows = 16;
  static constexpr int kPageBoxRowsWide = kBlockN % 64 == 0 ? 64 : kPageBoxRows;
  static_assert(kBlockN % kPageBoxRows == 0, "whole boxes per key block");
  template <class StageLayout, int kDim, int kRows>
  using BoxesOf = decltype(composition(
      StageLayout{}, make_layout(Shape<Int<kRows>, Int<kDim>, Int<kBlockN / kRows>, Int<kStages>>{},
                                 make_stride(_1{}, Int<kBlockN>{}, Int<kRows>{},
                                             Int<kBlockN * kDim>{}))));
  template <int kRows>
  using SmemLayoutKBoxes = BoxesOf<SmemLayoutK, kHeadDim, kRows>;
  template <int kRows>
  using SmemLayoutVBoxes = BoxesOf<SmemLayoutV, kHeadDimV, kRows>;
  template <int kRows>
  using TmaKBoxes = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{},
                                           take<0, 2>(SmemLayoutKBoxes<kRows>{}),
                                           Shape<Int<kRows>, Int<kHeadDim>>{}, _1{}));
  template <int kRows>
  using TmaVBoxes = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{},
                                           take<0, 2>(SmemLayoutVBoxes<kRows>{}),
                                           Shape<Int<kRows>, Int<kHeadDimV>>{}, _1{}));
  using TmaK = std::conditional_t<kPaged, TmaKBoxes<kPageBoxRows>, TmaKBlock>;
  using TmaV = std::conditional_t<kPaged, TmaVBoxes<kPageBoxRows>, TmaVBlock>;
  // Paged, page sizes that are a multiple of kBlockN: a key block lies inside one page and
  // loads as one box of kBlockN rows (the contiguous box), from the same pool view.
  struct NoTma {};
  using TmaKWholeBlock = std::conditional_t<kPaged, TmaKBlock, NoTma>;
  using TmaVWholeBlock = std::conditional_t<kPaged, TmaVBlock, NoTma>;
  using TmaKWideBox = std::conditional_t<kPaged, TmaKBoxes<kPageBoxRowsWide>, NoTma>;
  using TmaVWideBox = std::conditional_t<kPaged, TmaVBoxes<kPageBoxRowsWide>, NoTma>;

  // Epilogue: each consumer warpgroup writes its 64 x Dv half of O into shared memory and one
  // of its threads stores it with TMA (rows past the sequence and columns past the real head
  // dim are clipped by the descriptor's extents). O needs its own buffer: Q is reloaded for
  // the next tile and the K/V ring keeps streaming while the epilogue runs. At d256 (224 KB)
  // and 192 x 128 (208 KB) the ring leaves no room for one, so O goes through the last key
  // block's K and V stages there (kOInRing below), or from registers (varlen).
  using SmemAtomO = GMMA::Layout_K_SW128_Atom<ElementOut>;
  using SmemLayoutOHalf = decltype(tile_to_shape(SmemAtomO{}, Shape<_64, Int<kHeadDimV>>{}));
  using SmemLayoutO = decltype(tile_to_shape(
      SmemAtomO{}, Shape<_64, Int<kHeadDimV>, Int<kConsumerWarpgroups>>{}));
  using GmemTensorO = decltype(make_tensor(make_gmem_ptr(static_cast<ElementOut*>(nullptr)),
                                           GmemShape{}, GmemStride{}));
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensorO{}, SmemLayoutOHalf{},
                                      Shape<_64, Int<kHeadDimV>>{}, _1{}));

  static constexpr std::uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  // One stage of the K ring and of the V ring (their transaction byte counts).
  static constexpr std::uint32_t kKStageBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr std::uint32_t kVStageBytes = kBlockN * kHeadDimV * sizeof(Element);

  // The V scan of the key blocks the mask cuts (fwd_non_finite_v.hpp): warps 1-3 of the
  // producer warpgroup (one more consumer thread of the V pipeline), one bit per key row of a
  // stage. FP8 (V^T from the pre-pass in the stage): warp 1 reads the pre-pass's NaN key bits
  // instead of scanning.
  static constexpr bool kScanV = true;
  static constexpr int kScanThreads = 96;
  static constexpr int kVKeyWords = (kBlockN + 31) / 32;
  static constexpr int kScanTileSlots = kStages + 1;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  static constexpr int kSmemLimit = 227 * 1024;
  static constexpr int kOBytes = int(cosize_v<SmemLayoutO> * sizeof(ElementOut));
  // FP8 d256 has the room but stores from registers as bf16 d256 does: the TMA path's
  // addresses next to 128 O registers per thread spill.
  static constexpr bool kOBuffer =
      sm90_fwd_smem_bytes(kTile, int(sizeof(Element))) + kOBytes + 1024 <= kSmemLimit &&
      !(kFp8 && kHeadDimV > 128);
  // Where there is no room for an O buffer, O goes through the K/V ring from the head dim
  // FLASHCPP_SM90_FWD_O_IN_RING_MIN_HDIM up (configure-time A/B switch, default 192; 512:
  // never): the consumers keep the last key block's K and V stages past the main loop,
  // warpgroup 0 stages its 64 x Dv half of O in that K stage and warpgroup 1 in that V stage,
  // and both stages go back to the producer once the TMA stores have read them. Q is released
  // after the tile's last S = Q K^T as with an O buffer, so the next tile's Q and first K and V
  // blocks load under the epilogue; only its second key block waits for the stores. Each
  // stage must hold a half of O. Only without ping-pong: the epilogue's barrier of both
  // consumer warpgroups (both done reading the stages) takes the warp-scheduler id.
  // H100, bf16, 16k tokens: d256 against O through Q's buffer (the tenth to twelfth sessions'
  // default, removed since: the next tile's Q loaded only after the store had read O)
  // 0.93-0.95x the time at N 512-1k, 0.97-0.98x at 2k-4k, 0.99-1.01x at 16k; 192 x 128
  // against O from registers 0.87-0.92x non-causal, 0.88-0.98x causal at N 512-8k. Not for
  // varlen: with its register path for the rows past a sequence it spilled 184 B at d256 and
  // ran 0.97-0.98x as fast as O from registers.
#ifndef FLASHCPP_SM90_FWD_O_IN_RING_MIN_HDIM
#define FLASHCPP_SM90_FWD_O_IN_RING_MIN_HDIM 192
#endif
  static constexpr int kOHalfBytes = kOBytes / kConsumerWarpgroups;
  static constexpr bool kOInRing = !kOBuffer && !kFp8 && !kPingPong && !kVarlen &&
                                   int(kKStageBytes) >= kOHalfBytes &&
                                   int(kVStageBytes) >= kOHalfBytes &&
                                   kKStageBytes % 1024 == 0 && kVStageBytes % 1024 == 0 &&
                                   kHeadDim >= FLASHCPP_SM90_FWD_O_IN_RING_MIN_HDIM;
  static_assert(!kOInRing || kConsumerWarpgroups == 2,
                "O in the ring: a K and a V stage, one per consumer warpgroup");
  static constexpr bool kTmaStoreO = kOBuffer || kOInRing;

  struct NoSmemO {};
  struct SmemO {
    alignas(1024) cute::array_aligned<ElementOut, cosize_v<SmemLayoutO>> o;
  };

  struct SharedStorage {
    // 1024-byte alignment: the 128-byte swizzle pattern repeats every 8 rows of 128 B.
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    std::conditional_t<kOBuffer, SmemO, NoSmemO> o;
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
    // Q is loaded once per tile into one buffer: q_full (the TMA transaction barrier) tells
    // the consumers it arrived, q_empty (all consumer threads arrive) tells the producer that
    // the tile's last S = Q K^T has completed and the next tile's Q may overwrite it.
    alignas(8) std::uint64_t q_full;
    alignas(8) std::uint64_t q_empty;
    TileQueueStorage tile_queue;  // the dynamic tile deal (varlen), fwd_tile_scheduler.hpp
    // The V scan of the cut blocks (fwd_non_finite_v.hpp): the producer's ring of tiles (key
    // blocks [begin, end), query block, sequence lengths); per V stage, the scan done (warp 1
    // arrives), whether it found a non-finite value and (valid only then) the key bits; the
    // stage warps 2-3 scan and its first row past the sequence's keys.
    struct ScanTile {
      // FP8: nan_word, the tile's first word of NaN key bits; flagged, set by the scanner
      // when a cut block of the tile has a NaN key.
      int begin, end, m_block, seqlen_q, seqlen_k, nan_word, flagged;
    };
    ScanTile v_scan_tiles[kScanTileSlots];
    alignas(8) std::uint64_t v_scanned[kStages];
    int v_flagged[kStages];
    std::uint32_t v_bad_keys[kStages][kVKeyWords];
    int v_scan_stage, v_scan_tail;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= kSmemLimit, "shared memory over the sm90 limit");
};

}  // namespace flashcpp::detail::cuda::sm90
