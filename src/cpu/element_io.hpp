#pragma once
// Reading and writing fp32/fp16/bf16/fp8_e4m3 elements as float, so the compute code sees one
// type.
#include <cstdint>

#include "common/fp8.hpp"
#include "common/half.hpp"
#include "common/params.hpp"

namespace flashcpp::detail::cpu {

inline std::int64_t element_bytes(ElementType type) {
  return type == ElementType::fp32 ? 4 : type == ElementType::fp8_e4m3 ? 1 : 2;
}

inline float load_element(const void* base, ElementType type, std::int64_t index) {
  switch (type) {
    case ElementType::fp16:
      return fp16_to_float(static_cast<const std::uint16_t*>(base)[index]);
    case ElementType::bf16:
      return bf16_to_float(static_cast<const std::uint16_t*>(base)[index]);
    case ElementType::fp8_e4m3:
      return e4m3_to_float(static_cast<const std::uint8_t*>(base)[index]);
    case ElementType::fp32:
      break;
  }
  return static_cast<const float*>(base)[index];
}

inline void store_element(void* base, ElementType type, std::int64_t index, float value) {
  switch (type) {
    case ElementType::fp16:
      static_cast<std::uint16_t*>(base)[index] = float_to_fp16(value);
      return;
    case ElementType::bf16:
      static_cast<std::uint16_t*>(base)[index] = float_to_bf16(value);
      return;
    case ElementType::fp8_e4m3:
      static_cast<std::uint8_t*>(base)[index] = float_to_e4m3(value);
      return;
    case ElementType::fp32:
      break;
  }
  static_cast<float*>(base)[index] = value;
}

inline void load_row(const void* base, ElementType type, std::int64_t offset, int n, float* dst) {
  for (int i = 0; i < n; ++i) dst[i] = load_element(base, type, offset + i);
}

inline void store_row(void* base, ElementType type, std::int64_t offset, const float* src, int n) {
  for (int i = 0; i < n; ++i) store_element(base, type, offset + i, src[i]);
}

}  // namespace flashcpp::detail::cpu
