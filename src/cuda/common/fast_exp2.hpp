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

// exp2 on the FMA pipe, for the share of a softmax's exponentials that would otherwise queue
// on the MUFU unit (16 per clock per SM, as slow as the tensor cores at D 64 in 16-bit and at
// D 128 in FP8). x = r + f with r = round(x) and |f| <= 1/2 (the 1.5 * 2^23 shifter rounds x
// into the low mantissa bits of t), 2^f from a degree-3 polynomial with 2^0 = 1 exactly
// (relative error below 1.02e-4, fitted on [-1/2, 1/2]) and 2^r built from r's bits. Inputs
// are scores minus the row maximum (<= 0): below -127 the result is 0, as ex2 gives for
// -inf (the clamp keeps NaN, which then stays NaN through the product), and integer inputs
// give their power of 2 exactly.
__forceinline__ __device__ float exp2_on_fma(float x) {
  float xc;
  asm("max.NaN.f32 %0, %1, 0fC2FE0000;" : "=f"(xc) : "f"(x));  // max(x, -127)
  constexpr float kShifter = 12582912.f;                         // 1.5 * 2^23
  const float t = __fadd_rn(xc, kShifter);
  const float r = __fsub_rn(t, kShifter);
  const float f = __fsub_rn(xc, r);
  float p = __fmaf_rn(0x1.c2a1dcp-5f, f, 0x1.f00c3ap-3f);
  p = __fmaf_rn(p, f, 0x1.62f5fap-1f);
  p = __fmaf_rn(p, f, 1.f);
  // 2^r: r sits in t's low 9 bits (two's complement); at r = -127 the sum is +0.
  const float two_r = __int_as_float(static_cast<int>(__float_as_uint(t) << 23) + 0x3f800000);
  return p * two_r;
}

}  // namespace flashcpp::detail::cuda
