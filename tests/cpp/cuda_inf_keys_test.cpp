// Issue 23 on CUDA tensors, Inf in k: one element of k is +-Inf at a key some rows do not see.
// In the key blocks the mask cuts, dQ = dS K would multiply those rows' dS = 0 by the Inf
// (0 * Inf = NaN); the kernels must keep it out of them, softcap included (docs/semantics.md,
// "NaN and Inf in the inputs"). The gradients are compared with the float64 reference. Run under
// compute-sanitizer too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuda_harness.hpp"
#include "flashcpp/flashcpp.hpp"

namespace flashcpp {
namespace {

using namespace cuda_test;

#ifdef FLASHCPP_TEST_WITH_CUDA

// ---- Inf in one element of k, against the float64 reference -----------------------------------

// Where the reference gradient is finite the GPU's must be too, and within grad_bound of it
// (relative to the largest finite |ref|); where it is not, the GPU's must not be either; where
// `either(i)`, one may be finite and the other not. "as expected" or the first element that
// is not.
std::string compare_non_finite(const char* name, DType t, const std::vector<float>& x,
                               const std::vector<float>& ref,
                               const std::function<bool(std::int64_t)>& either) {
  double max_ref = 0;
  for (const float r : ref)
    if (std::isfinite(r)) max_ref = std::max(max_ref, double(std::fabs(r)));
  const double bound = grad_bound(t) * std::max(max_ref, 0.1);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::string at = std::string(name) + "[" + std::to_string(i) + "] = " +
                           std::to_string(x[i]) + ", reference " + std::to_string(ref[i]);
    const bool free = either(std::int64_t(i));
    if (std::isfinite(x[i]) != std::isfinite(ref[i])) {
      if (!free) return at;
    } else if (std::isfinite(x[i]) && std::fabs(double(x[i]) - ref[i]) > bound) {
      return at;
    }
  }
  return "as expected";
}

// One element of k (key `key`, kv head `head`, column `col`; rows of the packed tensor in
// varlen) is +-Inf. A row that sees it scores that key +-Inf (the sign of its q there): +Inf
// makes its lse NaN and its gradients NaN, -Inf gives the key weight 0. The rows that do not
// see it, in the blocks the mask cuts too, and the keys only finite rows see must match the
// reference. dq of a row that sees the key matches it but for column `col`: the reference adds
// nothing for a -Inf score, the kernels add 0 in the key blocks the mask cuts and IEEE's NaN
// (0 * Inf) in the others (with a softcap the reference has the NaN): either is accepted there.
void check_inf_key(BwdCase c, int key, int head, int col, float value) {
  c.k_values = {{(std::int64_t(key) * c.Hkv + head) * c.D + col, value}};  // B = 1 or packed
  SCOPED_TRACE(describe(c) + ", k[" + std::to_string(key) + ", " + std::to_string(head) + ", " +
               std::to_string(col) + "] = " + std::to_string(value));
  BwdResult r;
  run_built_case(c, r);
  if (r.not_built) return;
  expect_ran_on(c, r.info, "bwd_");
  // Whether (packed) row i sees the key: same sequence, inside the window (Nq = Nk in each).
  const auto sequence_begin = [](const std::vector<int>& lengths, int row) {
    int begin = 0;
    for (const int n : lengths) {
      if (row < begin + n) break;
      begin += n;
    }
    return begin;
  };
  const auto sees = [&](int i) {
    if (sequence_begin(c.seqlens_q, i) != sequence_begin(c.seqlens_k, key)) return false;
    const int right = c.causal ? 0 : c.wr;
    return (c.wl < 0 || key >= i - c.wl) && (right < 0 || key <= i + right);
  };
  const auto either = [&](std::int64_t i) {
    const std::int64_t d = i % c.D, hq = i / c.D % c.Hq, row = i / (std::int64_t(c.D) * c.Hq);
    return d == col && hq / (c.Hq / c.Hkv) == head && sees(int(row));
  };
  const auto never = [](std::int64_t) { return false; };
  EXPECT_EQ(compare_non_finite("dq", c.dtype, r.dq, r.ref_dq, either), "as expected");
  EXPECT_EQ(compare_non_finite("dk", c.dtype, r.dk, r.ref_dk, never), "as expected");
  EXPECT_EQ(compare_non_finite("dv", c.dtype, r.dv, r.ref_dv, never), "as expected");
}

class CudaInfKeys : public BackendSuite<backward_skip_reason> {
 protected:
  BwdCase base(int n, int hq, int hkv, int d) const {
    BwdCase c;
    c.backend = c.expect = GetParam();
    c.Nq = c.Nk = n;
    c.Hq = hq;
    c.Hkv = hkv;
    c.D = d;
    return c;
  }
};
INSTANTIATE_TEST_SUITE_P(, CudaInfKeys, kGpuBackends, backend_suffix);

// Seen failing on an H100 before the fix (the hidden rows' dq NaN in column `col`): causal,
// N 300, key 150 is hidden from rows 128..149 of the diagonal blocks; every head-dim layout of
// the sm90a backward (d64: K from registers, d128, d256: split by head dim).
TEST_P(CudaInfKeys, Causal) {
  for (const int d : {64, 128, 256})
    for (const bool deterministic : {false, true})
      for (const float value : {float(INFINITY), -float(INFINITY)}) {
        BwdCase c = base(300, 2, 2, d);
        c.causal = true;
        c.deterministic = deterministic;
        check_inf_key(c, 150, 0, 7, value);
      }
}

// Window (4, 4): key 20 is seen by rows 16..24 only; every key block is cut.
TEST_P(CudaInfKeys, Window) {
  for (const bool deterministic : {false, true})
    for (const float value : {float(INFINITY), -float(INFINITY)}) {
      BwdCase c = base(300, 2, 2, 128);
      c.wl = c.wr = 4;
      c.deterministic = deterministic;
      check_inf_key(c, 20, 0, 3, value);
      check_inf_key(c, 299, 1, 127, value);
    }
}

// Varlen, causal, sequences of 100, 150 and 70 rows: the Inf key is the second sequence's 11th
// (packed row 110, which the first sequence's last key block reaches into) or the third's
// (row 260, past the second's end).
TEST_P(CudaInfKeys, VarlenTails) {
  for (const bool deterministic : {false, true})
    for (const float value : {float(INFINITY), -float(INFINITY)}) {
      BwdCase c = base(1, 2, 2, 128);
      c.seqlens_q = c.seqlens_k = {100, 150, 70};
      c.causal = true;
      c.deterministic = deterministic;
      check_inf_key(c, 110, 0, 5, value);
      check_inf_key(c, 260, 1, 100, value);
    }
}

// GQA 2:1: the Inf key of kv head 0 is seen by query heads 0 and 1, causal.
TEST_P(CudaInfKeys, Gqa) {
  for (const bool deterministic : {false, true})
    for (const float value : {float(INFINITY), -float(INFINITY)}) {
      BwdCase c = base(300, 4, 2, 128);
      c.causal = true;
      c.deterministic = deterministic;
      check_inf_key(c, 150, 0, 7, value);
    }
}

// With a softcap an Inf k gives the rows that see it a finite score (c tanh(+-Inf) = +-c), in
// their lse. sm80 recomputes S from the true k and reads its Inf as 0 in the dQ product only;
// sm90a zeroes it in shared memory and recomputes that key's scores from k in global memory.
// Every head-dim layout of the sm90a backward, as in Causal.
TEST_P(CudaInfKeys, Softcap) {
  for (const int d : {64, 128, 256})
    for (const bool deterministic : {false, true})
      for (const float value : {float(INFINITY), -float(INFINITY)}) {
        BwdCase c = base(300, 2, 2, d);
        c.causal = true;
        c.softcap = 30.f;
        c.deterministic = deterministic;
        check_inf_key(c, 150, 0, 7, value);
      }
}

// The same through a window, with GQA 2:1 and a second Inf key near the end.
TEST_P(CudaInfKeys, SoftcapWindowGqa) {
  for (const float value : {float(INFINITY), -float(INFINITY)}) {
    BwdCase c = base(300, 4, 2, 128);
    c.wl = c.wr = 4;
    c.softcap = 30.f;
    check_inf_key(c, 20, 0, 3, value);
    check_inf_key(c, 299, 1, 127, value);
  }
}

#endif  // FLASHCPP_TEST_WITH_CUDA

}  // namespace
}  // namespace flashcpp
