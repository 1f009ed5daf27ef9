"""Padded batches as packed sequences: a [B, N] padding mask turns a padded call into a varlen
call over the kept tokens (unpad), and its output back into the padded layout (repad), as
transformers' FlashAttention-2 backend does.

Only torch: the transformers integration is the one user. The index arithmetic syncs with the
host (nonzero, max), so it is for eager mode.
"""

from typing import NamedTuple

import torch
from torch import Tensor


class Unpadded(NamedTuple):
    """The kept tokens of a padded batch, packed: inputs of attention_varlen, and the rows of
    the padded [B * Nq] layout the packed queries came from."""

    q: Tensor
    k: Tensor
    v: Tensor
    cu_seqlens_q: Tensor
    cu_seqlens_k: Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    query_rows: Tensor


def _packing(keep: Tensor):
    """keep [B, N] bool -> (flat indices of the kept tokens, cu_seqlens int32 [B + 1], max)."""
    lengths = keep.sum(dim=1, dtype=torch.int32)
    rows = torch.nonzero(keep.flatten(), as_tuple=True)[0]
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    return rows, cu_seqlens, int(lengths.max())


def unpad(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Unpadded:
    """q [B, Nq, Hq, D], k/v [B, Nk, Hkv, D] and mask [B, L] (True: a real token) -> Unpadded.

    The mask covers the first L key positions; keys past L (the unused slots of a static cache)
    are dropped. The queries are the last Nq of the L positions (a prefill has Nq = L; a decode
    step or a chunk appended to a cache, the newest tokens).
    """
    batch, q_len = q.shape[0], q.shape[1]
    keep_k = mask.to(torch.bool)
    length = keep_k.shape[1]
    k, v = k[:, :length], v[:, :length]
    rows_k, cu_k, max_k = _packing(keep_k)
    k = k.reshape(batch * length, *k.shape[2:]).index_select(0, rows_k)
    v = v.reshape(batch * length, *v.shape[2:]).index_select(0, rows_k)
    if q_len == length:
        rows_q, cu_q, max_q = rows_k, cu_k, max_k
    else:
        rows_q, cu_q, max_q = _packing(keep_k[:, -q_len:])
    q = q.reshape(batch * q_len, *q.shape[2:]).index_select(0, rows_q)
    return Unpadded(q, k, v, cu_q, cu_k, max_q, max_k, rows_q)


def repad(out: Tensor, query_rows: Tensor, batch: int, q_len: int) -> Tensor:
    """Packed out [total_q, H, Dv] -> [B, Nq, H, Dv], zeros at the padding positions."""
    padded = out.new_zeros((batch * q_len, *out.shape[1:]))
    padded = padded.index_copy(0, query_rows, out)
    return padded.view(batch, q_len, *out.shape[1:])
