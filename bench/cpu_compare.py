#!/usr/bin/env python3
"""flashcpp's CPU backend against PyTorch's CPU SDPA, in one process, on the same threads.

  python3 bench/cpu_compare.py                              # fwd+bwd, fp32+bf16, N 1k/4k, D 128
  python3 bench/cpu_compare.py --threads 1,2,4,8,16 --seqlens 1k,4k,16k --head-dims 64,128
  python3 bench/cpu_compare.py --modes decode               # KV-cache decode vs a plain copy

Each thread count runs in a child process started with OMP_NUM_THREADS set (flashcpp's OpenMP
and torch.set_num_threads both take it), so the two libraries get the same threads. Per cell
the two implementations are timed in rounds, the order alternating, --reps calls per round;
the table gives medians over all calls, the ratio flashcpp/torch in throughput, and the spread
of the per-round ratios (min-max) as the noise. Inputs are fresh random tensors in each
library's own layout (flashcpp [B, N, H, D], torch [B, H, N, D]); the outputs are compared once
per cell. Decode: 1 new token against a bf16 KV cache (GQA 32:8, D 128), timed as bytes of K
and V read per second, next to the bandwidth (bytes read + written per second) of a plain copy
(torch.Tensor.copy_) of the same bytes on the same threads.
--clock cpu times by the process's CPU time instead of the wall clock (1 thread on a shared
machine: time another process held the core is left out).
flashcpp is imported as installed, or from a build tree: PYTHONPATH=<build>/python.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def parse_size(text: str) -> int:
    return int(text[:-1]) * 1024 if text.endswith("k") else int(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default=None,
                   help="thread counts, comma-separated (default: this process's OpenMP count)")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--seqlens", default="1k,4k", help="N = Nq = Nk, k suffix allowed")
    p.add_argument("--head-dims", default="128")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--causal", choices=("off", "on", "both"), default="both")
    p.add_argument("--modes", default="fwd,bwd", help="fwd, bwd, decode")
    p.add_argument("--decode-lengths", default="16k", help="cache lengths L for --modes decode")
    p.add_argument("--reps", type=int, default=5, help="timed calls per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: time.perf_counter; cpu: time.process_time, the CPU time of the "
                        "process's threads, which leaves out the time another process held the "
                        "core (on a shared machine; with more than 1 thread it also counts the "
                        "threads' spin-waits, so use it with --threads 1)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def time_rounds(fns, reps, rounds, clock=time.perf_counter):
    """Per implementation: all call times (s) and the per-round medians."""
    times = {name: [] for name in fns}
    round_medians = {name: [] for name in fns}
    names = list(fns)
    for name in names:  # warm-up: first-call allocations, thread pools, caches
        fns[name]()
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            ts = []
            for _ in range(reps):
                t0 = clock()
                fns[name]()
                ts.append(clock() - t0)
            times[name] += ts
            round_medians[name].append(statistics.median(ts))
    return times, round_medians


def attention_cells(args, torch, flashcpp, threads):
    import torch.nn.functional as F
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    causals = {"off": [False], "on": [True], "both": [False, True]}[args.causal]
    rows = []
    for mode in [m for m in args.modes.split(",") if m in ("fwd", "bwd")]:
        for dname in args.dtypes.split(","):
            dt = dtypes[dname]
            for d in [int(x) for x in args.head_dims.split(",")]:
                for n in [parse_size(x) for x in args.seqlens.split(",")]:
                    for causal in causals:
                        b, h = args.batch, args.heads
                        gen = torch.Generator().manual_seed(0)
                        qf, kf, vf, dof = (torch.randn(b, n, h, d, generator=gen).to(dt)
                                           for _ in range(4))
                        qt, kt, vt, dot = (x.transpose(1, 2).contiguous() for x in (qf, kf, vf, dof))
                        out_f, lse_f = flashcpp.attention(qf, kf, vf, causal=causal,
                                                          return_lse=True, backend="cpu")
                        kernel = flashcpp.last_run_info().kernel
                        qt.requires_grad_(mode == "bwd")
                        kt.requires_grad_(mode == "bwd")
                        vt.requires_grad_(mode == "bwd")
                        out_t = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        err = (out_f.float() - out_t.detach().transpose(1, 2).float()).abs().max()
                        if mode == "fwd":
                            fns = {
                                "flashcpp": lambda: flashcpp.attention(qf, kf, vf, causal=causal,
                                                                       backend="cpu"),
                                "torch": lambda: F.scaled_dot_product_attention(
                                    qt, kt, vt, is_causal=causal),
                            }
                        else:
                            fns = {
                                "flashcpp": lambda: flashcpp.attention_backward(
                                    dof, qf, kf, vf, out_f, lse_f, causal=causal, backend="cpu"),
                                "torch": lambda: torch.autograd.grad(
                                    out_t, (qt, kt, vt), dot, retain_graph=True),
                            }
                        times, per_round = time_rounds(fns, args.reps, args.rounds, clock_of(args))
                        if mode == "bwd":
                            kernel = flashcpp.last_run_info().kernel
                        pairs = n * (n + 1) // 2 if causal else n * n
                        flop = 4.0 * b * h * pairs * d * (2.5 if mode == "bwd" else 1.0)
                        gf = {k: flop / statistics.median(v) / 1e9 for k, v in times.items()}
                        ratios = [t / f for f, t in zip(per_round["flashcpp"], per_round["torch"])]
                        rows.append((threads, mode, dname, n, d, "yes" if causal else "no", kernel,
                                     gf["flashcpp"], gf["torch"], gf["flashcpp"] / gf["torch"],
                                     min(ratios), max(ratios), float(err)))
                        print("| " + " | ".join(fmt(x) for x in rows[-1]) + " |", flush=True)
    return rows


def decode_cells(args, torch, flashcpp, threads):
    """1 token, Hq 32 : Hkv 8, D 128, bf16 cache of length L, batch --batch."""
    rows = []
    for length in [parse_size(x) for x in args.decode_lengths.split(",")]:
        b, hq, hkv, d = args.batch, 32, 8, 128
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(b, 1, hq, d, generator=gen).to(torch.bfloat16)
        kc = torch.randn(b, length, hkv, d, generator=gen).to(torch.bfloat16)
        vc = torch.randn(b, length, hkv, d, generator=gen).to(torch.bfloat16)
        dst = torch.empty(2 * kc.numel(), dtype=torch.bfloat16)
        src = torch.cat([kc.reshape(-1), vc.reshape(-1)])
        qt = q.transpose(1, 2).contiguous()  # torch's own layout, [B, H, L, D]
        kt, vt = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
        import torch.nn.functional as F
        fns = {
            "flashcpp": lambda: flashcpp.attention_with_kvcache(q, kc, vc, cache_seqlens=length,
                                                                backend="cpu"),
            "torch": lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True),
            "copy": lambda: dst.copy_(src),
        }
        times, _ = time_rounds(fns, args.reps, args.rounds, clock_of(args))
        flashcpp.attention_with_kvcache(q, kc, vc, cache_seqlens=length, backend="cpu")
        kernel = flashcpp.last_run_info().kernel
        nbytes = 2 * kc.numel() * kc.element_size()
        gbs = {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
        gbs["copy"] *= 2  # a copy reads and writes: its bandwidth counts both
        rows.append((threads, "decode", "bf16", length, d, "-", kernel, gbs["flashcpp"], gbs["torch"],
                     gbs["flashcpp"] / gbs["copy"], gbs["copy"]))
        print("| " + " | ".join(fmt(x) for x in rows[-1]) + " |", flush=True)
    return rows


def clock_of(args):
    return time.process_time if args.clock == "cpu" else time.perf_counter


def fmt(x):
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def child(args):
    import torch
    import flashcpp
    threads = int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count()
    torch.set_num_threads(threads)
    modes = args.modes.split(",")
    if "fwd" in modes or "bwd" in modes:
        attention_cells(args, torch, flashcpp, threads)
    if "decode" in modes:
        decode_cells(args, torch, flashcpp, threads)


def main():
    args = build_parser().parse_args()
    if args.child:
        child(args)
        return
    modes = args.modes.split(",")
    if "fwd" in modes or "bwd" in modes:
        print("| threads | mode | dtype | N | D | causal | kernel | flashcpp GFLOP/s | torch GFLOP/s "
              "| ratio | ratio min (rounds) | ratio max | max abs diff |")
        print("|" + "---|" * 13)
    if "decode" in modes:
        print("| threads | mode | dtype | L | D | causal | kernel | flashcpp GB/s | torch GB/s "
              "| flashcpp / copy | copy GB/s |")
        print("|" + "---|" * 11)
    sys.stdout.flush()
    counts = args.threads.split(",") if args.threads else [os.environ.get("OMP_NUM_THREADS", "")]
    for t in counts:
        env = dict(os.environ)
        if t:
            env["OMP_NUM_THREADS"] = t
        subprocess.run([sys.executable, os.path.abspath(__file__), "--child"] + sys.argv[1:],
                       env=env, check=True)


if __name__ == "__main__":
    main()
