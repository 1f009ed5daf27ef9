#pragma once
// Where the sm80 backward's main kernel adds dQ into the fp32 dq_accum workspace
// ([B, Hq, Nq, head_dim]) and where the post-pass reads it back.
//
// A whole query block (its kBlockM rows inside the sequence, the head dim the instantiated one)
// keeps its kBlockM x kHeadDim floats where its rows are, but in fragment order: value v of
// lane l of warp w in dQ column chunk c sits at ((c * kWarps + w) * kDqVals + v) * 32 + l from
// the block's first float. One atomicAdd instruction of a warp then covers 32 consecutive
// floats, one 128-byte line, where the row-major order spreads it over 8 rows (8 lines, 8 L2
// requests). FlashAttention-2 stores its dQ accumulator the same way.
// The last block of a sequence when it is cut short, and a zero-padded head dim, stay
// row-major (the post-pass reads each block the way the main kernel wrote it).
namespace flashcpp::detail::cuda::sm80::bwd {

template <class Tr>
struct DqAccumBlock {
  static_assert(Tr::kDqChunks * Tr::kWarps * Tr::kDqVals * 32 == Tr::kBlockM * Tr::kHeadDim,
                "the lanes' values fill the block exactly once");
  // The block of query rows [m0, m0 + kBlockM) of a sequence of sq rows is in fragment order.
  __device__ __forceinline__ static bool fragment_order(int head_dim, int m0, int sq) {
    return head_dim == Tr::kHeadDim && m0 + Tr::kBlockM <= sq;
  }
  // Offset of this lane's value 0 of chunk `chunk` from the block's first float; value v is
  // v * 32 further.
  __device__ __forceinline__ static int lane_offset(int warp, int lane, int chunk) {
    return (chunk * Tr::kWarps + warp) * Tr::kDqVals * 32 + lane;
  }
  // Index of accumulator acc_dq[mt][nt][2 h + e2] of a chunk among the lane's kDqVals values.
  static constexpr int value(int mt, int h, int nt, int e2) {
    return ((mt * 2 + h) * Tr::kDqChunkNT + nt) * 2 + e2;
  }
};

}  // namespace flashcpp::detail::cuda::sm80::bwd
