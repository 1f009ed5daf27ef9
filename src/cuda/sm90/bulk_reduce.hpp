#pragma once
// Bulk (non-tensor) asynchronous reductions from shared to global memory, sm90: one thread
// hands the copy engine a contiguous shared-memory range that it adds element-wise into global
// memory, so many threads' fp32 partial sums cost one instruction instead of one atomic each.
// The operations join the issuing thread's bulk group: commit with cute::tma_store_arrive(),
// wait for the shared-memory reads with cute::tma_store_wait<N>() (then the buffer may be
// rewritten) and for completion with bulk_wait_all().
#include <cstdint>

#include <cute/arch/util.hpp>

namespace flashcpp::detail::cuda::sm90 {

// gmem[0, bytes / 4) += smem[0, bytes / 4); both 16-byte aligned, bytes a multiple of 16. The
// writes to smem must be fenced for the async proxy (fence_view_async_shared) and ordered
// before this call (a barrier) when other threads made them.
__forceinline__ __device__ void bulk_reduce_add(float* gmem, const float* smem,
                                                std::uint32_t bytes) {
  const std::uint32_t smem_addr = cute::cast_smem_ptr_to_uint(smem);
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               :
               : "l"(gmem), "r"(smem_addr), "r"(bytes)
               : "memory");
}

// Waits until every bulk operation this thread committed has completed (its global writes
// done), not only read its shared memory.
__forceinline__ __device__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

}  // namespace flashcpp::detail::cuda::sm90
