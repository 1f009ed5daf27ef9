#pragma once
// Consecutive rows of one head of an input tensor, seen as fp32 by the tiled backward: the
// tensor itself when it is fp32, otherwise the rows converted into a buffer owned by the
// calling thread, one block at a time. Converting a block again for each block it meets
// costs O(rows * dim) against the O(rows * cols * dim) products that use it; a whole-input
// fp32 copy would cost 2x the input's memory. fp32 rows a multiple of 4 KiB apart (one head
// of a [B, N, H, D] tensor with H * D = 1024) are copied densely as well: the block products
// walk down their rows, which then fall into the same few L1 sets.
#include <cstdint>
#include <vector>

#include "common/params.hpp"

namespace flashcpp::detail::cpu {

class Fp32Rows {
 public:
  // Up to max_rows rows of `dim` elements.
  Fp32Rows(ElementType type, int max_rows, int dim);

  // Rows [0, rows) starting at element `first` of `base`, `ld` elements apart.
  void load(const void* base, ElementType type, std::int64_t first, std::int64_t ld, int rows,
            int dim);

  const float* data() const { return data_; }
  std::int64_t ld() const { return ld_; }

 private:
  std::vector<float> buffer_;
  const float* data_ = nullptr;
  std::int64_t ld_ = 0;
};

}  // namespace flashcpp::detail::cpu
