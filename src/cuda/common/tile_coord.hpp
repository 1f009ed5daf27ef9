#pragma once
// The coordinates of one forward work tile: query block, KV split, query head, batch. Every
// forward kernel's scheduler produces them and its epilogue consumes them.

namespace flashcpp::detail::cuda {

struct TileCoord {
  int m_block;
  int split;
  int head;
  int batch;
};

}  // namespace flashcpp::detail::cuda
