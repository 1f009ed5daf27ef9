#pragma once
// Compile-time shape of one main-kernel tile of the sm80 backward (a row of kSm80BwdTiles):
// the warp grids of its five products and its shared-memory carve-up.
#include <type_traits>

#include <cutlass/numeric_types.h>

#include "cuda/sm80/bwd_tile_table.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

// A kRows x kCols row-major matrix of 2-byte elements in shared memory. Rows of a multiple of
// 64 elements XOR their 16-byte chunk index with (row & 7); other rows are padded by 8
// elements. Either way the 8 row addresses of an ldmatrix phase (8 consecutive rows, one
// chunk column) and the 8 rows a warp's accumulator stores touch hit 8 different bank groups,
// and a 16-byte chunk stays contiguous (cp.async and ldmatrix move whole chunks).
template <int kRows, int kCols>
struct SmemMatrix {
  static constexpr int kLd = sm80_bwd_smem_row_elems(kCols);
  static constexpr bool kSwizzled = kLd == kCols;
  static constexpr int kElems = kRows * kLd;
  static_assert(kCols % 8 == 0, "whole 16-byte chunks");
  static_assert(!kSwizzled || kCols % 64 == 0, "the swizzle permutes groups of 8 chunks");

  __device__ __forceinline__ static int offset(int r, int c) {
    if constexpr (kSwizzled)
      return r * kLd + ((((c >> 3) ^ (r & 7)) << 3) | (c & 7));
    else
      return r * kLd + c;
  }
};

template <class Element_, int kTileIndex>
struct BwdMainTraits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                std::is_same_v<Element, cutlass::bfloat16_t>);
  static_assert(kTileIndex >= 0 && kTileIndex < kSm80BwdTileCount);
  static constexpr Sm80BwdTile kTile = kSm80BwdTiles[kTileIndex];
  static constexpr int kHeadDim = kTile.head_dim;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kQStages = kTile.q_stages;
  static constexpr int kDoStages = kTile.do_stages;
  static_assert(kQStages == 1 || kQStages == 2);
  static_assert(kDoStages == 1 || kDoStages == 2);

  // Every product's warp tile is MT m16 rows x NT n8 columns; NT is even because one
  // ldmatrix.x4 feeds two n8 columns of B.
  // S, dP: block_m x block_n.
  static constexpr int kSdpWarpsM = kTile.sdp_warps_m;
  static constexpr int kSdpWarpsN = kWarps / kSdpWarpsM;
  static_assert(kSdpWarpsM * kSdpWarpsN == kWarps);
  static constexpr int kSdpRows = kBlockM / kSdpWarpsM, kSdpCols = kBlockN / kSdpWarpsN;
  static_assert(kSdpRows % 16 == 0 && kSdpCols % 16 == 0);
  static constexpr int kSdpMT = kSdpRows / 16, kSdpNT = kSdpCols / 8;
  // dK, dV: block_n x head_dim, reduced over block_m.
  static constexpr int kDkvWarpsN = kTile.dkv_warps_n;
  static constexpr int kDkvWarpsD = kWarps / kDkvWarpsN;
  static_assert(kDkvWarpsN * kDkvWarpsD == kWarps);
  static constexpr int kDkvRows = kBlockN / kDkvWarpsN, kDkvCols = kHeadDim / kDkvWarpsD;
  static_assert(kDkvRows % 16 == 0 && kDkvCols % 16 == 0);
  static constexpr int kDkvMT = kDkvRows / 16, kDkvNT = kDkvCols / 8;
  // dQ: block_m x head_dim, reduced over block_n, in column chunks of at most 8 n8 tiles
  // (its accumulators live next to dK and dV).
  static constexpr int kDqWarpsM = kTile.dq_warps_m;
  static constexpr int kDqWarpsD = kWarps / kDqWarpsM;
  static_assert(kDqWarpsM * kDqWarpsD == kWarps);
  static constexpr int kDqRows = kBlockM / kDqWarpsM, kDqCols = kHeadDim / kDqWarpsD;
  static_assert(kDqRows % 16 == 0 && kDqCols % 16 == 0);
  static constexpr int kDqMT = kDqRows / 16, kDqNT = kDqCols / 8;
  static constexpr int kDqChunkNT = kDqNT % 8 == 0 ? 8 : kDqNT % 6 == 0 ? 6 : kDqNT % 4 == 0 ? 4 : 2;
  static_assert(kDqNT % kDqChunkNT == 0 && kDqChunkNT % 2 == 0);
  static constexpr int kDqChunks = kDqNT / kDqChunkNT;
  static constexpr int kDqVals = kDqMT * kDqChunkNT * 4;  // a lane's dQ values per chunk

  // Shared memory, in elements: Q[kQStages] | dO[kDoStages] | K | V | P | dS.
  using QTile = SmemMatrix<kBlockM, kHeadDim>;   // Q and dO
  using KTile = SmemMatrix<kBlockN, kHeadDim>;   // K and V
  using PTile = SmemMatrix<kBlockM, kBlockN>;    // P and dS (queries x keys)
  static constexpr int kOffQ = 0;
  static constexpr int kOffDO = kOffQ + kQStages * QTile::kElems;
  static constexpr int kOffK = kOffDO + kDoStages * QTile::kElems;
  static constexpr int kOffV = kOffK + KTile::kElems;
  static constexpr int kOffP = kOffV + KTile::kElems;
  static constexpr int kOffDS = kOffP + PTile::kElems;
  static constexpr int kSmemElems = kOffDS + PTile::kElems;
  static constexpr int kSmemBytes = kSmemElems * int(sizeof(Element));
  static_assert(kSmemBytes == sm80_bwd_smem_bytes(kTile), "the host's count is this carve-up");
  static_assert(QTile::kElems % 64 == 0 && KTile::kElems % 64 == 0 && PTile::kElems % 64 == 0,
                "every buffer starts 128-byte aligned");

  // Global -> shared loads move 16-byte chunks (8 elements); whole passes of the CTA.
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static_assert((kBlockM * kChunksPerRow) % kThreads == 0, "Q/dO chunks divide over threads");
  static_assert((kBlockN * kChunksPerRow) % kThreads == 0, "K/V chunks divide over threads");
};

}  // namespace flashcpp::detail::cuda::sm80::bwd
