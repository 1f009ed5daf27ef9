#pragma once
// block_gemm's AVX-512 implementation (block_gemm_avx512.cpp), which block_gemm takes where
// avx512_forward_usable() holds. Same contract as block_gemm.
#include <cstdint>

#include "cpu/block_gemm.hpp"

namespace flashcpp::detail::cpu {

void block_gemm_avx512(Op op_a, Op op_b, int m, int n, int k, float alpha, const float* a,
                       std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                       std::int64_t ldc);

}  // namespace flashcpp::detail::cpu
