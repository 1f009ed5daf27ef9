"""Point-to-point shifts around a ring of ranks: send to rank + 1, receive from rank - 1.

One shift is one torch.distributed.batch_isend_irecv of every tensor, issued before the
compute it overlaps with and waited on after it. With NCCL the transfers run on NCCL's own
stream; wait() makes the current stream wait for them without blocking the host. With gloo
wait() blocks the calling thread, which is the only way gloo has. Empty tensors are not sent:
both ends know the sizes (from the sharding), so they skip the same transfers.
"""

from __future__ import annotations

from typing import List, Sequence

import torch.distributed as dist
from torch import Tensor


class PendingShift:
    """Transfers in flight; wait() returns the received tensors."""

    def __init__(self, works, received: List[Tensor], sent: Sequence[Tensor]):
        self._works = works
        self._received = received
        self._sent = sent  # kept alive until the transfers are done

    def wait(self) -> List[Tensor]:
        for work in self._works:
            work.wait()
        self._works, self._sent = [], ()
        return self._received


class Ring:
    def __init__(self, group=None):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        whole = group if group is not None else dist.group.WORLD
        self.next_rank = dist.get_global_rank(whole, (self.rank + 1) % self.world_size)
        self.prev_rank = dist.get_global_rank(whole, (self.rank - 1) % self.world_size)

    def shift(self, send: Sequence[Tensor], receive: List[Tensor],
              first_tag: int = 0) -> PendingShift:
        """Sends send[i] to the next rank and receives receive[i] from the previous one.
        Shifts in flight at the same time need tags of their own (first_tag + i; gloo matches
        by tag, NCCL by order)."""
        ops = []
        for tag, (out, into) in enumerate(zip(send, receive), start=first_tag):
            if out.numel():
                ops.append(dist.P2POp(dist.isend, out, self.next_rank, self.group, tag))
            if into.numel():
                ops.append(dist.P2POp(dist.irecv, into, self.prev_rank, self.group, tag))
        works = dist.batch_isend_irecv(ops) if ops else []
        return PendingShift(works, receive, send)
