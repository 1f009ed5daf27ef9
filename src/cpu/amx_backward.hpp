#pragma once
// The bf16 backward's work on one (query block, key block) pair on AMX tiles: the five block
// products (S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q, dQ += dS K) as tile
// products, the softmax gradient on AVX-512 in between. tiled_backward.cpp walks the pairs
// (fused tasks or two passes) as it does for its fp32 block products; docs/design/cpu_kernels.md
// has the layout and the measurements.
#include <cstdint>
#include <vector>

#include "common/params.hpp"
#include "cpu/aligned_vector.hpp"
#include "cpu/block_mask.hpp"
#include "cpu/sequence.hpp"

namespace flashcpp::detail::cpu {

// bf16, D and Dv multiples of 32, no softcap, and the AMX forward usable on this CPU (the same
// run-time check and FLASHCPP_CPU_KERNEL choice).
bool amx_backward_usable(const BackwardParams& params);

// One thread's buffers and steps. Use inside a TileScope (amx_tiles.hpp). Memory:
// 2 * (3 * 64 * (D + Dv) + 128 * (2 * D + Dv) + 6 * 64 * 128) + 4 * 2 * 64 * 128 bytes,
// 0.34 MiB at D = Dv = 128, plus 2 * D * cached_keys (rounded up to 128).
class AmxBackwardBlocks {
 public:
  static constexpr int kRows = 64;   // query rows per block
  static constexpr int kKeys = 128;  // keys per block

  // `cached_keys`: room for the packed K of a sequence that long (cache_keys), else 0.
  AmxBackwardBlocks(int head_dim, int head_dim_v, std::int64_t cached_keys);

  // Packs K of all keys of `kv_head` (at most cached_keys) once, for the load_keys calls that
  // follow until the next cache_keys: the fused walk meets each key block once per query block.
  void cache_keys(const BackwardParams& p, const Sequence& seq, int kv_head);

  // Query rows [r0, r0 + rows) of `head` (rows <= kRows), with their lse (log2 units) and
  // D = rowsum(dO * O).
  void load_queries(const BackwardParams& p, const Sequence& seq, int head, std::int64_t r0,
                    int rows, const float* lse_log2, const float* delta);
  // Keys [c0, c0 + cols) of `kv_head` (cols <= kKeys).
  void load_keys(const BackwardParams& p, const Sequence& seq, int kv_head, std::int64_t c0,
                 int cols);
  // P and dS (times `scale`) of the loaded rows against the loaded keys; `alpha` is
  // scale * log2(e), the scores' factor into the lse's units. Hidden pairs get exactly 0.
  void gradients(const BlockMask& mask, float alpha, float scale);
  // dV[j] += sum_i P[i][j] dO[i], dK[j] += sum_i dS[i][j] Q[i] for the loaded keys: rows of
  // Dv and D floats; both hold kKeys rows (those past the block are scratch).
  void add_dv_dk(float* dv, float* dk);
  // dQ[i] += sum_j dS[i][j] K[j]: kRows rows of D floats.
  void add_dq(float* dq);

 private:
  int d_, dv_;
  std::int64_t r0_ = 0, c0_ = 0;
  int rows_ = 0, cols_ = 0;
  bool q_finite_ = true, dout_finite_ = true, k_finite_ = true, full_ = true;
  AlignedVector<std::uint16_t> q_, dout_;            // [kRows][D], [kRows][Dv], zero padded
  AlignedVector<std::uint16_t> q_t_, dout_t_;        // Q^T, dO^T as tile B
  AlignedVector<std::uint16_t> q_b_, dout_b_;        // Q, dO as tile B
  AlignedVector<std::uint16_t> k_, v_;               // [kKeys][D], [kKeys][Dv], zero padded
  const std::uint16_t* k_rows_ = nullptr;          // the block's K rows: in place or k_
  const std::uint16_t* v_rows_ = nullptr;
  std::int64_t ldk_ = 0, ldv_ = 0;
  AlignedVector<std::uint16_t> k_b_;                 // K as tile B
  AlignedVector<std::uint16_t> k_cache_;             // K as tile B, per key block of a sequence
  std::vector<char> k_cache_finite_;               // per cached block
  bool cached_ = false;
  const std::uint16_t* k_b_block_ = nullptr;       // the loaded block's: k_b_ or in k_cache_
  AlignedVector<float> lse_, delta_;                 // [kRows]
  AlignedVector<std::int32_t> seen_begin_, seen_end_;  // per row: visible keys of the block
  AlignedVector<float> st_, dst_;                    // S^T, then dP^T and dS^T: [kKeys][kRows]
  // P^T, dS^T ([kKeys][kRows]) and dS ([kRows][kKeys]) as bf16 high parts, then low parts
  AlignedVector<std::uint16_t> pt_parts_, dst_parts_, ds_parts_;
};

}  // namespace flashcpp::detail::cpu
