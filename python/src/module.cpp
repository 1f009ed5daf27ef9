// flashcpp._C: the native half of the Python package.
//
// It turns framework tensors into flashcpp::TensorView (DLPack and the buffer protocol through
// nb::ndarray, __cuda_array_interface__ by hand) and calls the public C++ API. It allocates
// nothing: the Python layer allocates outputs and workspace with the caller's framework and
// passes them here, so PyTorch's caching allocator (and CUDA graph pools) own every byte.
// flashcpp::Error becomes flashcpp.Error, a ValueError; a Python value of the wrong kind
// becomes TypeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <tuple>

#include "flashcpp/flashcpp.hpp"
#include "options.hpp"

#ifdef FLASHCPP_PY_WITH_CUDART
#include <cuda_runtime_api.h>
#endif
#ifdef FLASHCPP_PY_WITH_XLA_FFI
#include "xla_ffi.hpp"
#endif

namespace nb = nanobind;
using flashcpp::AttentionOptions;
using flashcpp::DType;
using flashcpp::TensorView;
using flashcpp_python::make_options;

namespace {

using RunInfoTuple = std::tuple<std::string, std::string, int>;

// Keeps the imported arrays (and so the DLPack capsules' owners) alive during one call.
struct Imports {
  std::deque<nb::ndarray<nb::ro>> read_only;
  std::deque<nb::ndarray<>> writable;
};

[[noreturn]] void type_error(const std::string& message) { throw nb::type_error(message.c_str()); }

std::string python_type_name(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

std::string dlpack_dtype_name(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  std::string base;
  switch (static_cast<Code>(t.code)) {
    case Code::Int: base = "int"; break;
    case Code::UInt: base = "uint"; break;
    case Code::Float: base = "float"; break;
    case Code::Bfloat: base = "bfloat"; break;
    case Code::Complex: base = "complex"; break;
    case Code::Bool: return "bool";
    case Code::Float8_E4M3FN: return "float8_e4m3fn";
    default: base = "dlpack_code" + std::to_string(t.code) + "_"; break;
  }
  std::string name = base + std::to_string(t.bits);
  if (t.lanes != 1) name += "x" + std::to_string(t.lanes);
  return name;
}

// How an argument is read: values (q, k, ...) or indices (cache_seqlens, block_table). An index
// argument maps int64 to DType::int64, so the C++ validation names the dtype it wants; the
// attention inputs keep refusing int64 here.
enum class Role { values, indices };

DType dtype_of(nb::dlpack::dtype t, const char* name, Role role) {
  using Code = nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == static_cast<uint8_t>(Code::Float) && t.bits == 32) return DType::fp32;
    if (t.code == static_cast<uint8_t>(Code::Float) && t.bits == 16) return DType::fp16;
    if (t.code == static_cast<uint8_t>(Code::Bfloat) && t.bits == 16) return DType::bf16;
    if (t.code == static_cast<uint8_t>(Code::Float8_E4M3FN) && t.bits == 8) return DType::fp8_e4m3;
    if (t.code == static_cast<uint8_t>(Code::Int) && t.bits == 32) return DType::int32;
    if (role == Role::indices && t.code == static_cast<uint8_t>(Code::Int) && t.bits == 64)
      return DType::int64;
  }
  type_error(std::string(name) + ": dtype " + dlpack_dtype_name(t) +
             " is not supported (supported: float32, float16, bfloat16, float8_e4m3fn; int32 for cu_seqlens, "
             "cache_seqlens and block_table)");
}

flashcpp::Device device_of(int device_type, int device_id, const char* name) {
  switch (device_type) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:  // pinned host memory is host memory
      return flashcpp::Device::cpu();
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value:
      return flashcpp::Device::cuda(device_id);
    default:
      type_error(std::string(name) + ": DLPack device type " + std::to_string(device_type) +
                 " is not supported (supported: cpu, cuda)");
  }
}

void check_rank(std::size_t ndim, const char* name) {
  if (ndim > static_cast<std::size_t>(TensorView::kMaxRank))
    throw flashcpp::Error(std::string(name) + ": expected at most " +
                          std::to_string(TensorView::kMaxRank) + " dimensions, got " +
                          std::to_string(ndim));
}

template <typename Array>
TensorView view_of_ndarray(const Array& a, const char* name, Role role) {
  check_rank(a.ndim(), name);
  TensorView view;
  view.data = const_cast<void*>(static_cast<const void*>(a.data()));
  view.dtype = dtype_of(a.dtype(), name, role);
  view.device = device_of(a.device_type(), a.device_id(), name);
  view.rank = static_cast<int>(a.ndim());
  for (int d = 0; d < view.rank; ++d) {
    view.shape[d] = static_cast<std::int64_t>(a.shape(d));
    view.stride[d] = a.stride(d);
  }
  return view;
}

// __cuda_array_interface__ (version 2 or 3) for producers without DLPack, e.g. Numba.
// typestr is byte order ('<' little, '>' big, '|' not applicable), kind and size: CUDA devices
// are little-endian, so a big-endian array would be read as other numbers.
DType dtype_of_typestr(const std::string& typestr, const char* name, Role role) {
  if (typestr.size() < 2 || (typestr[0] != '<' && typestr[0] != '|' && typestr[0] != '='))
    type_error(std::string(name) + ": __cuda_array_interface__ typestr '" + typestr +
               "' is not supported (supported: <f4, <f2, <i4: little-endian)");
  const std::string kind = typestr.substr(1);
  if (kind == "f4") return DType::fp32;
  if (kind == "f2") return DType::fp16;
  if (kind == "i4") return DType::int32;
  if (role == Role::indices && kind == "i8") return DType::int64;
  type_error(std::string(name) + ": __cuda_array_interface__ typestr '" + typestr +
             "' is not supported (supported: <f4, <f2, <i4; pass bfloat16 through DLPack)");
}

// Entry `key` of an interface dict as T, or a TypeError naming the argument and the entry.
template <typename T>
T interface_entry(nb::dict cai, const char* key, const char* name, const char* expected) {
  T value;
  if (!cai.contains(key) || !nb::try_cast(cai[key], value))
    type_error(std::string(name) + ": __cuda_array_interface__ needs '" + key + "' as " +
               expected);
  return value;
}

TensorView view_of_cuda_array_interface(nb::handle obj, const char* name, bool writable,
                                        Role role) {
  nb::dict cai;
  if (!nb::try_cast(obj.attr("__cuda_array_interface__"), cai))
    type_error(std::string(name) + ": __cuda_array_interface__ must be a dict");
  const auto shape = interface_entry<nb::tuple>(cai, "shape", name, "a tuple of ints");
  check_rank(shape.size(), name);
  const auto data = interface_entry<nb::tuple>(cai, "data", name, "a tuple (pointer, read_only)");
  std::uintptr_t pointer = 0;
  bool read_only = false;
  if (data.size() != 2 || !nb::try_cast(data[0], pointer) || !nb::try_cast(data[1], read_only))
    type_error(std::string(name) + ": __cuda_array_interface__ needs 'data' as a tuple "
               "(pointer, read_only)");
  if (writable && read_only) throw flashcpp::Error(std::string(name) + ": array is read-only");
  TensorView view;
  view.data = reinterpret_cast<void*>(pointer);
  view.dtype =
      dtype_of_typestr(interface_entry<std::string>(cai, "typestr", name, "a str"), name, role);
  view.rank = static_cast<int>(shape.size());
  const auto item = static_cast<std::int64_t>(flashcpp::dtype_size(view.dtype));
  nb::object strides = cai.contains("strides") ? nb::borrow(cai["strides"]) : nb::none();
  std::int64_t running = 1;
  nb::tuple stride_tuple;
  if (!strides.is_none() &&
      (!nb::try_cast(strides, stride_tuple) || stride_tuple.size() != shape.size()))
    type_error(std::string(name) + ": __cuda_array_interface__ 'strides' must be None or a "
               "tuple of ints, one per dimension");
  for (int d = view.rank - 1; d >= 0; --d) {
    if (!nb::try_cast(shape[d], view.shape[d]))
      type_error(std::string(name) + ": __cuda_array_interface__ 'shape' must hold ints");
    if (strides.is_none()) {
      view.stride[d] = running;
      running *= view.shape[d];
    } else {
      std::int64_t bytes = 0;
      if (!nb::try_cast(stride_tuple[d], bytes))
        type_error(std::string(name) + ": __cuda_array_interface__ 'strides' must hold ints");
      if (bytes % item != 0)
        throw flashcpp::Error(std::string(name) + ": stride of dimension " + std::to_string(d) +
                              " (" + std::to_string(bytes) +
                              " bytes) is not a multiple of the element size");
      view.stride[d] = bytes / item;
    }
  }
  int device = 0;
#ifdef FLASHCPP_PY_WITH_CUDART
  cudaPointerAttributes attributes{};
  if (view.data != nullptr && cudaPointerGetAttributes(&attributes, view.data) == cudaSuccess)
    device = attributes.device;
  else
    cudaGetLastError();  // clear the sticky-free error of a failed query
#endif
  view.device = flashcpp::Device::cuda(device);
  return view;
}

// nanobind refuses an array (NumPy's buffer protocol) whose byte strides are not whole
// elements; say that, instead of "expected an array".
void check_whole_element_strides(nb::handle obj, const char* name) {
  nb::tuple strides;
  std::int64_t item = 0;
  if (!nb::hasattr(obj, "strides") || !nb::hasattr(obj, "itemsize") ||
      !nb::try_cast(obj.attr("strides"), strides) || !nb::try_cast(obj.attr("itemsize"), item) ||
      item <= 0)
    return;
  for (std::size_t d = 0; d < strides.size(); ++d) {
    std::int64_t bytes = 0;
    if (nb::try_cast(strides[d], bytes) && bytes % item != 0)
      throw flashcpp::Error(std::string(name) + ": stride of dimension " + std::to_string(d) +
                            " (" + std::to_string(bytes) +
                            " bytes) is not a multiple of the element size (" +
                            std::to_string(item) + " bytes)");
  }
}

TensorView view_of(nb::handle obj, const char* name, bool writable, Imports& keep,
                   Role role = Role::values) {
  if (obj.is_none()) type_error(std::string(name) + ": expected an array or tensor, got None");
  if (writable) {
    nb::ndarray<> array;
    if (nb::try_cast(obj, array, false)) {
      keep.writable.push_back(array);
      return view_of_ndarray(keep.writable.back(), name, role);
    }
  }
  nb::ndarray<nb::ro> array;
  if (nb::try_cast(obj, array, false)) {
    if (writable) throw flashcpp::Error(std::string(name) + ": array is read-only");
    keep.read_only.push_back(array);
    return view_of_ndarray(keep.read_only.back(), name, role);
  }
  if (nb::hasattr(obj, "__cuda_array_interface__"))
    return view_of_cuda_array_interface(obj, name, writable, role);
  check_whole_element_strides(obj, name);
  type_error(std::string(name) +
             ": expected an array or tensor (DLPack, buffer protocol or "
             "__cuda_array_interface__), got " +
             python_type_name(obj));
}

const TensorView* optional_view(nb::handle obj, const char* name, bool writable, Imports& keep,
                                TensorView& storage, Role role = Role::values) {
  if (obj.is_none()) return nullptr;
  storage = view_of(obj, name, writable, keep, role);
  return &storage;
}

// cu_seqlens_q and cu_seqlens_k: both for a varlen call, neither for a padded one.
class CuSeqlens {
 public:
  CuSeqlens(nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, Imports& keep)
      : q_(optional_view(cu_seqlens_q, "cu_seqlens_q", false, keep, q_storage_)),
        k_(optional_view(cu_seqlens_k, "cu_seqlens_k", false, keep, k_storage_)) {}
  CuSeqlens(const CuSeqlens&) = delete;  // q_ and k_ point into this object
  CuSeqlens& operator=(const CuSeqlens&) = delete;

  bool varlen() const {
    if ((q_ == nullptr) != (k_ == nullptr))
      throw flashcpp::Error("cu_seqlens_q and cu_seqlens_k must be given together");
    return q_ != nullptr;
  }
  const TensorView& q() const { return *q_; }
  const TensorView& k() const { return *k_; }

 private:
  TensorView q_storage_, k_storage_;
  const TensorView* q_;
  const TensorView* k_;
};

// q_descale, k_descale, v_descale (fp8 inputs; each may be None): set into the options, which
// then point into this object.
class DescaleViews {
 public:
  DescaleViews(nb::handle q, nb::handle k, nb::handle v, Imports& keep)
      : q_(optional_view(q, "q_descale", false, keep, q_storage_)),
        k_(optional_view(k, "k_descale", false, keep, k_storage_)),
        v_(optional_view(v, "v_descale", false, keep, v_storage_)) {}
  DescaleViews(const DescaleViews&) = delete;
  DescaleViews& operator=(const DescaleViews&) = delete;

  AttentionOptions applied(AttentionOptions options) const {
    options.descale = {q_, k_, v_};
    return options;
  }

 private:
  TensorView q_storage_, k_storage_, v_storage_;
  const TensorView* q_;
  const TensorView* k_;
  const TensorView* v_;
};

// The tensors of a KV-cache call. The caches are writable exactly when something is appended;
// the optional views point into this object.
class KVCacheCall {
 public:
  KVCacheCall(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle cache_seqlens,
              nb::handle out, nb::handle block_table, nb::handle k_new, nb::handle v_new,
              nb::handle lse, Imports& keep) {
    const bool appends = !k_new.is_none();
    t_.q = view_of(q, "q", false, keep);
    t_.k_cache = view_of(k_cache, "k_cache", appends, keep);
    t_.v_cache = view_of(v_cache, "v_cache", appends, keep);
    t_.cache_seqlens = view_of(cache_seqlens, "cache_seqlens", false, keep, Role::indices);
    t_.out = view_of(out, "out", true, keep);
    t_.block_table = optional_view(block_table, "block_table", false, keep, block_table_storage_,
                                   Role::indices);
    t_.k_new = optional_view(k_new, "k_new", false, keep, k_new_storage_);
    t_.v_new = optional_view(v_new, "v_new", false, keep, v_new_storage_);
    t_.lse = optional_view(lse, "lse", true, keep, lse_storage_);
  }
  KVCacheCall(const KVCacheCall&) = delete;
  KVCacheCall& operator=(const KVCacheCall&) = delete;

  const flashcpp::KVCacheTensors& tensors() const { return t_; }

 private:
  TensorView block_table_storage_, k_new_storage_, v_new_storage_, lse_storage_;
  flashcpp::KVCacheTensors t_;
};

// Scratch memory: any writable array (the Python layer passes uint8); only its bytes count.
flashcpp::Workspace workspace_of(nb::handle obj, Imports& keep) {
  if (obj.is_none()) return {};
  nb::ndarray<> array;
  if (!nb::try_cast(obj, array, false))
    type_error("workspace: expected a writable array or tensor, got " + python_type_name(obj));
  keep.writable.push_back(array);
  return {array.data(), array.nbytes()};
}

flashcpp::Stream stream_of(std::uintptr_t stream) {
  return reinterpret_cast<flashcpp::Stream>(stream);
}

RunInfoTuple to_tuple(const flashcpp::RunInfo& info) {
  return {flashcpp::backend_name(info.backend), info.kernel ? info.kernel : "", info.num_splits};
}

// The keyword arguments every entry point shares, in this order, after its tensors.
#define FLASHCPP_OPTION_ARGS                                                          \
  nb::kw_only(), nb::arg("causal") = false, nb::arg("softmax_scale") = nb::none(),   \
      nb::arg("window_left") = -1, nb::arg("window_right") = -1,                     \
      nb::arg("softcap") = 0.0f, nb::arg("backend") = "auto", nb::arg("num_splits") = 0, \
      nb::arg("deterministic") = false

RunInfoTuple forward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
                     nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int max_seqlen_q,
                     int max_seqlen_k, bool causal, std::optional<float> softmax_scale,
                     int window_left, int window_right, float softcap, const std::string& backend,
                     int num_splits, bool deterministic, std::uintptr_t stream,
                     nb::handle workspace, nb::handle q_descale, nb::handle k_descale,
                     nb::handle v_descale, bool fp8_fast_accum) {
  Imports keep;
  const DescaleViews descales(q_descale, k_descale, v_descale, keep);
  AttentionOptions options = descales.applied(make_options(
      causal, softmax_scale, window_left, window_right, softcap, backend, num_splits, deterministic));
  options.fp8_fast_accum = fp8_fast_accum;
  const TensorView qv = view_of(q, "q", false, keep);
  const TensorView kv = view_of(k, "k", false, keep);
  const TensorView vv = view_of(v, "v", false, keep);
  const TensorView ov = view_of(out, "out", true, keep);
  TensorView lse_storage;
  const TensorView* lv = optional_view(lse, "lse", true, keep, lse_storage);
  const CuSeqlens cu(cu_seqlens_q, cu_seqlens_k, keep);
  const flashcpp::Workspace ws = workspace_of(workspace, keep);
  flashcpp::RunInfo info;
  {
    nb::gil_scoped_release release;
    info = cu.varlen() ? flashcpp::forward_varlen(qv, kv, vv, ov, lv, cu.q(), cu.k(), max_seqlen_q,
                                                  max_seqlen_k, options, stream_of(stream), ws)
                       : flashcpp::forward(qv, kv, vv, ov, lv, options, stream_of(stream), ws);
  }
  return to_tuple(info);
}

RunInfoTuple backward(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                      nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv,
                      nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int max_seqlen_q,
                      int max_seqlen_k, bool causal, std::optional<float> softmax_scale,
                      int window_left, int window_right, float softcap,
                      const std::string& backend, int num_splits, bool deterministic,
                      std::uintptr_t stream, nb::handle workspace) {
  const AttentionOptions options = make_options(causal, softmax_scale, window_left, window_right,
                                                softcap, backend, num_splits, deterministic);
  Imports keep;
  const TensorView dov = view_of(dout, "dout", false, keep);
  const TensorView qv = view_of(q, "q", false, keep);
  const TensorView kv = view_of(k, "k", false, keep);
  const TensorView vv = view_of(v, "v", false, keep);
  const TensorView ov = view_of(out, "out", false, keep);
  const TensorView lv = view_of(lse, "lse", false, keep);
  const TensorView dqv = view_of(dq, "dq", true, keep);
  const TensorView dkv = view_of(dk, "dk", true, keep);
  const TensorView dvv = view_of(dv, "dv", true, keep);
  const CuSeqlens cu(cu_seqlens_q, cu_seqlens_k, keep);
  const flashcpp::Workspace ws = workspace_of(workspace, keep);
  flashcpp::RunInfo info;
  {
    nb::gil_scoped_release release;
    info = cu.varlen()
               ? flashcpp::backward_varlen(qv, kv, vv, ov, dov, lv, dqv, dkv, dvv, cu.q(), cu.k(),
                                           max_seqlen_q, max_seqlen_k, options,
                                           stream_of(stream), ws)
               : flashcpp::backward(qv, kv, vv, ov, dov, lv, dqv, dkv, dvv, options,
                                    stream_of(stream), ws);
  }
  return to_tuple(info);
}

template <bool for_backward>
std::size_t workspace_size(nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q,
                           nb::handle cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,
                           bool causal, std::optional<float> softmax_scale,
                           int window_left, int window_right, float softcap,
                           const std::string& backend, int num_splits, bool deterministic) {
  const AttentionOptions options = make_options(causal, softmax_scale, window_left, window_right,
                                                softcap, backend, num_splits, deterministic);
  Imports keep;
  const TensorView qv = view_of(q, "q", false, keep);
  const TensorView kv = view_of(k, "k", false, keep);
  const TensorView vv = view_of(v, "v", false, keep);
  const CuSeqlens cu(cu_seqlens_q, cu_seqlens_k, keep);
  if (!cu.varlen())
    return for_backward ? flashcpp::backward_workspace_size(qv, kv, vv, options)
                        : flashcpp::forward_workspace_size(qv, kv, vv, options);
  return for_backward
             ? flashcpp::backward_varlen_workspace_size(qv, kv, vv, cu.q(), cu.k(), max_seqlen_q,
                                                        max_seqlen_k, options)
             : flashcpp::forward_varlen_workspace_size(qv, kv, vv, cu.q(), cu.k(), max_seqlen_q,
                                                       max_seqlen_k, options);
}

using KVCachePlanTuple = std::tuple<std::string, std::string, int, std::size_t>;

KVCachePlanTuple plan_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache,
                              nb::handle cache_seqlens, nb::handle out, nb::handle block_table,
                              nb::handle k_new, nb::handle v_new, nb::handle lse, bool causal,
                              std::optional<float> softmax_scale, int window_left,
                              int window_right, float softcap, const std::string& backend,
                              int num_splits, bool deterministic, nb::handle q_descale,
                              nb::handle k_descale, nb::handle v_descale) {
  Imports keep;
  const DescaleViews descales(q_descale, k_descale, v_descale, keep);
  const AttentionOptions options = descales.applied(make_options(
      causal, softmax_scale, window_left, window_right, softcap, backend, num_splits, deterministic));
  const KVCacheCall call(q, k_cache, v_cache, cache_seqlens, out, block_table, k_new, v_new, lse,
                         keep);
  const flashcpp::KVCachePlan plan = flashcpp::plan_attention_with_kvcache(call.tensors(), options);
  return {flashcpp::backend_name(plan.backend), plan.kernel ? plan.kernel : "", plan.num_splits,
          plan.workspace_bytes};
}

RunInfoTuple attention_with_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache,
                                    nb::handle cache_seqlens, nb::handle out,
                                    nb::handle block_table, nb::handle k_new, nb::handle v_new,
                                    nb::handle lse, bool causal,
                                    std::optional<float> softmax_scale, int window_left,
                                    int window_right, float softcap, const std::string& backend,
                                    int num_splits, bool deterministic, std::uintptr_t stream,
                                    nb::handle workspace, nb::handle q_descale,
                                    nb::handle k_descale, nb::handle v_descale) {
  Imports keep;
  const DescaleViews descales(q_descale, k_descale, v_descale, keep);
  const AttentionOptions options = descales.applied(make_options(
      causal, softmax_scale, window_left, window_right, softcap, backend, num_splits, deterministic));
  const KVCacheCall call(q, k_cache, v_cache, cache_seqlens, out, block_table, k_new, v_new, lse,
                        keep);
  const flashcpp::Workspace ws = workspace_of(workspace, keep);
  flashcpp::RunInfo info;
  {
    nb::gil_scoped_release release;
    info = flashcpp::attention_with_kvcache(call.tensors(), options, stream_of(stream), ws);
  }
  return to_tuple(info);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashcpp native module (use the flashcpp package, not this module directly)";
  m.attr("__version__") = std::to_string(FLASHCPP_VERSION_MAJOR) + "." +
                          std::to_string(FLASHCPP_VERSION_MINOR) + "." +
                          std::to_string(FLASHCPP_VERSION_PATCH);
#ifdef FLASHCPP_PY_WITH_CUDART
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif

  // The JAX binding's handlers (flashcpp/jax.py), where this build has them.
#ifdef FLASHCPP_PY_WITH_XLA_FFI
  m.attr("has_xla_ffi") = true;
  flashcpp_python::define_xla_ffi(m);
#else
  m.attr("has_xla_ffi") = false;
#endif

  // flashcpp.Error is a ValueError: invalid arguments, and requests no kernel can serve.
  nb::exception<flashcpp::Error>(m, "Error", PyExc_ValueError);

  m.def("cuda_available", &flashcpp::cuda_available,
        "True when flashcpp was built with CUDA and a usable GPU is present.");

  m.def(
      "select_backend",
      [](nb::handle q, bool causal, std::optional<float> softmax_scale, int window_left,
         int window_right, float softcap, const std::string& backend, int num_splits,
         bool deterministic) {
        const AttentionOptions options =
            make_options(causal, softmax_scale, window_left, window_right, softcap, backend,
                         num_splits, deterministic);
        Imports keep;
        return std::string(flashcpp::backend_name(
            flashcpp::select_backend(view_of(q, "q", false, keep), options)));
      },
      nb::arg("q"), FLASHCPP_OPTION_ARGS);

  // Scratch bytes of the matching call; cu_seqlens given for a varlen call.
#define FLASHCPP_WORKSPACE_ARGS                                                              \
  nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q").none() = nb::none(),   \
      nb::arg("cu_seqlens_k").none() = nb::none(), nb::arg("max_seqlen_q") = 0,            \
      nb::arg("max_seqlen_k") = 0, FLASHCPP_OPTION_ARGS
  m.def("forward_workspace_size", &workspace_size<false>, FLASHCPP_WORKSPACE_ARGS);
  m.def("backward_workspace_size", &workspace_size<true>, FLASHCPP_WORKSPACE_ARGS);
#undef FLASHCPP_WORKSPACE_ARGS

  // fp8_e4m3 inputs' factors (AttentionOptions::descale), float32 [B, Hkv] or [1], or None.
#define FLASHCPP_DESCALE_ARGS                                                              \
  nb::arg("q_descale").none() = nb::none(), nb::arg("k_descale").none() = nb::none(),     \
      nb::arg("v_descale").none() = nb::none()
  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("cu_seqlens_q").none() = nb::none(),
        nb::arg("cu_seqlens_k").none() = nb::none(), nb::arg("max_seqlen_q") = 0,
        nb::arg("max_seqlen_k") = 0, FLASHCPP_OPTION_ARGS, nb::arg("stream") = 0,
        nb::arg("workspace").none() = nb::none(), FLASHCPP_DESCALE_ARGS,
        nb::arg("fp8_fast_accum") = false,
        "Writes out (and lse when given); returns (backend, kernel, num_splits).");

  // Attention against a KV cache (flashcpp/kvcache.hpp): block_table for a paged cache,
  // k_new and v_new to append.
#define FLASHCPP_KVCACHE_ARGS                                                                \
  nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("cache_seqlens"),           \
      nb::arg("out"), nb::arg("block_table").none() = nb::none(),                           \
      nb::arg("k_new").none() = nb::none(), nb::arg("v_new").none() = nb::none(),           \
      nb::arg("lse").none() = nb::none(), FLASHCPP_OPTION_ARGS
  m.def("plan_kvcache", &plan_kvcache, FLASHCPP_KVCACHE_ARGS, FLASHCPP_DESCALE_ARGS,
        "The plan of the matching call: (backend, kernel, num_splits, workspace_bytes).");
  m.def("attention_with_kvcache", &attention_with_kvcache, FLASHCPP_KVCACHE_ARGS,
        nb::arg("stream") = 0, nb::arg("workspace").none() = nb::none(), FLASHCPP_DESCALE_ARGS,
        "Appends k_new/v_new (when given), writes out (and lse when given); returns (backend, "
        "kernel, num_splits).");
#undef FLASHCPP_KVCACHE_ARGS
#undef FLASHCPP_DESCALE_ARGS

  m.def("backward", &backward, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("cu_seqlens_q").none() = nb::none(), nb::arg("cu_seqlens_k").none() = nb::none(),
        nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_k") = 0, FLASHCPP_OPTION_ARGS,
        nb::arg("stream") = 0, nb::arg("workspace").none() = nb::none(),
        "Writes dq, dk, dv; returns (backend, kernel, num_splits).");
}
