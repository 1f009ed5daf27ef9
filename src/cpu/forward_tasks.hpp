#pragma once
// How the CPU forwards (AVX-512 fp32, AMX bf16) deal their work: tasks of (batch, head, row
// block). A task's rows share each key block it converts or packs (that copy is read from
// memory: at 128 rows, D 128, fp32 it took ~13% of the time), so a task takes as many rows as
// it can, 512, 256 or 128, while every thread still gets 4 tasks.
#include <omp.h>

#include <cstdint>

#include "common/params.hpp"

namespace flashcpp::detail::cpu {

inline constexpr int kForwardTaskRows = 512;       // the most rows of a task (buffers' size)
inline constexpr int kForwardSmallTaskRows = 128;  // the fewest

// The rows of each task for this call.
inline int forward_task_rows(const ForwardParams& p) {
  const std::int64_t heads = std::int64_t{p.batch} * p.heads_q;
  int rows = kForwardTaskRows;
  while (rows > kForwardSmallTaskRows &&
         heads * ((p.seqlen_q + rows - 1) / rows) < 4 * omp_get_max_threads())
    rows /= 2;
  return rows;
}

}  // namespace flashcpp::detail::cpu
