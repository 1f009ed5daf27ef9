#pragma once
// Register-fragment helpers for mma.sync m16n8k16 accumulators (CuTe layouts):
// re-viewing an accumulator as (row, col), re-viewing it as the A operand of the next product,
// converting its element type with packed instructions, and quad reductions.
#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace flashcpp::detail::cuda {

using namespace cute;

// C fragment ((2 cols, 2 rows), MMA_M, MMA_N) -> ((2 rows, MMA_M), (2 cols, MMA_N)): rows of
// the view are the accumulator rows this thread holds, so row reductions are plain loops.
template <class Layout>
__forceinline__ __device__ auto acc_rowcol(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3);
  static_assert(decltype(rank<0>(acc))::value == 2);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<2>(acc)));
}

// C fragment of S = Q K^T ((2,2), MMA_M, MMA_N) -> A fragment ((2,2,2), MMA_M, MMA_N/2) of
// O += P V: two neighbouring n8 accumulator tiles hold exactly the registers of one k16 A
// tile (a0..a3 from the first, a4..a7 from the second), so P never leaves registers.
template <class Layout>
__forceinline__ __device__ auto acc_as_a_operand(Layout acc) {
  auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});  // ((2,2),M,(2,N/2))
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

// Element-type conversion of a whole register fragment (cvt.rn.bf16x2.f32 / f16x2 pairs).
template <class To, class Engine, class Layout>
__forceinline__ __device__ auto convert_fragment(Tensor<Engine, Layout> const& src) {
  using From = typename Engine::value_type;
  constexpr int N = decltype(size(src))::value;
  cutlass::NumericArrayConverter<To, From, N> convert;
  auto converted = convert(*reinterpret_cast<const cutlass::Array<From, N>*>(src.data()));
  Tensor dst = make_tensor<To>(src.layout());
  *reinterpret_cast<cutlass::Array<To, N>*>(dst.data()) = converted;
  return dst;
}

// The four threads of a quad share accumulator rows (lanes 4r..4r+3).
__forceinline__ __device__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__forceinline__ __device__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flashcpp::detail::cuda
