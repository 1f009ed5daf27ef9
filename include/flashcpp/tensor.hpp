#pragma once
// A non-owning tensor view: pointer, dtype, shape and int64 strides (in elements), device.
// The last dimension must have stride 1; every other stride is free, so BSHD and BHSD memory
// are both accepted without copies.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace flashcpp {

// fp8_e4m3: float8 e4m3 "fn" (torch.float8_e4m3fn: no infinities, largest finite 448), an
// input type of inference calls (docs/semantics.md, "FP8"); appended last to keep the values.
enum class DType : std::uint8_t { fp32, fp16, bf16, int32, int64, fp8_e4m3 };

const char* dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);

enum class DeviceType : std::uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA device ordinal; ignored for the CPU

  static constexpr Device cpu() { return {DeviceType::cpu, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  friend constexpr bool operator==(Device a, Device b) {
    return a.type == b.type && (a.type == DeviceType::cpu || a.index == b.index);
  }
};

std::string device_name(Device device);  // "cpu", "cuda:0"

struct TensorView {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::fp32;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> stride{};
  Device device{};

  // A view with the given shape and strides (one stride per dimension, at most kMaxRank
  // dimensions: anything else throws flashcpp::Error).
  static TensorView strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                            std::initializer_list<std::int64_t> stride, Device device = {});
  // A view of densely packed row-major memory.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               Device device = {});

  std::int64_t numel() const;
  bool empty() const { return numel() == 0; }
  std::string shape_string() const;  // "[2, 17, 8, 64]"
};

}  // namespace flashcpp
