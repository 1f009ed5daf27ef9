#pragma once
// Host side: a [batch, row, head, dim] tensor of the API (int64 element strides) as the
// (row, dim, head, batch) CuTe view a TMA descriptor is built from, with the real extents so
// that rows past the sequence and columns past the real head dim load as zeros (and stores
// past them are clipped). Shared by the sm90 launchers.
#include <cstdint>

#include <cute/tensor.hpp>

#include "common/params.hpp"

namespace flashcpp::detail::cuda::sm90 {

// A TMA descriptor needs every extent >= 1 (an empty key sequence loads nothing; its extent
// is raised to 1) and every stride a multiple of 16 bytes. A mode of extent 1 is never
// stepped, so its stride (callers may leave 0 or anything there) is replaced by the packed one.
inline std::int64_t tma_stride(std::int64_t stride, std::int64_t extent, std::int64_t packed) {
  return extent <= 1 ? packed : stride;
}

// Element is const for the tensors TMA loads (Q, K, V) and not for those it stores (O).
template <class Element>
auto gmem_view(Element* ptr, int rows, int dim, int heads, int batch, const Strides& s) {
  using namespace cute;
  rows = rows > 0 ? rows : 1;
  constexpr std::int64_t kPer16Bytes = 16 / sizeof(Element);  // TMA strides: 16-byte multiples
  const std::int64_t row =
      tma_stride(s.row, rows, (std::int64_t(dim) + kPer16Bytes - 1) / kPer16Bytes * kPer16Bytes);
  const std::int64_t head = tma_stride(s.head, heads, row * rows);
  const std::int64_t bat = tma_stride(s.batch, batch, head * heads);
  return make_tensor(make_gmem_ptr(ptr), make_shape(rows, dim, heads, batch),
                     make_stride(row, _1{}, head, bat));
}

}  // namespace flashcpp::detail::cuda::sm90
