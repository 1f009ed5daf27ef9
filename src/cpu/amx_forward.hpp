#pragma once
// The bf16 forward on AMX tiles, taken when the CPU has AMX-BF16 (and the OS grants the tile
// state), D and Dv are multiples of 32, and FLASHCPP_CPU_KERNEL is not "generic" or "avx512".
// docs/design/cpu_kernels.md explains the layout.
#include "common/params.hpp"

namespace flashcpp::detail::cpu {

bool amx_forward_usable(const ForwardParams& params);

// Same contract as tiled_forward.
void amx_forward(const ForwardParams& params);

}  // namespace flashcpp::detail::cpu
