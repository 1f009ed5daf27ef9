"""The exact merge of partial attention results by their log-sum-exp.

Attention over keys K1 and K2 together, from the results over each part:
    lse = log(exp(lse1) + exp(lse2)),   out = exp(lse1 - lse) out1 + exp(lse2 - lse) out2.
A row that sees no key of a part has lse = -inf and out 0 there; when it sees none at all the
merged lse stays -inf and out 0 (the weights are computed against 0, not against -inf, which
would give exp(-inf - -inf) = NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor

_MINUS_INF = float("-inf")


def _finite_or_zero(x: Tensor) -> Tensor:
    return torch.where(x == _MINUS_INF, 0.0, x)


def merged_lse(lse_a: Tensor, lse_b: Tensor) -> Tensor:
    """log(exp(lse_a) + exp(lse_b)), -inf (not NaN) where both are -inf."""
    top = _finite_or_zero(torch.maximum(lse_a, lse_b))
    return top + torch.log(torch.exp(lse_a - top) + torch.exp(lse_b - top))


def _per_row(lse: Tensor) -> Tensor:
    # lse [..., H, N] against out [..., N, H, Dv]: [B, H, N] padded, [H, T] varlen
    return lse.transpose(-1, -2).unsqueeze(-1)


def merge_partial(out_acc: Tensor, lse_acc: Tensor, out: Tensor, lse: Tensor) -> None:
    """Merges the partial result (out, lse) into (out_acc, lse_acc), in place (float32
    accumulators; out [..., N, H, Dv] with lse [..., H, N], as flashcpp returns them)."""
    lse_new = merged_lse(lse_acc, lse)
    weight = torch.exp(lse - _finite_or_zero(lse_new))  # the new part's share, in [0, 1]
    # The two shares add up to 1, so out_acc + weight (out - out_acc) is the weighted sum, in
    # one pass over out_acc (this runs once per ring step on the whole shard). Where both lse
    # are -inf, weight is 0 and out_acc stays 0.
    out_acc.lerp_(out.to(out_acc.dtype), _per_row(weight))
    lse_acc.copy_(lse_new)
