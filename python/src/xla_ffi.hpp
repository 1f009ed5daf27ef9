#pragma once
// The XLA FFI half of the JAX binding (xla_ffi.cpp), compiled into flashcpp._C when CMake
// finds the XLA FFI headers that jaxlib ships (FLASHCPP_XLA_FFI).
#include <nanobind/nanobind.h>

namespace flashcpp_python {

// Adds to the module: xla_ffi_targets() -> {target name: {platform: handler capsule}}, for
// jax.ffi.register_ffi_target, and xla_workspace_size(...), the scratch bytes a CUDA call
// needs, asked at trace time.
void define_xla_ffi(nanobind::module_& m);

}  // namespace flashcpp_python
