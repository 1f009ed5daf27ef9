#pragma once
// Byte permutes of 32-bit words (PTX prmt), host and device, so the host tests check the same
// code the kernels run.
#include <cstdint>

#include "common/host_device.hpp"

namespace flashcpp::detail {

// Byte i of the result is byte (selector >> 4i) & 7 of the 8 bytes {x, y} (x's low byte is 0,
// y's is 4): CUDA's __byte_perm without the sign-replicating mode.
FLASHCPP_HOST_DEVICE std::uint32_t byte_perm(std::uint32_t x, std::uint32_t y, std::uint32_t selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, selector);
#else
  const std::uint64_t bytes = (std::uint64_t{y} << 32) | x;
  std::uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= std::uint32_t((bytes >> (8 * ((selector >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
#endif
}

}  // namespace flashcpp::detail
