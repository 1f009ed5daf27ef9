#pragma once
// Memory overlap between the tensors of one call. An output that shares memory with an input,
// with another output or with itself gives wrong results (a kernel reads what it already
// overwrote), so validation refuses it, as PyTorch does for its out= arguments.
#include <initializer_list>

#include "flashcpp/tensor.hpp"

namespace flashcpp::detail {

struct NamedView {
  const TensorView* view;  // null: not given (an optional tensor), skipped
  const char* name;
};

// Throws flashcpp::Error naming the first output that overlaps itself, an input or an earlier
// output. Exact for views of one layout (dq, dk, dv interleaved in one packed buffer pass);
// views of different layouts whose address ranges intersect count as overlapping. Call after
// the shapes and strides are validated (non-negative, rank as expected).
void check_no_overlap(std::initializer_list<NamedView> outputs,
                      std::initializer_list<NamedView> inputs);

}  // namespace flashcpp::detail
