"""Context parallelism: exact attention over a sequence sharded across the ranks of a
torch.distributed process group (NCCL on GPUs, gloo on CPUs; the same code).

    import torch.distributed as dist
    from flashcpp.distributed import ring_attention, shard_sequence, gather_sequence
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard_sequence(t, rank, world) for t in (q_full, k_full, v_full))  # zig-zag
    out = ring_attention(q, k, v, causal=True)         # this rank's rows, differentiable
    out_full = gather_sequence(out)

ring_attention passes K/V shards around a ring; ulysses_attention exchanges heads all-to-all
instead. Which to pick when: docs/context_parallel.md.
"""

from .merge import merge_partial, merged_lse
from .ring import ring_attention, ring_attention_varlen
from .sharding import (
    gather_sequence,
    local_cu_seqlens,
    shard_sequence,
    shard_varlen,
    unshard_sequence,
    unshard_varlen,
)
from .ulysses import ulysses_attention

__all__ = [
    "gather_sequence",
    "local_cu_seqlens",
    "merge_partial",
    "merged_lse",
    "ring_attention",
    "ring_attention_varlen",
    "shard_sequence",
    "shard_varlen",
    "unshard_sequence",
    "ulysses_attention",
    "unshard_varlen",
]
