#pragma once
// Lookups over a registry of kernel instantiations (an array of entries with `entry`, `dtype`
// and `head_dim`, generated per build; an entry without `entry` is the empty-build sentinel),
// shared by the sm80 and sm90 forward and backward dispatch headers.
#include <cstddef>
#include <string>

#include "common/params.hpp"

namespace flashcpp::detail::cuda {

// One instantiation of a registry: its element type, its (padded) head dim and its entry
// point. An array of them ends with the sentinel, which keeps it valid in an empty build.
template <class Entry>
struct RegistryEntry {
  ElementType dtype;
  int head_dim;
  Entry entry;
};
template <class Entry>
inline constexpr RegistryEntry<Entry> kRegistrySentinel{ElementType::fp32, 0, nullptr};

// An sm90a instantiation, whose V and O head dim may differ from the Q and K one: its element
// type, its (padded) head dims and its entry point. Same sentinel convention.
template <class Entry>
struct PairRegistryEntry {
  ElementType dtype;
  int head_dim;    // Q, K
  int head_dim_v;  // V, O
  Entry entry;
};
template <class Entry>
inline constexpr PairRegistryEntry<Entry> kPairRegistrySentinel{ElementType::fp32, 0, 0, nullptr};

// "fp16", "bf16", "fp8_e4m3", "fp32": kernel names and error messages.
inline const char* dtype_name(ElementType t) {
  switch (t) {
    case ElementType::fp16: return "fp16";
    case ElementType::bf16: return "bf16";
    case ElementType::fp8_e4m3: return "fp8_e4m3";
    default: return "fp32";
  }
}

// The smallest instantiation of `dtype` whose head dim covers `head_dim` (smaller head dims
// run zero-padded on it), or null.
template <class Kernel, std::size_t N>
const Kernel* smallest_covering(const Kernel (&kernels)[N], ElementType dtype, int head_dim) {
  const Kernel* best = nullptr;
  for (const Kernel& k : kernels)
    if (k.entry && k.dtype == dtype && k.head_dim >= head_dim &&
        (!best || k.head_dim < best->head_dim))
      best = &k;
  return best;
}

// "32, 64, 128" (or "none"): the head dims built for `dtype`, for error messages.
template <class Kernel, std::size_t N>
std::string built_head_dims(const Kernel (&kernels)[N], ElementType dtype) {
  std::string s;
  for (const Kernel& k : kernels)
    if (k.entry && k.dtype == dtype) s += (s.empty() ? "" : ", ") + std::to_string(k.head_dim);
  return s.empty() ? "none" : s;
}

// The instantiation of `dtype` that runs a call of head dims (head_dim, head_dim_v): for
// D == Dv the smallest D == Dv one with head_dim >= D; for D != Dv the smallest D != Dv one
// covering both (the sm90 tile tables' rule: zero padding covers the rest). Null when none.
template <class Kernel, std::size_t N>
const Kernel* smallest_covering_pair(const Kernel (&kernels)[N], ElementType dtype, int head_dim,
                                     int head_dim_v) {
  const bool pair = head_dim != head_dim_v;
  const Kernel* best = nullptr;
  for (const Kernel& k : kernels)
    if (k.entry && k.dtype == dtype && (k.head_dim != k.head_dim_v) == pair &&
        k.head_dim >= head_dim && k.head_dim_v >= head_dim_v &&
        (!best || k.head_dim < best->head_dim ||
         (k.head_dim == best->head_dim && k.head_dim_v < best->head_dim_v)))
      best = &k;
  return best;
}

// "64" for an instantiation with D == Dv, "192x128" otherwise: kernel names and messages.
template <class Kernel>
std::string head_dim_tag(const Kernel& k) {
  return std::to_string(k.head_dim) +
         (k.head_dim == k.head_dim_v ? "" : "x" + std::to_string(k.head_dim_v));
}

// "64, 128, 192x128" (or "none"): the head dims and DxDv pairs built for `dtype`.
template <class Kernel, std::size_t N>
std::string built_head_dim_pairs(const Kernel (&kernels)[N], ElementType dtype) {
  std::string s;
  for (const Kernel& k : kernels)
    if (k.entry && k.dtype == dtype) s += (s.empty() ? "" : ", ") + head_dim_tag(k);
  return s.empty() ? "none" : s;
}

}  // namespace flashcpp::detail::cuda
