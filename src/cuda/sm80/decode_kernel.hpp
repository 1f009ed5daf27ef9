#pragma once
// The KV-cache decode kernel (sm80 mma.sync; runs on sm80 and newer). One CTA per (sequence,
// kv head, split, 16-row tile), where a row is a (new token, query head of the group) pair:
// GQA's query heads share every K/V load, and the rows are token-major so the bottom-right
// causal rule still sees token order.
//   scheduler  blockIdx: x = batch * Hkv + kv head, y = split, z = row tile; a split owns an
//              equal share of the key blocks its rows see, from the sequence's real length
//              (read on the device, never planned from it);
//   mainloop   K/V blocks of block_n keys stream through `stages` cp.async buffers (zero-filled
//              past the length, on unused pages and in the head-dim padding, so no garbage is
//              ever multiplied); each warp takes 16 keys of a block: S = Q K^T and
//              O += P V on mma.sync m16n8k16, with its own online softmax;
//   epilogue   the warps' (max, sum, O) are merged through shared memory; O and lse go to
//              the output, or, split, to the workspace for the combine kernel.
// An fp8 (e4m3) cache (Cache = std::uint8_t, q and out bf16) streams its bytes the same way and
// turns them into f16 operands in registers (decode_fp8_fragments.hpp), q scaled into f16's
// range once per CTA; its descales and q's scale scale the scores and the output in fp32.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/mask.hpp"
#include "cuda/common/dependent_launch.hpp"
#include "cuda/common/fast_exp2.hpp"
#include "cuda/common/fragment_utils.hpp"
#include "cuda/common/kvcache_kernel_params.hpp"
#include "cuda/common/kvcache_layout.hpp"
#include "cuda/common/non_finite_rows.hpp"
#include "cuda/sm80/decode_fp8_fragments.hpp"
#include "cuda/sm80/decode_tile_table.hpp"
#include "cuda/sm80/mma_ptx.hpp"
#include "cuda/sm90/decode_cluster_combine.hpp"

namespace flashcpp::detail::cuda::sm80 {

// Element: q, k_new, v_new and out; Cache: the caches' elements (Element, or std::uint8_t
// holding e4m3 with Element bf16).
template <class Element_, int kHeadDim_, class Cache_ = Element_>
struct DecodeTraits {
  using Element = Element_;
  using Cache = Cache_;
  static constexpr bool kFp8 = std::is_same_v<Cache, std::uint8_t>;
  static_assert(!kFp8 || std::is_same_v<Element, cutlass::bfloat16_t>, "fp8 caches take bf16 q");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr DecodeTile kTile = kFp8 ? decode_tile_fp8(kHeadDim) : decode_tile(kHeadDim);
  static_assert(kTile.head_dim == kHeadDim, "decode instantiations use the tile table's head dims");
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kQChunks = kHeadDim / 8;  // 16-byte chunks per row of Q
  static constexpr int kChunks = kHeadDim * int(sizeof(Cache)) / 16;  // ... of K and V
  static constexpr int kChunkElems = 16 / int(sizeof(Cache));
  static constexpr int kSmemBytes = decode_smem_bytes(kTile, int(sizeof(Element)), int(sizeof(Cache)));
  static_assert(kBlockN == 16 * kWarps, "each warp takes 16 keys of a block");
  static_assert(kQChunks >= 8, "the swizzle permutes 8 chunks");
  // The epilogue's merge buffer (fp32 O of every warp) reuses the K/V stages.
  static_assert(kWarps * kDecodeRows * kHeadDim * 4 <=
                2 * kStages * kBlockN * kHeadDim * int(sizeof(Cache)));
};

// Element index of 16-byte chunk `chunk` of row `row` in a [rows][kChunks * 8] tile. Chunks are
// XOR-swizzled by row % 8, so the 8 rows one ldmatrix reads sit in 8 different bank groups.
template <int kChunks>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return (row * kChunks + (chunk ^ (row & 7))) * 8;
}

// Asks L2 (sm90+) for the K and V rows of the key block where split `split` of a full cache
// starts, one row per thread. Reads nothing, so it may run before the wait for the kernel
// ahead: L2 is where every write lands, so a line fetched early is updated by a later write,
// never stale.
template <class Traits>
__device__ __forceinline__ void l2_prefetch_first_block(const KVCacheParams& p, int b, int head_kv, int split,
                                                        int num_splits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cache = typename Traits::Cache;
  constexpr int BN = Traits::kBlockN;
  constexpr int kRowBytes = Traits::kHeadDim * int(sizeof(Cache));
  static_assert(2 * BN == Traits::kThreads, "a thread per K or V row of a block");
  const int blocks = (p.seqlen_k + BN - 1) / BN;
  const int key = split * ((blocks + num_splits - 1) / num_splits) * BN + int(threadIdx.x) % BN;
  if (key >= p.seqlen_k) return;
  const bool v = int(threadIdx.x) >= BN;
  const Strides& s = v ? p.v_stride : p.k_stride;
  const char* row = reinterpret_cast<const char*>(static_cast<const Cache*>(v ? p.v : p.k) + b * s.batch +
                                                  std::int64_t(head_kv) * s.head + std::int64_t(key) * s.row);
#pragma unroll
  for (int line = 0; line < (kRowBytes + 127) / 128; ++line)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + 128 * line));
#endif
}

// kClusterCombine (sm90 builds only): the splits of a tile run as one cluster and merge
// through distributed shared memory (sm90/decode_cluster_combine.hpp) instead of writing
// partials for the combine kernel.
// kSm90Code: instantiated by an sm90a translation unit (sm90/decode_launch.cuh). The sm80
// translation units compile the same template from compute_80 PTX, where the dependent-launch
// wait and trigger are no-ops; a distinct template argument keeps the two codes apart as
// symbols, so a launch from sm90a code never runs the sm80 code of the same name.
template <class Traits, bool kSoftcap, bool kPaged, bool kClusterCombine = false,
          bool kSm90Code = kClusterCombine>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kTile.ctas_per_sm)
    decode_kernel(const __grid_constant__ KVCacheKernelParams kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static_assert(!kSm90Code, "an sm90a instantiation compiled for an older architecture");
#endif
  using Element = typename Traits::Element;
  using Cache = typename Traits::Cache;
  constexpr bool kFp8 = Traits::kFp8;
  constexpr int D = Traits::kHeadDim, BN = Traits::kBlockN, kStages = Traits::kStages;
  constexpr int kWarps = Traits::kWarps;
  constexpr int C = Traits::kChunks, QC = Traits::kQChunks, kChunkElems = Traits::kChunkElems;
  const KVCacheParams& p = kp.p;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* s_q = reinterpret_cast<Element*>(smem_raw);    // [16][D]
  Cache* s_k = reinterpret_cast<Cache*>(s_q + kDecodeRows * D);  // [stages][BN][D]
  Cache* s_v = s_k + kStages * BN * D;
  // Element offset of a K/V chunk in a stage.
  const auto kv_slot = [](int row, int chunk) {
    if constexpr (kFp8)
      return fp8_swizzled<C>(row, chunk);
    else
      return swizzled<C>(row, chunk);
  };

  const int head_kv = int(blockIdx.x % unsigned(p.heads_kv));
  const int b = int(blockIdx.x / unsigned(p.heads_kv));
  const int split = blockIdx.y;
  const int row0 = blockIdx.z * kDecodeRows;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, tq = lane % 4;
  // The split-KV combine may launch once every CTA has started; it waits for their results.
  allow_dependent_launch();
  // An fp8 cache's kernel (sm90a translation units) is launched as a programmatic dependent:
  // the CTA may start while the kernel ahead drains, and before waiting for its results it asks
  // L2 for the first key block it would read if the sequence filled the cache (contiguous
  // caches: no table to read first), which overlaps that block's DRAM latency with the kernel
  // ahead's tail (H100, GQA 32:8, D 128, B8 L4k: 71% -> 76% of the copy bandwidth). 16-bit
  // caches are not: the same launch lost 3-8% at B 1 (8-split clusters), not understood yet.
  // Without the launch attribute the wait returns at once.
  if constexpr (kFp8 && !kPaged) l2_prefetch_first_block<Traits>(p, b, head_kv, split, kp.num_splits);
  wait_for_kernel_ahead();

  // fp8 caches: the descales of q . k fold into the score scale, v's into the normaliser.
  // 16-bit caches read the kernel parameters themselves (copies would take registers).
  float fp8_scale_log2 = kp.scale_log2, fp8_lse_scale = kp.lse_scale;
  float fp8_softcap_in = kp.softcap_in_scale, out_factor = 1.f;
  if constexpr (kFp8) {
    const float qk = p.q_descale.at(b, head_kv) * p.k_descale.at(b, head_kv);
    if constexpr (kSoftcap) {
      fp8_softcap_in *= qk;
    } else {
      fp8_scale_log2 *= qk;
      fp8_lse_scale *= qk;
    }
    out_factor = p.v_descale.at(b, head_kv);
  }
  // fp8 caches: the products run in f16 (decode_fp8_fragments.hpp).
  using MmaElement = std::conditional_t<kFp8, cutlass::half_t, Element>;
  const float& scale_log2 = kFp8 ? fp8_scale_log2 : kp.scale_log2;
  const float& lse_scale = kFp8 ? fp8_lse_scale : kp.lse_scale;
  const float& softcap_in = kFp8 ? fp8_softcap_in : kp.softcap_in_scale;

  // ---- scheduler: the key blocks of this CTA ----
  const int n_keys = kvcache_keys(p, b);
  const int rows_here = min(kDecodeRows, kp.rows - row0);
  const int t_first = row0 / kp.group, t_last = (row0 + rows_here - 1) / kp.group;
  const WindowMask mask(p.seqlen_q, n_keys, p.window_left, p.window_right);
  // The rule's key ranges never move back from one token to the next: [first.begin, last.end)
  // holds every key some row sees, [last.begin, first.end) those every row sees.
  const KeyRange first = mask.keys(t_first), last = mask.keys(t_last);
  const int visible_begin = int(first.begin) / BN;
  const int visible_end = first.begin < last.end ? int((last.end + BN - 1) / BN) : visible_begin;
  const int per_split = (visible_end - visible_begin + kp.num_splits - 1) / kp.num_splits;
  const int blk_begin = min(visible_end, visible_begin + split * per_split);
  const int blk_end = min(visible_end, blk_begin + per_split);

  // ---- loads (cp.async, zero fill where nothing may be read) ----
  const Element* q = static_cast<const Element*>(p.q);
  for (int i = tid; i < kDecodeRows * QC; i += Traits::kThreads) {
    const int r = i / QC, c = i % QC, row = row0 + r;
    const int t = row / kp.group, h = head_kv * kp.group + row % kp.group;
    const bool ok = r < rows_here && c * 8 < p.head_dim;
    const Element* src = ok ? q + b * p.q_stride.batch + std::int64_t(t) * p.q_stride.row +
                                  std::int64_t(h) * p.q_stride.head + c * 8
                            : q;
    cp_async_16(s_q + swizzled<QC>(r, c), src, ok);
  }
  // Each thread copies one 16-byte chunk column of kRowsPerThread consecutive rows of a block.
  // Consecutive rows share a page whenever the page size is a multiple of kRowsPerThread (every
  // power of two from 8 up), so one block-table lookup serves them all and the row addresses
  // step by the row stride: the copies cost few instructions, which decides the speed of a
  // CTA (the kernel is issue-bound per CTA, not latency-bound).
  constexpr int kRowGroups = Traits::kThreads / C;
  constexpr int kRowsPerThread = BN / kRowGroups;
  static_assert(Traits::kThreads % C == 0 && BN % kRowGroups == 0);
  const int chunk = tid % C, row_base = (tid / C) * kRowsPerThread;
  const Strides ks = p.k_stride, vs = p.v_stride;
  const Cache* k_head = static_cast<const Cache*>(p.k) + std::int64_t(head_kv) * ks.head + chunk * kChunkElems;
  const Cache* v_head = static_cast<const Cache*>(p.v) + std::int64_t(head_kv) * vs.head + chunk * kChunkElems;
  if constexpr (!kPaged) {
    k_head += b * ks.batch;
    v_head += b * vs.batch;
  }
  const bool k_col = chunk * kChunkElems < p.head_dim, v_col = chunk * kChunkElems < p.head_dim_v;
  const bool rows_share_page = !kPaged || p.page_size % kRowsPerThread == 0;
  // Paged, rows sharing a page: the block-table entry of the next block this thread loads is
  // read one load_block ahead, so its latency hides behind a block's compute instead of
  // stalling the copies that depend on it (blocks are loaded in order).
  const auto table_entry = [&](int blk) {
    const int key0 = blk * BN + row_base;
    return blk < blk_end && key0 < n_keys
               ? p.block_table[b * p.block_table_stride + page_of(p, key0)]
               : -1;
  };
  int next_entry = kPaged && rows_share_page ? table_entry(blk_begin) : -1;
  const auto load_block = [&](int blk, int stage) {
    const int key0 = blk * BN + row_base;
    int rows = min(kRowsPerThread, n_keys - key0);  // this thread's rows inside the sequence
    Cache* sk = s_k + stage * BN * D;
    Cache* sv = s_v + stage * BN * D;
    if (rows_share_page) {
      std::int64_t k_row0 = 0, v_row0 = 0;
      if (rows > 0) {
        if constexpr (kPaged) {
          const int page = next_entry >= 0 && next_entry < p.num_pages ? next_entry : -1;
          if (page < 0) rows = 0;
          k_row0 = page * ks.batch + std::int64_t(row_in_page(p, key0)) * ks.row;
          v_row0 = page * vs.batch + std::int64_t(row_in_page(p, key0)) * vs.row;
        } else {
          k_row0 = std::int64_t(key0) * ks.row;
          v_row0 = std::int64_t(key0) * vs.row;
        }
      }
      if constexpr (kPaged) next_entry = table_entry(blk + 1);
      if constexpr (kFp8) {
        // Instruction-bound: the source steps by the row stride, and a copy that may not read
        // (past the length, an unused page, the head-dim padding) copies 0 bytes, which
        // reads nothing, so its address needs no replacing.
        const Cache* k_src = k_head + k_row0;
        const Cache* v_src = v_head + v_row0;
#pragma unroll
        for (int j = 0; j < kRowsPerThread; ++j) {
          cp_async_16(sk + kv_slot(row_base + j, chunk), k_src, j < rows && k_col);
          cp_async_16(sv + kv_slot(row_base + j, chunk), v_src, j < rows && v_col);
          k_src += ks.row;
          v_src += vs.row;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kRowsPerThread; ++j) {
          const bool k_ok = j < rows && k_col, v_ok = j < rows && v_col;
          cp_async_16(sk + kv_slot(row_base + j, chunk), k_ok ? k_head + k_row0 + j * ks.row : k_head, k_ok);
          cp_async_16(sv + kv_slot(row_base + j, chunk), v_ok ? v_head + v_row0 + j * vs.row : v_head, v_ok);
        }
      }
    } else if constexpr (kPaged) {
      // Pages whose size is not a multiple of kRowsPerThread: each row looks up its own page.
#pragma unroll 1
      for (int j = 0; j < kRowsPerThread; ++j) {
        const int page = j < rows ? cache_page(p, b, key0 + j) : -1;
        const bool k_ok = page >= 0 && k_col, v_ok = page >= 0 && v_col;
        const std::int64_t in_page = row_in_page(p, key0 + j);
        cp_async_16(sk + kv_slot(row_base + j, chunk),
                    k_ok ? k_head + page * ks.batch + in_page * ks.row : k_head, k_ok);
        cp_async_16(sv + kv_slot(row_base + j, chunk),
                    v_ok ? v_head + page * vs.batch + in_page * vs.row : v_head, v_ok);
      }
    }
  };
#pragma unroll 1
  for (int s = 0; s < kStages - 1; ++s) {
    if (blk_begin + s < blk_end) load_block(blk_begin + s, s);
    cp_async_commit();  // one group per stage, empty or not, so the waits count alike
  }

  // ---- mainloop ----
  float acc_o[D / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  std::uint32_t q_frag[D / 16][4];
  // Keys every row sees in full: blocks inside need no element mask.
  const std::int64_t full_begin = last.begin, full_end = first.end;
  for (int blk = blk_begin; blk < blk_end; ++blk) {
    const int it = blk - blk_begin;
    cp_async_wait<kStages - 2>();
    __syncthreads();  // block `blk` landed for every thread; stage (it - 1) % kStages is free
    if (it == 0) {
      if constexpr (kFp8) {
        // Q into f16 times 2^e; the scores come out 2^e too large, the scale takes it back.
        __shared__ int q_max_of_warp[kWarps];
        const int e = fp8_q_scale_exponent<Traits::kThreads, kDecodeRows * D>(s_q, q_max_of_warp);
        if constexpr (kSoftcap) {
          fp8_softcap_in *= fp8_pow2(-e);
        } else {
          fp8_scale_log2 *= fp8_pow2(-e);
          fp8_lse_scale *= fp8_pow2(-e);
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          fp8_q_fragment<C>(q_frag[kk], s_q, kk, lane, fp8_pow2(e),
                            [](int row, int chunk) { return swizzled<QC>(row, chunk); });
      } else {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const int m = lane / 8;
          ldmatrix_x4(q_frag[kk], s_q + swizzled<QC>((m % 2) * 8 + lane % 8, kk * 2 + m / 2));
        }
      }
    }
    if (blk + kStages - 1 < blk_end) load_block(blk + kStages - 1, (it + kStages - 1) % kStages);
    cp_async_commit();

    const Cache* sk = s_k + (it % kStages) * BN * D;
    const Cache* sv = s_v + (it % kStages) * BN * D;
    float s[2][4] = {};
    if constexpr (kFp8) {
      fp8_qk<D, C>(s, q_frag, sk, warp * 16, lane,
                   [](float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
                     mma_16816<MmaElement>(c, a, b0, b1);
                   });
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t kf[4];
        const int m = lane / 8;
        ldmatrix_x4(kf, sk + swizzled<C>(warp * 16 + (m / 2) * 8 + lane % 8, kk * 2 + m % 2));
        mma_16816<Element>(s[0], q_frag[kk], kf[0], kf[1]);
        mma_16816<Element>(s[1], q_frag[kk], kf[2], kf[3]);
      }
    }
    if constexpr (kSoftcap) {
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = tanhf(s[n][e] * softcap_in);
    }
    const int key0 = blk * BN + warp * 16;
    if (blk * BN < full_begin || (blk + 1) * BN > full_end || (blk + 1) * BN > n_keys) {
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row0 + g + (e >= 2 ? 8 : 0);
          const int key = key0 + n * 8 + 2 * tq + (e & 1);
          if (key >= n_keys || !mask.visible(row / kp.group, key)) s[n][e] = -INFINITY;
        }
      // NaN or Inf in V at a key some row does not see would reach that row as P = 0 times
      // NaN: the warp zeroes such chunks of its own 16 V rows (only it reads them) and makes
      // the rows that do see one of those keys NaN instead (common/non_finite_rows.hpp).
      Cache* const sv_warp = s_v + (it % kStages) * BN * D + warp * 16 * D;
      std::uint32_t bad_rows = 0;  // bit k: key key0 + k
      // One chunk at a time: unrolled, the loads of every chunk were hoisted together, which
      // cost registers (this runs with O live).
#pragma unroll 1
      for (int i = lane; i < 16 * C; i += 32) {
        uint4* const chunk_ptr = reinterpret_cast<uint4*>(sv_warp + kv_slot(i / C, i % C));
        bool bad;
        if constexpr (kFp8)
          bad = chunk_has_e4m3_nan(*chunk_ptr);
        else
          bad = chunk_non_finite<Element>(*chunk_ptr);
        if (bad) {
          *chunk_ptr = make_uint4(0, 0, 0, 0);
          bad_rows |= 1u << (i / C);
        }
      }
      bad_rows = __reduce_or_sync(0xffffffffu, bad_rows);
      if (bad_rows != 0) {  // rare; uniform over the warp
        __syncwarp();  // the zeroed chunks are visible to the warp's ldmatrix below
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const KeyRange seen = mask.keys((row0 + g + 8 * r) / kp.group);
          const int first = int(max(seen.begin - key0, std::int64_t(0)));
          const int last = int(min(seen.end - key0, std::int64_t(16))) - 1;
          if (any_row_bit<1>(&bad_rows, first, last))
#pragma unroll
            for (int n = 0; n < D / 8; ++n) acc_o[n][2 * r] = acc_o[n][2 * r + 1] = NAN;
        }
      }
    }

    // Online softmax of the thread's two rows (g and g + 8), stats shared across the quad.
    float rescale_of_row[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float block_max =
          quad_max(fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1])));
      const float m = fmaxf(row_max[r], block_max);
      // A row that has seen no visible key keeps max -inf: offset 0 keeps exp2 at 0, not NaN.
      const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
      const float rescale = fast_exp2(row_max[r] * scale_log2 - m_scaled);
      rescale_of_row[r] = rescale;
      row_max[r] = m;
      row_sum[r] *= rescale;
      if constexpr (!kFp8) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          acc_o[n][2 * r] *= rescale;
          acc_o[n][2 * r + 1] *= rescale;
        }
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[n][e] = fast_exp2(s[n][e] * scale_log2 - m_scaled);
          row_sum[r] += s[n][e];
        }
    }
    // fp8 (instruction-bound): once the maxima settle, no row of the warp rescales (the factor
    // is exactly 1), and the D / 4 multiplies per thread are skipped.
    if constexpr (kFp8) {
      if (__any_sync(0xffffffffu, rescale_of_row[0] != 1.f || rescale_of_row[1] != 1.f)) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int n = 0; n < D / 8; ++n) {
            acc_o[n][2 * r] *= rescale_of_row[r];
            acc_o[n][2 * r + 1] *= rescale_of_row[r];
          }
      }
    }
    // P as the A operand of P V: the S accumulators of two n8 tiles are one k16 A tile.
    const std::uint32_t p_frag[4] = {pack2<MmaElement>(s[0][0], s[0][1]), pack2<MmaElement>(s[0][2], s[0][3]),
                                     pack2<MmaElement>(s[1][0], s[1][1]), pack2<MmaElement>(s[1][2], s[1][3])};
    if constexpr (kFp8) {
      fp8_pv<D, C>(acc_o, p_frag, sv, warp * 16, lane,
                   [](float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
                     mma_16816<MmaElement>(c, a, b0, b1);
                   });
    } else {
#pragma unroll
      for (int dd = 0; dd < D / 16; ++dd) {
        std::uint32_t vf[4];
        const int m = lane / 8;
        ldmatrix_x4_trans(vf, sv + swizzled<C>(warp * 16 + (m % 2) * 8 + lane % 8, dd * 2 + m / 2));
        mma_16816<Element>(acc_o[2 * dd], p_frag, vf[0], vf[1]);
        mma_16816<Element>(acc_o[2 * dd + 1], p_frag, vf[2], vf[3]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: the merge buffers reuse them

  // ---- epilogue: merge the warps' softmax states, then store ----
  float* merge_o = reinterpret_cast<float*>(s_k);  // [warp][16][D]
  __shared__ float merge_max[kWarps][kDecodeRows], merge_sum[kWarps][kDecodeRows];
#pragma unroll
  for (int r = 0; r < 2; ++r) row_sum[r] = quad_sum(row_sum[r]);
  if (tq == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      merge_max[warp][g + 8 * r] = row_max[r];
      merge_sum[warp][g + 8 * r] = row_sum[r];
    }
  }
  __syncthreads();
  // A row's common offset over the warps, and each warp's weight exp2(max_w - max).
  const auto row_offset = [&](int row) {
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, merge_max[w][row]);
    return m;
  };
  // Each row's normaliser and lse, once per row (not per element of the store loop below).
  __shared__ float row_scale[kDecodeRows], row_lse[kDecodeRows];
  if (tid < kDecodeRows) {
    const float m = row_offset(tid);
    // A warp whose max is still -inf has sum 0 (no visible key) or NaN (NaN scores, which
    // fmaxf skips): weight 0 keeps the NaN, so only a row whose sum is 0 counts as empty.
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = merge_max[w][tid];
      sum += merge_sum[w][tid] * (mw == -INFINITY ? 0.f : fast_exp2((mw - m) * scale_log2));
    }
    const bool empty = sum == 0.f;
    row_scale[tid] = empty ? 0.f : (kFp8 ? out_factor / sum : 1.f / sum);
    row_lse[tid] = empty ? -INFINITY : m * lse_scale + logf(sum);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    const float m = row_offset(row);
    const float weight = m == -INFINITY ? 0.f : fast_exp2((row_max[r] - m) * scale_log2);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      // fp8: V's n index was permuted (decode_fp8_fragments.hpp), and the merge buffer's
      // columns are swizzled so that the permuted stores do not all hit one bank.
      const int col0 = kFp8 ? fp8_merge_slot(row, fp8_v_dim<D>(n, 2 * tq)) : n * 8 + 2 * tq;
      const int col1 = kFp8 ? fp8_merge_slot(row, fp8_v_dim<D>(n, 2 * tq + 1)) : col0 + 1;
      merge_o[(warp * kDecodeRows + row) * D + col0] = acc_o[n][2 * r] * weight;
      merge_o[(warp * kDecodeRows + row) * D + col1] = acc_o[n][2 * r + 1] * weight;
    }
  }
  __syncthreads();

  const std::int64_t rows_per_split = std::int64_t(p.batch) * p.heads_q * p.seqlen_q;
  // Cluster merge: this split's rows go to shared memory past the merge buffers.
  float* const part_o = merge_o + kWarps * kDecodeRows * D;  // [16][D]
  static_assert((kWarps + 1) * kDecodeRows * D * 4 <=
                2 * Traits::kStages * BN * D * int(sizeof(Cache)));
  // 16-bit outputs: 8 columns per step (two 16-byte merge-buffer reads per warp, 16-byte
  // stores) where Dv and the destination's rows allow it; otherwise one column per step. With
  // 16 live rows (Nnew 4 x group 4) the one-column loop was the largest part of the
  // difference between a short Nnew 4 call and an Nnew 1 call (ncu on the H100, B8 L1k);
  // 8 columns a step took B8 L1k Nnew 4 from 17.4 to 15.5 us, B1 L1k from 9.6 to 9.0 us.
  constexpr int kVec = 8;
  const bool vec_dst =
      kClusterCombine ||
      (kp.num_splits > 1 ? reinterpret_cast<std::uintptr_t>(kp.o_accum) % 16 == 0
                         : reinterpret_cast<std::uintptr_t>(p.out) % 16 == 0 && p.out_stride.batch % 8 == 0 &&
                               p.out_stride.row % 8 == 0 && p.out_stride.head % 8 == 0);
  const bool stored = !kFp8 && p.head_dim_v % kVec == 0 && vec_dst;  // (fp8: swizzled columns)
  if (stored) {
    constexpr int kSteps = D / kVec;
    for (int i = tid; i < rows_here * kSteps; i += Traits::kThreads) {
      const int r = i / kSteps, col = i % kSteps * kVec;
      if (col >= p.head_dim_v) continue;
      float o[kVec] = {};
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
#pragma unroll
        for (int j = 0; j < kVec; j += 4) {
          const float4 x = *reinterpret_cast<const float4*>(merge_o + (w * kDecodeRows + r) * D + col + j);
          o[j] += x.x, o[j + 1] += x.y, o[j + 2] += x.z, o[j + 3] += x.w;
        }
      const float scale = row_scale[r];
#pragma unroll
      for (int j = 0; j < kVec; ++j) o[j] = scale == 0.f ? 0.f : o[j] * scale;  // no key: exactly 0
      float* f32_dst = nullptr;
      if constexpr (kClusterCombine) {
        f32_dst = part_o + r * D + col;
      } else {
        const int row = row0 + r, t = row / kp.group, h = head_kv * kp.group + row % kp.group;
        if (kp.num_splits > 1) {
          const std::int64_t row_id = (std::int64_t(b) * p.heads_q + h) * p.seqlen_q + t;
          f32_dst = kp.o_accum + (split * rows_per_split + row_id) * p.head_dim_v + col;
          if (col == 0) kp.lse_accum[split * rows_per_split + row_id] = row_lse[r];
        } else {
          uint4 packed;
          packed.x = pack2<Element>(o[0], o[1]);
          packed.y = pack2<Element>(o[2], o[3]);
          packed.z = pack2<Element>(o[4], o[5]);
          packed.w = pack2<Element>(o[6], o[7]);
          *reinterpret_cast<uint4*>(static_cast<Element*>(p.out) + b * p.out_stride.batch +
                                    std::int64_t(t) * p.out_stride.row +
                                    std::int64_t(h) * p.out_stride.head + col) = packed;
          if (col == 0 && p.lse != nullptr)
            p.lse[b * p.lse_batch_stride + std::int64_t(h) * p.lse_head_stride + t] = row_lse[r];
        }
      }
      if (f32_dst != nullptr) {
#pragma unroll
        for (int j = 0; j < kVec; j += 4)
          *reinterpret_cast<float4*>(f32_dst + j) = make_float4(o[j], o[j + 1], o[j + 2], o[j + 3]);
      }
    }
  }
  if (!stored) {
    for (int i = tid; i < rows_here * D; i += Traits::kThreads) {
      const int r = i / D, col = i % D;
      if (col >= p.head_dim_v) continue;
      float o = 0.f;
  #pragma unroll
      for (int w = 0; w < kWarps; ++w)
        o += merge_o[(w * kDecodeRows + r) * D + (kFp8 ? fp8_merge_slot(r, col) : col)];
      o = row_scale[r] == 0.f ? 0.f : o * row_scale[r];  // a row that saw no key: exactly 0
      const float lse = row_lse[r];
      if constexpr (kClusterCombine) {
        part_o[r * D + col] = o;
        continue;
      }
      const int row = row0 + r, t = row / kp.group, h = head_kv * kp.group + row % kp.group;
      if (kp.num_splits > 1) {
        const std::int64_t row_id = (std::int64_t(b) * p.heads_q + h) * p.seqlen_q + t;
        kp.o_accum[(split * rows_per_split + row_id) * p.head_dim_v + col] = o;
        if (col == 0) kp.lse_accum[split * rows_per_split + row_id] = lse;
      } else {
        static_cast<Element*>(p.out)[b * p.out_stride.batch + std::int64_t(t) * p.out_stride.row +
                                     std::int64_t(h) * p.out_stride.head + col] = Element(o);
        if (col == 0 && p.lse != nullptr)
          p.lse[b * p.lse_batch_stride + std::int64_t(h) * p.lse_head_stride + t] = lse;
      }
    }
  }
  if constexpr (kClusterCombine)
    sm90::cluster_combine_store<Element, D>(part_o, row_lse, rows_here, row0, b, head_kv, kp);
}

}  // namespace flashcpp::detail::cuda::sm80
