"""Benchmark cases, the grids of docs/benchmarking.md, and the FLOP and byte counts (no torch).

A `Case` is one attention problem; a *mode* says what is timed on it (`fwd`, `bwd`, `fwd+bwd`
for the training grid, `decode` for the decode grid). A decode case is a `Case` with Nq = the
new tokens, Nk = the cache length L, H = Hq and Hkv < H; its *layouts* (a contiguous cache, or
a paged one with pages of 16, 64 or 256 rows) are timed as separate rows.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable, Dict, Iterable, List, Sequence, Tuple

TRAIN_MODES = ("fwd", "bwd", "fwd+bwd")
BACKWARD_MODES = ("bwd", "fwd+bwd")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# The decode dtype "e4m3": an fp8 (e4m3) KV cache, bf16 queries and output (flashcpp only);
# in the training grid (sdpa_compare --dtype e4m3): fp8 q, k and v, bf16 output, forward only.
FP8_CACHE = "e4m3"


def kv_element_bytes(dtype: str) -> int:
    """Bytes of one cached key or value element."""
    return 1 if dtype == FP8_CACHE else DTYPE_BYTES[dtype]


def query_element_bytes(dtype: str) -> int:
    """Bytes of one query or output element."""
    return 2 if dtype == FP8_CACHE else DTYPE_BYTES[dtype]
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

DECODE_MODE = "decode"
# The decode grid: a GQA model (Hq 32, Hkv 8, D 128) attending over a full KV cache.
DECODE_HQ, DECODE_HKV, DECODE_HEAD_DIM = 32, 8, 128
DECODE_BATCHES = (1, 8, 64)
DECODE_LENGTHS = (1024, 4096, 16384, 65536)
DECODE_NNEW = (1,)
# --quick: two cells, one small enough to rotate input sets through L2 and one that is not.
QUICK_DECODE_BATCHES = (8,)
QUICK_DECODE_LENGTHS = (1024, 16384)
CONTIGUOUS = "contiguous"
LAYOUTS = (CONTIGUOUS, "paged16", "paged64", "paged256")
DEFAULT_LAYOUTS = (CONTIGUOUS, "paged16", "paged64")
# The layout recorded for a peer that read K/V repeated to Hq heads (its backend refused GQA).
EXPANDED = "expanded"


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


def size_label(n: int) -> str:
    """1024 -> '1k', 65536 -> '64k', 1000 -> '1000'."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


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


def decode_grid(dtypes: Iterable[str], batches: Iterable[int], lengths: Iterable[int],
                nnew: Iterable[int], hq: int = DECODE_HQ, hkv: int = DECODE_HKV,
                head_dim: int = DECODE_HEAD_DIM) -> List[Case]:
    """Nq = new tokens, Nk = cache length L (every sequence full), not causal."""
    if hkv <= 0 or hq % hkv:
        raise ValueError(f"Hq {hq} is not a multiple of Hkv {hkv}")
    return [Case(dtype=dtype, D=head_dim, causal=False, B=b, H=hq, Hkv=hkv, Nq=n, Nk=length)
            for dtype in dtypes for n in nnew for b in batches for length in lengths]


GRIDS: Dict[str, Callable[..., List[Case]]] = {"train": training_grid, "decode": decode_grid}


def page_size(layout: str) -> int:
    """'paged64' -> 64; 0 for the contiguous cache."""
    return 0 if layout == CONTIGUOUS else int(layout[len("paged"):])


def decode_series(impl: str, layout: str) -> str:
    """The name of a decode row in tables and plots: the implementation, or the page layout for
    flashcpp's paged rows ('paged16'). A peer that read expanded K/V keeps its own name."""
    return layout if layout.startswith("paged") else impl


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
    return {"fwd": fwd, "bwd": 2.5 * fwd, "fwd+bwd": 3.5 * fwd, DECODE_MODE: fwd}[mode]


def mode_bytes(case: Case, mode: str) -> float:
    """Minimal HBM traffic: every tensor read or written once.

    fwd: read Q, K, V; write O (the LSE is not counted: inference forward).
    bwd: read Q, K, V, O, dO, LSE; write dQ, dK, dV.
    decode: decode_bytes.
    """
    if mode == DECODE_MODE:
        return decode_bytes(case)
    e = kv_element_bytes(case.dtype)  # e4m3 in the training grid: fp8 q, k, v, bf16 out
    q = case.B * case.Nq * case.H * case.D * e
    o = case.B * case.Nq * case.H * case.D * query_element_bytes(case.dtype)
    kv = case.B * case.Nk * case.Hkv * case.D * e
    lse = case.B * case.H * case.Nq * LSE_BYTES
    fwd = q + 2 * kv + o
    bwd = (q + 2 * kv + q + q + lse) + (q + 2 * kv)
    return {"fwd": float(fwd), "bwd": float(bwd), "fwd+bwd": float(fwd + lse + bwd)}[mode]


def kv_bytes(case: Case, kv_heads: int = 0) -> float:
    """K and V of every sequence: B x L x heads x D x 2 tensors x element size. kv_heads is what
    an implementation really reads (H for one that got K/V expanded); 0 means case.Hkv."""
    return float(2 * case.B * case.Nk * (kv_heads or case.Hkv) * case.D *
                 kv_element_bytes(case.dtype))


def decode_bytes(case: Case, kv_heads: int = 0) -> float:
    """Decode traffic: K and V read once (kv_bytes), Q read and O written. The block table of a
    paged cache (4 bytes per page) is left out: under 0.2% of a page of 16 rows."""
    q = case.B * case.Nq * case.H * case.D * query_element_bytes(case.dtype)
    return kv_bytes(case, kv_heads) + 2.0 * q


def pages_per_sequence(length: int, page: int) -> int:
    return -(-length // page)


def cache_bytes(case: Case, layout: str) -> float:
    """Device memory of one input set's K and V caches in `layout`: the contiguous cache, or a
    page pool of B x (pages + 2) pages (the spare NaN pages, peers.shuffled_page_table) and its
    int32 block table."""
    page = page_size(layout)
    if not page:
        return kv_bytes(case)
    n = pages_per_sequence(case.Nk, page)
    pool_rows = case.B * (n + 2) * page
    return float(2 * pool_rows * case.Hkv * case.D * kv_element_bytes(case.dtype) +
                 case.B * (n + 1) * 4)


def reference_bytes(case: Case) -> float:
    """Working memory of reference.compute_decode: one sequence's K and V in float64 (twice, for
    the transposed copies matmul may make) and its float64 scores (three score-sized tensors)."""
    return 4.0 * case.Nk * case.Hkv * case.D * 8 + 3.0 * case.H * case.Nq * case.Nk * 8


def plan_layouts(case: Case, layouts: Sequence[str], n_sets: int, budget: float,
                 extra: float = 0.0) -> Tuple[List[str], List[str], float]:
    """Which layouts of a decode case are held (all at once, n_sets input sets each) within
    `budget` bytes, with `extra` bytes held beside them and the reference's working memory.
    Layouts are taken in order; the contiguous cache first, because the pages are filled from
    it and the paged rows are compared with it: when it does not fit, nothing runs.
    Returns (kept, dropped, bytes of what is kept)."""
    used = extra + reference_bytes(case)
    kept: List[str] = []
    dropped: List[str] = []
    for layout in layouts:
        need = n_sets * cache_bytes(case, layout)
        base_ok = layout == CONTIGUOUS or CONTIGUOUS in kept
        if base_ok and used + need <= budget:
            kept.append(layout)
            used += need
        else:
            dropped.append(layout)
    return kept, dropped, used


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
