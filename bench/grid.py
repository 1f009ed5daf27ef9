"""Benchmark cases, the grids of docs/benchmarking.md, and the FLOP and byte counts (no torch).

A `Case` is one attention problem; a *mode* says what is timed on it (`fwd`, `bwd`, `fwd+bwd`).
The decode grid (KV cache) is a later issue: it will add its own builder to `GRIDS` and its own
modes, and reuse `Case` (Hkv != H, Nq of 1/4/16) and the `gbps` column.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable, Dict, Iterable, List, Sequence

TRAIN_MODES = ("fwd", "bwd", "fwd+bwd")
BACKWARD_MODES = ("bwd", "fwd+bwd")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
LSE_BYTES = 4  # the log-sum-exp is float32 in every implementation we compare

# The FlashAttention papers' training grid: 16k tokens per batch, hidden size 2048.
DEFAULT_TOKENS = 16384
DEFAULT_HIDDEN = 2048
DEFAULT_HEAD_DIMS = (64, 128, 256)
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
# --quick: one head dim, two lengths, causal off and on, every mode (~1-2 minutes with flex's
# compiles included).
QUICK_HEAD_DIMS = (128,)
QUICK_SEQLENS = (1024, 4096)


@dataclasses.dataclass(frozen=True)
class Case:
    """One attention problem. H is the number of query heads; Hkv that of key/value heads."""

    dtype: str
    D: int
    causal: bool
    B: int
    H: int
    Hkv: int
    Nq: int
    Nk: int

    @property
    def label(self) -> str:
        """Short name for tables: `bf16 D128 N4096 B4 H16 causal`."""
        n = f"N{self.Nq}" if self.Nq == self.Nk else f"Nq{self.Nq} Nk{self.Nk}"
        kv = f"/{self.Hkv}" if self.Hkv != self.H else ""
        return f"{self.dtype} D{self.D} {n} B{self.B} H{self.H}{kv} {'causal' if self.causal else 'full'}"


def parse_size(text: str) -> int:
    """'512' -> 512, '1k' -> 1024, '16K' -> 16384, '64k' -> 65536."""
    m = re.fullmatch(r"\s*(\d+)\s*([kK]?)\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 512, 1k, 16k)")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


def parse_size_list(text: str) -> List[int]:
    values = [parse_size(t) for t in text.split(",") if t.strip()]
    if not values:
        raise ValueError(f"empty list: {text!r}")
    return values


def parse_choice_list(text: str, choices: Sequence[str], what: str) -> List[str]:
    """'fwd,bwd' -> ['fwd', 'bwd'], checked against `choices`; keeps the order of `choices`."""
    wanted = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in wanted if t not in choices]
    if bad or not wanted:
        raise ValueError(f"unknown {what}: {', '.join(bad) or text!r} (choose from {', '.join(choices)})")
    return [c for c in choices if c in wanted]


def causal_flags(choice: str) -> List[bool]:
    return {"off": [False], "on": [True], "both": [False, True]}[choice]


def training_grid(dtypes: Iterable[str], head_dims: Iterable[int], seqlens: Iterable[int],
                  causal: Iterable[bool], tokens: int = DEFAULT_TOKENS,
                  hidden: int = DEFAULT_HIDDEN) -> List[Case]:
    """H = hidden / D, B = tokens / N (at least 1), Nq = Nk = N, Hkv = H."""
    cases = []
    for dtype in dtypes:
        for d in head_dims:
            if hidden % d:
                raise ValueError(f"hidden {hidden} is not a multiple of head dim {d}")
            h = hidden // d
            for c in causal:
                for n in seqlens:
                    b = max(1, tokens // n)
                    cases.append(Case(dtype=dtype, D=d, causal=c, B=b, H=h, Hkv=h, Nq=n, Nk=n))
    return cases


GRIDS: Dict[str, Callable[..., List[Case]]] = {"train": training_grid}


def attended_pairs(nq: int, nk: int, causal: bool) -> float:
    """(query, key) pairs that are computed, per batch and head.

    docs/benchmarking.md: halved for causal with Nq == Nk (the FlashAttention papers'
    convention, N^2 / 2, not N (N + 1) / 2); otherwise the unmasked pairs of the bottom-right
    aligned causal mask, where query i sees keys j <= i + Nk - Nq.
    """
    if not causal:
        return float(nq * nk)
    if nq == nk:
        return nq * nk / 2.0
    shift = nk - nq
    # row i sees min(nk, max(0, i + shift + 1)) keys
    total = 0
    for i in range(nq):
        total += min(nk, max(0, i + shift + 1))
    return float(total)


def forward_flops(case: Case) -> float:
    """4 * B * H * pairs * D: two matmuls (QK^T and PV) of 2 FLOPs per multiply-add."""
    return 4.0 * case.B * case.H * attended_pairs(case.Nq, case.Nk, case.causal) * case.D


def mode_flops(case: Case, mode: str) -> float:
    """fwd = forward_flops; bwd = 2.5 x fwd (five matmuls instead of two); fwd+bwd = 3.5 x fwd."""
    fwd = forward_flops(case)
    return {"fwd": fwd, "bwd": 2.5 * fwd, "fwd+bwd": 3.5 * fwd}[mode]


def mode_bytes(case: Case, mode: str) -> float:
    """Minimal HBM traffic: every tensor read or written once.

    fwd: read Q, K, V; write O (the LSE is not counted: inference forward).
    bwd: read Q, K, V, O, dO, LSE; write dQ, dK, dV.
    """
    e = DTYPE_BYTES[case.dtype]
    q = case.B * case.Nq * case.H * case.D * e
    kv = case.B * case.Nk * case.Hkv * case.D * e
    lse = case.B * case.H * case.Nq * LSE_BYTES
    fwd = q + 2 * kv + q
    bwd = (q + 2 * kv + q + q + lse) + (q + 2 * kv)
    return {"fwd": float(fwd), "bwd": float(bwd), "fwd+bwd": float(fwd + lse + bwd)}[mode]


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12 if ms > 0 else math.nan


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9 if ms > 0 else math.nan


def rotation_sets(bytes_per_set: float, l2_bytes: float, max_sets: int = 8) -> int:
    """How many input sets to rotate through so that one pass over them does not fit in L2.

    A problem whose tensors fit in L2 (H100/H200: 50 MB) would otherwise be timed from a warm
    cache; we rotate enough sets to touch at least 3x the L2 size between two uses of a set.
    """
    if bytes_per_set <= 0:
        return 1
    if bytes_per_set >= 3 * l2_bytes:
        return 1
    return max(1, min(max_sets, math.ceil(3 * l2_bytes / bytes_per_set)))
