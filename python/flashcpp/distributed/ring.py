"""Ring attention: exact attention over a sequence sharded across the ranks of a process group.

Every rank keeps its query shard; the K/V shards travel around the ring (rank r sends to r + 1),
so at step s rank r holds the K/V shard of rank r - s. Each step computes the local queries
against that shard with flashcpp's forward (block_plan says which calls, from the sharding and
the mask) and merges the partial (out, lse) into float32 accumulators (merge.py). The next
shard's transfer is issued before the step's attention and waited on after it.

The backward runs the same ring. flashcpp's backward, given the merged out and lse, returns
exactly this block's share of dq, dk and dv (its probabilities are exp(s - lse) with the global
lse, and its row sums dout . out use the global out), so no merge is needed there: dq adds up
locally, and each K/V shard's dk, dv (float32) travel with it one step behind and arrive back
at their owner after the last step.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from .. import torch as _custom_ops  # noqa: F401 - registers torch.ops.flashcpp
from .._native import Error
from .block_plan import Call, mask_bounds, plan_calls
from .merge import merge_partial
from .ring_comm import Ring
from .sharding import check_layout, shard_segments, varlen_shard_segments
from .varlen_calls import pack_varlen_calls


class _Options:
    def __init__(self, softmax_scale, softcap, backend, deterministic):
        self.softmax_scale = None if softmax_scale is None else float(softmax_scale)
        self.softcap = float(softcap)
        self.backend = backend
        self.deterministic = bool(deterministic)


class _Schedule:
    """What rank `rank` computes at each ring step, decided on the host from the sharding."""

    def __init__(self, ring: Ring, steps: List[list], kv_lengths: List[int],
                 cu_seqlens: Optional[Tensor]):
        self.ring = ring
        self.steps = steps            # steps[s]: the calls against the shard of rank - s
        self.kv_lengths = kv_lengths  # rows of every rank's K/V shard
        self.cu_seqlens = cu_seqlens  # varlen: every call's cu_seqlens_q, cu_seqlens_k, on device

    def held(self, step: int) -> int:
        """The rank whose K/V shard this rank holds at `step`."""
        return (self.ring.rank - step) % self.ring.world_size


_SCHEDULES: dict = {}


@torch.compiler.disable  # host-side planning: torch.compile runs it as it is
def _cached_padded_schedule(group, seq_len, layout, left, right) -> "_Schedule":
    # world size and rank are part of the key: a default group created anew may differ
    key = (group, dist.get_world_size(group), dist.get_rank(group), seq_len, layout, left,
           right)
    schedule = _SCHEDULES.get(key)
    if schedule is None:
        if len(_SCHEDULES) >= 64:
            _SCHEDULES.clear()
        schedule = _SCHEDULES[key] = _padded_schedule(Ring(group), seq_len, layout, left,
                                                      right)
    return schedule


def _padded_schedule(ring, seq_len, layout, left, right) -> _Schedule:
    world, rank = ring.world_size, ring.rank
    segments = [shard_segments(seq_len, r, world, layout) for r in range(world)]
    steps = [plan_calls(segments[rank], segments[(rank - s) % world], left, right)
             for s in range(world)]
    lengths = [sum(seg.length for seg in segments[r]) for r in range(world)]
    return _Schedule(ring, steps, lengths, None)


@torch.compiler.disable  # host-side planning: torch.compile runs it as it is
def _varlen_schedule(ring, cu_seqlens, layout, left, right, device) -> _Schedule:
    world, rank = ring.world_size, ring.rank
    segments = [varlen_shard_segments(cu_seqlens, r, world, layout) for r in range(world)]
    steps, offsets = [], []
    flat: List[int] = []
    for s in range(world):
        held = segments[(rank - s) % world]
        blocks = [call for mine, theirs in zip(segments[rank], held)
                  for call in plan_calls(mine, theirs, left, right)]
        calls = pack_varlen_calls(blocks)
        for call in calls:
            offsets.append(len(flat))
            flat += call.cu_seqlens_q + call.cu_seqlens_k
        steps.append(calls)
    lengths = [sum(seg.length for sequence in segments[r] for seg in sequence)
               for r in range(world)]
    # One copy to the device for the whole call: no host synchronisation per step.
    cu = torch.tensor(flat, dtype=torch.int32)
    if device.type == "cuda":
        cu = cu.pin_memory().to(device, non_blocking=True)
    schedule = _Schedule(ring, [], lengths, cu)
    for calls in steps:
        placed = []
        for call in calls:
            start = offsets.pop(0)
            n = len(call.cu_seqlens_q)
            placed.append((call, cu[start:start + n], cu[start + n:start + 2 * n]))
        schedule.steps.append(placed)
    return schedule


# ---- one block ---------------------------------------------------------------------------
def _rows(t: Tensor, call, dim: int) -> Tensor:
    return t if not isinstance(call, Call) else t.narrow(dim, call.q0, call.q1 - call.q0)


def _keys(t: Tensor, call) -> Tensor:
    return t if not isinstance(call, Call) else t.narrow(1, call.k0, call.k1 - call.k0)


def _block_forward(entry, q, k, v, o: _Options) -> Tuple[Tensor, Tensor]:
    if isinstance(entry, Call):
        return torch.ops.flashcpp.attention_fwd(
            _rows(q, entry, 1), _keys(k, entry), _keys(v, entry), entry.causal,
            o.softmax_scale, entry.window_left, entry.window_right, o.softcap, o.backend,
            o.deterministic)
    call, cu_q, cu_k = entry
    return torch.ops.flashcpp.attention_varlen_fwd(
        q, k, v, cu_q, cu_k, call.max_seqlen_q, call.max_seqlen_k, call.causal,
        o.softmax_scale, call.window_left, call.window_right, o.softcap, o.backend,
        o.deterministic)


def _block_backward(entry, dout, q, k, v, out, lse, o: _Options):
    if isinstance(entry, Call):
        return torch.ops.flashcpp.attention_bwd(
            _rows(dout, entry, 1), _rows(q, entry, 1), _keys(k, entry), _keys(v, entry),
            _rows(out, entry, 1), _rows(lse, entry, 2), entry.causal, o.softmax_scale,
            entry.window_left, entry.window_right, o.softcap, o.backend, o.deterministic)
    call, cu_q, cu_k = entry
    return torch.ops.flashcpp.attention_varlen_bwd(
        dout, q, k, v, out, lse, cu_q, cu_k, call.max_seqlen_q, call.max_seqlen_k,
        call.causal, o.softmax_scale, call.window_left, call.window_right, o.softcap,
        o.backend, o.deterministic)


def _call_of(entry):
    return entry if isinstance(entry, Call) else None


# ---- the ring ----------------------------------------------------------------------------
def _kv_like(t: Tensor, rows: int, dtype=None) -> Tensor:
    rows_dim = t.dim() - 3  # [B, N, H, D] or [T, H, D]
    shape = t.shape[:rows_dim] + (rows,) + t.shape[rows_dim + 1:]
    return t.new_empty(shape, dtype=dtype)


def _single_call(schedule: _Schedule, q: Tensor, k: Tensor):
    """The one call of a world of one rank that covers every row and key, or None."""
    calls = schedule.steps[0] if schedule.ring.world_size == 1 else []
    if len(calls) != 1:
        return None
    rows_dim = q.dim() - 3
    entry = calls[0]
    if isinstance(entry, Call) and (entry.q1 - entry.q0, entry.k1 - entry.k0) != (
            q.shape[rows_dim], k.shape[rows_dim]):
        return None
    return entry


def _ring_forward(q, k, v, schedule: _Schedule, o: _Options) -> Tuple[Tensor, Tensor]:
    ring, world = schedule.ring, schedule.ring.world_size
    rows_dim = q.dim() - 3
    single = _single_call(schedule, q, k)
    if single is not None:  # plain flashcpp: nothing to merge
        return _block_forward(single, q, k, v, o)
    heads, rows = q.shape[-2], q.shape[rows_dim]
    out_acc = q.new_zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float32)
    lse_acc = q.new_full(q.shape[:rows_dim] + (heads, rows), float("-inf"),
                         dtype=torch.float32)
    k_held, v_held = k.contiguous(), v.contiguous()
    for step in range(world):
        pending = None
        if step + 1 < world:
            incoming = schedule.kv_lengths[schedule.held(step + 1)]
            pending = ring.shift([k_held, v_held],
                                 [_kv_like(k, incoming), _kv_like(v, incoming)])
        for entry in schedule.steps[step]:
            out, lse = _block_forward(entry, q, k_held, v_held, o)
            call = _call_of(entry)
            merge_partial(_rows(out_acc, call, rows_dim), _rows(lse_acc, call, rows_dim + 1),
                          out, lse)
        if pending is not None:
            k_held, v_held = pending.wait()
    return out_acc.to(q.dtype), lse_acc


def _ring_backward(dout, q, k, v, out, lse, schedule: _Schedule, o: _Options):
    ring, world = schedule.ring, schedule.ring.world_size
    rows_dim = q.dim() - 3
    single = _single_call(schedule, q, k)
    if single is not None:  # plain flashcpp: nothing to add up
        return _block_backward(single, dout, q, k, v, out, lse, o)
    dq_acc = torch.zeros_like(q, dtype=torch.float32)
    k_held, v_held = k.contiguous(), v.contiguous()
    pending_grads = None
    for step in range(world):
        pending_kv = None
        if step + 1 < world:
            incoming = schedule.kv_lengths[schedule.held(step + 1)]
            pending_kv = ring.shift([k_held, v_held],
                                    [_kv_like(k, incoming), _kv_like(v, incoming)])
        dk_part = torch.zeros_like(k_held, dtype=torch.float32)
        dv_part = torch.zeros_like(v_held, dtype=torch.float32)
        for entry in schedule.steps[step]:
            dq, dk, dv = _block_backward(entry, dout, q, k_held, v_held, out, lse, o)
            call = _call_of(entry)
            _rows(dq_acc, call, rows_dim).add_(dq)
            _keys(dk_part, call).add_(dk)
            _keys(dv_part, call).add_(dv)
        if pending_grads is not None:  # this shard's dk, dv from the ranks before
            dk_before, dv_before = pending_grads.wait()
            dk_part.add_(dk_before)
            dv_part.add_(dv_before)
        if world > 1:  # pass them on; after the last step they reach the shard's owner
            incoming = schedule.kv_lengths[schedule.held(step + 1)]
            # The last hop carries the finished sums, which the owner only rounds to k's dtype:
            # rounded before sending instead (the same bits), it moves half the bytes, and it
            # is the one transfer no compute hides.
            dtypes = ((k.dtype, v.dtype) if step == world - 1
                      else (torch.float32, torch.float32))
            pending_grads = ring.shift(
                [dk_part.to(dtypes[0]), dv_part.to(dtypes[1])],
                [_kv_like(k, incoming, dtypes[0]), _kv_like(v, incoming, dtypes[1])],
                first_tag=2)  # in flight together with the next K/V shift
        else:
            dk_mine, dv_mine = dk_part, dv_part
        if pending_kv is not None:
            k_held, v_held = pending_kv.wait()
    if world > 1:
        dk_mine, dv_mine = pending_grads.wait()
    return dq_acc.to(q.dtype), dk_mine.to(k.dtype), dv_mine.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, schedule, options):
        out, lse = _ring_forward(q, k, v, schedule, options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.schedule, ctx.options = schedule, options
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        grads = _ring_backward(dout.contiguous(), q, k, v, out, lse, ctx.schedule,
                               ctx.options)
        return (*grads, None, None)


# ---- public functions --------------------------------------------------------------------
def _check_shards(q, k, v, rank_q: int, layout: str, window):
    check_layout(layout)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    shapes = {"q": "[B, N_local, Hq, D]", "k": "[B, N_local, Hkv, D]",
              "v": "[B, N_local, Hkv, Dv]"}
    if rank_q == 3:
        shapes = {n: "[total_local, " + s.split(", ", 2)[2] for n, s in shapes.items()}
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank_q:
            raise Error(f"{name}: expected {rank_q} dimensions {shapes[name]}, got {t.dim()}")
    rows_dim = rank_q - 3
    for name, t in (("k", k), ("v", v)):
        if t.shape[:rows_dim + 1] != q.shape[:rows_dim + 1]:
            raise Error(f"{name}: expected the leading dimensions {tuple(q.shape[:rows_dim + 1])}"
                        f" of q (a shard of the same sequence), got {tuple(t.shape)}")
    try:
        left, right = window
    except (TypeError, ValueError):
        raise TypeError(f"window: expected a pair (left, right) of ints, got {window!r}") from None
    return int(left), int(right)


def _check_length(q: Tensor, rows: int, ring: Ring, what: str) -> None:
    local = q.shape[q.dim() - 3]
    if local != rows:
        raise Error(f"q: rank {ring.rank} holds {local} rows, but {what} over "
                    f"{ring.world_size} ranks gives it {rows}")


def ring_attention(q: Tensor, k: Tensor, v: Tensor, group=None, *, causal: bool = False,
                   softmax_scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
                   softcap: float = 0.0, layout: str = "zigzag", seq_len: Optional[int] = None,
                   return_lse: bool = False, backend: str = "auto",
                   deterministic: bool = False):
    """Exact attention of a sequence sharded over the ranks of `group` (default: the world).

    q [B, N_local, Hq, D], k [B, N_local, Hkv, D], v [B, N_local, Hkv, Dv]: this rank's shard
    of the sequence as shard_sequence(x, rank, world_size, layout=layout) gives it. The mask
    options mean what they mean for the whole sequence (docs/semantics.md, Nq = Nk). seq_len:
    the whole sequence's length, needed when shards differ in length (default N_local times
    the world size). Returns this rank's rows of out [B, N_local, Hq, Dv] (and lse
    [B, Hq, N_local] float32 when return_lse). Differentiable in q, k and v; every rank of
    the group must call it with the same options and shapes (other than N_local).
    """
    left, right = _check_shards(q, k, v, 4, layout, window)
    if seq_len is None:
        seq_len = q.shape[1] * dist.get_world_size(group)
    schedule = _cached_padded_schedule(group, int(seq_len), layout,
                                       *mask_bounds(causal, (left, right)))
    ring = schedule.ring
    _check_length(q, schedule.kv_lengths[ring.rank], ring, f"layout {layout} of {seq_len} rows")
    out, lse = _RingAttention.apply(q, k, v, schedule,
                                    _Options(softmax_scale, softcap, backend, deterministic))
    return (out, lse) if return_lse else out


def ring_attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens, group=None, *,
                          causal: bool = False, softmax_scale: Optional[float] = None,
                          window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                          layout: str = "zigzag", return_lse: bool = False,
                          backend: str = "auto", deterministic: bool = False):
    """ring_attention for packed sequences. cu_seqlens: the offsets of the whole batch (a list
    or an int tensor, the same on every rank; read on the host once per call). q [T_local, Hq,
    D], k, v [T_local, Hkv, D]: this rank's packed shard, as shard_varlen gives it (each
    sequence sharded on its own; local_cu_seqlens gives its offsets). Returns out [T_local, Hq,
    Dv] (and lse [Hq, T_local] float32 when return_lse)."""
    left, right = _check_shards(q, k, v, 3, layout, window)
    ring = Ring(group)
    schedule = _varlen_schedule(ring, cu_seqlens, layout, *mask_bounds(causal, (left, right)),
                                q.device)
    _check_length(q, schedule.kv_lengths[ring.rank], ring, f"layout {layout} of cu_seqlens")
    out, lse = _RingAttention.apply(q, k, v, schedule,
                                    _Options(softmax_scale, softcap, backend, deterministic))
    return (out, lse) if return_lse else out


__all__ = ["ring_attention", "ring_attention_varlen"]
