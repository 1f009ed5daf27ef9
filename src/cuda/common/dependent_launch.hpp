#pragma once
// Programmatic dependent launch (sm90+): a kernel launched with programmatic stream
// serialization may start before the kernel ahead of it in the stream has finished, once every
// CTA of that kernel has allowed it (or exited); it must wait for that kernel's results before
// reading them. The split-KV combine uses it so that its launch overlaps the main kernel's
// tail instead of following it. On older GPUs both calls compile to nothing, and so they do
// in the sm80 translation units' code for Hopper (compiled from compute_80 PTX): only sm90a
// code may be launched as a dependent that reads the results of the kernel ahead. A kernel
// launched without the attribute returns from the wait at once.

namespace flashcpp::detail::cuda {

// Called by the kernel ahead: its dependents may launch now.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Called by the dependent kernel before it reads what the kernel ahead wrote.
__device__ __forceinline__ void wait_for_kernel_ahead() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace flashcpp::detail::cuda
