"""Which flashcpp calls compute the attention of a local query shard to one K/V shard.

The mask is defined on global positions: query row p sees key row t iff
    -right <= p - t <= left           (either bound may be absent; causal sets right = 0)
the usual bottom-right alignment of a self-attention with Nq = Nk (docs/semantics.md). A shard
is a list of segments (global rows [start, start + length) at a local offset), so within one
(query segment, key segment) pair the mask is a band in local rows with a shift
delta = (q.start - q.offset) - (k.start - k.offset). flashcpp's own window is such a band too,
aligned to the bottom-right corner of its call, so each pair is one flashcpp call once its
rectangle is trimmed to the rows and keys that see something (which keeps the call's window
bounds >= 0, the only values flashcpp takes).

Fewer, larger calls are faster, so plan_calls first tries one call over the whole shards, then
one call per key segment, then one per query segment, and only then one per pair: a grouping
is valid when every pair in it is, under one shared shift, what it really is (fully visible,
fully hidden, or the same band). For zig-zag causal shards this gives one call per step:
the diagonal step is a plain causal call, the others a full block of half the rows or keys.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence

from .sharding import Segment

_UNBOUNDED = 1 << 62  # larger than any row count, small enough for exact int arithmetic


class Call(NamedTuple):
    """One flashcpp call: query rows [q0, q1) of the local shard against key rows [k0, k1) of
    the K/V shard, with flashcpp's options (causal, window_left, window_right)."""

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool
    window_left: int
    window_right: int


def mask_bounds(causal: bool, window=(-1, -1)) -> tuple:
    """(left, right) of the global mask, None where unbounded (causal caps right at 0)."""
    left, right = window
    left = None if left < 0 else int(left)
    right = None if right < 0 else int(right)
    if causal:
        right = 0
    return left, right


def _visibility(a, b, c, d, delta, left, right) -> str:
    """'full', 'empty' or 'partial': rows [a, b) x keys [c, d) under -right <= i-j+delta <= left."""
    lo, hi = a - (d - 1) + delta, (b - 1) - c + delta  # every value in between occurs
    if hi < -right or lo > left:
        return "empty"
    return "full" if lo >= -right and hi <= left else "partial"


def _shift(q: Segment, k: Segment) -> int:
    return (q.start - q.offset) - (k.start - k.offset)


def _group_shift(q_segments, k_segments, left, right) -> Optional[tuple]:
    """(kind, delta) for one call over these segments, or None when no single band fits.
    kind: 'empty' (nothing visible), 'full' (no mask needed) or 'band'."""
    pairs = [(q, k) for q in q_segments for k in k_segments]
    kinds = [_visibility(q.offset, q.offset + q.length, k.offset, k.offset + k.length,
                         _shift(q, k), left, right) for q, k in pairs]
    if all(kind == "empty" for kind in kinds):
        return "empty", 0
    if all(kind == "full" for kind in kinds):
        return "full", 0
    candidates = {_shift(q, k) for (q, k), kind in zip(pairs, kinds) if kind == "partial"}
    if len(candidates) > 1:
        return None
    for delta in candidates or {_shift(q, k) for q, k in pairs}:
        if all(_visibility(q.offset, q.offset + q.length, k.offset, k.offset + k.length, delta,
                           left, right) == kind for (q, k), kind in zip(pairs, kinds)):
            return "band", delta
    return None


def _band_call(qa, qb, ka, kb, delta, left, right) -> Optional[Call]:
    """The call over rows [qa, qb) x keys [ka, kb) under the band of shift delta, trimmed to the
    rows and keys that see something (None if nothing is visible)."""
    q0, q1 = max(qa, ka - delta - right), min(qb, kb - delta + left)
    k0, k1 = max(ka, qa + delta - left), min(kb, qb + delta + right)
    if q0 >= q1 or k0 >= k1:
        return None
    nq, nk = q1 - q0, k1 - k0
    shift = delta + q0 - k0 - (nk - nq)  # the band relative to flashcpp's bottom-right diagonal
    window_left, window_right = left - shift, right + shift
    # Trimming keeps both >= 0: the last row sees a key and the last key is seen.
    assert window_left >= 0 and window_right >= 0, (window_left, window_right)
    window_left = -1 if window_left >= nk - 1 else window_left
    window_right = -1 if window_right >= nq - 1 else window_right
    if (window_left, window_right) == (-1, 0):
        return Call(q0, q1, k0, k1, True, -1, -1)
    return Call(q0, q1, k0, k1, False, window_left, window_right)


def _extent(segments: Sequence[Segment]) -> tuple:
    return segments[0].offset, segments[-1].offset + segments[-1].length


def _group_calls(q_segments, k_segments, left, right) -> Optional[List[Call]]:
    shape = _group_shift(q_segments, k_segments, left, right)
    if shape is None:
        return None
    kind, delta = shape
    if kind == "empty":
        return []
    (qa, qb), (ka, kb) = _extent(q_segments), _extent(k_segments)
    if kind == "full":
        return [Call(qa, qb, ka, kb, False, -1, -1)]
    call = _band_call(qa, qb, ka, kb, delta, left, right)
    return [] if call is None else [call]


def plan_calls(q_segments: Sequence[Segment], k_segments: Sequence[Segment],
               left: Optional[int], right: Optional[int]) -> List[Call]:
    """The flashcpp calls computing local queries (q_segments) against one K/V shard
    (k_segments) of the same sequence, under the global mask bounds (left, right)."""
    if not q_segments or not k_segments:
        return []
    left = _UNBOUNDED if left is None else left
    right = _UNBOUNDED if right is None else right
    groupings = [
        [(q_segments, k_segments)],
        [(q_segments, [k]) for k in k_segments],
        [([q], k_segments) for q in q_segments],
        [([q], [k]) for q in q_segments for k in k_segments],
    ]
    best = None
    for grouping in groupings:
        calls = []
        for qs, ks in grouping:
            group = _group_calls(qs, ks, left, right)
            if group is None:
                break
            calls += group
        else:
            if best is None or len(calls) < len(best):
                best = calls
    return best
