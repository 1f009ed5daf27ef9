#pragma once
// Lets small helpers be shared by the CPU backend and CUDA kernels.
#if defined(__CUDACC__)
#define FLASHCPP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHCPP_HOST_DEVICE inline
#endif
