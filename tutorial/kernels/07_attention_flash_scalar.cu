// Attention step 2: a tiled flash kernel with online softmax, fp32 on the ordinary FMA units.
//
// The unfused step writes the N x N score matrix to global memory and reads it back twice.
// Here one block owns a tile of 64 query rows and walks over K and V in tiles of 64 keys:
//
//   for each key tile:
//     S = Q_tile K_tile^T          64 x 64 scores, in registers (4 x 4 per thread)
//     online softmax on S          running max and sum per row, P = exp(S - max)
//     O_acc = O_acc * rescale + P V_tile
//   O = O_acc / sum
//
// Both products are register-blocked exactly like matmul step 2 (02_matmul_tiled.cu): the
// operands sit in shared memory laid out so that a thread reads 4 consecutive values as one
// float4, and each thread turns 2 float4 loads into 16 multiply-adds. Only P makes a trip
// through shared memory (64 x 64 floats), because the thread that computes a score is not
// the one that needs it for P V. Global memory sees Q once, K and V once per query tile, and
// O once: the score matrix never exists.
//
// Online softmax. The denominator of a row needs all its scores, but we see them 64 at a
// time. Each row keeps its running maximum m and, per thread, the partial sum l of
// exp(s - m) over the keys that thread has seen; the accumulator holds sum exp(s - m) * v.
// When a key tile raises the maximum to m', every term so far is off by the same factor
// exp(m - m'), so l and the accumulator are multiplied by it before the new terms are
// added. The partial sums are added across the row's threads once, at the end.
//
// Threads: 256 = 16 x 16, thread (ty, tx) owns query rows 4ty..4ty+3; of S it computes keys
// 4tx..4tx+3 and of O the columns tx * D/16 onwards. The 16 threads of a row group are 16
// neighbouring lanes of one warp, so row maxima and sums are warp shuffles.
//
// Scores are computed in base 2: Q is multiplied by scale * log2(e) when it is staged, and
// exp2 replaces exp (exp(x) = exp2(x * log2(e))).
//
// Causal: key tiles after the block's last query row are never visited, and the blocks with
// the most key tiles (the last query tiles) are scheduled first so they do not straggle.
#include <cmath>
#include <cstdint>

#include "kernels/check.hpp"
#include "kernels/ladder.hpp"

namespace flashcpp::ladder {
namespace {

constexpr int kRows = 64;      // query rows per block
constexpr int kKeys = 64;      // keys per K/V tile
constexpr int kThreads = 256;  // 16 x 16
constexpr int kPad = 4;        // padding of the transposed tiles (keeps float4 alignment)

// Shared-memory layout, in floats. Q and K are stored transposed ([d][row], [d][key]) so the
// S product reads 4 rows or 4 keys of one d as a float4; P is [row][key], V is [key][d].
template <int D>
struct Smem {
  static constexpr int kQ = 0;                             // q_t[D][kRows + kPad]
  static constexpr int kK = kQ + D * (kRows + kPad);       // k_t[D][kKeys + kPad]
  static constexpr int kV = kK + D * (kKeys + kPad);       // v[kKeys][D]
  static constexpr int kP = kV + kKeys * D;                // p[kRows][kKeys + kPad]
  static constexpr int kFloats = kP + kRows * (kKeys + kPad);
  static constexpr size_t kBytes = kFloats * sizeof(float);
};

struct Params {
  const float* q;
  const float* k;
  const float* v;
  float* o;
  int seqlen;
  float scale_log2;  // softmax scale * log2(e)
  bool causal;
};

constexpr unsigned kFullMask = 0xffffffffu;

// Max / sum over the 16 lanes of a row group (lane bits 0..3 are tx).
__device__ inline float group_max(float v) {
  for (int offset = 8; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}
__device__ inline float group_sum(float v) {
  for (int offset = 8; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Copies rows [row0, row0 + kTile) of a [N, D] matrix into a transposed tile t[d][row]
// (row stride kTile + kPad), multiplied by `scale`; rows past N become 0. Consecutive threads
// take consecutive rows: their global reads are 16 bytes from different rows (half of each
// 32-byte sector unused, a small cost next to the arithmetic on the tile), and in exchange
// the four scalar stores of each float4 land in 32 different banks.
template <int D, int kTile>
__device__ void stage_transposed(float* t, const float* src, int row0, int n, float scale) {
  for (int f = threadIdx.x; f < kTile * (D / 4); f += kThreads) {
    const int r = f % kTile;
    const int d = 4 * (f / kTile);
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row0 + r < n) x = *reinterpret_cast<const float4*>(src + static_cast<size_t>(row0 + r) * D + d);
    t[(d + 0) * (kTile + kPad) + r] = x.x * scale;
    t[(d + 1) * (kTile + kPad) + r] = x.y * scale;
    t[(d + 2) * (kTile + kPad) + r] = x.z * scale;
    t[(d + 3) * (kTile + kPad) + r] = x.w * scale;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) flash_scalar_kernel(Params p) {
  constexpr int kCols = D / 16;  // output columns per thread: 2, 4 or 8
  using L = Smem<D>;
  extern __shared__ __align__(16) float smem[];
  float* q_t = smem + L::kQ;
  float* k_t = smem + L::kK;
  float* v_s = smem + L::kV;
  float* p_s = smem + L::kP;

  const int n = p.seqlen;
  const size_t head_offset = static_cast<size_t>(blockIdx.y) * n * D;
  const int tile = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // heaviest first
  const int q0 = tile * kRows;
  const int tx = threadIdx.x % 16;
  const int ty = threadIdx.x / 16;

  stage_transposed<D, kRows>(q_t, p.q + head_offset, q0, n, p.scale_log2);

  float acc[4][kCols] = {};  // O rows 4ty+i, columns tx*kCols+c
  float m[4], l[4];          // running max (base 2) and this thread's partial sum, per row
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }

  const int kv_end = p.causal ? min(n, q0 + kRows) : n;
  for (int kv0 = 0; kv0 < kv_end; kv0 += kKeys) {
    __syncthreads();  // the previous tile's K, V and P are no longer read
    stage_transposed<D, kKeys>(k_t, p.k + head_offset, kv0, n, 1.0f);
    for (int f = threadIdx.x; f < kKeys * (D / 4); f += kThreads) {
      const int j = f / (D / 4);
      const int d = 4 * (f % (D / 4));
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (kv0 + j < n) x = *reinterpret_cast<const float4*>(p.v + head_offset + static_cast<size_t>(kv0 + j) * D + d);
      *reinterpret_cast<float4*>(&v_s[j * D + d]) = x;
    }
    __syncthreads();

    // ---- S = Q K^T for rows 4ty+i, keys 4tx+j (already in base-2 units) ----
    float s[4][4] = {};
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
      const float4 qv = *reinterpret_cast<const float4*>(&q_t[d * (kRows + kPad) + ty * 4]);
      const float4 kv = *reinterpret_cast<const float4*>(&k_t[d * (kKeys + kPad) + tx * 4]);
      const float qr[4] = {qv.x, qv.y, qv.z, qv.w};
      const float kr[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] += qr[i] * kr[j];
      }
    }

    // ---- online softmax, row by row ----
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = q0 + ty * 4 + i;
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = kv0 + tx * 4 + j;
        if (key >= n || (p.causal && key > row)) s[i][j] = -INFINITY;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      const float m_new = fmaxf(m[i], group_max(tile_max));
      // A row that has seen only masked keys still has m_new = -inf; measuring from 0 then
      // keeps exp2(-inf - -inf) = NaN out (every term is exp2(-inf) = 0).
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
      const float correction = exp2f(m[i] - m_ref);
      m[i] = m_new;
      l[i] *= correction;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[i][c] *= correction;
      float4 probs;
      probs.x = exp2f(s[i][0] - m_ref);
      probs.y = exp2f(s[i][1] - m_ref);
      probs.z = exp2f(s[i][2] - m_ref);
      probs.w = exp2f(s[i][3] - m_ref);
      l[i] += (probs.x + probs.y) + (probs.z + probs.w);
      *reinterpret_cast<float4*>(&p_s[(ty * 4 + i) * (kKeys + kPad) + tx * 4]) = probs;
    }
    __syncthreads();  // P complete

    // ---- O_acc += P V: rows 4ty+i, columns tx*kCols+c, 4 keys per step ----
#pragma unroll 2
    for (int j0 = 0; j0 < kKeys; j0 += 4) {
      float pr[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 pv = *reinterpret_cast<const float4*>(&p_s[(ty * 4 + i) * (kKeys + kPad) + j0]);
        pr[i][0] = pv.x;
        pr[i][1] = pv.y;
        pr[i][2] = pv.z;
        pr[i][3] = pv.w;
      }
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        float vr[kCols];
#pragma unroll
        for (int c = 0; c < kCols; ++c) vr[c] = v_s[(j0 + jj) * D + tx * kCols + c];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int c = 0; c < kCols; ++c) acc[i][c] += pr[i][jj] * vr[c];
        }
      }
    }
  }

  // ---- O = acc / l, with l summed over the row's 16 threads ----
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float inv_l = 1.0f / group_sum(l[i]);
    const int row = q0 + ty * 4 + i;
    if (row >= n) continue;
    float* out = p.o + head_offset + static_cast<size_t>(row) * D + tx * kCols;
#pragma unroll
    for (int c = 0; c < kCols; ++c) out[c] = acc[i][c] * inv_l;
  }
}

template <int D>
void launch(const Params& p, int heads, cudaStream_t stream) {
  // More than 48 KiB of shared memory per block must be asked for explicitly.
  check_cuda(cudaFuncSetAttribute(flash_scalar_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(Smem<D>::kBytes)),
             "cudaFuncSetAttribute(flash_scalar_kernel)");
  const dim3 grid(ceil_div(p.seqlen, kRows), heads);
  flash_scalar_kernel<D><<<grid, kThreads, Smem<D>::kBytes, stream>>>(p);
  check_launch("flash_scalar_kernel");
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

void attention_flash_scalar(const float* q, const float* k, const float* v, float* o,
                            const AttentionShape& s, cudaStream_t stream) {
  if (s.batch < 0 || s.heads < 0 || s.seqlen < 0) throw Error("ladder attention: negative size");
  if (s.batch * s.heads > 65535) throw Error("ladder attention: batch * heads must be <= 65535");
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(o)) {
    throw Error("ladder attention: q, k, v and o must be 16-byte aligned");
  }
  const int heads = s.batch * s.heads;
  const float log2e = 1.4426950408889634f;
  const Params p{q, k, v, o, s.seqlen, log2e / std::sqrt(static_cast<float>(s.head_dim)), s.causal};
  switch (s.head_dim) {
    case 32: if (heads > 0 && s.seqlen > 0) launch<32>(p, heads, stream); break;
    case 64: if (heads > 0 && s.seqlen > 0) launch<64>(p, heads, stream); break;
    case 128: if (heads > 0 && s.seqlen > 0) launch<128>(p, heads, stream); break;
    default:
      throw Error("ladder attention: head_dim must be 32, 64 or 128, got " +
                  std::to_string(s.head_dim));
  }
}

}  // namespace flashcpp::ladder
