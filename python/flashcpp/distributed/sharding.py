"""Which rows of a sequence each rank holds, and the helpers that shard and unshard tensors.

A sequence of length N is cut into chunks; rank r holds some of them, concatenated in order:

- "contiguous": W chunks, rank r holds chunk r. Fine without a causal mask.
- "zigzag": 2W chunks, rank r holds chunks r and 2W-1-r. Under a causal mask every rank then
  has the same amount of work (an early chunk, cheap, with a late one, expensive).

Chunk sizes differ by at most one row when W (or 2W) does not divide N: the first N mod W chunks
get one row more, as torch.tensor_split does. A rank may hold no row at all (N < W).
Varlen batches are sharded sequence by sequence, each with the same rule.
"""

from __future__ import annotations

from typing import List, NamedTuple, Sequence

import torch
from torch import Tensor

from .._native import Error

LAYOUTS = ("zigzag", "contiguous")


class Segment(NamedTuple):
    """Rows [start, start + length) of a sequence, held at row `offset` of the local shard."""

    start: int
    length: int
    offset: int


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise Error(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")


def _chunk_bounds(seq_len: int, chunks: int) -> List[int]:
    base, extra = divmod(seq_len, chunks)
    bounds = [0]
    for c in range(chunks):
        bounds.append(bounds[-1] + base + (1 if c < extra else 0))
    return bounds


def shard_segments(seq_len: int, rank: int, world_size: int, layout: str,
                   offset: int = 0) -> List[Segment]:
    """The segments of a sequence of seq_len rows that `rank` holds, in local order, the first
    at local row `offset`. Empty segments are left out."""
    check_layout(layout)
    if world_size < 1 or not 0 <= rank < world_size:
        raise Error(f"rank: expected 0 <= rank < world_size ({world_size}), got {rank}")
    if seq_len < 0:
        raise Error(f"seq_len: must be >= 0, got {seq_len}")
    if layout == "contiguous":
        bounds = _chunk_bounds(seq_len, world_size)
        chunks = [rank]
    else:
        bounds = _chunk_bounds(seq_len, 2 * world_size)
        chunks = [rank, 2 * world_size - 1 - rank]
    segments = []
    for c in chunks:
        length = bounds[c + 1] - bounds[c]
        if length:
            segments.append(Segment(bounds[c], length, offset))
            offset += length
    return segments


def shard_length(seq_len: int, rank: int, world_size: int, layout: str) -> int:
    return sum(s.length for s in shard_segments(seq_len, rank, world_size, layout))


def shard_rows(seq_len: int, rank: int, world_size: int, layout: str) -> List[int]:
    """The global rows `rank` holds, in local order."""
    return [row for s in shard_segments(seq_len, rank, world_size, layout)
            for row in range(s.start, s.start + s.length)]


def shard_sequence(x: Tensor, rank: int, world_size: int, *, dim: int = 1,
                   layout: str = "zigzag") -> Tensor:
    """Rank `rank`'s shard of the full sequence x along `dim` (1 for [B, N, H, D])."""
    segments = shard_segments(x.shape[dim], rank, world_size, layout)
    if not segments:
        return x.narrow(dim, 0, 0).clone()
    return torch.cat([x.narrow(dim, s.start, s.length) for s in segments], dim=dim)


def unshard_sequence(shards: Sequence[Tensor], *, dim: int = 1,
                     layout: str = "zigzag") -> Tensor:
    """The full sequence from every rank's shard (shards[r] from rank r)."""
    world_size = len(shards)
    seq_len = sum(s.shape[dim] for s in shards)
    pieces = []
    for rank, shard in enumerate(shards):
        segments = shard_segments(seq_len, rank, world_size, layout)
        if sum(s.length for s in segments) != shard.shape[dim]:
            raise Error(f"shards[{rank}]: {shard.shape[dim]} rows along dim {dim}, but layout "
                        f"{layout} of {seq_len} rows over {world_size} ranks gives it "
                        f"{sum(s.length for s in segments)}")
        pieces += [(s.start, shard.narrow(dim, s.offset, s.length)) for s in segments]
    pieces.sort(key=lambda p: p[0])
    return torch.cat([p[1] for p in pieces], dim=dim) if pieces else shards[0]


def gather_sequence(shard: Tensor, group=None, *, dim: int = 1, layout: str = "zigzag",
                    seq_len: int | None = None) -> Tensor:
    """The full sequence on every rank of `group`, from each rank's shard (all_gather).

    seq_len: the full length; needed when shards differ in length (default: the local length
    times the world size)."""
    import torch.distributed as dist

    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if seq_len is None:
        seq_len = shard.shape[dim] * world_size
    lengths = [shard_length(seq_len, r, world_size, layout) for r in range(world_size)]
    if shard.shape[dim] != lengths[rank]:
        raise Error(f"shard: {shard.shape[dim]} rows along dim {dim}, but layout {layout} of "
                    f"{seq_len} rows over {world_size} ranks gives rank {rank} {lengths[rank]}")
    # all_gather needs equal sizes: pad to the longest shard, then cut each back.
    longest = max(lengths)
    padded = shard.new_zeros(shard.shape[:dim] + (longest,) + shard.shape[dim + 1:])
    padded.narrow(dim, 0, shard.shape[dim]).copy_(shard)
    gathered = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(gathered, padded.contiguous(), group=group)
    return unshard_sequence([g.narrow(dim, 0, n) for g, n in zip(gathered, lengths)], dim=dim,
                            layout=layout)


# ---- varlen (packed sequences) -------------------------------------------------------------
def _seqlens(cu_seqlens) -> List[int]:
    """Host ints from cu_seqlens (a list or an int tensor: one copy to the host, once a call)."""
    cu = cu_seqlens.tolist() if isinstance(cu_seqlens, Tensor) else [int(c) for c in cu_seqlens]
    if not cu or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise Error(f"cu_seqlens: expected 0 followed by non-decreasing offsets, got {cu}")
    return cu


def varlen_shard_segments(cu_seqlens, rank: int, world_size: int,
                          layout: str) -> List[List[Segment]]:
    """Per sequence, the segments `rank` holds, with offsets into the local packed shard
    (sequences stay in order; each one's rows are sharded as a sequence of its own)."""
    cu = _seqlens(cu_seqlens)
    result, offset = [], 0
    for a, b in zip(cu, cu[1:]):
        segments = shard_segments(b - a, rank, world_size, layout, offset)
        offset += sum(s.length for s in segments)
        result.append(segments)
    return result


def local_cu_seqlens(cu_seqlens, rank: int, world_size: int, layout: str) -> List[int]:
    """cu_seqlens of `rank`'s packed shard."""
    cu = [0]
    for segments in varlen_shard_segments(cu_seqlens, rank, world_size, layout):
        cu.append(cu[-1] + sum(s.length for s in segments))
    return cu


def _varlen_rows(cu_seqlens, rank: int, world_size: int, layout: str) -> List[int]:
    cu = _seqlens(cu_seqlens)
    return [cu[b] + s.start + i
            for b, segments in enumerate(varlen_shard_segments(cu, rank, world_size, layout))
            for s in segments for i in range(s.length)]


def shard_varlen(x: Tensor, cu_seqlens, rank: int, world_size: int, *, dim: int = 0,
                 layout: str = "zigzag") -> Tensor:
    """Rank `rank`'s packed shard of packed sequences x ([total, H, D] for dim 0): each sequence
    is sharded on its own; local_cu_seqlens gives the shard's offsets."""
    rows = _varlen_rows(cu_seqlens, rank, world_size, layout)
    return x.index_select(dim, torch.tensor(rows, dtype=torch.long, device=x.device))


def unshard_varlen(shards: Sequence[Tensor], cu_seqlens, *, dim: int = 0,
                   layout: str = "zigzag") -> Tensor:
    """The packed sequences from every rank's packed shard (shards[r] from rank r)."""
    world_size = len(shards)
    total = _seqlens(cu_seqlens)[-1]
    first = shards[0]
    out = first.new_zeros(first.shape[:dim] + (total,) + first.shape[dim + 1:])
    for rank, shard in enumerate(shards):
        rows = _varlen_rows(cu_seqlens, rank, world_size, layout)
        if len(rows) != shard.shape[dim]:
            raise Error(f"shards[{rank}]: {shard.shape[dim]} rows along dim {dim}, expected "
                        f"{len(rows)} for cu_seqlens over {world_size} ranks")
        out.index_copy_(dim, torch.tensor(rows, dtype=torch.long, device=out.device), shard)
    return out
