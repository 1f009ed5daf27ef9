"""Ulysses attention (DeepSpeed-Ulysses): context parallelism by exchanging heads.

One all-to-all turns this rank's sequence shard of every head into the whole sequence of
H / W heads; flashcpp attends over it as one ordinary call (any mask, no merge); a second
all-to-all turns the result back into a sequence shard of every head. Each rank moves
3 (q, k, v) + 1 (out) tensors of its shard's size once, independent of W, but H and Hkv must be
divisible by the world size W, and the whole sequence of H / W heads must fit on one rank.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from .. import torch as flashcpp_torch
from .._native import Error
from .sharding import check_layout, shard_length, shard_sequence, unshard_sequence


def _sequence_to_heads(x: Tensor, lengths: List[int], layout: str, group) -> Tensor:
    """[B, n_rank, H, D] shard -> [B, N, H / W, D]: the whole sequence of this rank's heads."""
    world = len(lengths)
    batch, rows, heads, dim = x.shape
    local_heads = heads // world
    # [W, B, n_rank, H / W, D]: block j goes to rank j
    send = x.reshape(batch, rows, world, local_heads, dim).permute(2, 0, 1, 3, 4).contiguous()
    received = x.new_empty((batch * sum(lengths), local_heads * dim))
    dist.all_to_all_single(received, send.reshape(world * batch * rows, local_heads * dim),
                           [batch * n for n in lengths], [batch * rows] * world, group=group)
    pieces = received.split([batch * n for n in lengths])
    shards = [p.reshape(batch, n, local_heads, dim) for p, n in zip(pieces, lengths)]
    return unshard_sequence(shards, dim=1, layout=layout)


def _heads_to_sequence(x: Tensor, lengths: List[int], layout: str, group) -> Tensor:
    """[B, N, H / W, D] whole sequence -> [B, n_rank, H, D]: this rank's shard of every head."""
    world, rank = len(lengths), dist.get_rank(group)
    batch, _, local_heads, dim = x.shape
    send = torch.cat([shard_sequence(x, r, world, dim=1, layout=layout).reshape(-1)
                      for r in range(world)]).reshape(-1, local_heads * dim)
    rows = lengths[rank]
    received = x.new_empty((world * batch * rows, local_heads * dim))
    dist.all_to_all_single(received, send, [batch * rows] * world,
                           [batch * n for n in lengths], group=group)
    received = received.reshape(world, batch, rows, local_heads, dim).permute(1, 2, 0, 3, 4)
    return received.reshape(batch, rows, world * local_heads, dim)


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lengths, layout, group):
        ctx.lengths, ctx.layout, ctx.group = lengths, layout, group
        return _sequence_to_heads(x, lengths, layout, group)

    @staticmethod
    def backward(ctx, grad):
        return _heads_to_sequence(grad.contiguous(), ctx.lengths, ctx.layout, ctx.group), \
            None, None, None


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lengths, layout, group):
        ctx.lengths, ctx.layout, ctx.group = lengths, layout, group
        return _heads_to_sequence(x, lengths, layout, group)

    @staticmethod
    def backward(ctx, grad):
        return _sequence_to_heads(grad.contiguous(), ctx.lengths, ctx.layout, ctx.group), \
            None, None, None


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, group=None, *, causal: bool = False,
                      softmax_scale: Optional[float] = None,
                      window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                      layout: str = "zigzag", seq_len: Optional[int] = None,
                      backend: str = "auto", deterministic: bool = False) -> Tensor:
    """ring_attention's arguments and result, computed by two all-to-alls around one flashcpp
    call. Hq and Hkv must be divisible by the group's size. Differentiable."""
    check_layout(layout)
    world = dist.get_world_size(group)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise Error(f"{name}: expected 4 dimensions [B, N_local, H, D], got {t.dim()}")
        if t.shape[2] % world:
            raise Error(f"{name}: {t.shape[2]} heads are not divisible by the world size "
                        f"{world} (ulysses_attention splits heads; ring_attention does not)")
    if seq_len is None:
        seq_len = q.shape[1] * world
    lengths = [shard_length(int(seq_len), r, world, layout) for r in range(world)]
    rank = dist.get_rank(group)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[1] != lengths[rank]:
            raise Error(f"{name}: rank {rank} holds {t.shape[1]} rows, but layout {layout} of "
                        f"{seq_len} rows over {world} ranks gives it {lengths[rank]}")
    whole = [_SequenceToHeads.apply(t, lengths, layout, group) for t in (q, k, v)]
    out = flashcpp_torch.attention(*whole, causal=causal, softmax_scale=softmax_scale,
                                   window=window, softcap=softcap, backend=backend,
                                   deterministic=deterministic)
    return _HeadsToSequence.apply(out, lengths, layout, group)
