// Configure-time probe (python/CMakeLists.txt): do these XLA FFI headers have what
// python/src/xla_ffi.cpp uses? Older jaxlib releases lack some of it; then the JAX binding is
// left out instead of failing the build.
#include <cstdint>
#include <string_view>

#include "xla/ffi/api/ffi.h"

struct CUstream_st;

namespace probe {
struct Attrs {
  bool flag;
  float number;
  std::int32_t count;
  std::string_view name;
};
}  // namespace probe

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(probe::Attrs, ::xla::ffi::StructMember<bool>("flag"),
                                      ::xla::ffi::StructMember<float>("number"),
                                      ::xla::ffi::StructMember<std::int32_t>("count"),
                                      ::xla::ffi::StructMember<std::string_view>("name"));

namespace probe {
namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER(handler,
                       ([](CUstream_st*, ffi::AnyBuffer in, ffi::Result<ffi::AnyBuffer> out,
                           Attrs attrs) {
                         if (in.size_bytes() != out->size_bytes() || !attrs.flag)
                           return ffi::Error::InvalidArgument("probe");
                         if (in.dimensions()[0] < 0 || in.element_type() != ffi::DataType::S32)
                           return ffi::Error::Internal("probe");
                         return ffi::Error::Success();
                       }),
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<CUstream_st*>>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attrs<Attrs>());
}  // namespace probe

int main() {
  XLA_FFI_Handler* handler = probe::handler;
  return handler != nullptr ? 0 : 1;
}
