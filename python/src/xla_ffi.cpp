// The JAX binding's native half: XLA FFI handlers for the forward (out, lse) and the backward
// (dq, dk, dv), padded and varlen, on XLA's CPU platform and, in a CUDA build, its CUDA
// platform.
//
// XLA hands a handler dense row-major buffers, its stream (CUDA) and the attributes that
// flashcpp/jax.py put into the call; the handler views the buffers as flashcpp::TensorView and
// calls the same C++ API as the DLPack entry points. Scratch memory is one more output buffer
// that XLA allocates with the others, sized at trace time (xla_workspace_size): a handler
// allocates nothing and never waits for the device.
#include "xla_ffi.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashcpp/flashcpp.hpp"
#include "options.hpp"
#include "xla/ffi/api/ffi.h"

#ifdef FLASHCPP_PY_WITH_CUDART
#include <cuda_runtime_api.h>
#endif

namespace nb = nanobind;
namespace ffi = xla::ffi;
using flashcpp::DType;
using flashcpp::TensorView;

namespace flashcpp_python {
namespace {

// The call's attributes (jax.py: _ffi_attributes), by name. softmax_scale is read only when
// has_softmax_scale (an FFI attribute cannot be None).
struct AttentionAttrs {
  bool causal;
  bool has_softmax_scale;
  float softmax_scale;
  std::int32_t window_left;
  std::int32_t window_right;
  float softcap;
  std::string_view backend;
  std::int32_t num_splits;
  bool deterministic;
};

// A varlen call's attributes: the same options and the bounds of the sequence lengths.
struct VarlenAttrs {
  bool causal;
  bool has_softmax_scale;
  float softmax_scale;
  std::int32_t window_left;
  std::int32_t window_right;
  float softcap;
  std::string_view backend;
  std::int32_t num_splits;
  bool deterministic;
  std::int32_t max_seqlen_q;
  std::int32_t max_seqlen_k;
};

}  // namespace
}  // namespace flashcpp_python

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    flashcpp_python::VarlenAttrs, ::xla::ffi::StructMember<bool>("causal"),
    ::xla::ffi::StructMember<bool>("has_softmax_scale"),
    ::xla::ffi::StructMember<float>("softmax_scale"),
    ::xla::ffi::StructMember<std::int32_t>("window_left"),
    ::xla::ffi::StructMember<std::int32_t>("window_right"),
    ::xla::ffi::StructMember<float>("softcap"),
    ::xla::ffi::StructMember<std::string_view>("backend"),
    ::xla::ffi::StructMember<std::int32_t>("num_splits"),
    ::xla::ffi::StructMember<bool>("deterministic"),
    ::xla::ffi::StructMember<std::int32_t>("max_seqlen_q"),
    ::xla::ffi::StructMember<std::int32_t>("max_seqlen_k"));

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    flashcpp_python::AttentionAttrs, ::xla::ffi::StructMember<bool>("causal"),
    ::xla::ffi::StructMember<bool>("has_softmax_scale"),
    ::xla::ffi::StructMember<float>("softmax_scale"),
    ::xla::ffi::StructMember<std::int32_t>("window_left"),
    ::xla::ffi::StructMember<std::int32_t>("window_right"),
    ::xla::ffi::StructMember<float>("softcap"),
    ::xla::ffi::StructMember<std::string_view>("backend"),
    ::xla::ffi::StructMember<std::int32_t>("num_splits"),
    ::xla::ffi::StructMember<bool>("deterministic"));

namespace flashcpp_python {
namespace {

template <class Attrs>
flashcpp::AttentionOptions options_of(const Attrs& a) {
  return make_options(a.causal,
                      a.has_softmax_scale ? std::optional<float>(a.softmax_scale) : std::nullopt,
                      a.window_left, a.window_right, a.softcap, a.backend, a.num_splits,
                      a.deterministic);
}

DType dtype_of(ffi::DataType type, const char* name) {
  switch (type) {
    case ffi::DataType::F32: return DType::fp32;
    case ffi::DataType::F16: return DType::fp16;
    case ffi::DataType::BF16: return DType::bf16;
    case ffi::DataType::S32: return DType::int32;  // cu_seqlens (the library checks roles)
    default:
      throw flashcpp::Error(std::string(name) + ": XLA element type " +
                            std::to_string(static_cast<int>(type)) +
                            " is not supported (supported: float32, float16, bfloat16; int32 "
                            "for cu_seqlens)");
  }
}

// A view of a dense row-major buffer of `rank` dimensions ([B, N, H, D] or lse's [B, H, N]).
// jax.vmap (vmap_method "broadcast_all") prepends its dimensions to every buffer of the call;
// in row-major memory they and B make one larger batch, so they fold into dimension 0.
TensorView view_of(const ffi::AnyBuffer& buffer, int rank, const char* name,
                   flashcpp::Device device) {
  const auto dims = buffer.dimensions();
  const int given = static_cast<int>(dims.size());
  if (given < rank)
    throw flashcpp::Error(std::string(name) + ": expected " + std::to_string(rank) +
                          " dimensions, got " + std::to_string(given));
  TensorView view;
  view.data = buffer.untyped_data();
  view.dtype = dtype_of(buffer.element_type(), name);
  view.device = device;
  view.rank = rank;
  const int folded = given - rank;
  view.shape[0] = 1;
  for (int d = 0; d <= folded; ++d) view.shape[0] *= dims[d];
  for (int d = 1; d < rank; ++d) view.shape[d] = dims[folded + d];
  std::int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    view.stride[d] = stride;
    stride *= view.shape[d];
  }
  return view;
}

flashcpp::Workspace workspace_of(const ffi::AnyBuffer& buffer) {
  if (buffer.size_bytes() == 0) return {};
  return {buffer.untyped_data(), buffer.size_bytes()};
}

// Where a handler's buffers live, and the stream it runs on (none on the host).
struct Place {
  flashcpp::Device device;
  flashcpp::Stream stream;
};

// flashcpp::Error (a bad argument, a request no kernel serves) becomes INVALID_ARGUMENT, which
// JAX raises with the message; anything else is INTERNAL.
template <class Body>
ffi::Error guarded(Body&& body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const flashcpp::Error& e) {
    return ffi::Error::InvalidArgument(std::string("flashcpp: ") + e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("flashcpp: ") + e.what());
  }
}

ffi::Error forward(Place place, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                   ffi::Result<ffi::AnyBuffer> workspace, const AttentionAttrs& attrs) {
  return guarded([&] {
    const TensorView lse_view = view_of(*lse, 3, "lse", place.device);
    flashcpp::forward(view_of(q, 4, "q", place.device), view_of(k, 4, "k", place.device),
                      view_of(v, 4, "v", place.device), view_of(*out, 4, "out", place.device),
                      &lse_view, options_of(attrs), place.stream, workspace_of(*workspace));
  });
}

ffi::Error backward(Place place, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                    ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                    ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                    ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> workspace,
                    const AttentionAttrs& attrs) {
  return guarded([&] {
    const flashcpp::Device d = place.device;
    flashcpp::backward(view_of(q, 4, "q", d), view_of(k, 4, "k", d), view_of(v, 4, "v", d),
                       view_of(out, 4, "out", d), view_of(dout, 4, "dout", d),
                       view_of(lse, 3, "lse", d), view_of(*dq, 4, "dq", d),
                       view_of(*dk, 4, "dk", d), view_of(*dv, 4, "dv", d), options_of(attrs),
                       place.stream, workspace_of(*workspace));
  });
}

// Varlen: out, lse, dq, dk, dv arrive zero-filled (lse -inf) through input/output aliasing, as
// the library leaves the rows past cu_seqlens[B] unwritten on CUDA (docs/semantics.md).
ffi::Error forward_varlen(Place place, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                          ffi::AnyBuffer cu_seqlens_q, ffi::AnyBuffer cu_seqlens_k,
                          ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                          ffi::Result<ffi::AnyBuffer> workspace, const VarlenAttrs& attrs) {
  return guarded([&] {
    const flashcpp::Device d = place.device;
    const TensorView lse_view = view_of(*lse, 2, "lse", d);
    flashcpp::forward_varlen(view_of(q, 3, "q", d), view_of(k, 3, "k", d), view_of(v, 3, "v", d),
                             view_of(*out, 3, "out", d), &lse_view,
                             view_of(cu_seqlens_q, 1, "cu_seqlens_q", d),
                             view_of(cu_seqlens_k, 1, "cu_seqlens_k", d), attrs.max_seqlen_q,
                             attrs.max_seqlen_k, options_of(attrs), place.stream,
                             workspace_of(*workspace));
  });
}

ffi::Error backward_varlen(Place place, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                           ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                           ffi::AnyBuffer cu_seqlens_q, ffi::AnyBuffer cu_seqlens_k,
                           ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                           ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> workspace,
                           const VarlenAttrs& attrs) {
  return guarded([&] {
    const flashcpp::Device d = place.device;
    flashcpp::backward_varlen(
        view_of(q, 3, "q", d), view_of(k, 3, "k", d), view_of(v, 3, "v", d),
        view_of(out, 3, "out", d), view_of(dout, 3, "dout", d), view_of(lse, 2, "lse", d),
        view_of(*dq, 3, "dq", d), view_of(*dk, 3, "dk", d), view_of(*dv, 3, "dv", d),
        view_of(cu_seqlens_q, 1, "cu_seqlens_q", d), view_of(cu_seqlens_k, 1, "cu_seqlens_k", d),
        attrs.max_seqlen_q, attrs.max_seqlen_k, options_of(attrs), place.stream,
        workspace_of(*workspace));
  });
}

// Bindings: arguments and results in the order jax.py passes them, then the attributes.
auto forward_binding() {
  return ffi::Ffi::Bind()
      .Arg<ffi::AnyBuffer>()  // q
      .Arg<ffi::AnyBuffer>()  // k
      .Arg<ffi::AnyBuffer>()  // v
      .Ret<ffi::AnyBuffer>()  // out
      .Ret<ffi::AnyBuffer>()  // lse
      .Ret<ffi::AnyBuffer>()  // workspace (uint8)
      .Attrs<AttentionAttrs>();
}

auto backward_binding() {
  return ffi::Ffi::Bind()
      .Arg<ffi::AnyBuffer>()  // dout
      .Arg<ffi::AnyBuffer>()  // q
      .Arg<ffi::AnyBuffer>()  // k
      .Arg<ffi::AnyBuffer>()  // v
      .Arg<ffi::AnyBuffer>()  // out
      .Arg<ffi::AnyBuffer>()  // lse
      .Ret<ffi::AnyBuffer>()  // dq
      .Ret<ffi::AnyBuffer>()  // dk
      .Ret<ffi::AnyBuffer>()  // dv
      .Ret<ffi::AnyBuffer>()  // workspace (uint8)
      .Attrs<AttentionAttrs>();
}

// Varlen: the zero-filled initial outputs are arguments too (aliased to the results).
auto forward_varlen_binding() {
  return ffi::Ffi::Bind()
      .Arg<ffi::AnyBuffer>()  // q
      .Arg<ffi::AnyBuffer>()  // k
      .Arg<ffi::AnyBuffer>()  // v
      .Arg<ffi::AnyBuffer>()  // cu_seqlens_q
      .Arg<ffi::AnyBuffer>()  // cu_seqlens_k
      .Arg<ffi::AnyBuffer>()  // out's zeros (aliased to out)
      .Arg<ffi::AnyBuffer>()  // lse's -inf (aliased to lse)
      .Ret<ffi::AnyBuffer>()  // out
      .Ret<ffi::AnyBuffer>()  // lse
      .Ret<ffi::AnyBuffer>()  // workspace (uint8)
      .Attrs<VarlenAttrs>();
}

auto backward_varlen_binding() {
  return ffi::Ffi::Bind()
      .Arg<ffi::AnyBuffer>()  // dout
      .Arg<ffi::AnyBuffer>()  // q
      .Arg<ffi::AnyBuffer>()  // k
      .Arg<ffi::AnyBuffer>()  // v
      .Arg<ffi::AnyBuffer>()  // out
      .Arg<ffi::AnyBuffer>()  // lse
      .Arg<ffi::AnyBuffer>()  // cu_seqlens_q
      .Arg<ffi::AnyBuffer>()  // cu_seqlens_k
      .Arg<ffi::AnyBuffer>()  // dq's zeros (aliased to dq)
      .Arg<ffi::AnyBuffer>()  // dk's zeros
      .Arg<ffi::AnyBuffer>()  // dv's zeros
      .Ret<ffi::AnyBuffer>()  // dq
      .Ret<ffi::AnyBuffer>()  // dk
      .Ret<ffi::AnyBuffer>()  // dv
      .Ret<ffi::AnyBuffer>()  // workspace (uint8)
      .Attrs<VarlenAttrs>();
}

constexpr Place kHost{flashcpp::Device::cpu(), nullptr};

XLA_FFI_DEFINE_HANDLER(forward_cpu,
                       ([](ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                           ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                           ffi::Result<ffi::AnyBuffer> ws, AttentionAttrs attrs) {
                         return forward(kHost, q, k, v, out, lse, ws, attrs);
                       }),
                       forward_binding());

XLA_FFI_DEFINE_HANDLER(backward_cpu,
                       ([](ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                           ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                           ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                           ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> ws,
                           AttentionAttrs attrs) {
                         return backward(kHost, dout, q, k, v, out, lse, dq, dk, dv, ws, attrs);
                       }),
                       backward_binding());

XLA_FFI_DEFINE_HANDLER(forward_varlen_cpu,
                       ([](ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                           ffi::AnyBuffer cu_q, ffi::AnyBuffer cu_k, ffi::AnyBuffer,
                           ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer> out,
                           ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> ws,
                           VarlenAttrs attrs) {
                         return forward_varlen(kHost, q, k, v, cu_q, cu_k, out, lse, ws, attrs);
                       }),
                       forward_varlen_binding());

XLA_FFI_DEFINE_HANDLER(backward_varlen_cpu,
                       ([](ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                           ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                           ffi::AnyBuffer cu_q, ffi::AnyBuffer cu_k, ffi::AnyBuffer,
                           ffi::AnyBuffer, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer> dq,
                           ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                           ffi::Result<ffi::AnyBuffer> ws, VarlenAttrs attrs) {
                         return backward_varlen(kHost, dout, q, k, v, out, lse, cu_q, cu_k, dq,
                                                dk, dv, ws, attrs);
                       }),
                       backward_varlen_binding());

#ifdef FLASHCPP_PY_WITH_CUDART
// The CUDA device that holds a buffer XLA passed (the device of the call): a host-side query,
// no synchronisation.
flashcpp::Device device_holding(const void* pointer) {
  cudaPointerAttributes attributes{};
  if (pointer == nullptr || cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();  // clear the error of a failed query
    int current = 0;
    cudaGetDevice(&current);
    return flashcpp::Device::cuda(current);
  }
  return flashcpp::Device::cuda(attributes.device);
}

XLA_FFI_DEFINE_HANDLER(forward_cuda,
                       ([](flashcpp::Stream stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                           ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> out,
                           ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> ws,
                           AttentionAttrs attrs) {
                         const Place place{device_holding(q.untyped_data()), stream};
                         return forward(place, q, k, v, out, lse, ws, attrs);
                       }),
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<flashcpp::Stream>>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attrs<AttentionAttrs>());

XLA_FFI_DEFINE_HANDLER(backward_cuda,
                       ([](flashcpp::Stream stream, ffi::AnyBuffer dout, ffi::AnyBuffer q,
                           ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                           ffi::AnyBuffer lse, ffi::Result<ffi::AnyBuffer> dq,
                           ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                           ffi::Result<ffi::AnyBuffer> ws, AttentionAttrs attrs) {
                         const Place place{device_holding(q.untyped_data()), stream};
                         return backward(place, dout, q, k, v, out, lse, dq, dk, dv, ws, attrs);
                       }),
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<flashcpp::Stream>>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attrs<AttentionAttrs>());
XLA_FFI_DEFINE_HANDLER(forward_varlen_cuda,
                       ([](flashcpp::Stream stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                           ffi::AnyBuffer v, ffi::AnyBuffer cu_q, ffi::AnyBuffer cu_k,
                           ffi::AnyBuffer, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer> out,
                           ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> ws,
                           VarlenAttrs attrs) {
                         const Place place{device_holding(q.untyped_data()), stream};
                         return forward_varlen(place, q, k, v, cu_q, cu_k, out, lse, ws, attrs);
                       }),
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<flashcpp::Stream>>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attrs<VarlenAttrs>());

XLA_FFI_DEFINE_HANDLER(backward_varlen_cuda,
                       ([](flashcpp::Stream stream, ffi::AnyBuffer dout, ffi::AnyBuffer q,
                           ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                           ffi::AnyBuffer lse, ffi::AnyBuffer cu_q, ffi::AnyBuffer cu_k,
                           ffi::AnyBuffer, ffi::AnyBuffer, ffi::AnyBuffer,
                           ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                           ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> ws,
                           VarlenAttrs attrs) {
                         const Place place{device_holding(q.untyped_data()), stream};
                         return backward_varlen(place, dout, q, k, v, out, lse, cu_q, cu_k, dq,
                                                dk, dv, ws, attrs);
                       }),
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<flashcpp::Stream>>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attrs<VarlenAttrs>());
#endif

nb::capsule capsule_of(XLA_FFI_Handler* handler) {
  return nb::capsule(reinterpret_cast<void*>(handler));
}

DType dtype_named(const std::string& name) {
  if (name == "float32") return DType::fp32;
  if (name == "float16") return DType::fp16;
  if (name == "bfloat16") return DType::bf16;
  throw flashcpp::Error("q: dtype " + name +
                        " is not supported (supported: float32, float16, bfloat16)");
}

// A dense CUDA view of `shape` for a workspace query: the query validates the call and reads
// no data, so the pointer only has to be non-null and aligned.
TensorView stand_in_view(DType dtype, const std::vector<std::int64_t>& shape, int device,
                         const char* name) {
  if (shape.empty() || shape.size() > static_cast<std::size_t>(TensorView::kMaxRank))
    throw flashcpp::Error(std::string(name) + ": expected 1 to 4 dimensions, got " +
                          std::to_string(shape.size()));
  TensorView view;
  view.data = reinterpret_cast<void*>(std::uintptr_t{256});
  view.dtype = dtype;
  view.device = flashcpp::Device::cuda(device);
  view.rank = static_cast<int>(shape.size());
  std::int64_t stride = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.shape[d] = shape[d];
    view.stride[d] = stride;
    stride *= shape[d];
  }
  return view;
}

std::size_t xla_workspace_size(bool for_backward, const std::string& dtype,
                               const std::vector<std::int64_t>& q_shape,
                               const std::vector<std::int64_t>& k_shape,
                               const std::vector<std::int64_t>& v_shape, int device,
                               std::int64_t batch, int max_seqlen_q, int max_seqlen_k, bool causal,
                               std::optional<float> softmax_scale, int window_left,
                               int window_right, float softcap, const std::string& backend,
                               int num_splits, bool deterministic) {
  const flashcpp::AttentionOptions options = make_options(
      causal, softmax_scale, window_left, window_right, softcap, backend, num_splits,
      deterministic);
  const DType type = dtype_named(dtype);
  const TensorView q = stand_in_view(type, q_shape, device, "q");
  const TensorView k = stand_in_view(type, k_shape, device, "k");
  const TensorView v = stand_in_view(type, v_shape, device, "v");
  if (batch < 0)
    return for_backward ? flashcpp::backward_workspace_size(q, k, v, options)
                        : flashcpp::forward_workspace_size(q, k, v, options);
  const TensorView cu_q = stand_in_view(DType::int32, {batch + 1}, device, "cu_seqlens_q");
  const TensorView cu_k = stand_in_view(DType::int32, {batch + 1}, device, "cu_seqlens_k");
  return for_backward
             ? flashcpp::backward_varlen_workspace_size(q, k, v, cu_q, cu_k, max_seqlen_q,
                                                        max_seqlen_k, options)
             : flashcpp::forward_varlen_workspace_size(q, k, v, cu_q, cu_k, max_seqlen_q,
                                                       max_seqlen_k, options);
}

}  // namespace

void define_xla_ffi(nb::module_& m) {
  // XLA refuses handlers built against a newer FFI API than its own (and then cannot start its
  // backend at all): jax.py compares this with the running jaxlib's before registering.
  m.attr("xla_ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  m.def(
      "xla_ffi_targets",
      [] {
        nb::dict targets, forward_platforms, backward_platforms;
        forward_platforms["cpu"] = capsule_of(forward_cpu);
        backward_platforms["cpu"] = capsule_of(backward_cpu);
#ifdef FLASHCPP_PY_WITH_CUDART
        forward_platforms["CUDA"] = capsule_of(forward_cuda);
        backward_platforms["CUDA"] = capsule_of(backward_cuda);
#endif
        nb::dict varlen_forward_platforms, varlen_backward_platforms;
        varlen_forward_platforms["cpu"] = capsule_of(forward_varlen_cpu);
        varlen_backward_platforms["cpu"] = capsule_of(backward_varlen_cpu);
#ifdef FLASHCPP_PY_WITH_CUDART
        varlen_forward_platforms["CUDA"] = capsule_of(forward_varlen_cuda);
        varlen_backward_platforms["CUDA"] = capsule_of(backward_varlen_cuda);
#endif
        targets["flashcpp_attention_forward"] = forward_platforms;
        targets["flashcpp_attention_backward"] = backward_platforms;
        targets["flashcpp_attention_varlen_forward"] = varlen_forward_platforms;
        targets["flashcpp_attention_varlen_backward"] = varlen_backward_platforms;
        return targets;
      },
      "{XLA FFI target name: {platform: handler capsule}} for jax.ffi.register_ffi_target.");
  m.def("xla_workspace_size", &xla_workspace_size, nb::arg("for_backward"), nb::arg("dtype"),
        nb::arg("q_shape"), nb::arg("k_shape"), nb::arg("v_shape"), nb::arg("device"),
        nb::arg("batch") = -1, nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_k") = 0,
        nb::kw_only(), nb::arg("causal") = false, nb::arg("softmax_scale") = nb::none(),
        nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("softcap") = 0.0f,
        nb::arg("backend") = "auto", nb::arg("num_splits") = 0,
        nb::arg("deterministic") = false,
        "Scratch bytes of the CUDA call on CUDA device `device` with these dense shapes; a "
        "varlen call gives its batch (the sequences) and max_seqlen_q/k.");
}

}  // namespace flashcpp_python
