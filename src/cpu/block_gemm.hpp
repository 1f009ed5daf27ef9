#pragma once
// Block products of the tiled CPU backend: C = alpha * op(A) * op(B) + beta * C on row-major
// fp32 matrices with leading dimensions (so blocks of strided tensors are used in place).
// AVX-512 microkernels where the CPU has them (block_gemm_avx512.cpp); otherwise OpenBLAS when
// built with FLASHCPP_WITH_CBLAS, plain loops without it.
#include <cstdint>

namespace flashcpp::detail::cpu {

enum class Op : bool { none, transpose };

void block_gemm(Op op_a, Op op_b, int m, int n, int k, float alpha, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                std::int64_t ldc);

// Holds the BLAS single-threaded while block_gemm runs inside an OpenMP region (the threads
// come from OpenMP, so the BLAS must not start its own). OpenBLAS keeps one process-wide
// thread count: the first of overlapping holders saves it and sets 1, the last puts it back,
// so a host program's own BLAS calls keep their threads outside flashcpp calls. Where
// block_gemm runs on AVX-512 it touches nothing.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  bool held_;
};

// "openblas" or "loops".
const char* block_gemm_name();

}  // namespace flashcpp::detail::cpu
