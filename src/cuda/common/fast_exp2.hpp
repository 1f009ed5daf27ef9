#pragma once
// The exp2 every kernel's softmax takes (forward and backward, sm80 and sm90a).

namespace flashcpp::detail::cuda {

// exp2 on the MUFU unit (ex2.approx.ftz): exp2f without fast-math adds denormal handling
// around it; the inputs here are <= 0 and results below 2^-126 do not matter next to the 1 of
// the row maximum.
__forceinline__ __device__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashcpp::detail::cuda
