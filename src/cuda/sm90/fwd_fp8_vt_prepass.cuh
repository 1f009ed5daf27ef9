#pragma once
// The FP8 forward's pre-pass: V (keys x Dv, Dv contiguous) -> V^T in the workspace (Dv x keys,
// keys contiguous, each 32-key chunk in the P V key order), the layout of fp8_vt_layout.hpp.
// One CTA per (32-key chunk, kv head, sequence): it reads the chunk's 32 rows of V (zeros past
// the sequence's end), and writes Dv rows of 32 bytes. Chunks past the sequence's keys are the
// zero gap after it. Memory-bound: V is read once and written once. Each CTA also writes the
// word of NaN key bits of its 32 keys (every word a forward may read is written, zeros too).
#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/non_finite_rows.hpp"
#include "cuda/common/seqlen_info.hpp"
#include "cuda/sm90/fp8_pv_order.hpp"
#include "cuda/sm90/fp8_vt_layout.hpp"

namespace flashcpp::detail::cuda::sm90 {

inline constexpr int kFp8VtPrepassThreads = 256;

template <int kMaxHeadDimV>
__global__ void __launch_bounds__(kFp8VtPrepassThreads)
    fp8_vt_prepass_kernel(const ForwardParams p, std::uint8_t* vt, std::uint32_t* nan_keys,
                          std::int64_t row_columns, int chunks_per_seq) {
  constexpr int kChunk = kFp8PvChunk;
  static_assert(kChunk == 32, "one word of NaN key bits per chunk");
  __shared__ alignas(16) std::uint8_t rows[kChunk][kMaxHeadDimV + 16];
  __shared__ std::uint32_t warp_nan_keys[kFp8VtPrepassThreads / 32];
  const int chunk = int(blockIdx.x % unsigned(chunks_per_seq));
  const int b = int(blockIdx.x / unsigned(chunks_per_seq));
  const int h = int(blockIdx.y);
  const SeqlenInfo seq(p, b);
  const std::int64_t first_row = seq.row_k + seq.batch_k * p.seqlen_k;
  const int key0 = chunk * kChunk;
  if (key0 >= fp8_vt_seq_columns(seq.seqlen_k)) return;
  const int dv = p.head_dim_v;
  const int tid = int(threadIdx.x);

  // 32 rows of V into shared memory, 16 bytes at a time (bytewise for a ragged Dv tail).
  const auto* v = static_cast<const std::uint8_t*>(p.v) +
                  seq.offset(p.v_stride, seq.batch_k, seq.row_k, h);
  const int pieces = (dv + 15) / 16;
  std::uint32_t my_nan_keys = 0;  // bit r: a piece of row r this thread read holds a NaN
  for (int i = tid; i < kChunk * pieces; i += blockDim.x) {
    const int r = i / pieces, c = (i % pieces) * 16;
    const int key = key0 + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (key < seq.seqlen_k) {
      const std::uint8_t* src = v + std::int64_t(key) * p.v_stride.row + c;
      if (c + 16 <= dv) {
        val = *reinterpret_cast<const uint4*>(src);
      } else {
        std::uint8_t bytes[16] = {};
        for (int j = 0; c + j < dv; ++j) bytes[j] = src[j];
        val = *reinterpret_cast<const uint4*>(bytes);
      }
    }
    if (chunk_has_e4m3_nan(val)) my_nan_keys |= 1u << r;
    *reinterpret_cast<uint4*>(&rows[r][c]) = val;
  }
  my_nan_keys = __reduce_or_sync(0xffffffffu, my_nan_keys);
  if (tid % 32 == 0) warp_nan_keys[tid / 32] = my_nan_keys;
  __syncthreads();
  const std::int64_t column = fp8_vt_seq_start(first_row, b) + key0;
  if (tid == 0) {
    std::uint32_t word = 0;
    for (int w = 0; w < kFp8VtPrepassThreads / 32; ++w) word |= warp_nan_keys[w];
    nan_keys[(std::int64_t(h) * row_columns + column) / 32] = word;
  }

  // Dv rows of 32 bytes: two 16-byte halves per row, slot a holding key fp8_pv_key_of_slot(a).
  std::uint8_t* out = vt + std::int64_t(h) * dv * row_columns + column;
  for (int i = tid; i < dv * 2; i += blockDim.x) {
    const int d = i / 2, half = i % 2;
    std::uint32_t words[4];
    for (int w = 0; w < 4; ++w) {
      std::uint32_t word = 0;
      for (int e = 0; e < 4; ++e)
        word |= std::uint32_t(rows[fp8_pv_key_of_slot(16 * half + 4 * w + e)][d]) << (8 * e);
      words[w] = word;
    }
    *reinterpret_cast<uint4*>(out + std::int64_t(d) * row_columns + 16 * half) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// Writes V^T for every sequence and kv head of the call into `vt` (fp8_vt_bytes(p) bytes), and
// its NaN key bits into `nan_keys` (fp8_v_nan_key_bytes(p)).
template <int kMaxHeadDimV>
void launch_fp8_vt_prepass(const ForwardParams& p, std::uint8_t* vt, std::uint32_t* nan_keys,
                           cudaStream_t stream) {
  const int chunks_per_seq = int(fp8_vt_seq_columns(p.seqlen_k) / kFp8PvChunk);
  const std::int64_t blocks = std::int64_t(chunks_per_seq) * p.batch;
  if (blocks == 0 || p.heads_kv == 0) return;
  const dim3 grid(unsigned(blocks), unsigned(p.heads_kv));
  fp8_vt_prepass_kernel<kMaxHeadDimV><<<grid, kFp8VtPrepassThreads, 0, stream>>>(
      p, vt, nan_keys, fp8_vt_row_columns(p), chunks_per_seq);
  FLASHCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashcpp::detail::cuda::sm90
