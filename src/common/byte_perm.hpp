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

// The 4 x 4 byte matrix whose rows are r0..r3 (byte j of a row is column j), transposed in
// place: afterwards r_j holds column j, {r0.j, r1.j, r2.j, r3.j}. Eight permutes.
FLASHCPP_HOST_DEVICE void transpose_bytes_4x4(std::uint32_t& r0, std::uint32_t& r1, std::uint32_t& r2,
                                          std::uint32_t& r3) {
  const std::uint32_t t0 = byte_perm(r0, r1, 0x5140u);  // r0.0 r1.0 r0.1 r1.1
  const std::uint32_t t1 = byte_perm(r0, r1, 0x7362u);  // r0.2 r1.2 r0.3 r1.3
  const std::uint32_t t2 = byte_perm(r2, r3, 0x5140u);
  const std::uint32_t t3 = byte_perm(r2, r3, 0x7362u);
  r0 = byte_perm(t0, t2, 0x5410u);
  r1 = byte_perm(t0, t2, 0x7632u);
  r2 = byte_perm(t1, t3, 0x5410u);
  r3 = byte_perm(t1, t3, 0x7632u);
}

}  // namespace flashcpp::detail
