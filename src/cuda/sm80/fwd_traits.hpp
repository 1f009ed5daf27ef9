#pragma once
// Compile-time description of one sm80 forward instantiation: the tile (row kTileIndex of the
// tile table), the mma.sync tiled MMA, swizzled shared-memory layouts and the copy atoms.
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/sm80/fwd_tile_table.hpp"

namespace flashcpp::detail::cuda::sm80 {

using namespace cute;

template <class Element_, int kTileIndex>
struct FwdTraits {
  using Element = Element_;
  static_assert(kTileIndex >= 0 && kTileIndex < kSm80FwdTileCount);
  static constexpr Sm80FwdTile kTile = kSm80FwdTiles[kTileIndex];
  static constexpr int kHeadDim = kTile.head_dim;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kNWarps = kTile.warps;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kKVStages = kTile.kv_stages;
  static_assert(kKVStages == 1 || kKVStages == 2);
  static constexpr int kWarpsN = kTile.warps_n;  // 2: warp pairs (fwd_tile_table.hpp)
  static constexpr int kWarpsM = kNWarps / kWarpsN;
  static_assert(kWarpsN == 1 || kWarpsN == 2);
  static_assert(kBlockM % (16 * kWarpsM) == 0);
  // A warp skips the masked key blocks none of its rows sees (fwd_mainloop.hpp): d256 only,
  // which keeps 0 spills with it. It raised the spills (sm_90, stores/loads, no softcap /
  // softcap) at d128 from 40/60 / 100/100 B to 112/96 / 180/144 B and at d192 (128x64 kv2)
  // from 0/0 / 0/0 B to 8/16 / 32/32 B.
  static constexpr bool kSkipUnseen = kHeadDim >= 256 && kWarpsN == 1;

  // m16n8k16 with fp32 accumulation; warps stacked along M (each owns whole rows, so row
  // statistics never cross warps). The 16-wide N tile pairs two n8 atoms so that one
  // ldmatrix.x4 feeds a whole B k16 x n16 block.
  using MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                     SM80_16x8x16_F32F16F16F32_TN, SM80_16x8x16_F32BF16BF16F32_TN>;
  // Warp pairs: warp w owns the rows of w % kWarpsM and half w / kWarpsM of the N extent,
  // [n * N/2, n * N/2 + N/2) (the permutation turns the atoms' 8-column interleave into
  // halves): the keys of S (TiledMmaS, N = kBlockN) and the head dim of O (TiledMmaO).
  template <int N>
  using HalvesN = std::conditional_t<kWarpsN == 1, _16,
                                     Layout<Shape<_8, _2, Int<N / 16>>, Stride<_1, Int<N / 2>, _8>>>;
  using TiledMmaS = TiledMMA<MMA_Atom<MmaAtom>, Layout<Shape<Int<kWarpsM>, Int<kWarpsN>, _1>>,
                             Tile<Int<16 * kWarpsM>, HalvesN<kBlockN>, _16>>;
  using TiledMmaO = TiledMMA<MMA_Atom<MmaAtom>, Layout<Shape<Int<kWarpsM>, Int<kWarpsN>, _1>>,
                             Tile<Int<16 * kWarpsM>, HalvesN<kHeadDim>, _16>>;
  // The swap area of a warp pair's warp (after Q and the K/V buffers): per lane its row
  // statistics (kPairRows floats), then its half of P (kPairPWords 16-byte words).
  static constexpr int kPairRows = kBlockM / kWarpsM / 8;
  static constexpr int kPairPWords = kBlockM / kWarpsM * (kBlockN / 2) * int(sizeof(Element)) / 32 / 16;
  static_assert(kWarpsN == 1 || kPairRows == 4, "the row statistics are swapped as one float4");

  // Shared memory rows of 64 elements (128 B) with a 3-bit XOR swizzle of 16-byte chunks:
  // the 8 rows an ldmatrix phase reads land in 8 different bank groups. d96 does not tile
  // by 64, so it uses 32-element rows with a 2-bit swizzle.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kBlockKSmem == 64 ? 3 : 2;
  using SmemLayoutAtom = decltype(composition(
      Swizzle<kSwizzleBits, 3, 3>{},
      Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V read as the B operand of O += P V needs (head dim, key) order: the same bytes viewed
  // transposed, loaded with ldmatrix.trans.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomO = Copy_Atom<UniversalCopy<uint32_t>, Element>;  // 2 accumulator cols

  // Global <-> shared: 16-byte vectors, kBlockKSmem/8 threads per row so a warp reads whole
  // 128-byte lines. cp.async.cg bypasses L1 (K/V are streamed once per CTA).
  static constexpr int kElemsPerVec = 16 / sizeof(Element);
  static constexpr int kThreadsPerRow = kBlockKSmem / kElemsPerVec;
  using GmemThreadLayout = Layout<Shape<Int<kNThreads / kThreadsPerRow>, Int<kThreadsPerRow>>,
                                  Stride<Int<kThreadsPerRow>, _1>>;
  using GmemTiledCopyQKV = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{}, GmemThreadLayout{},
      Layout<Shape<_1, Int<kElemsPerVec>>>{}));
  using GmemTiledCopyO = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{}, GmemThreadLayout{},
      Layout<Shape<_1, Int<kElemsPerVec>>>{}));

  static constexpr int kSmemBytes = sm80_fwd_smem_bytes(kTile, int(sizeof(Element)));
  static_assert(kBlockM % (kNThreads / kThreadsPerRow) == 0);
  static_assert(kBlockN % (kNThreads / kThreadsPerRow) == 0);
};

}  // namespace flashcpp::detail::cuda::sm80
