#pragma once
// The lookup the sm90a tile tables share (fwd_tile_table.hpp, bwd_tile_table.hpp): which row of
// a table serves a call of head dims (head_dim, head_dim_v). Host constexpr only.

namespace flashcpp::detail::cuda {

// For D == Dv the smallest D == Dv row with head_dim >= D (smaller dims run zero-padded: TMA
// fills the missing columns with zeros); for D != Dv the smallest D != Dv row covering both
// (same padding). A value-initialised Tile (head_dim 0) when no row covers the call.
template <class Tile, int N>
constexpr Tile tile_for_head_dims(const Tile (&tiles)[N], int head_dim, int head_dim_v) {
  const bool pair = head_dim != head_dim_v;
  Tile best{};
  for (const Tile& t : tiles)
    if ((t.head_dim != t.head_dim_v) == pair && t.head_dim >= head_dim &&
        t.head_dim_v >= head_dim_v &&
        (best.head_dim == 0 || t.head_dim < best.head_dim ||
         (t.head_dim == best.head_dim && t.head_dim_v < best.head_dim_v)))
      best = t;
  return best;
}

}  // namespace flashcpp::detail::cuda
