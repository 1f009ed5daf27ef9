#pragma once
// The tiled forward with AVX-512 microkernels of its own (no BLAS), taken when the CPU has
// AVX-512 F/BW/DQ/VL (checked at run time; the library itself is built for the baseline ISA).
// docs/design/cpu_kernels.md explains the layout.
#include "common/params.hpp"

namespace flashcpp::detail::cpu {

// True when this CPU runs avx512_forward, and FLASHCPP_CPU_KERNEL is not "generic" (the
// variable forces the portable path, so tests can cover it on AVX-512 machines).
bool avx512_forward_usable();

// Same contract as tiled_forward (NaN and Inf need no separate bookkeeping here).
void avx512_forward(const ForwardParams& params);

}  // namespace flashcpp::detail::cpu
