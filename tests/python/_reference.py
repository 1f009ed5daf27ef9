"""A float64 NumPy oracle for the tests, written from docs/semantics.md.

It materialises S and P per (batch, head), independent of flashcpp's own C++ reference, so the
tests compare two implementations written separately.
"""

from __future__ import annotations

import numpy as np


def visible(nq: int, nk: int, causal: bool, window=(-1, -1)) -> np.ndarray:
    """[nq, nk] bool: key j visible to query i (bottom-right aligned)."""
    left, right = window
    if causal:  # causal caps the right bound at the diagonal
        right = 0
    i = np.arange(nq)[:, None] + (nk - nq)
    j = np.arange(nk)[None, :]
    mask = np.ones((nq, nk), dtype=bool)
    if left >= 0:
        mask &= j >= i - left
    if right >= 0:
        mask &= j <= i + right
    return mask


def _softmax(q, k, mask, scale, softcap):
    """q [Nq, D], k [Nk, D] -> the raw scores x = scale * q k^T, P (softmax of the capped,
    masked scores; all zero in a row without a visible key) and each row's lse (-inf there)."""
    x = scale * (q @ k.T)
    s = softcap * np.tanh(x / softcap) if softcap > 0 else x
    s = np.where(mask, s, -np.inf)
    row_max = s.max(axis=1, initial=-np.inf, keepdims=True)
    safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
    p = np.exp(s - safe_max)
    denom = p.sum(axis=1, keepdims=True)
    lse = np.full(len(p), -np.inf)
    has_key = denom[:, 0] > 0
    lse[has_key] = np.log(denom[has_key, 0]) + safe_max[has_key, 0]
    p = np.divide(p, denom, out=np.zeros_like(p), where=denom > 0)
    return x, p, lse


def forward(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """q [B, Nq, Hq, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv] -> out (float64), lse [B, Hq, Nq]."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    b, nq, hq, d = q.shape
    nk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    mask = visible(nq, nk, causal, window)
    out = np.zeros((b, nq, hq, dv))
    lse = np.empty((b, hq, nq))
    for bi in range(b):
        for h in range(hq):
            g = h // (hq // hkv)
            _, p, lse[bi, h] = _softmax(q[bi, :, h], k[bi, :, g], mask, scale, softcap)
            out[bi, :, h] = p @ v[bi, :, g]
    return out, lse


def backward(dout, q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """Analytic float64 gradients (dq, dk, dv) of forward()."""
    dout, q, k, v = (np.asarray(t, dtype=np.float64) for t in (dout, q, k, v))
    b, nq, hq, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    mask = visible(nq, nk, causal, window)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for bi in range(b):
        for h in range(hq):
            g = h // (hq // hkv)
            x, p, _ = _softmax(q[bi, :, h], k[bi, :, g], mask, scale, softcap)
            do = dout[bi, :, h]
            dv[bi, :, g] += p.T @ do
            dp = do @ v[bi, :, g].T
            ds = p * (dp - (dp * p).sum(axis=1, keepdims=True))
            if softcap > 0:
                ds = ds * (1.0 - np.tanh(x / softcap) ** 2)
            dq[bi, :, h] = scale * ds @ k[bi, :, g]
            dk[bi, :, g] += scale * ds.T @ q[bi, :, h]
    return dq, dk, dv


def pack(seqs):
    """[n_i, H, D] arrays -> packed [sum n_i, H, D] and int32 cu_seqlens [len + 1]."""
    lengths = [s.shape[0] for s in seqs]
    cu = np.zeros(len(seqs) + 1, dtype=np.int32)
    cu[1:] = np.cumsum(lengths)
    return np.concatenate(seqs, axis=0), cu
