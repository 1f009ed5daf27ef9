// Attention step 2: a tiled flash kernel with online softmax, fp32 on the ordinary FMA units.
//
// The unfused step writes the N x N score matrix to global memory and reads it back twice.
// Here a block owns a tile of 64 query rows and walks over K and V in tiles of 32 keys,
// staged in shared memory. For each key tile it computes the 64 x 32 scores in registers,
// turns them into probabilities, and adds probability x V into an output accumulator that
// stays in registers until the end. Global memory sees Q, K, V once per query tile and O
// once: the score matrix never exists.
//
// The difficulty is the softmax: its denominator needs every score of the row, but we see
// the row 32 keys at a time. Online softmax keeps, per row, the maximum m seen so far, the
// sum l of exp(s - m) so far, and the accumulator acc = sum of exp(s - m) * v. When a new
// tile raises the maximum to m', the old terms are all off by the same factor exp(m - m'),
// so l and acc are rescaled by it and the new terms added; at the end O = acc / l.
//
// Threads. Each query row is owned by a team of kTeam = D / 16 neighbouring lanes, each
// holding 16 of the D columns of q and of acc (32 registers), so the registers stay within
// budget even at D = 128. A dot product q . k is 16 multiply-adds per lane and a
// shuffle-reduction across the team (log2(kTeam) rounds); after it every lane of the team
// holds the full score, so each lane can do the softmax bookkeeping for its row itself.
// A lane's 16 columns are 4 float4 chunks interleaved with its team-mates' (lane l owns
// chunks l, l + kTeam, ...): then the team reads kTeam consecutive float4 of a K or V row
// from shared memory, which is free of bank conflicts.
//
// Scores are computed in base 2: q is scaled by scale * log2(e) when it is loaded, and
// exp2 replaces exp (exp(x) = exp2(x * log2(e)), one multiply folded away).
//
// Causal: keys after the block's last query row are never loaded, and the blocks with the
// most key tiles (the last query tiles) are scheduled first so that they do not straggle.
#include <cmath>
#include <cstdint>

#include "cuda/ladder/check.hpp"
#include "cuda/ladder/ladder.hpp"

namespace flashcpp::ladder {
namespace {

constexpr int kQueryRows = 64;  // query rows per block (the query tile)
constexpr int kKeys = 32;       // keys per K/V tile
constexpr int kChunks = 4;      // float4 chunks of q and acc per lane: 16 columns

template <int D>
struct Config {
  static constexpr int kTeam = D / (4 * kChunks);  // lanes per query row: 2, 4 or 8
  static constexpr int kThreads = kQueryRows * kTeam;
  static constexpr int kVecsPerRow = D / 4;
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

template <int D>
__global__ void __launch_bounds__(Config<D>::kThreads) flash_scalar_kernel(Params p) {
  using C = Config<D>;
  __shared__ __align__(16) float k_tile[kKeys][D];
  __shared__ __align__(16) float v_tile[kKeys][D];

  const int n = p.seqlen;
  const size_t head_offset = static_cast<size_t>(blockIdx.y) * n * D;
  const float* q_head = p.q + head_offset;
  const float* k_head = p.k + head_offset;
  const float* v_head = p.v + head_offset;
  float* o_head = p.o + head_offset;

  // Heaviest query tiles first when causal (see the top of the file).
  const int tile = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int row = tile * kQueryRows + threadIdx.x / C::kTeam;  // this thread's query row
  const int lane = threadIdx.x % C::kTeam;                     // its place in the row's team
  const bool row_valid = row < n;

  // This lane's chunks of q, pre-scaled, and of the output accumulator.
  float4 q[kChunks];
  float4 acc[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int col = 4 * (lane + C::kTeam * i);
    q[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row_valid) q[i] = *reinterpret_cast<const float4*>(q_head + static_cast<size_t>(row) * D + col);
    q[i].x *= p.scale_log2;
    q[i].y *= p.scale_log2;
    q[i].z *= p.scale_log2;
    q[i].w *= p.scale_log2;
    acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float m = -INFINITY;  // running max of this row's scores (base-2 units)
  float l = 0.0f;       // running sum of exp2(score - m)

  // Causal: no row of this tile sees keys past its last row.
  const int kv_end = p.causal ? min(n, (tile + 1) * kQueryRows) : n;
  for (int kv0 = 0; kv0 < kv_end; kv0 += kKeys) {
    // ---- stage the K and V tiles in shared memory (zeros past the end) ----
    __syncthreads();  // everyone is done reading the previous tiles
    for (int f = threadIdx.x; f < kKeys * C::kVecsPerRow; f += C::kThreads) {
      const int j = f / C::kVecsPerRow;
      const int col = 4 * (f % C::kVecsPerRow);
      float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      float4 vv = kv;
      if (kv0 + j < n) {
        kv = *reinterpret_cast<const float4*>(k_head + static_cast<size_t>(kv0 + j) * D + col);
        vv = *reinterpret_cast<const float4*>(v_head + static_cast<size_t>(kv0 + j) * D + col);
      }
      *reinterpret_cast<float4*>(&k_tile[j][col]) = kv;
      *reinterpret_cast<float4*>(&v_tile[j][col]) = vv;
    }
    __syncthreads();

    // ---- scores s[j] = q . k_j for the 32 keys, masked to -inf ----
    float s[kKeys];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const float4 kv = *reinterpret_cast<const float4*>(&k_tile[j][4 * (lane + C::kTeam * i)]);
        dot += q[i].x * kv.x + q[i].y * kv.y + q[i].z * kv.z + q[i].w * kv.w;
      }
#pragma unroll
      for (int offset = C::kTeam / 2; offset > 0; offset /= 2) {
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);  // sum over the team's columns
      }
      const int key = kv0 + j;
      const bool visible = key < n && !(p.causal && key > row);
      s[j] = visible ? dot : -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }

    // ---- online softmax: rescale what we have, add this tile ----
    const float m_new = fmaxf(m, tile_max);
    // A row that has seen only masked keys so far still has m_new = -inf; measuring from 0
    // instead keeps exp2(-inf - -inf) = NaN out (every term is exp2(-inf) = 0 then).
    const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
    const float correction = exp2f(m - m_ref);
    l *= correction;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      acc[i].x *= correction;
      acc[i].y *= correction;
      acc[i].z *= correction;
      acc[i].w *= correction;
    }
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      const float prob = exp2f(s[j] - m_ref);
      l += prob;
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const float4 vv = *reinterpret_cast<const float4*>(&v_tile[j][4 * (lane + C::kTeam * i)]);
        acc[i].x += prob * vv.x;
        acc[i].y += prob * vv.y;
        acc[i].z += prob * vv.z;
        acc[i].w += prob * vv.w;
      }
    }
    m = m_new;
  }

  // ---- O = acc / l ----
  if (!row_valid) return;
  const float inv_l = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int col = 4 * (lane + C::kTeam * i);
    *reinterpret_cast<float4*>(o_head + static_cast<size_t>(row) * D + col) =
        make_float4(acc[i].x * inv_l, acc[i].y * inv_l, acc[i].z * inv_l, acc[i].w * inv_l);
  }
}

template <int D>
void launch(const Params& p, int heads, cudaStream_t stream) {
  const dim3 grid(ceil_div(p.seqlen, kQueryRows), heads);
  flash_scalar_kernel<D><<<grid, Config<D>::kThreads, 0, stream>>>(p);
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
  if (heads == 0 || s.seqlen == 0) return;
  const float log2e = 1.4426950408889634f;
  const Params p{q, k, v, o, s.seqlen, log2e / std::sqrt(static_cast<float>(s.head_dim)), s.causal};
  switch (s.head_dim) {
    case 32: launch<32>(p, heads, stream); break;
    case 64: launch<64>(p, heads, stream); break;
    case 128: launch<128>(p, heads, stream); break;
    default:
      throw Error("ladder attention: head_dim must be 32, 64 or 128, got " +
                  std::to_string(s.head_dim));
  }
}

}  // namespace flashcpp::ladder
