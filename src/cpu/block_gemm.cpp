#include "cpu/block_gemm.hpp"

#include "cpu/avx512_forward.hpp"
#include "cpu/block_gemm_avx512.hpp"

#include <algorithm>
#include <climits>

#ifdef FLASHCPP_WITH_CBLAS
#include <cblas.h>

#include <mutex>
#endif

namespace flashcpp::detail::cpu {
namespace {

// Plain loops; the inner loop runs over contiguous memory of C where possible so the
// compiler vectorises it.
void gemm_loops(Op op_a, Op op_b, int m, int n, int k, float alpha, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                std::int64_t ldc) {
  const auto a_at = [&](int i, int p) {
    return op_a == Op::none ? a[i * lda + p] : a[p * lda + i];
  };
  for (int i = 0; i < m; ++i) {
    float* c_row = c + i * ldc;
    for (int j = 0; j < n; ++j) c_row[j] = beta == 0.0f ? 0.0f : beta * c_row[j];
    if (op_b == Op::transpose) {  // C[i, j] += alpha * dot(A[i, :], B[j, :])
      for (int j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (int p = 0; p < k; ++p) sum += a_at(i, p) * b[j * ldb + p];
        c_row[j] += alpha * sum;
      }
    } else {  // C[i, :] += alpha * A[i, p] * B[p, :]
      for (int p = 0; p < k; ++p) {
        const float scaled = alpha * a_at(i, p);
        const float* b_row = b + p * ldb;
        for (int j = 0; j < n; ++j) c_row[j] += scaled * b_row[j];
      }
    }
  }
}

}  // namespace

#ifdef FLASHCPP_WITH_CBLAS

void block_gemm(Op op_a, Op op_b, int m, int n, int k, float alpha, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                std::int64_t ldc) {
  if (avx512_forward_usable()) {
    block_gemm_avx512(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // BLAS wants ints and leading dimensions of at least the row length; strided views can break
  // either (a one-row tensor may have any row stride, a broadcast one stride 0).
  const auto fits = [](std::int64_t ld, int row_length) {
    return ld >= std::max(row_length, 1) && ld <= INT_MAX;
  };
  if (!fits(lda, op_a == Op::none ? k : m) || !fits(ldb, op_b == Op::none ? n : k) ||
      !fits(ldc, n)) {
    gemm_loops(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const auto trans = [](Op op) { return op == Op::none ? CblasNoTrans : CblasTrans; };
  cblas_sgemm(CblasRowMajor, trans(op_a), trans(op_b), m, n, k, alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

namespace {
std::mutex blas_threads_mutex;
int blas_holders = 0;       // SingleThreadedBlas objects alive, over all threads
int blas_saved_threads = 1; // the count before the first of them
}  // namespace

SingleThreadedBlas::SingleThreadedBlas() : held_(!avx512_forward_usable()) {
  if (!held_) return;  // block_gemm does not call the BLAS: leave its thread count alone
  const std::lock_guard<std::mutex> lock(blas_threads_mutex);
  if (blas_holders++ > 0) return;
  blas_saved_threads = openblas_get_num_threads();
  if (blas_saved_threads != 1) openblas_set_num_threads(1);
}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (!held_) return;
  const std::lock_guard<std::mutex> lock(blas_threads_mutex);
  if (--blas_holders == 0 && blas_saved_threads != 1) openblas_set_num_threads(blas_saved_threads);
}

const char* block_gemm_name() { return "openblas"; }

#else

void block_gemm(Op op_a, Op op_b, int m, int n, int k, float alpha, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                std::int64_t ldc) {
  if (avx512_forward_usable()) {
    block_gemm_avx512(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  gemm_loops(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

SingleThreadedBlas::SingleThreadedBlas() : held_(false) {}
SingleThreadedBlas::~SingleThreadedBlas() = default;

const char* block_gemm_name() { return "loops"; }

#endif

}  // namespace flashcpp::detail::cpu
