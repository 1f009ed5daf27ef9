"""The float32 reference (and its gradients) for the correctness check before timing.

It is the math of PyTorch's MATH backend in float32 on the same (bf16/fp16) inputs, computed a
few heads at a time so that the score matrix of one chunk stays under ~1 GiB: at N = 16k the
unchunked math path would need B*H*N^2*4 bytes (17 GB for H = 16) more than once.
TF32 is switched off while it runs.

Decode (compute_decode) has its own reference in float64: a query head reads its key/value
head in place (the query heads of one group are stacked), one sequence at a time, so a 64k
cache is neither expanded to Hq heads nor held in float64 whole.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

SCORE_BYTES_PER_CHUNK = 1 << 30
# Max |impl - ref| / max |ref| allowed, per tensor. bf16 keeps 8 bits of mantissa (2^-8 = 0.4%);
# a correct kernel stays well under these (about 0.5% for O, 1-2% for dQ at 16k keys), a wrong
# mask or scale or a race is off by tens of percent.
TOLERANCE = {"out": 2e-2, "dq": 5e-2, "dk": 5e-2, "dv": 5e-2}
# fp8 (e4m3) q, k, v: P is rounded to e4m3 (2^-4 relative per weight) before P V
# (docs/semantics.md, FP8 accuracy), coarser than the 16-bit bound above.
TOLERANCE_FP8_OUT = 0.1


class Reference:
    """out and, if asked, dq/dk/dv, as float32 [B, H, N, D] (BHSD) tensors."""

    def __init__(self, out, dq=None, dk=None, dv=None):
        self.out, self.dq, self.dk, self.dv = out, dq, dk, dv


def compute(q, k, v, dout, causal: bool, scale: float, grads: bool) -> Reference:
    """q [B, H, Nq, D], k/v [B, Hkv, Nk, D], dout like q (any strides, any float dtype)."""
    import torch  # noqa: PLC0415

    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = H // Hkv
    heads = max(1, min(H, SCORE_BYTES_PER_CHUNK // (Nq * Nk * 4)))
    out = torch.empty(B, H, Nq, D, device=q.device, dtype=torch.float32)
    dq = torch.empty_like(out) if grads else None
    dk = torch.zeros(B, Hkv, Nk, D, device=q.device, dtype=torch.float32) if grads else None
    dv = torch.zeros_like(dk) if grads else None
    mask = None
    if causal:
        i = torch.arange(Nq, device=q.device).view(Nq, 1)
        j = torch.arange(Nk, device=q.device).view(1, Nk)
        mask = j > i + (Nk - Nq)  # bottom-right aligned; True = masked
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with torch.enable_grad():
            for b in range(B):
                for h0 in range(0, H, heads):
                    h1 = min(H, h0 + heads)
                    kv_idx = torch.arange(h0, h1, device=q.device) // group
                    qc = q[b, h0:h1].float().requires_grad_(grads)
                    kc = k[b].float().requires_grad_(grads)
                    vc = v[b].float().requires_grad_(grads)
                    ke, ve = kc.index_select(0, kv_idx), vc.index_select(0, kv_idx)
                    s = torch.matmul(qc, ke.transpose(-1, -2)) * scale
                    if mask is not None:
                        s = s.masked_fill(mask, -math.inf)
                    p = torch.softmax(s, dim=-1)
                    if mask is not None:
                        p = torch.nan_to_num(p, nan=0.0)  # rows with no visible key give 0
                    o = torch.matmul(p, ve)
                    out[b, h0:h1] = o.detach()
                    if grads:
                        gq, gk, gv = torch.autograd.grad(o, (qc, kc, vc), dout[b, h0:h1].float())
                        dq[b, h0:h1] = gq
                        dk[b] += gk
                        dv[b] += gv
                    del s, p, o
    finally:
        torch.set_float32_matmul_precision(precision)
    return Reference(out, dq, dk, dv)


def compute_decode(q, k, v, scale: float):
    """out [B, Nq, Hq, D] float64 of q [B, Nq, Hq, D] over the full caches k, v [B, Nk, Hkv, D]
    (not causal); query head h reads key/value head h // (Hq / Hkv)."""
    import torch  # noqa: PLC0415

    B, Nq, Hq, D = q.shape
    Hkv = k.shape[2]
    group = Hq // Hkv
    out = torch.empty(B, Nq, Hq, D, device=q.device, dtype=torch.float64)
    for b in range(B):
        # [Nq, Hkv, group, D] -> [Hkv, group * Nq, D]: one matmul per key/value head
        qb = q[b].double().view(Nq, Hkv, group, D).permute(1, 2, 0, 3).reshape(Hkv, group * Nq, D)
        kb = k[b].double().transpose(0, 1)
        vb = v[b].double().transpose(0, 1)
        p = torch.softmax(torch.matmul(qb, kb.transpose(1, 2)) * scale, dim=-1)
        o = torch.matmul(p, vb).view(Hkv, group, Nq, D).permute(2, 0, 1, 3)
        out[b] = o.reshape(Nq, Hq, D)
        del qb, kb, vb, p, o  # before the next sequence's copies: one sequence's worth at a time
    return out


def relative_error(got, ref) -> float:
    """max |got - ref| / max |ref| in float32; inf when got has NaN/inf or the wrong shape."""
    import torch  # noqa: PLC0415
    if tuple(got.shape) != tuple(ref.shape):
        return math.inf
    g = got.float()
    if not torch.isfinite(g).all():
        return math.inf
    scale = ref.abs().max().item()
    return (g - ref).abs().max().item() / max(scale, 1e-6)


def check(ref: Reference, out=None, grads: Optional[Sequence] = None) -> Dict[str, float]:
    """Errors of the given tensors (all as BHSD views) against the reference."""
    errs: Dict[str, float] = {}
    if out is not None:
        errs["out"] = relative_error(out, ref.out)
    if grads is not None:
        for name, g, r in zip(("dq", "dk", "dv"), grads, (ref.dq, ref.dk, ref.dv)):
            errs[name] = relative_error(g, r)
    return errs


def verdict(errs: Dict[str, float], fp8: bool = False) -> Optional[str]:
    """None when every error is within TOLERANCE (fp8 inputs: TOLERANCE_FP8_OUT for out), else
    a line naming the bad tensors."""
    tol = dict(TOLERANCE, out=TOLERANCE_FP8_OUT) if fp8 else TOLERANCE
    bad = [f"{k} err {v:.3g} > {tol[k]:g}" for k, v in errs.items() if not v <= tol[k]]
    return "; ".join(bad) if bad else None
