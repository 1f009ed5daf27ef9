// Validation of public arguments. Messages follow the contract: they name the argument and say
// what was expected, e.g. "k: expected dtype bf16 (same as q), got fp16".
#include "api/validate.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "api/overlap.hpp"
#include "flashcpp/error.hpp"

namespace flashcpp::detail {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kHeadDimMultiple = 8;
constexpr std::size_t kCudaAlignmentBytes = 16;

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw Error(message.str());
}

bool is_cuda_backend(Backend b) { return b == Backend::cuda_sm80 || b == Backend::cuda_sm90; }

ElementType element_type(DType dtype) {
  switch (dtype) {
    case DType::fp16: return ElementType::fp16;
    case DType::bf16: return ElementType::bf16;
    case DType::fp8_e4m3: return ElementType::fp8_e4m3;
    default: return ElementType::fp32;
  }
}

void check_rank(const TensorView& t, const char* name, int rank, const char* layout) {
  if (dtype_size(t.dtype) == 0)
    fail(name, ": dtype ", static_cast<int>(t.dtype), " is not a flashcpp::DType");
  if (t.rank != rank) fail(name, ": expected ", rank, " dimensions ", layout, ", got ", t.rank);
  for (int d = 0; d < rank; ++d) {
    if (t.shape[d] < 0) fail(name, ": dimension ", d, " has negative size ", t.shape[d]);
    if (t.stride[d] < 0) fail(name, ": stride of dimension ", d, " is negative (", t.stride[d], ")");
  }
}

void check_same_dtype(const TensorView& t, const char* name, const TensorView& q) {
  if (t.dtype != q.dtype)
    fail(name, ": expected dtype ", dtype_name(q.dtype), " (same as q), got ", dtype_name(t.dtype));
}

void check_same_device(const TensorView& t, const char* name, const TensorView& q) {
  if (!(t.device == q.device))
    fail(name, " is on ", device_name(t.device), " but q is on ", device_name(q.device));
}

// "k: expected batch size 2 (same as q) in dimension 0, got 3 (shape [3, 17, 1, 64])"
void check_dim(const TensorView& t, const char* name, int dim, std::int64_t expected,
               const char* what, const char* same_as) {
  if (t.shape[dim] != expected)
    fail(name, ": expected ", what, " ", expected, " (same as ", same_as, ") in dimension ", dim,
         ", got ", t.shape[dim], " (shape ", t.shape_string(), ")");
}

// Counts the kernels index with int: larger ones would be truncated.
void check_int32(std::int64_t value, const char* name, const char* what) {
  if (value > INT32_MAX) fail(name, ": ", value, " ", what, " exceed 2^31 - 1");
}

void check_head_dim(std::int64_t dim, const char* name) {
  if (dim <= 0 || dim > kMaxHeadDim || dim % kHeadDimMultiple != 0)
    fail(name, ": head dim ", dim, " is not supported (supported: multiples of ", kHeadDimMultiple,
         " up to ", kMaxHeadDim, ")");
}

// CUDA rules (16-byte alignment, fp16/bf16 only) apply to CUDA tensors whatever backend was
// requested: `automatic` on a CUDA tensor must not slip through with CPU rules.
bool cuda_rules(const TensorView& q, Backend backend) {
  return q.device.type == DeviceType::cuda || is_cuda_backend(backend);
}

// Memory rules: last dimension contiguous, pointer set when non-empty, alignment.
void check_memory(const TensorView& t, const char* name, bool cuda) {
  if (t.empty()) return;
  if (t.rank > 0 && t.shape[t.rank - 1] > 1 && t.stride[t.rank - 1] != 1)
    fail(name, ": last dimension must have stride 1, got ", t.stride[t.rank - 1]);
  if (t.data == nullptr) fail(name, ": data pointer is null");
  const auto address = reinterpret_cast<std::uintptr_t>(t.data);
  const std::size_t element = dtype_size(t.dtype);
  if (cuda && t.dtype != DType::int32) {
    if (address % kCudaAlignmentBytes != 0)
      fail(name, ": data pointer is not ", kCudaAlignmentBytes, "-byte aligned");
    const std::int64_t multiple = static_cast<std::int64_t>(kCudaAlignmentBytes / element);
    for (int d = 0; d + 1 < t.rank; ++d) {
      if (t.shape[d] > 1 && t.stride[d] % multiple != 0)
        fail(name, ": stride of dimension ", d, " is ", t.stride[d],
             " elements; the cuda backend needs a multiple of ", multiple, " (16 bytes)");
    }
  } else if (address % element != 0) {
    fail(name, ": data pointer is not ", element, "-byte aligned");
  }
}

void check_input_dtype(const TensorView& q, bool cuda) {
  if (q.dtype == DType::int32)
    fail("q: dtype int32 is not supported (supported: fp32, fp16, bf16, fp8_e4m3)");
  if (cuda && q.dtype == DType::fp32)
    fail("q: dtype fp32 is not supported by the cuda backend (supported: fp16, bf16)");
}

bool is_fp8(const TensorView& t) { return t.dtype == DType::fp8_e4m3; }

// The output of fp8 inputs: a 16-bit float.
void check_fp8_out(const TensorView& out) {
  if (out.dtype != DType::bf16 && out.dtype != DType::fp16)
    fail("out: expected dtype bf16 or fp16 for fp8_e4m3 inputs, got ", dtype_name(out.dtype));
}

// On the CPU, fp8 inputs run on the float64 reference (automatic picks it); the tiled `cpu`
// backend does not read them.
void check_fp8_cpu_backend(const AttentionOptions& options) {
  if (options.backend == Backend::cpu)
    fail("backend: cpu does not take fp8_e4m3 inputs (use cpu_reference, which automatic "
         "picks for CPU tensors)");
}

// One descale factor tensor (AttentionOptions::descale): float32 [B, Hkv] or [1] on q's
// device, given only for an fp8 tensor.
Descale check_descale(const TensorView* d, const char* name, const TensorView& of,
                      const char* of_name, const TensorView& q, std::int64_t batch,
                      std::int64_t heads_kv) {
  if (d == nullptr) return {};
  if (!is_fp8(of))
    fail(name, ": given, but ", of_name, " is ", dtype_name(of.dtype),
         " (descales apply to fp8_e4m3 tensors only)");
  if (d->dtype != DType::fp32) fail(name, ": expected dtype fp32, got ", dtype_name(d->dtype));
  check_same_device(*d, name, q);
  Descale r;
  if (d->rank == 1) {
    if (d->shape[0] != 1)
      fail(name, ": expected shape [B, Hkv] = [", batch, ", ", heads_kv, "] or [1], got ",
           d->shape_string());
  } else if (d->rank == 2) {
    if (d->shape[0] != batch || d->shape[1] != heads_kv)
      fail(name, ": expected shape [B, Hkv] = [", batch, ", ", heads_kv, "] or [1], got ",
           d->shape_string());
    if (d->stride[0] < 0 || d->stride[1] < 0) fail(name, ": strides must be >= 0");
    r.batch_stride = d->stride[0];
    r.head_stride = d->stride[1];
  } else {
    fail(name, ": expected 2 dimensions [B, Hkv] or 1 dimension [1], got ", d->rank);
  }
  if (d->data == nullptr) fail(name, ": data pointer is null");
  if (reinterpret_cast<std::uintptr_t>(d->data) % alignof(float) != 0)
    fail(name, ": data pointer is not ", alignof(float), "-byte aligned");
  r.data = static_cast<const float*>(d->data);
  return r;
}

void check_options(const AttentionOptions& o) {
  if (o.softmax_scale && !std::isfinite(*o.softmax_scale))
    fail("softmax_scale: must be finite, got ", *o.softmax_scale);
  if (!std::isfinite(o.softcap) || o.softcap < 0.0f)
    fail("softcap: must be >= 0 (0 turns it off), got ", o.softcap);
  if (o.window_left < -1) fail("window_left: must be -1 (unbounded) or >= 0, got ", o.window_left);
  if (o.window_right < -1)
    fail("window_right: must be -1 (unbounded) or >= 0, got ", o.window_right);
  if (o.num_splits < 0) fail("num_splits: must be >= 0 (0 chooses automatically), got ", o.num_splits);
}

int longest(const std::vector<std::int32_t>& offsets) {
  std::int32_t longest = 0;
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b)
    longest = std::max(longest, offsets[b + 1] - offsets[b]);
  return longest;
}

Strides strides_of(const TensorView& t, bool varlen) {
  if (varlen) return {0, t.stride[0], t.stride[1]};
  return {t.stride[0], t.stride[1], t.stride[2]};
}

// What every call sets alike from its checked views: element type, pointers, head counts and
// dims, and the strides of q, k, v and out (the caches are k and v of a KV-cache call).
void set_views(ForwardParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& out, const TensorView* lse, std::int64_t heads_q,
               std::int64_t heads_kv, std::int64_t head_dim, std::int64_t head_dim_v,
               bool varlen) {
  p.dtype = element_type(out.dtype);
  p.q_dtype = element_type(q.dtype);
  p.kv_dtype = element_type(k.dtype);
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.out = out.data;
  p.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  p.heads_q = static_cast<int>(heads_q);
  p.heads_kv = static_cast<int>(heads_kv);
  p.head_dim = static_cast<int>(head_dim);
  p.head_dim_v = static_cast<int>(head_dim_v);
  p.q_stride = strides_of(q, varlen);
  p.k_stride = strides_of(k, varlen);
  p.v_stride = strides_of(v, varlen);
  p.out_stride = strides_of(out, varlen);
}

// Varlen offsets: int32 [B + 1] on q's device. Host offsets are copied into `copy` first and
// the copy is checked and used: another thread may change the caller's memory meanwhile.
int check_cu_seqlens(const TensorView& cu, const char* name, const TensorView& q,
                     std::int64_t total_rows, int max_seqlen, const char* max_name,
                     std::vector<std::int32_t>& copy) {
  if (cu.dtype != DType::int32)
    fail(name, ": expected dtype int32, got ", dtype_name(cu.dtype));
  if (cu.rank != 1) fail(name, ": expected 1 dimension [B + 1], got ", cu.rank);
  if (cu.shape[0] < 1) fail(name, ": expected at least 1 element (B + 1), got 0");
  check_same_device(cu, name, q);
  if (cu.shape[0] > 1 && cu.stride[0] != 1) fail(name, ": must be contiguous, got stride ", cu.stride[0]);
  if (cu.data == nullptr) fail(name, ": data pointer is null");
  if (reinterpret_cast<std::uintptr_t>(cu.data) % alignof(std::int32_t) != 0)
    fail(name, ": data pointer is not ", alignof(std::int32_t), "-byte aligned");
  check_int32(cu.shape[0] - 1, name, "sequences");
  if (max_seqlen < 0) fail(max_name, ": must be >= 0, got ", max_seqlen);
  if (cu.device.type == DeviceType::cpu) {
    const auto* source = static_cast<const std::int32_t*>(cu.data);
    copy.assign(source, source + cu.shape[0]);
    const std::int32_t* offsets = copy.data();
    if (offsets[0] != 0) fail(name, "[0]: expected 0, got ", offsets[0]);
    for (std::int64_t b = 0; b + 1 < cu.shape[0]; ++b) {
      const std::int64_t length = std::int64_t{offsets[b + 1]} - offsets[b];
      if (length < 0)
        fail(name, ": must be non-decreasing, but [", b + 1, "] = ", offsets[b + 1], " < [", b,
             "] = ", offsets[b]);
      if (length > max_seqlen)
        fail(max_name, " (", max_seqlen, ") is smaller than sequence ", b, " of ", name,
             " (length ", length, ")");
    }
    if (offsets[cu.shape[0] - 1] > total_rows)
      fail(name, ": last offset ", offsets[cu.shape[0] - 1], " exceeds the ", total_rows,
           " rows of its tensor");
  }
  return static_cast<int>(cu.shape[0] - 1);
}

// The options' part of the params (after head_dim is set): scale, softcap, the window with
// causal folded in, the device and the split request.
void apply_options(ForwardParams& p, const AttentionOptions& options, const TensorView& q) {
  p.scale = options.softmax_scale ? *options.softmax_scale
                                  : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  p.softcap = options.softcap;
  // The kernels fold log2(e) and the softcap into the scale: each product must stay finite.
  constexpr float kLog2e = 1.4426950408889634f;
  if (!std::isfinite(p.scale * kLog2e))
    fail("softmax_scale: ", p.scale, " times log2(e) overflows float32");
  if (p.softcap > 0 && !std::isfinite(p.scale / p.softcap))
    fail("softcap: softmax_scale / softcap (", p.scale, " / ", p.softcap, ") must be finite");
  if (!std::isfinite(p.softcap * kLog2e))
    fail("softcap: ", p.softcap, " times log2(e) overflows float32");
  p.window_left = options.window_left;
  p.window_right = options.causal ? 0 : options.window_right;  // causal caps the right bound
  p.causal = p.window_left < 0 && p.window_right == 0;
  p.device = q.device.index;
  p.num_splits = options.num_splits;
}

}  // namespace

Backend check_backend(const TensorView& q, const AttentionOptions& options) {
  const Backend requested = options.backend;
  const bool on_cuda = q.device.type == DeviceType::cuda;
  if (on_cuda && (requested == Backend::cpu || requested == Backend::cpu_reference))
    fail("q is on ", device_name(q.device), " but the ", backend_name(requested),
         " backend was selected");
  if (!on_cuda && is_cuda_backend(requested))
    fail("q is on cpu but the ", backend_name(requested), " backend was selected");
  if (!on_cuda) return requested == Backend::automatic ? Backend::cpu : requested;
#ifndef FLASHCPP_WITH_CUDA
  fail("q is on ", device_name(q.device),
       " but flashcpp was built without CUDA (configure with -DFLASHCPP_CUDA=ON)");
#else
  return requested;
#endif
}

void validate_select(const TensorView& q, const AttentionOptions& options) {
  if (q.rank != 3) check_rank(q, "q", 4, "[B, Nq, Hq, D] (3 for varlen: [total_q, Hq, D])");
  check_rank(q, "q", q.rank, "");
  check_options(options);
}

ForwardParams validate_forward(const ForwardTensors& t, const AttentionOptions& options,
                               Backend backend, HostCopies& copies, Outputs outputs) {
  const bool varlen = t.cu_seqlens_q != nullptr || t.cu_seqlens_k != nullptr;
  if (varlen && (t.cu_seqlens_q == nullptr || t.cu_seqlens_k == nullptr))
    fail("cu_seqlens_q and cu_seqlens_k must be given together");
  const int rank = varlen ? 3 : 4;
  check_rank(t.q, "q", rank, varlen ? "[total_q, Hq, D]" : "[B, Nq, Hq, D]");
  check_rank(t.k, "k", rank, varlen ? "[total_k, Hkv, D]" : "[B, Nk, Hkv, D]");
  check_rank(t.v, "v", rank, varlen ? "[total_k, Hkv, Dv]" : "[B, Nk, Hkv, Dv]");
  check_rank(t.out, "out", rank, varlen ? "[total_q, Hq, Dv]" : "[B, Nq, Hq, Dv]");

  const bool cuda = cuda_rules(t.q, backend);
  check_input_dtype(t.q, cuda);
  check_same_dtype(t.k, "k", t.q);
  check_same_dtype(t.v, "v", t.q);
  if (is_fp8(t.q)) {
    check_fp8_out(t.out);
    check_fp8_cpu_backend(options);
  } else {
    check_same_dtype(t.out, "out", t.q);
  }
  check_same_device(t.k, "k", t.q);
  check_same_device(t.v, "v", t.q);
  check_same_device(t.out, "out", t.q);

  // Dimension positions: [B, N, H, D] or, varlen, [total, H, D].
  const int n_dim = varlen ? 0 : 1;
  const int h_dim = n_dim + 1;
  const int d_dim = n_dim + 2;
  const std::int64_t batch = varlen ? 0 : t.q.shape[0];
  const std::int64_t heads_q = t.q.shape[h_dim];
  const std::int64_t heads_kv = t.k.shape[h_dim];
  const std::int64_t head_dim = t.q.shape[d_dim];
  const std::int64_t head_dim_v = t.v.shape[d_dim];

  if (!varlen) {
    check_dim(t.k, "k", 0, batch, "batch size", "q");
    check_dim(t.v, "v", 0, batch, "batch size", "q");
  }
  check_dim(t.k, "k", d_dim, head_dim, "head dim", "q");
  check_dim(t.v, "v", n_dim, t.k.shape[n_dim], varlen ? "total keys" : "keys", "k");
  check_dim(t.v, "v", h_dim, heads_kv, "kv heads", "k");
  if (!varlen) check_dim(t.out, "out", 0, batch, "batch size", "q");
  check_dim(t.out, "out", n_dim, t.q.shape[n_dim], varlen ? "total queries" : "queries", "q");
  check_dim(t.out, "out", h_dim, heads_q, "query heads", "q");
  check_dim(t.out, "out", d_dim, head_dim_v, "head dim", "v");
  check_head_dim(head_dim, "q");
  check_head_dim(head_dim_v, "v");
  if (heads_kv <= 0) fail("k: number of kv heads must be positive, got ", heads_kv);
  if (heads_q <= 0) fail("q: number of query heads must be positive, got ", heads_q);
  if (heads_q % heads_kv != 0)
    fail("num_heads_q (", heads_q, ") must be a multiple of num_heads_kv (", heads_kv, ")");
  check_int32(heads_kv, "k", "kv heads");
  check_int32(heads_q, "q", "query heads");
  if (!varlen) {
    if (batch > INT32_MAX) fail("q: batch size ", batch, " exceeds 2^31 - 1");
    check_int32(t.q.shape[1], "q", "queries");
    check_int32(t.k.shape[1], "k", "keys");
  }

  if (t.lse != nullptr) {
    const TensorView& lse = *t.lse;
    check_rank(lse, "lse", varlen ? 2 : 3, varlen ? "[Hq, total_q]" : "[B, Hq, Nq]");
    if (lse.dtype != DType::fp32) fail("lse: expected dtype fp32, got ", dtype_name(lse.dtype));
    check_same_device(lse, "lse", t.q);
    if (!varlen) check_dim(lse, "lse", 0, batch, "batch size", "q");
    check_dim(lse, "lse", varlen ? 0 : 1, heads_q, "query heads", "q");
    check_dim(lse, "lse", varlen ? 1 : 2, t.q.shape[n_dim], "queries", "q");
  }
  check_options(options);
  for (const auto& [view, name] : {std::pair{&t.q, "q"}, {&t.k, "k"}, {&t.v, "v"}, {&t.out, "out"}})
    check_memory(*view, name, cuda);
  if (t.lse != nullptr) check_memory(*t.lse, "lse", false);  // fp32, no vector loads

  ForwardParams p;
  set_views(p, t.q, t.k, t.v, t.out, t.lse, heads_q, heads_kv, head_dim, head_dim_v, varlen);
  if (varlen) {
    const int batch_q = check_cu_seqlens(*t.cu_seqlens_q, "cu_seqlens_q", t.q, t.q.shape[0],
                                         t.max_seqlen_q, "max_seqlen_q", copies.cu_seqlens_q);
    const int batch_k = check_cu_seqlens(*t.cu_seqlens_k, "cu_seqlens_k", t.q, t.k.shape[0],
                                         t.max_seqlen_k, "max_seqlen_k", copies.cu_seqlens_k);
    if (batch_q != batch_k)
      fail("cu_seqlens_k: expected ", batch_q + 1, " elements (same as cu_seqlens_q), got ",
           batch_k + 1);
    p.batch = batch_q;
    p.seqlen_q = t.max_seqlen_q;
    p.seqlen_k = t.max_seqlen_k;
    p.cu_seqlens_q = static_cast<const std::int32_t*>(t.cu_seqlens_q->data);
    p.cu_seqlens_k = static_cast<const std::int32_t*>(t.cu_seqlens_k->data);
    p.total_rows_q = t.q.shape[0];
    p.total_rows_k = t.k.shape[0];
    if (t.cu_seqlens_q->device.type == DeviceType::cpu) {
      // The host backends use the checked copies, and their work follows the real lengths.
      p.cu_seqlens_q = copies.cu_seqlens_q.data();
      p.cu_seqlens_k = copies.cu_seqlens_k.data();
      p.seqlen_q = longest(copies.cu_seqlens_q);
      p.seqlen_k = longest(copies.cu_seqlens_k);
    }
    if (t.lse) {
      p.lse_batch_stride = 0;
      p.lse_head_stride = t.lse->stride[0];
    }
  } else {
    p.batch = static_cast<int>(batch);
    p.seqlen_q = static_cast<int>(t.q.shape[1]);
    p.seqlen_k = static_cast<int>(t.k.shape[1]);
    if (t.lse) {
      p.lse_batch_stride = t.lse->stride[0];
      p.lse_head_stride = t.lse->stride[1];
    }
  }
  // One factor per sequence (varlen: per cu_seqlens entry, checked above) and kv head.
  p.q_descale = check_descale(options.descale.q, "q_descale", t.q, "q", t.q, p.batch, heads_kv);
  p.k_descale = check_descale(options.descale.k, "k_descale", t.k, "k", t.q, p.batch, heads_kv);
  p.v_descale = check_descale(options.descale.v, "v_descale", t.v, "v", t.q, p.batch, heads_kv);
  if (options.fp8_fast_accum && !is_fp8(t.q))
    fail("fp8_fast_accum: set, but q is ", dtype_name(t.q.dtype),
         " (it applies to the forward with fp8_e4m3 q, k, v only)");
  p.fp8_fast_accum = options.fp8_fast_accum;
  apply_options(p, options, t.q);
  if (outputs == Outputs::given)
    check_no_overlap({{&t.out, "out"}, {t.lse, "lse"}},
                     {{&t.q, "q"}, {&t.k, "k"}, {&t.v, "v"}, {t.cu_seqlens_q, "cu_seqlens_q"},
                      {t.cu_seqlens_k, "cu_seqlens_k"}, {options.descale.q, "q_descale"},
                      {options.descale.k, "k_descale"}, {options.descale.v, "v_descale"}});
  return p;
}

BackwardParams validate_backward(const BackwardTensors& t, const AttentionOptions& options,
                                 Backend backend, HostCopies& copies) {
  if (t.forward.lse == nullptr) fail("lse: required by the backward pass");
  if (is_fp8(t.forward.q))
    fail("q: dtype fp8_e4m3 is not supported by the backward (FP8 is forward and inference only)");
  if (options.descale.q || options.descale.k || options.descale.v)
    fail("q_descale, k_descale, v_descale: the backward takes no descales (FP8 is forward and "
         "inference only)");
  BackwardParams p;
  static_cast<ForwardParams&>(p) =
      validate_forward(t.forward, options, backend, copies, Outputs::stand_in);
  const bool varlen = p.is_varlen();
  const int rank = varlen ? 3 : 4;
  const struct {
    const TensorView& grad;
    const char* name;
    const TensorView& like;
    const char* like_name;
  } grads[] = {{t.dout, "dout", t.forward.out, "out"},
               {t.dq, "dq", t.forward.q, "q"},
               {t.dk, "dk", t.forward.k, "k"},
               {t.dv, "dv", t.forward.v, "v"}};
  for (const auto& g : grads) {
    check_rank(g.grad, g.name, rank, (std::string("(same as ") + g.like_name + ")").c_str());
    check_same_dtype(g.grad, g.name, t.forward.q);
    check_same_device(g.grad, g.name, t.forward.q);
    for (int d = 0; d < rank; ++d) {
      if (g.grad.shape[d] != g.like.shape[d])
        fail(g.name, ": expected shape ", g.like.shape_string(), " (same as ", g.like_name,
             "), got ", g.grad.shape_string());
    }
    check_memory(g.grad, g.name, cuda_rules(t.forward.q, backend));
  }
  p.dout = t.dout.data;
  p.dq = t.dq.data;
  p.dk = t.dk.data;
  p.dv = t.dv.data;
  p.dout_stride = strides_of(t.dout, varlen);
  p.dq_stride = strides_of(t.dq, varlen);
  p.dk_stride = strides_of(t.dk, varlen);
  p.dv_stride = strides_of(t.dv, varlen);
  p.deterministic = options.deterministic;
  const ForwardTensors& f = t.forward;
  check_no_overlap({{&t.dq, "dq"}, {&t.dk, "dk"}, {&t.dv, "dv"}},
                   {{&f.q, "q"}, {&f.k, "k"}, {&f.v, "v"}, {&f.out, "out"}, {&t.dout, "dout"},
                    {f.lse, "lse"}, {f.cu_seqlens_q, "cu_seqlens_q"},
                    {f.cu_seqlens_k, "cu_seqlens_k"}});
  return p;
}

KVCacheParams validate_kvcache(const KVCacheTensors& t, const AttentionOptions& options,
                               Backend backend, HostCopies& copies) {
  const bool paged = t.block_table != nullptr;
  if ((t.k_new == nullptr) != (t.v_new == nullptr)) fail("k_new and v_new must be given together");
  const char* cache_layout = paged ? "[num_pages, page_size, Hkv, D]" : "[B, Nmax, Hkv, D]";
  check_rank(t.q, "q", 4, "[B, Nnew, Hq, D]");
  check_rank(t.k_cache, "k_cache", 4, cache_layout);
  check_rank(t.v_cache, "v_cache", 4, paged ? "[num_pages, page_size, Hkv, Dv]" : "[B, Nmax, Hkv, Dv]");
  check_rank(t.out, "out", 4, "[B, Nnew, Hq, Dv]");
  const bool cuda = cuda_rules(t.q, backend);
  check_input_dtype(t.q, cuda);
  if (is_fp8(t.q))
    fail("q: dtype fp8_e4m3 is not supported for the KV cache's queries (pass q in bf16 or fp16; "
         "k_cache and v_cache may be fp8_e4m3)");
  // An fp8 cache holds q's type quantised: k_new / v_new come in q's type.
  if (!is_fp8(t.k_cache)) {
    check_same_dtype(t.k_cache, "k_cache", t.q);
    check_same_dtype(t.v_cache, "v_cache", t.q);
  } else if (t.v_cache.dtype != t.k_cache.dtype) {
    fail("v_cache: expected dtype fp8_e4m3 (same as k_cache), got ", dtype_name(t.v_cache.dtype));
  }
  if (is_fp8(t.k_cache)) check_fp8_cpu_backend(options);
  check_same_dtype(t.out, "out", t.q);
  check_same_device(t.k_cache, "k_cache", t.q);
  check_same_device(t.v_cache, "v_cache", t.q);
  check_same_device(t.out, "out", t.q);

  const std::int64_t batch = t.q.shape[0], nnew = t.q.shape[1], heads_q = t.q.shape[2];
  const std::int64_t head_dim = t.q.shape[3];
  const std::int64_t heads_kv = t.k_cache.shape[2], head_dim_v = t.v_cache.shape[3];
  if (!paged) check_dim(t.k_cache, "k_cache", 0, batch, "batch size", "q");
  check_dim(t.k_cache, "k_cache", 3, head_dim, "head dim", "q");
  for (int d = 0; d < 3; ++d)
    check_dim(t.v_cache, "v_cache", d, t.k_cache.shape[d],
              d == 0 ? (paged ? "pages" : "batch size") : d == 1 ? (paged ? "page size" : "capacity") : "kv heads",
              "k_cache");
  check_dim(t.out, "out", 0, batch, "batch size", "q");
  check_dim(t.out, "out", 1, nnew, "new tokens", "q");
  check_dim(t.out, "out", 2, heads_q, "query heads", "q");
  check_dim(t.out, "out", 3, head_dim_v, "head dim", "v_cache");
  check_head_dim(head_dim, "q");
  check_head_dim(head_dim_v, "v_cache");
  if (heads_kv <= 0) fail("k_cache: number of kv heads must be positive, got ", heads_kv);
  if (heads_q <= 0) fail("q: number of query heads must be positive, got ", heads_q);
  if (heads_q % heads_kv != 0)
    fail("num_heads_q (", heads_q, ") must be a multiple of num_heads_kv (", heads_kv, ")");
  check_int32(heads_kv, "k_cache", "kv heads");
  check_int32(heads_q, "q", "query heads");
  if (batch > INT32_MAX) fail("q: batch size ", batch, " exceeds 2^31 - 1");

  // The cache's capacity per sequence: Nmax, or max_pages_per_seq * page_size.
  std::int64_t capacity = t.k_cache.shape[1];
  std::int64_t max_pages = 0;
  if (paged) {
    const TensorView& bt = *t.block_table;
    if (bt.dtype != DType::int32) fail("block_table: expected dtype int32, got ", dtype_name(bt.dtype));
    check_rank(bt, "block_table", 2, "[B, max_pages_per_seq]");
    check_same_device(bt, "block_table", t.q);
    check_dim(bt, "block_table", 0, batch, "batch size", "q");
    if (bt.shape[1] > 1 && bt.stride[1] != 1)
      fail("block_table: the page dimension must be contiguous, got stride ", bt.stride[1]);
    if (!bt.empty() && bt.data == nullptr) fail("block_table: data pointer is null");
    if (reinterpret_cast<std::uintptr_t>(bt.data) % alignof(std::int32_t) != 0)
      fail("block_table: data pointer is not ", alignof(std::int32_t), "-byte aligned");
    if (t.k_cache.shape[1] <= 0) fail("k_cache: page size must be positive, got ", t.k_cache.shape[1]);
    max_pages = bt.shape[1];
    capacity = max_pages * t.k_cache.shape[1];
  }
  if (capacity > INT32_MAX) fail("k_cache: a capacity of ", capacity, " keys exceeds 2^31 - 1");

  const TensorView& lens = t.cache_seqlens;
  if (lens.dtype != DType::int32)
    fail("cache_seqlens: expected dtype int32, got ", dtype_name(lens.dtype));
  check_rank(lens, "cache_seqlens", 1, "[B]");
  check_same_device(lens, "cache_seqlens", t.q);
  check_dim(lens, "cache_seqlens", 0, batch, "batch size", "q");
  if (lens.shape[0] > 1 && lens.stride[0] != 1)
    fail("cache_seqlens: must be contiguous, got stride ", lens.stride[0]);
  if (!lens.empty() && lens.data == nullptr) fail("cache_seqlens: data pointer is null");
  if (reinterpret_cast<std::uintptr_t>(lens.data) % alignof(std::int32_t) != 0)
    fail("cache_seqlens: data pointer is not ", alignof(std::int32_t), "-byte aligned");

  if (t.k_new != nullptr) {
    const struct {
      const TensorView& t;
      const char* name;
      std::int64_t dim;
      const char* dim_of;
    } news[] = {{*t.k_new, "k_new", head_dim, "q"}, {*t.v_new, "v_new", head_dim_v, "v_cache"}};
    for (const auto& n : news) {
      check_rank(n.t, n.name, 4, "[B, Nnew, Hkv, D]");
      check_same_dtype(n.t, n.name, t.q);
      check_same_device(n.t, n.name, t.q);
      check_dim(n.t, n.name, 0, batch, "batch size", "q");
      check_dim(n.t, n.name, 1, nnew, "new tokens", "q");
      check_dim(n.t, n.name, 2, heads_kv, "kv heads", "k_cache");
      check_dim(n.t, n.name, 3, n.dim, "head dim", n.dim_of);
      check_memory(n.t, n.name, cuda);
    }
    if (nnew > capacity)
      fail("k_new: ", nnew, " new tokens do not fit in the cache's capacity of ", capacity, " keys");
  }

  if (t.lse != nullptr) {
    const TensorView& lse = *t.lse;
    check_rank(lse, "lse", 3, "[B, Hq, Nnew]");
    if (lse.dtype != DType::fp32) fail("lse: expected dtype fp32, got ", dtype_name(lse.dtype));
    check_same_device(lse, "lse", t.q);
    check_dim(lse, "lse", 0, batch, "batch size", "q");
    check_dim(lse, "lse", 1, heads_q, "query heads", "q");
    check_dim(lse, "lse", 2, nnew, "new tokens", "q");
    check_memory(lse, "lse", false);
  }
  check_options(options);
  for (const auto& [view, name] : {std::pair{&t.q, "q"}, {&t.k_cache, "k_cache"},
                                   {&t.v_cache, "v_cache"}, {&t.out, "out"}})
    check_memory(*view, name, cuda);
  // Appending writes the caches: then they are outputs too.
  if (t.k_new != nullptr)
    check_no_overlap({{&t.k_cache, "k_cache"}, {&t.v_cache, "v_cache"}, {&t.out, "out"},
                      {t.lse, "lse"}},
                     {{&t.q, "q"}, {t.k_new, "k_new"}, {t.v_new, "v_new"},
                      {&lens, "cache_seqlens"}, {t.block_table, "block_table"},
                      {options.descale.k, "k_descale"}, {options.descale.v, "v_descale"}});
  else
    check_no_overlap({{&t.out, "out"}, {t.lse, "lse"}},
                     {{&t.q, "q"}, {&t.k_cache, "k_cache"}, {&t.v_cache, "v_cache"},
                      {&lens, "cache_seqlens"}, {t.block_table, "block_table"},
                      {options.descale.k, "k_descale"}, {options.descale.v, "v_descale"}});

  // Host-side lengths and pages (CPU tensors): copied first (another thread may change the
  // caller's arrays during the call), then every key a sequence will read must lie in the cache.
  const std::int64_t appended = t.k_new != nullptr ? nnew : 0;
  const bool host_lengths = lens.device.type == DeviceType::cpu && batch > 0;
  std::int64_t table_width = 0;
  if (host_lengths) {
    const auto* source = static_cast<const std::int32_t*>(lens.data);
    copies.cache_seqlens.assign(source, source + batch);
    if (paged) {
      table_width = t.block_table->shape[1];
      copies.block_table.resize(static_cast<std::size_t>(batch * table_width));
      const auto* bt = static_cast<const std::int32_t*>(t.block_table->data);
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t pg = 0; pg < table_width; ++pg)
          copies.block_table[b * table_width + pg] = bt[b * t.block_table->stride[0] + pg];
    }
    const std::int32_t* l = copies.cache_seqlens.data();
    for (std::int64_t b = 0; b < batch; ++b) {
      if (l[b] < 0) fail("cache_seqlens[", b, "]: must be >= 0, got ", l[b]);
      if (l[b] + appended > capacity)
        fail(appended ? "k_new" : "cache_seqlens", ": sequence ", b, " would hold ", l[b] + appended,
             " keys (cache_seqlens[", b, "] = ", l[b], appended ? " plus the new tokens" : "",
             "), more than the cache's capacity of ", capacity);
      if (paged) {
        const std::int64_t pages = (l[b] + appended + t.k_cache.shape[1] - 1) / t.k_cache.shape[1];
        for (std::int64_t pg = 0; pg < pages; ++pg) {
          const std::int32_t page = copies.block_table[b * table_width + pg];
          if (page < 0 || page >= t.k_cache.shape[0])
            fail("block_table[", b, "][", pg, "]: page ", page, " is outside the cache's ",
                 t.k_cache.shape[0], " pages");
        }
      }
    }
  }

  if (nnew > INT32_MAX) fail("q: ", nnew, " new tokens exceed 2^31 - 1");
  KVCacheParams p;
  set_views(p, t.q, t.k_cache, t.v_cache, t.out, t.lse, heads_q, heads_kv, head_dim, head_dim_v,
            false);
  p.q_descale = check_descale(options.descale.q, "q_descale", t.q, "q", t.q, batch, heads_kv);
  p.k_descale = check_descale(options.descale.k, "k_descale", t.k_cache, "k_cache", t.q, batch, heads_kv);
  p.v_descale = check_descale(options.descale.v, "v_descale", t.v_cache, "v_cache", t.q, batch, heads_kv);
  if (options.fp8_fast_accum)
    fail("fp8_fast_accum: set, but the KV cache takes 16-bit q (it applies to the forward with "
         "fp8_e4m3 q, k, v only)");
  p.batch = static_cast<int>(batch);
  p.seqlen_q = static_cast<int>(nnew);
  p.seqlen_k = static_cast<int>(capacity);
  if (t.lse) {
    p.lse_batch_stride = t.lse->stride[0];
    p.lse_head_stride = t.lse->stride[1];
  }
  apply_options(p, options, t.q);
  p.cache_seqlens = host_lengths ? copies.cache_seqlens.data()
                                  : static_cast<const std::int32_t*>(lens.data);
  if (paged) {
    p.block_table = host_lengths ? copies.block_table.data()
                                 : static_cast<const std::int32_t*>(t.block_table->data);
    p.block_table_stride = host_lengths ? table_width : t.block_table->stride[0];
    p.page_size = static_cast<int>(t.k_cache.shape[1]);
    const auto size = static_cast<unsigned>(p.page_size);
    p.page_shift = std::has_single_bit(size) ? std::countr_zero(size) : -1;
    p.num_pages = static_cast<int>(t.k_cache.shape[0]);
  }
  if (t.k_new) {
    p.k_new = t.k_new->data;
    p.v_new = t.v_new->data;
    p.k_new_stride = strides_of(*t.k_new, false);
    p.v_new_stride = strides_of(*t.v_new, false);
  }
  return p;
}

}  // namespace flashcpp::detail
