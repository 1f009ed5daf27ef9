#include "api/overlap.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "flashcpp/error.hpp"

namespace flashcpp::detail {
namespace {

struct Dim {
  std::int64_t size;
  std::int64_t stride;
};

// The dimensions that address more than one element, largest stride first.
struct Layout {
  std::vector<Dim> dims;
  int count = 0;
};

Layout layout_of(const TensorView& t) {
  Layout l;
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1) l.dims.push_back({t.shape[d], t.stride[d]});
  std::sort(l.dims.begin(), l.dims.end(),
            [](const Dim& a, const Dim& b) { return a.stride > b.stride; });
  l.count = static_cast<int>(l.dims.size());
  return l;
}

// Offset of the last element, in elements.
std::int64_t last_offset(const Layout& l) {
  std::int64_t last = 0;
  for (int i = 0; i < l.count; ++i) last += (l.dims[i].size - 1) * l.dims[i].stride;
  return last;
}

// Every stride steps past all the elements the smaller strides reach: then no two elements
// share an address, and an offset decomposes into indices in at most two ways per dimension.
bool is_nested(const Layout& l) {
  std::int64_t reach = 0;
  for (int i = l.count - 1; i >= 0; --i) {
    if (l.dims[i].stride <= reach) return false;
    reach += (l.dims[i].size - 1) * l.dims[i].stride;
  }
  return true;
}

// Whether `offset` equals sum_i j_i * stride_i with |j_i| < size_i over dims [first, count):
// the difference of two elements' offsets. Nested layouts leave at most two j_i to try.
bool is_difference(const Layout& l, int first, std::int64_t offset) {
  if (first == l.count) return offset == 0;
  std::int64_t reach = 0;
  for (int i = first + 1; i < l.count; ++i) reach += (l.dims[i].size - 1) * l.dims[i].stride;
  const Dim& d = l.dims[first];
  const auto floor_div = [](std::int64_t a, std::int64_t b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
  };
  const std::int64_t lo = std::max(-(d.size - 1), -floor_div(-(offset - reach), d.stride));
  const std::int64_t hi = std::min(d.size - 1, floor_div(offset + reach, d.stride));
  for (std::int64_t j = lo; j <= hi; ++j)
    if (is_difference(l, first + 1, offset - j * d.stride)) return true;
  return false;
}

struct Bytes {
  std::uintptr_t begin, end;  // [begin, end)
};

Bytes bytes_of(const TensorView& t) {
  const auto begin = reinterpret_cast<std::uintptr_t>(t.data);
  const auto element = static_cast<std::uintptr_t>(dtype_size(t.dtype));
  return {begin, begin + (static_cast<std::uintptr_t>(last_offset(layout_of(t))) + 1) * element};
}

bool same_layout(const TensorView& a, const TensorView& b) {
  if (a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d) {
    if (a.shape[d] != b.shape[d]) return false;
    if (a.shape[d] > 1 && a.stride[d] != b.stride[d]) return false;
  }
  return true;
}

bool overlaps(const TensorView& out, const TensorView& other) {
  if (out.empty() || other.empty()) return false;
  const Bytes a = bytes_of(out), b = bytes_of(other);
  if (a.end <= b.begin || b.end <= a.begin) return false;
  const Layout layout = layout_of(out);
  if (!same_layout(out, other) || !is_nested(layout)) return true;
  const auto delta = static_cast<std::int64_t>(b.begin - a.begin);
  const auto element = static_cast<std::int64_t>(dtype_size(out.dtype));
  if (delta % element != 0) return true;
  return is_difference(layout, 0, delta / element);
}

[[noreturn]] void fail_overlap(const char* output, const char* other) {
  throw Error(std::string(output) + ": overlaps " + other +
              " in memory (outputs may not share memory with inputs or other outputs)");
}

}  // namespace

void check_no_overlap(std::initializer_list<NamedView> outputs,
                      std::initializer_list<NamedView> inputs) {
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    if (out->view == nullptr || out->view->empty()) continue;
    if (!is_nested(layout_of(*out->view)))
      throw Error(std::string(out->name) +
                  ": several elements share one memory location (stride 0 or overlapping "
                  "strides); an output must not overlap itself");
    for (const NamedView& in : inputs)
      if (in.view != nullptr && overlaps(*out->view, *in.view)) fail_overlap(out->name, in.name);
    for (auto earlier = outputs.begin(); earlier != out; ++earlier)
      if (earlier->view != nullptr && overlaps(*out->view, *earlier->view))
        fail_overlap(out->name, earlier->name);
  }
}

}  // namespace flashcpp::detail
