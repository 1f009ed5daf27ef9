#pragma once
// NaN and Inf at the hidden pairs of the blocks the mask cuts through, sm80 backward. A hidden
// (query, key) pair has P = dS = 0 there (mask_p_ds and p_ds select them, whatever dP or dsum
// hold), but the products still multiply those zeros by the pair's rows (0 * NaN = 0 * Inf =
// NaN): dV += P^T dO and dK += dS^T Q by the query's dO and Q rows, dQ += dS K by the key's K
// row. So, in the cut blocks only:
//  - main kernel, each step the mask cuts: every thread looks at its share of the Q and dO
//    chunks once they have landed (before the products, where fewer registers are live), and
//    the barrier that publishes P and dS becomes a vote (__syncthreads_or). Almost always
//    nobody found one. Otherwise the rare path zeroes the
//    non-finite chunks and adds 0 * dS to P in shared memory: a row whose dO was zeroed has a
//    non-finite dsum, hence a non-finite dS at the pairs it sees, so dV of those keys stays
//    NaN (a non-finite q row needs nothing: its lse is NaN, so are its visible P);
//  - main kernel, once, when some step is cut: K's NaN chunks are zeroed before the loop
//    (a row that sees such a key has a NaN lse, so the zeroed key changes nothing it sees),
//    and a vote says whether K still holds Inf. Inf stays in shared memory (zeroing it would
//    give a row whose score is -Inf there, weight 0, a wrong finite P); when the vote said
//    yes (rare), the dQ += dS K of the cut steps reads K's Inf as 0 in its B fragments
//    (warp_gemm's kFiniteB), so a hidden pair's dS = 0 adds 0; so does a visible pair's:
//    its dS is 0 too where the row's lse is finite (score -Inf), and NaN where it is not;
//  - deterministic dQ kernel, each key block the mask cuts: K's NaN and Inf chunks are
//    zeroed after S, before dQ += dS K.
// So a key with an Inf k adds 0 to dq of every row of the cut blocks, softcap or not (S saw
// the true K); so does sm90a (docs/semantics.md).
#include <cstdint>
#include <type_traits>

#include "cuda/common/non_finite_rows.hpp"

namespace flashcpp::detail::cuda::sm80::bwd {

// The 16-byte chunks of a kRows x kCols shared matrix (element offsets Mat::offset(r, c), or
// r * kLd + c when Mat is void), split over kThreads threads: thread t takes t, t + kThreads...
template <class Mat, int kRows, int kCols, int kThreads, int kLd = 0>
struct OwnChunks {
  static constexpr int kChunks = kRows * kCols / 8;
  __device__ __forceinline__ static int offset(int i) {
    const int r = i / (kCols / 8), c = i % (kCols / 8) * 8;
    if constexpr (std::is_void_v<Mat>)
      return r * kLd + c;
    else
      return Mat::offset(r, c);
  }
  template <bool kNanOnly, class Element>
  __device__ __forceinline__ static bool bad(uint4 c) {
    return kNanOnly ? chunk_has_nan<Element>(c) : chunk_non_finite<Element>(c);
  }
  // Whether one of this thread's chunks is bad (one load at a time: this runs with dK and dV
  // live, and more spilled at d128).
  template <bool kNanOnly, class Element>
  __device__ __forceinline__ static bool any(const Element* m) {
    bool hit = false;
#pragma unroll 1
    for (int i = int(threadIdx.x); i < kChunks; i += kThreads)
      hit |= bad<kNanOnly, Element>(*reinterpret_cast<const uint4*>(m + offset(i)));
    return hit;
  }
  // Zeroes this thread's bad chunks.
  template <bool kNanOnly, class Element>
  __device__ __forceinline__ static void zero(Element* m) {
#pragma unroll 1
    for (int i = int(threadIdx.x); i < kChunks; i += kThreads) {
      uint4* const chunk = reinterpret_cast<uint4*>(m + offset(i));
      if (bad<kNanOnly, Element>(*chunk)) *chunk = make_uint4(0, 0, 0, 0);
    }
  }
};

// The main kernel's rare path of a cut step (every thread, after the vote said yes): zeroes
// the non-finite chunks of Q and dO, adds 0 * dS to P, then a barrier: the products may read.
template <class Tr, class Element>
__device__ void clean_cut_step(Element* sQ, Element* sdO, Element* sP, const Element* sdS) {
  using QChunks = OwnChunks<typename Tr::QTile, Tr::kBlockM, Tr::kHeadDim, Tr::kThreads>;
  QChunks::template zero<false>(sQ);
  QChunks::template zero<false>(sdO);
  using PTile = typename Tr::PTile;
#pragma unroll 1
  for (int i = int(threadIdx.x); i < Tr::kBlockM * Tr::kBlockN; i += Tr::kThreads) {
    const int o = PTile::offset(i / Tr::kBlockN, i % Tr::kBlockN);
    sP[o] = Element(float(sP[o]) + 0.f * float(sdS[o]));
  }
  __syncthreads();
}

}  // namespace flashcpp::detail::cuda::sm80::bwd
