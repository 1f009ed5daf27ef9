#!/usr/bin/env python3
"""Prefill with a KV cache (chunked prefill): flashcpp.attention_with_kvcache with Nnew new
tokens over a contiguous cache of L keys, causal, on the kernel the plan picks (the forward
kernels from 64 new tokens) against the decode kernel forced for the same call
(FLASHCPP_KVCACHE_FORWARD_MIN_NNEW set past Nnew, in a child process: the threshold is read
once per process). With --pages, the same calls over paged caches (shuffled pages of each
size) too, timed in the same process as the contiguous ones ("vs contiguous": contiguous time
/ paged time). bf16, Hq 32, Hkv 8, D 128 by default; time per call from CUDA graph replays of
10 calls; TFLOP/s count the visible (query, key) pairs.

  python3 bench/kvcache_prefill.py
  python3 bench/kvcache_prefill.py --cases 4x4k+512,1x32k+1024
  python3 bench/kvcache_prefill.py --pages 16,64,256
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DEFAULT_CASES = "1x16k+128,8x2k+64,4x4k+128,4x4k+512,1x32k+1024"


def parse_case(text: str):
    """'BxL+Nnew' with k = 1024, e.g. 4x4k+512."""
    size = lambda s: int(s[:-1]) * 1024 if s.lower().endswith("k") else int(s)
    batch, rest = text.split("x")
    length, nnew = rest.split("+")
    return int(batch), size(length), size(nnew)


def cache_of(torch, batch, length, nnew, hkv, d, page):
    """k_cache, v_cache and block table (None: contiguous) holding L + Nnew keys a sequence;
    a paged cache's pages are shuffled over the pool."""
    keys = length + nnew
    if page is None:
        k_cache = torch.randn(batch, keys, hkv, d, device="cuda", dtype=torch.bfloat16)
        return k_cache, torch.randn_like(k_cache), None
    pages = (keys + page - 1) // page
    k_cache = torch.randn(batch * pages, page, hkv, d, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(batch * pages, device="cuda").to(torch.int32).reshape(batch, pages)
    return k_cache, torch.randn_like(k_cache), table


def time_cases(cases, hq, hkv, d, reps, pages):
    import torch  # noqa: PLC0415

    import flashcpp  # noqa: PLC0415
    import flashcpp.torch as fa  # noqa: PLC0415
    from timing import capture  # noqa: PLC0415

    rows = []
    for (batch, length, nnew), page in ((c, p) for c in cases for p in [None, *pages]):
        q = torch.randn(batch, nnew, hq, d, device="cuda", dtype=torch.bfloat16)
        k_cache, v_cache, table = cache_of(torch, batch, length, nnew, hkv, d, page)
        lengths = torch.full((batch,), length, dtype=torch.int32, device="cuda")
        call = lambda i: fa.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                                   block_table=table, causal=True)
        call(0)
        kernel = flashcpp.last_run_info().kernel
        replay = capture(call, 1, 10)
        for _ in range(3):
            replay(0)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            replay(0)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 10)
        ms = statistics.median(times)
        pairs = batch * nnew * (length + (nnew + 1) / 2)  # causal: token i sees L + i + 1 keys
        rows.append(dict(batch=batch, length=length, nnew=nnew, page=page, kernel=kernel,
                         us=ms * 1e3, tflops=4 * pairs * hq * d / (ms * 1e-3) / 1e12))
        del q, k_cache, v_cache, table
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=DEFAULT_CASES, help="BxL+Nnew,... (default %(default)s)")
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--pages", default="",
                   help="page sizes of paged caches to time too, e.g. 16,64,256")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    cases = [parse_case(c) for c in a.cases.split(",")]
    pages = [int(x) for x in a.pages.split(",") if x]
    if a.child:
        print(json.dumps(time_cases(cases, a.hq, a.hkv, a.head_dim, a.reps, pages)))
        return 0
    runs = {}
    for name, threshold in (("planned", None), ("decode", str(1 << 30))):
        env = dict(os.environ)
        if threshold is not None:
            env["FLASHCPP_KVCACHE_FORWARD_MIN_NNEW"] = threshold
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *argv_of(a)],
                             env=env, check=True, capture_output=True, text=True).stdout
        runs[name] = json.loads(out.strip().splitlines()[-1])
    print("| B | L | Nnew | cache | planned kernel | us | TFLOP/s | vs contiguous "
          "| decode kernel us | speed-up |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---:|")
    contiguous_us = None
    for mine, decode in zip(runs["planned"], runs["decode"]):
        if mine["page"] is None:
            contiguous_us = mine["us"]
        cache = "contiguous" if mine["page"] is None else f"paged {mine['page']}"
        print(f"| {mine['batch']} | {mine['length']} | {mine['nnew']} | {cache} | "
              f"`{mine['kernel']}` | {mine['us']:.1f} | {mine['tflops']:.0f} | "
              f"{contiguous_us / mine['us']:.2f} | {decode['us']:.1f} | "
              f"{decode['us'] / mine['us']:.2f} |")
    return 0


def argv_of(a) -> list:
    return ["--cases", a.cases, "--hq", str(a.hq), "--hkv", str(a.hkv), "--head-dim",
            str(a.head_dim), "--reps", str(a.reps), "--pages", a.pages]


if __name__ == "__main__":
    sys.exit(main())
