// The sm90a FP8 forward with NaN in v (e4m3's only non-finite value) at keys some rows do not
// see: such a NaN must stay out of those rows. The harness (exact-P inputs, the reference, the
// run on the GPU): fp8_cuda_harness.hpp. Every test skips without a Hopper GPU or without the
// fp8_e4m3 sm90a forward in this build; a build without CUDA compiles none of them (the
// suite's CudaFp8Forward.NeedsCuda skip is fp8_cuda_test.cpp's).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fp8_cuda_harness.hpp"

namespace flashcpp::fp8_test {
namespace {

#ifdef FLASHCPP_TEST_WITH_CUDA

// ---- NaN in v (e4m3's only non-finite value) ---------------------------------------------------

// An element of v set to NaN: row of the padded [B * Nk] or packed varlen keys, kv head, and
// column (-1: every column of the row).
struct NanAt {
  int row, head, column = -1;
};

// Exact-P case `c` with NaN in v at `at` (codes and the reference's copy). A hidden key's P is
// 0, but the tensor cores' P V still multiplies it by the key's v: in the key blocks the mask
// cuts, the kernel must keep such a NaN out of the rows that do not see it
// (fwd_non_finite_v.hpp, from the pre-pass's NaN key bits). So: where the reference is NaN (a
// row that sees the key, at its NaN columns) out must be NaN; the rest of such a row NaN or
// within the exact-P bound (the kernel makes the whole row NaN in a cut block); every other row
// within that bound; lse as always (it does not depend on v). The case must hold rows of both
// kinds.
void check_nan_v(const Fp8Case& c, const std::vector<NanAt>& at) {
  SCOPED_TRACE(describe(c));
  Fp8Data d = make_data(c);
  for (const NanAt& a : at)
    for (int ch = 0; ch < c.D; ++ch)
      if (a.column < 0 || a.column == ch) {
        const std::int64_t i = (std::int64_t{a.row} * c.Hkv + a.head) * c.D + ch;
        d.v8.set(i, NAN);
        d.v32.set(i, NAN);
      }
  const Outputs got = run_gpu(c, d);
  if (::testing::Test::HasFatalFailure()) return;
  const Outputs ref = reference(c, d);
  std::int64_t nan_rows = 0, clean_rows = 0, bad = 0;
  std::string first_bad;
  for (std::int64_t r = 0; r < ref.out.numel() / c.D; ++r) {  // r = query row x Hq + head
    bool ref_nan = false;
    for (int ch = 0; ch < c.D; ++ch) ref_nan |= std::isnan(ref.out.get(r * c.D + ch));
    (ref_nan ? nan_rows : clean_rows) += 1;
    for (int ch = 0; ch < c.D; ++ch) {
      const double want = ref.out.get(r * c.D + ch), have = got.out.get(r * c.D + ch);
      const bool ok = std::isnan(want) ? std::isnan(have)
                                       : (ref_nan && std::isnan(have)) ||
                                             std::fabs(have - want) <= 0x1p-8 * std::fabs(want) + 1e-3;
      if (!ok && bad++ == 0)
        first_bad = "out query row " + std::to_string(r / c.Hq) + " head " + std::to_string(r % c.Hq) +
                    " column " + std::to_string(ch) + ": " + std::to_string(have) + ", reference " +
                    std::to_string(want);
    }
  }
  for (std::int64_t i = 0; i < ref.lse.numel(); ++i) {
    const double want = ref.lse.get(i), have = got.lse.get(i);
    const bool ok = std::isinf(want) && want < 0 ? std::isinf(have) && have < 0
                                                 : std::fabs(have - want) <= 1e-3;
    if (!ok && bad++ == 0)
      first_bad = "lse " + std::to_string(i) + ": " + std::to_string(have) + ", reference " + std::to_string(want);
  }
  EXPECT_EQ(bad, 0) << "first: " << first_bad;
  EXPECT_GT(nan_rows, 0) << "no row sees a NaN key: the case tests nothing";
  EXPECT_GT(clean_rows, 0);
}

// Seen failing before the pre-pass wrote NaN key bits: the FP8 forward multiplied a NaN v at a
// hidden key of a cut block by P = 0, so the rows of that block that do not see the key came
// out NaN. Causal diagonal blocks, window edges, the key blocks cut by the end of the keys,
// GQA, and all three head dims (d256 has key blocks of 96). NaN at whole rows of v, and at
// single elements (only that column of a seeing row must be NaN).
TEST(CudaFp8Forward, NanValuesAtHiddenKeys) {
  SKIP_WITHOUT_FP8_FORWARD();
  {
    // Causal, N 300 (blocks of 128): key 200 of batch 0 is in the diagonal block of rows
    // 128..255, of which rows 128..199 do not see it; key 5 in the first, rows 0..4.
    Fp8Case c;
    c.Nq = c.Nk = 300;
    c.causal = true;
    check_nan_v(c, {{200, 0}, {300 + 299, 1}, {5, 1}, {300 + 130, 0, 7}});
    c.D = 64;
    check_nan_v(c, {{200, 0}, {300 + 299, 1}, {5, 1}, {300 + 130, 0, 7}});
  }
  {
    // Window (40, 7): every block near the band's edges is cut.
    Fp8Case c;
    c.B = 1;
    c.Nq = c.Nk = 333;
    c.Hq = c.Hkv = 2;
    c.window_left = 40;
    c.window_right = 7;
    check_nan_v(c, {{100, 0}, {260, 1}, {64, 1, 3}});
    c.D = 256;
    check_nan_v(c, {{100, 0}, {260, 1}, {64, 1, 3}});
  }
  {
    // GQA 4:1, causal, N 273.
    Fp8Case c;
    c.B = 1;
    c.Nq = c.Nk = 273;
    c.Hq = 8;
    c.Hkv = 2;
    c.causal = true;
    check_nan_v(c, {{140, 1}, {272, 0}, {20, 0, 100}});
  }
  {
    // No mask but the end of the keys (300: the last block of 128 is cut): every row of the
    // query heads on kv head 0 sees keys 260 and 299; those on kv head 1 stay clean.
    Fp8Case c;
    c.B = 1;
    c.Nq = 64;
    c.Nk = 300;
    check_nan_v(c, {{260, 0}, {299, 0, 2}});
  }
}

// Varlen, causal: NaN at the first and last keys of packed sequences (the last key block of a
// sequence reaches past its end, into the next sequence's keys), inside them, with Nq != Nk.
TEST(CudaFp8Forward, NanValuesAtHiddenKeysVarlen) {
  SKIP_WITHOUT_FP8_FORWARD();
  Fp8Case c;
  c.causal = true;
  c.lq = {150, 77, 260};
  c.lk = {150, 77, 260};
  const std::vector<NanAt> at = {{149, 0}, {150, 1}, {150 + 76, 0}, {227 + 10, 1}, {227 + 200, 0, 0}};
  for (int d : {64, 128, 256}) {
    c.D = d;
    check_nan_v(c, at);
  }
  c.D = 128;
  c.lq = {50, 120, 1};
  c.lk = {200, 130, 40};
  check_nan_v(c, {{0, 0}, {199, 1}, {200, 0}, {200 + 129, 1, 9}, {330 + 39, 0}});
}

#endif

}  // namespace
}  // namespace flashcpp::fp8_test
