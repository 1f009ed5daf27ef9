// fp8_e4m3 on the CPU: the e4m3 codec and the byte permutes the decode kernel's fragments use
// (checked against definitions written here), the index math of the sm90a fp8 forward (the P
// register packing against the PTX fragment layouts, the V^T workspace layout), the float64
// reference forward of fp8 q, k, v
// with descales (against the same reference run on the dequantised values in float32), and
// the argument errors of fp8 calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/byte_perm.hpp"
#include "common/fp8.hpp"
#include "common/half.hpp"
#include "cuda/sm90/fp8_pv_order.hpp"
#include "cuda/sm90/fp8_vt_layout.hpp"
#include "flashcpp/flashcpp.hpp"
#include "test_util.hpp"

namespace flashcpp::test {
namespace {

// e4m3fn from its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (m / 8 * 2^-6); S.1111.111 is NaN; no infinities.
double e4m3_value(int byte) {
  const int sign = byte >> 7, exponent = (byte >> 3) & 15, mantissa = byte & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

TEST(Fp8Codec, DecodesEveryByte) {
  for (int byte = 0; byte < 256; ++byte) {
    const double want = e4m3_value(byte);
    const float got = detail::e4m3_to_float(static_cast<std::uint8_t>(byte));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << byte;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << byte;
      EXPECT_EQ(std::signbit(got), (byte & 0x80) != 0) << byte;
    }
  }
  EXPECT_EQ(detail::e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(detail::e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

// The encoder picks the nearest e4m3 value (ties to an even mantissa), saturates at +-448
// (Inf too) and keeps NaN NaN.
TEST(Fp8Codec, RoundsToNearestEvenAndSaturates) {
  std::vector<double> finite;  // the non-negative finite values, ascending
  for (int byte = 0; byte < 0x7f; ++byte) finite.push_back(e4m3_value(byte));
  const auto nearest_even = [&](double a) {
    if (a >= 448.0) return 0x7e;
    for (int i = 0; i + 1 < static_cast<int>(finite.size()); ++i) {
      if (a > finite[i + 1]) continue;
      const double below = a - finite[i], above = finite[i + 1] - a;
      if (below < above) return i;
      if (above < below) return i + 1;
      return (i & 1) == 0 ? i : i + 1;  // tie: the even code (even mantissa)
    }
    return 0x7e;
  };
  std::mt19937_64 rng(7);
  std::vector<float> probes = {0.0f, 1e-30f, 0x1p-10f, 0x1p-9f, 0x1.8p-9f, 0x1p-7f, 0x1.1p0f,
                               1.0625f, 1.1875f, 447.0f, 448.0f, 463.0f, 464.0f, 1e6f};
  for (int byte = 0; byte + 1 < 0x7f; ++byte)  // the midpoints: ties
    probes.push_back(static_cast<float>((finite[byte] + finite[byte + 1]) / 2));
  for (int i = 0; i < 20000; ++i)
    probes.push_back(std::ldexp(static_cast<float>(rng() >> 40) * 0x1p-24f, static_cast<int>(rng() % 24) - 14));
  for (float a : probes)
    for (float x : {a, -a}) {
      const int want = nearest_even(std::fabs(static_cast<double>(x))) | (std::signbit(x) ? 0x80 : 0);
      EXPECT_EQ(detail::float_to_e4m3(x), want) << x;
    }
  EXPECT_EQ(detail::float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(detail::float_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(detail::float_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
  for (int byte = 0; byte < 256; ++byte) {  // every finite code round-trips
    if ((byte & 0x7f) == 0x7f) continue;
    EXPECT_EQ(detail::float_to_e4m3(detail::e4m3_to_float(static_cast<std::uint8_t>(byte))), byte);
  }
}

// The decode kernel's e4m3 -> f16 fallback (GPUs before sm89): every byte pair, each byte's
// f16 bits read as a value and times 2^8 must be the byte's value (NaN bytes are flagged by
// e4m3x2_nan_bits and patched by the kernel).
TEST(Fp8Codec, BytePairsToF16BitsOver256) {
  for (std::uint32_t pair = 0; pair < 0x10000u; ++pair) {
    const std::uint32_t bits = detail::e4m3x2_to_f16x2_bits_over_256(pair);
    const std::uint32_t nan = detail::e4m3x2_nan_bits(pair);
    for (int i = 0; i < 2; ++i) {
      const int byte = static_cast<int>((pair >> (8 * i)) & 0xffu);
      const double want = e4m3_value(byte);
      EXPECT_EQ(((nan >> (8 * i)) & 0x80u) != 0, std::isnan(want)) << byte;
      if (std::isnan(want)) continue;
      const float got = detail::fp16_to_float(static_cast<std::uint16_t>(bits >> (16 * i)));
      ASSERT_EQ(static_cast<double>(got) * 256.0, want) << "pair " << pair << ", byte " << i;
      EXPECT_EQ(std::signbit(got), (byte & 0x80) != 0) << byte;  // -0 stays -0
    }
  }
}

// The byte permutes that pair two V rows dim by dim (decode_fp8_fragments.hpp): selector
// 0x5140 gives {r0.0, r1.0, r0.1, r1.1}, 0x7362 {r0.2, r1.2, r0.3, r1.3}.
TEST(Fp8Codec, BytePermutePairsRows) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 100; ++trial) {
    const auto r0 = static_cast<std::uint32_t>(rng()), r1 = static_cast<std::uint32_t>(rng());
    const std::uint32_t pairs[2] = {detail::byte_perm(r0, r1, 0x5140u), detail::byte_perm(r0, r1, 0x7362u)};
    for (int dim = 0; dim < 4; ++dim) {
      const std::uint32_t pair = pairs[dim / 2] >> (16 * (dim % 2));
      EXPECT_EQ(pair & 0xffu, (r0 >> (8 * dim)) & 0xffu) << dim;
      EXPECT_EQ((pair >> 8) & 0xffu, (r1 >> (8 * dim)) & 0xffu) << dim;
    }
  }
}

// ---- the sm90a fp8 forward's index math ---------------------------------------------------------

// The PTX ISA's wgmma register fragments, for thread t of a warp (g = t / 4, q = t % 4):
// f32 accumulator D (m64nN): value 4i + 2r + b sits at row g + 8r, column 8i + 2q + b;
// e4m3 A operand (m64k32): byte b of register j sits at row g + 8 (j % 2), column
// 16 (j / 2) + 4q + b. The kernel packs accumulator value fp8_pv_acc_index(j, b) of each 32-key
// chunk into byte b of A register j; the pre-pass stores key fp8_pv_key_of_slot(a) of each
// chunk at V^T column a. Each packed value must stay in its row, and the key V^T puts at the
// A column must be the value's own key.
TEST(Fp8ForwardLayout, PackedPMatchesTransposedVOrder) {
  namespace sm90 = detail::cuda::sm90;
  std::vector<int> keys_seen(32, 0);
  for (int q = 0; q < 4; ++q) {
    std::vector<int> values_used(16, 0);
    for (int j = 0; j < 4; ++j)
      for (int b = 0; b < 4; ++b) {
        const int value = sm90::fp8_pv_acc_index(j, b);
        ASSERT_GE(value, 0);
        ASSERT_LT(value, 16);
        ++values_used[value];
        const int i = value / 4, r = value / 2 % 2, e = value % 2;
        const int acc_row_half = r, acc_key = 8 * i + 2 * q + e;
        const int a_row_half = j % 2, a_column = 16 * (j / 2) + 4 * q + b;
        EXPECT_EQ(acc_row_half, a_row_half) << "q " << q << " register " << j << " byte " << b;
        EXPECT_EQ(sm90::fp8_pv_key_of_slot(a_column), acc_key)
            << "q " << q << " register " << j << " byte " << b;
        if (r == 0) ++keys_seen[sm90::fp8_pv_key_of_slot(a_column)];
      }
    for (int v = 0; v < 16; ++v) EXPECT_EQ(values_used[v], 1) << "q " << q << " value " << v;
    // Bytes 0, 1 (and 2, 3) are one cvt e4m3x2 of two neighbouring accumulator values.
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(sm90::fp8_pv_acc_index(j, 1), sm90::fp8_pv_acc_index(j, 0) + 1);
      EXPECT_EQ(sm90::fp8_pv_acc_index(j, 3), sm90::fp8_pv_acc_index(j, 2) + 1);
    }
  }
  for (int k = 0; k < 32; ++k) EXPECT_EQ(keys_seen[k], 1) << "key " << k;  // a permutation
}

// V^T in the workspace: each sequence's columns (its keys rounded up to 32, then at least 128
// zero columns) start at a multiple of 32, never overlap the next sequence's and stay inside
// the row, for packed varlen offsets and for padded batches; their words of NaN key bits
// start at their first column and stay inside the kv head's row of words.
TEST(Fp8ForwardLayout, TransposedVSequencesDoNotOverlap) {
  namespace sm90 = detail::cuda::sm90;
  auto rng = test_rng();
  for (int trial = 0; trial < 200; ++trial) {
    const bool varlen = trial % 2 == 0;
    const int batch = 1 + static_cast<int>(rng() % 9);
    std::vector<int> lengths(batch);
    for (int& n : lengths) n = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 700);
    detail::ForwardParams p;
    p.batch = batch;
    p.heads_kv = 1;
    p.head_dim_v = 1;
    p.seqlen_k = *std::max_element(lengths.begin(), lengths.end());
    std::int32_t dummy = 0;
    if (varlen) {
      p.cu_seqlens_q = p.cu_seqlens_k = &dummy;
      for (int n : lengths) p.total_rows_k += n;
    } else {
      lengths.assign(batch, p.seqlen_k);
    }
    const std::int64_t row = sm90::fp8_vt_row_columns(p);
    EXPECT_EQ(row % 32, 0);
    std::int64_t first = 0, end_of_previous = 0;
    for (int b = 0; b < batch; ++b) {
      const std::int64_t start = sm90::fp8_vt_seq_start(first, b);
      const std::int64_t columns = sm90::fp8_vt_seq_columns(lengths[b]);
      EXPECT_EQ(start % 32, 0);
      EXPECT_GE(start, end_of_previous) << "sequence " << b;
      EXPECT_GE(columns - lengths[b], 128);  // the last key block (<= 128 keys) reads zeros
      EXPECT_EQ(columns % 32, 0);
      // Its NaN key bits: the words of its columns, inside the head's share of the bits.
      for (int h : {0, 2}) {
        p.heads_kv = 3;
        const std::int64_t word = sm90::fp8_v_nan_key_word(p, h, int(start));
        EXPECT_EQ(word * 32, h * sm90::fp8_vt_row_columns(p) + start);
        EXPECT_LE((word * 32 + columns) / 32, (h + 1) * sm90::fp8_vt_row_columns(p) / 32);
        EXPECT_LE((word * 32 + columns) / 32 * 4, sm90::fp8_v_nan_key_bytes(p));
        p.heads_kv = 1;
      }
      end_of_previous = start + columns;
      first += lengths[b];
    }
    EXPECT_LE(end_of_previous, row);
  }
}

// ---- the float64 reference with fp8 inputs -----------------------------------------------------

// fp8 q, k, v (e4m3 codes) with descales, against the reference on float32 tensors holding
// code * descale: descales of few significant bits keep those products exact in float32, so
// the two calls compute the same float64 numbers and differ only in the rounding of out.
struct Fp8Forward {
  int batch = 2, nq = 37, nk = 70, hq = 8, hkv = 2, d = 64;
  bool causal = false;
  int window_left = -1;
  float softcap = 0.0f;
  bool varlen = false;
  DType out_dtype = DType::bf16;
  bool fast_accum = false;  // allowed, and the reference stays exact
};

void check_fp8_forward(const Fp8Forward& f) {
  auto rng = test_rng();
  const int B = f.batch;
  // Varlen: the sequences' rows packed as batch 1 of a [1, total, H, D] tensor would not
  // exercise the per-sequence descales, so varlen packs [total, H, D] with cu_seqlens.
  const std::vector<int> lq = {f.nq, f.nq / 2 + 1}, lk = {f.nk, f.nk / 3};
  const int total_q = f.varlen ? lq[0] + lq[1] : 0, total_k = f.varlen ? lk[0] + lk[1] : 0;
  const auto make = [&](DType t, int n, int h, int dim, int total) {
    return f.varlen ? HostTensor(t, {total, h, dim}) : HostTensor(t, {B, n, h, dim});
  };
  HostTensor q8 = make(DType::fp8_e4m3, f.nq, f.hq, f.d, total_q);
  HostTensor k8 = make(DType::fp8_e4m3, f.nk, f.hkv, f.d, total_k);
  HostTensor v8 = make(DType::fp8_e4m3, f.nk, f.hkv, f.d, total_k);
  fill_normal(q8, rng, 2.0f);
  fill_normal(k8, rng, 2.0f);
  fill_normal(v8, rng, 2.0f);
  // Descales k / 8 for k in 1..15: 4 significant bits, as the codes.
  HostTensor dq(DType::fp32, {B, f.hkv}), dk(DType::fp32, {B, f.hkv}), dv(DType::fp32, {1});
  for (HostTensor* t : {&dq, &dk, &dv})
    for (std::int64_t i = 0; i < t->numel(); ++i) t->set(i, static_cast<float>(1 + rng() % 15) / 8.0f);
  // The dequantised float32 copies.
  HostTensor q32 = q8.converted(DType::fp32), k32 = k8.converted(DType::fp32), v32 = v8.converted(DType::fp32);
  const auto sequence_of_row = [&](std::int64_t row, const std::vector<int>& lengths) {
    return row < lengths[0] ? 0 : 1;
  };
  const auto dequantise = [&](HostTensor& t, const HostTensor& factors, int heads, bool keys, bool per_tensor) {
    const int dim = f.d;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const std::int64_t row = i / (std::int64_t{heads} * dim);  // b * n + r, or the packed row
      const int h = static_cast<int>(i / dim % heads);
      const int g = keys ? h : h / (f.hq / f.hkv);
      const int b = f.varlen ? sequence_of_row(row, keys ? lk : lq)
                             : static_cast<int>(row / (keys ? f.nk : f.nq));
      const float factor = per_tensor ? factors.get(0) : factors.get(std::int64_t{b} * f.hkv + g);
      t.set(i, t.get(i) * factor);
    }
  };
  dequantise(q32, dq, f.hq, false, false);
  dequantise(k32, dk, f.hkv, true, false);
  dequantise(v32, dv, f.hkv, true, true);

  HostTensor out8 = make(f.out_dtype, f.nq, f.hq, f.d, total_q), out32 = make(DType::fp32, f.nq, f.hq, f.d, total_q);
  HostTensor lse8 = f.varlen ? HostTensor(DType::fp32, {f.hq, total_q}) : HostTensor(DType::fp32, {B, f.hq, f.nq});
  HostTensor lse32 = lse8;
  out8.poison();
  lse8.poison();
  AttentionOptions o;
  o.backend = Backend::automatic;  // fp8 on CPU tensors: the reference
  o.causal = f.causal;
  o.window_left = f.window_left;
  o.softcap = f.softcap;
  const TensorView dqv = dq.view(), dkv = dk.view(), dvv = dv.view();
  AttentionOptions o8 = o;
  o8.descale = {&dqv, &dkv, &dvv};
  o8.fp8_fast_accum = f.fast_accum;
  o.backend = Backend::cpu_reference;
  const TensorView lse8v = lse8.view(), lse32v = lse32.view();
  RunInfo info;
  if (f.varlen) {
    HostTensor cuq = cu_seqlens(lq), cuk = cu_seqlens(lk);
    info = forward_varlen(q8.view(), k8.view(), v8.view(), out8.view(), &lse8v, cuq.view(), cuk.view(),
                          lq[0], lk[0], o8);
    forward_varlen(q32.view(), k32.view(), v32.view(), out32.view(), &lse32v, cuq.view(), cuk.view(),
                   lq[0], lk[0], o);
  } else {
    info = forward(q8.view(), k8.view(), v8.view(), out8.view(), &lse8v, o8);
    forward(q32.view(), k32.view(), v32.view(), out32.view(), &lse32v, o);
  }
  EXPECT_EQ(info.backend, Backend::cpu_reference);
  // out: float64 results rounded once to out's dtype, or to fp32.
  for (std::int64_t i = 0; i < out8.numel(); ++i) {
    const float want = round_to(f.out_dtype, out32.get(i));
    ASSERT_NEAR(out8.get(i), want, ulp(f.out_dtype, want)) << i;
  }
  for (std::int64_t i = 0; i < lse8.numel(); ++i) ASSERT_EQ(lse8.get(i), lse32.get(i)) << i;
}

TEST(Fp8Reference, ForwardWithDescales) { check_fp8_forward({}); }

TEST(Fp8Reference, ForwardMasksSoftcapFp16Out) {
  Fp8Forward f;
  f.causal = true;
  f.window_left = 20;
  f.softcap = 15.0f;
  f.out_dtype = DType::fp16;
  f.d = 128;
  check_fp8_forward(f);
}

TEST(Fp8Reference, VarlenForwardPerSequenceDescales) {
  Fp8Forward f;
  f.varlen = true;
  f.causal = true;
  check_fp8_forward(f);
}

TEST(Fp8Reference, FastAccumulationIsExactOnTheCpu) {
  Fp8Forward f;
  f.fast_accum = true;
  check_fp8_forward(f);
  f.varlen = true;
  check_fp8_forward(f);
}

// ---- argument errors -------------------------------------------------------------------------------

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_ERROR(call, text) EXPECT_NE(error_of([&] { call; }).find(text), std::string::npos) << error_of([&] { call; })

TEST(Fp8Errors, ForwardArguments) {
  HostTensor q(DType::fp8_e4m3, {1, 8, 2, 64}), k(DType::fp8_e4m3, {1, 8, 2, 64}),
      v(DType::fp8_e4m3, {1, 8, 2, 64}), kb(DType::bf16, {1, 8, 2, 64}), out(DType::bf16, {1, 8, 2, 64}),
      out8(DType::fp8_e4m3, {1, 8, 2, 64}), qb(DType::bf16, {1, 8, 2, 64}), ob(DType::bf16, {1, 8, 2, 64});
  HostTensor good(DType::fp32, {1, 2}), wrong_shape(DType::fp32, {2, 2}), wrong_type(DType::fp16, {1, 2}),
      scalar(DType::fp32, {1});
  AttentionOptions o;
  EXPECT_NO_THROW(forward(q.view(), k.view(), v.view(), out.view(), nullptr, o));
  EXPECT_ERROR(forward(q.view(), kb.view(), v.view(), out.view(), nullptr, o),
               "k: expected dtype fp8_e4m3 (same as q), got bf16");
  EXPECT_ERROR(forward(qb.view(), k.view(), v.view(), ob.view(), nullptr, o),
               "k: expected dtype bf16 (same as q), got fp8_e4m3");
  EXPECT_ERROR(forward(q.view(), k.view(), v.view(), out8.view(), nullptr, o),
               "out: expected dtype bf16 or fp16 for fp8_e4m3 inputs, got fp8_e4m3");
  AttentionOptions cpu = o;
  cpu.backend = Backend::cpu;
  EXPECT_ERROR(forward(q.view(), k.view(), v.view(), out.view(), nullptr, cpu),
               "backend: cpu does not take fp8_e4m3 inputs");
  const TensorView g = good.view(), ws = wrong_shape.view(), wt = wrong_type.view(), sc = scalar.view();
  AttentionOptions d = o;
  d.descale.k = &ws;
  EXPECT_ERROR(forward(q.view(), k.view(), v.view(), out.view(), nullptr, d),
               "k_descale: expected shape [B, Hkv] = [1, 2] or [1], got [2, 2]");
  d.descale.k = &wt;
  EXPECT_ERROR(forward(q.view(), k.view(), v.view(), out.view(), nullptr, d),
               "k_descale: expected dtype fp32, got fp16");
  d.descale.k = &sc;
  d.descale.q = &g;
  EXPECT_NO_THROW(forward(q.view(), k.view(), v.view(), out.view(), nullptr, d));
  AttentionOptions b16 = o;
  b16.descale.v = &g;
  EXPECT_ERROR(forward(qb.view(), kb.view(), kb.view(), ob.view(), nullptr, b16),
               "v_descale: given, but v is bf16 (descales apply to fp8_e4m3 tensors only)");
  AttentionOptions fast = o;
  fast.fp8_fast_accum = true;
  EXPECT_NO_THROW(forward(q.view(), k.view(), v.view(), out.view(), nullptr, fast));
  EXPECT_ERROR(forward(qb.view(), kb.view(), kb.view(), ob.view(), nullptr, fast),
               "fp8_fast_accum: set, but q is bf16 (it applies to the forward with fp8_e4m3 q, k, v only)");
}

TEST(Fp8Errors, BackwardRefusesFp8) {
  HostTensor q(DType::fp8_e4m3, {1, 8, 2, 64}), out(DType::bf16, {1, 8, 2, 64}),
      lse(DType::fp32, {1, 2, 8}), grad(DType::fp8_e4m3, {1, 8, 2, 64});
  EXPECT_ERROR(backward(q.view(), q.view(), q.view(), out.view(), out.view(), lse.view(), grad.view(),
                        grad.view(), grad.view()),
               "q: dtype fp8_e4m3 is not supported by the backward (FP8 is forward and inference only)");
  HostTensor qb(DType::bf16, {1, 8, 2, 64}), g(DType::bf16, {1, 8, 2, 64}), s(DType::fp32, {1});
  const TensorView sv = s.view();
  AttentionOptions o;
  o.descale.q = &sv;
  EXPECT_ERROR(backward(qb.view(), qb.view(), qb.view(), out.view(), out.view(), lse.view(), g.view(),
                        g.view(), g.view(), o),
               "the backward takes no descales");
  AttentionOptions fast;
  fast.fp8_fast_accum = true;
  EXPECT_ERROR(backward(qb.view(), qb.view(), qb.view(), out.view(), out.view(), lse.view(), g.view(),
                        g.view(), g.view(), fast),
               "fp8_fast_accum: set, but q is bf16");
}

TEST(Fp8Errors, KvCacheArguments) {
  HostTensor q(DType::bf16, {1, 1, 4, 64}), out(DType::bf16, {1, 1, 4, 64}),
      cache(DType::fp8_e4m3, {1, 16, 2, 64}), cache_b(DType::bf16, {1, 16, 2, 64}),
      q8(DType::fp8_e4m3, {1, 1, 4, 64}), lens(DType::int32, {1});
  const KVCacheTensors ok{q.view(), cache.view(), cache.view(), lens.view(), out.view()};
  EXPECT_NO_THROW(attention_with_kvcache(ok, {}));
  EXPECT_ERROR(attention_with_kvcache({q.view(), cache.view(), cache_b.view(), lens.view(), out.view()}, {}),
               "v_cache: expected dtype fp8_e4m3 (same as k_cache), got bf16");
  EXPECT_ERROR(attention_with_kvcache({q8.view(), cache.view(), cache.view(), lens.view(), out.view()}, {}),
               "q: dtype fp8_e4m3 is not supported for the KV cache's queries");
  HostTensor s(DType::fp32, {1});
  const TensorView sv = s.view();
  AttentionOptions o;
  o.descale.q = &sv;
  EXPECT_ERROR(attention_with_kvcache(ok, o), "q_descale: given, but q is bf16");
  o.descale.q = nullptr;
  o.descale.k = &sv;
  EXPECT_ERROR(attention_with_kvcache({q.view(), cache_b.view(), cache_b.view(), lens.view(), out.view()}, o),
               "k_descale: given, but k_cache is bf16");
  AttentionOptions fast;
  fast.fp8_fast_accum = true;
  EXPECT_ERROR(attention_with_kvcache(ok, fast), "fp8_fast_accum: set, but the KV cache takes 16-bit q");
}

}  // namespace
}  // namespace flashcpp::test
