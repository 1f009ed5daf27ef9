"""Packs per-sequence block calls of a varlen shard into flashcpp varlen calls.

A varlen call needs its sequences packed back to back in q and in k, while the blocks of one
ring step cover only some rows of each sequence. The rows in between become filler sequences
with no keys (their out is 0 and lse -inf, which the merge ignores) and the keys in between
filler sequences with no queries (their dk, dv are 0). Blocks with the same mask options go in
one call when their rows and keys both increase; each call runs over the whole local shard.
"""

from __future__ import annotations

from typing import List, NamedTuple, Sequence

from .block_plan import Call


class VarlenCall(NamedTuple):
    cu_seqlens_q: List[int]
    cu_seqlens_k: List[int]
    max_seqlen_q: int
    max_seqlen_k: int
    causal: bool
    window_left: int
    window_right: int


def _pack(blocks: Sequence[Call]) -> VarlenCall:
    cu_q, cu_k = [0], [0]

    def add(rows_q, rows_k):
        cu_q.append(cu_q[-1] + rows_q)
        cu_k.append(cu_k[-1] + rows_k)

    for block in blocks:
        if block.q0 > cu_q[-1]:
            add(block.q0 - cu_q[-1], 0)
        if block.k0 > cu_k[-1]:
            add(0, block.k0 - cu_k[-1])
        add(block.q1 - block.q0, block.k1 - block.k0)
    lengths_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
    lengths_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
    first = blocks[0]
    return VarlenCall(cu_q, cu_k, max(lengths_q), max(lengths_k), first.causal,
                      first.window_left, first.window_right)


def pack_varlen_calls(blocks: Sequence[Call]) -> List[VarlenCall]:
    """blocks: the calls of every sequence (rows and keys in local packed coordinates)."""
    groups: List[List[Call]] = []
    for block in sorted(blocks, key=lambda b: (b.q0, b.k0)):
        options = block[4:]
        for group in groups:
            last = group[-1]
            if last[4:] == options and block.q0 >= last.q1 and block.k0 >= last.k1:
                group.append(block)
                break
        else:
            groups.append([block])
    return [_pack(group) for group in groups]
