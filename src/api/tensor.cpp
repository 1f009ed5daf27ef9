// TensorView helpers and names of the public enums.
#include <sstream>
#include <string>

#include "flashcpp/error.hpp"

#include "flashcpp/options.hpp"
#include "flashcpp/tensor.hpp"

namespace flashcpp {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::fp32: return "fp32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::fp8_e4m3: return "fp8_e4m3";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::fp32: return 4;
    case DType::fp16: return 2;
    case DType::bf16: return 2;
    case DType::int32: return 4;
    case DType::int64: return 8;
    case DType::fp8_e4m3: return 1;
  }
  return 0;
}

std::string device_name(Device device) {
  if (device.type == DeviceType::cpu) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::automatic: return "automatic";
    case Backend::cpu_reference: return "cpu_reference";
    case Backend::cpu: return "cpu";
    case Backend::cuda_sm80: return "cuda_sm80";
    case Backend::cuda_sm90: return "cuda_sm90";
  }
  return "unknown";
}

namespace {

TensorView with_shape(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                      Device device) {
  if (shape.size() > static_cast<std::size_t>(TensorView::kMaxRank))
    throw Error("TensorView: at most " + std::to_string(TensorView::kMaxRank) +
                " dimensions, got " + std::to_string(shape.size()));
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.rank = static_cast<int>(shape.size());
  int i = 0;
  for (auto extent : shape) view.shape[i++] = extent;
  return view;
}

}  // namespace

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               std::initializer_list<std::int64_t> stride, Device device) {
  TensorView view = with_shape(data, dtype, shape, device);
  if (stride.size() != shape.size())
    throw Error("TensorView::strided: " + std::to_string(stride.size()) + " strides for " +
                std::to_string(shape.size()) + " dimensions");
  int i = 0;
  for (auto s : stride) view.stride[i++] = s;
  return view;
}

TensorView TensorView::contiguous(void* data, DType dtype,
                                  std::initializer_list<std::int64_t> shape, Device device) {
  TensorView view = with_shape(data, dtype, shape, device);
  std::int64_t running = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.stride[d] = running;
    running *= view.shape[d];
  }
  return view;
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

std::string TensorView::shape_string() const {
  std::ostringstream out;
  out << '[';
  for (int d = 0; d < rank; ++d) out << (d ? ", " : "") << shape[d];
  out << ']';
  return out.str();
}

}  // namespace flashcpp
