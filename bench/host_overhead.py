#!/usr/bin/env python3
"""Host time per call of flashcpp's Python entry points, on a shape so small that the kernel
costs next to nothing (B 1, Hq 4, Hkv 1, D 64, 16 cached keys, one new token): what is left is
the Python and binding overhead an eager caller pays on every call (docs/performance.md,
"Python host overhead").

  python3 bench/host_overhead.py                 # CPU tensors (torch where installed, numpy)
  python3 bench/host_overhead.py --device cuda   # torch CUDA tensors: launches are async, the
                                                 # figure is host time while the GPU keeps up
  python3 bench/host_overhead.py --no-kernel     # the native launches replaced by their plan
                                                 # (same imports and checks, no kernel)
  python3 bench/host_overhead.py --calls 5000 --repeats 7

Each row: microseconds per call, the fastest (least disturbed by other load) of --repeats
timings of --calls back-to-back calls (time.perf_counter). "C++ only" rows call the native
module flashcpp._C directly with arguments prepared once (outputs, stream, workspace): the
floor the Python layer sits on.

On the CPU backend the "kernel" starts worker threads on every call, tens of microseconds that
vary with the machine's load; --no-kernel swaps flashcpp._C's launches for the plan query of
the same call (flashcpp._C.plan_kvcache, forward_workspace_size), which imports and checks the
same arrays, so what is timed is the host path alone.
"""
from __future__ import annotations

import argparse
import sys
import time


def per_call_us(fn, calls: int, repeats: int, sync) -> float:
    for _ in range(max(calls // 10, 10)):  # warm up caches, the allocator, lazy imports
        fn()
    sync()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        timings.append((time.perf_counter() - start) / calls * 1e6)
    return min(timings)


class PlanInsteadOfLaunch:
    """flashcpp._C with forward and attention_with_kvcache replaced by their plan queries."""

    def __init__(self, native):
        self._native = native

    def __getattr__(self, name):
        return getattr(self._native, name)

    def forward(self, q, k, v, out, lse, *, stream=0, workspace=None, **options):
        self._native.forward_workspace_size(q, k, v, **options)
        return ("none", "plan only", 1)

    def attention_with_kvcache(self, *tensors, stream=0, workspace=None, **options):
        self._native.plan_kvcache(*tensors, **options)
        return ("none", "plan only", 1)


def torch_rows(device: str):
    import torch

    import flashcpp
    import flashcpp.compat
    import flashcpp.torch as ft
    from torch.utils.dlpack import to_dlpack
    from flashcpp import _native

    _C = _native._C  # the --no-kernel stand-in where asked

    torch.manual_seed(0)
    B, HQ, HKV, D, L = 1, 4, 1, 64, 16
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    def randn(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)

    q, k_cache, v_cache = randn(B, 1, HQ, D), randn(B, L + 64, HKV, D), randn(B, L + 64, HKV, D)
    k_new, v_new = randn(B, 1, HKV, D), randn(B, 1, HKV, D)
    lens = torch.full((B,), L, dtype=torch.int32, device=device)
    qa, ka, va = randn(B, L, HQ, D), randn(B, L, HKV, D), randn(B, L, HKV, D)

    rows = [
        ("flashcpp.attention_with_kvcache",
         lambda: flashcpp.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                                 causal=True)),
        ("flashcpp.attention_with_kvcache (append k, v)",
         lambda: flashcpp.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                 cache_seqlens=lens, causal=True)),
        ("flashcpp.compat.flash_attn_with_kvcache",
         lambda: flashcpp.compat.flash_attn_with_kvcache(q, k_cache, v_cache,
                                                         cache_seqlens=lens, causal=True)),
        ("flashcpp.torch.attention_with_kvcache (op)",
         lambda: ft.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                           causal=True)),
        ("flashcpp.attention", lambda: flashcpp.attention(qa, ka, va, causal=True)),
        ("flashcpp.compat.flash_attn_func",
         lambda: flashcpp.compat.flash_attn_func(qa, ka, va, causal=True)),
        ("flashcpp.torch.attention (op)", lambda: ft.attention(qa, ka, va, causal=True)),
    ]

    # The C++ floor: the native calls with everything prepared once; torch tensors are handed
    # over as they are (the native module calls their __dlpack__) or as capsules.
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0
    options = dict(causal=True, softmax_scale=None, window_left=-1, window_right=-1,
                   softcap=0.0, backend="auto", num_splits=0, deterministic=False)
    out = torch.empty_like(q)
    plan = _C.plan_kvcache(q, k_cache, v_cache, lens, out, **options)
    ws = torch.empty(max(plan[3], 1), dtype=torch.uint8, device=device) if plan[3] else None
    out_a = torch.empty_like(qa)
    fw_ws_bytes = _C.forward_workspace_size(qa, ka, va, **options)
    ws_a = torch.empty(fw_ws_bytes, dtype=torch.uint8, device=device) if fw_ws_bytes else None
    rows += [
        ("C++ only: _C.attention_with_kvcache",
         lambda: _C.attention_with_kvcache(q, k_cache, v_cache, lens, out, **options,
                                           stream=stream, workspace=ws)),
        ("C++ only: _C.attention_with_kvcache (to_dlpack capsules)",
         lambda: _C.attention_with_kvcache(to_dlpack(q), to_dlpack(k_cache), to_dlpack(v_cache),
                                           to_dlpack(lens), to_dlpack(out), **options,
                                           stream=stream, workspace=ws)),
        ("C++ only: _C.forward",
         lambda: _C.forward(qa, ka, va, out_a, None, **options, stream=stream,
                            workspace=ws_a)),
        ("torch.empty (one output allocation)", lambda: torch.empty_like(q)),
    ]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return rows, sync


def numpy_rows():
    import numpy as np

    import flashcpp

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 4, 64), dtype=np.float32)
    k_cache = rng.standard_normal((1, 80, 1, 64), dtype=np.float32)
    v_cache = rng.standard_normal((1, 80, 1, 64), dtype=np.float32)
    lens = np.full((1,), 16, dtype=np.int32)
    qa = rng.standard_normal((1, 16, 4, 64), dtype=np.float32)
    ka = rng.standard_normal((1, 16, 1, 64), dtype=np.float32)
    return [
        ("numpy: flashcpp.attention_with_kvcache",
         lambda: flashcpp.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                                 causal=True)),
        ("numpy: flashcpp.attention", lambda: flashcpp.attention(qa, ka, ka, causal=True)),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timing")
    parser.add_argument("--no-kernel", action="store_true",
                        help="replace the native launches by their plan queries (host path only)")
    parser.add_argument("--repeats", type=int, default=9,
                        help="timings; the fastest is shown (the others met more load)")
    args = parser.parse_args()

    if args.no_kernel:
        from flashcpp import _native

        _native._C = PlanInsteadOfLaunch(_native._C)
    rows, sync = [], (lambda: None)
    try:
        rows, sync = torch_rows(args.device)
    except ImportError:
        if args.device == "cuda":
            print("host_overhead: --device cuda needs torch", file=sys.stderr)
            return 1
        print("host_overhead: torch not installed, numpy rows only", file=sys.stderr)
    if args.device == "cpu":
        rows += numpy_rows()

    import flashcpp

    where = args.device
    if args.device == "cuda":
        import torch

        where = torch.cuda.get_device_name()
    print(f"flashcpp {flashcpp.__version__}, device {where}, "
          f"{args.calls} calls x {args.repeats} repeats (best), microseconds per call"
          f"{', native launches replaced by their plan (--no-kernel)' if args.no_kernel else ''}")
    width = max(len(name) for name, _ in rows)
    for name, fn in rows:
        print(f"{name:<{width}}  {per_call_us(fn, args.calls, args.repeats, sync):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
