#!/usr/bin/env python3
"""Runs the teaching ladder (flashcpp-ladder) and times its PyTorch peers in the same run.

    python3 tutorial/bench/ladder_compare.py --ladder-bin build/ladder/tutorial/flashcpp-ladder \
        --out ladder-out

Steps come from the C++ binary's CSV; the peers are timed here, on the same GPU and shapes:
  softmax 1024x1024 / 8192x8192 fp32  ->  torch.softmax
  matmul 4096^3 fp32                  ->  torch.matmul (TF32 off)
  attention B4 H16 N2048 D64          ->  F.scaled_dot_product_attention fp32 (and bf16 for
                                          reference), flashcpp's production forward (bf16,
                                          BSHD) when the flashcpp package imports, and the CPU
                                          backend through flashcpp-bench when --cpu-bench is given.
Writes <out>/ladder.csv (the binary's), <out>/combined.csv and <out>/ladder.png, and prints one
table: step, time, throughput, speed-up over the previous step, ratio to the PyTorch peer
(peer time / step time: 1.0 = as fast as the peer, 0.5 = half as fast).
"""
from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ATTN = dict(batch=4, heads=16, seqlen=2048, head_dim=64)


def median_ms(fn, reps: int, warmup: int = 3) -> float:
    """Median of `reps` CUDA-event-timed calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def attention_flops(causal: bool = False) -> float:
    b, h, n, d = ATTN["batch"], ATTN["heads"], ATTN["seqlen"], ATTN["head_dim"]
    return 4.0 * b * h * n * n * d / (2.0 if causal else 1.0)


def time_peers(reps: int) -> dict[str, dict]:
    """PyTorch peers (and flashcpp's production kernel if importable), keyed by problem."""
    peers: dict[str, list[dict]] = {}
    dev = "cuda"

    def add(problem, step, ms, metric, value, note=""):
        peers.setdefault(problem, []).append(
            dict(problem=problem, step=step, time_ms=ms, metric=metric, value=value, note=note))

    for rows, cols in [(1024, 1024), (8192, 8192)]:
        x = torch.empty(rows, cols, device=dev).uniform_(-8, 8)
        ms = median_ms(lambda: torch.softmax(x, dim=-1), reps)
        add(f"softmax {rows}x{cols}", "torch.softmax", ms, "GB/s", 2 * x.numel() * 4 / ms / 1e6)
        del x

    torch.backends.cuda.matmul.allow_tf32 = False
    n = 4096
    a = torch.empty(n, n, device=dev).uniform_(-1, 1)
    b = torch.empty(n, n, device=dev).uniform_(-1, 1)
    ms = median_ms(lambda: torch.matmul(a, b), reps)
    add(f"matmul {n}^3", "torch.matmul fp32", ms, "TFLOP/s", 2 * n**3 / ms / 1e9)
    del a, b

    bsz, h, s, d = ATTN["batch"], ATTN["heads"], ATTN["seqlen"], ATTN["head_dim"]
    problem = f"attention B{bsz} H{h} N{s} D{d}"
    for dtype, label in [(torch.float32, "SDPA fp32"), (torch.bfloat16, "SDPA bf16 (ref)")]:
        q, k, v = (torch.empty(bsz, h, s, d, device=dev, dtype=dtype).uniform_(-1, 1)
                   for _ in range(3))
        ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v), reps)
        add(problem, label, ms, "TFLOP/s", attention_flops() / ms / 1e9)
        if dtype == torch.float32:
            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps)
            add(problem + " causal", label, ms, "TFLOP/s", attention_flops(causal=True) / ms / 1e9)

    try:
        import flashcpp  # the production forward, if the Python package is built and importable

        q, k, v = (torch.empty(bsz, s, h, d, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
                   for _ in range(3))  # BSHD
        ms = median_ms(lambda: flashcpp.attention(q, k, v), reps)
        info = flashcpp.last_run_info()
        add(problem, "flashcpp forward bf16", ms, "TFLOP/s", attention_flops() / ms / 1e9,
            note=f"{info.backend}/{info.kernel}" if info else "")
    except Exception as e:  # ImportError, or a build without this kernel
        print(f"note: flashcpp production forward not timed ({type(e).__name__}: {e})")
    return peers


def cpu_backend_row(cpu_bench: str | None, out: Path) -> dict | None:
    """Hook: the CPU backend on the same attention case, through the C++ CLI flashcpp-bench.

    Its output format belongs to flashcpp-bench; we keep the raw output and take its median
    time (a 'time_ms' CSV column, "median X ms", or else the first number followed by 'ms').
    """
    if not cpu_bench:
        return None
    cmd = [cpu_bench, "--batch", str(ATTN["batch"]), "--heads", str(ATTN["heads"]),
           "--seqlen-q", str(ATTN["seqlen"]), "--head-dim", str(ATTN["head_dim"]),
           "--dtype", "fp32", "--backend", "cpu"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"note: CPU backend not timed ({e})")
        return None
    (out / "cpu_bench_output.txt").write_text(res.stdout + res.stderr)
    ms = None
    lines = res.stdout.splitlines()
    for i, line in enumerate(lines):
        if "time_ms" in line.split(",") and i + 1 < len(lines):
            ms = float(lines[i + 1].split(",")[line.split(",").index("time_ms")])
            break
    if ms is None:  # flashcpp-bench prints "time        median 12.345 ms over ..."
        m = (re.search(r"median\s+([0-9]+(?:\.[0-9]+)?)\s*ms\b", res.stdout)
             or re.search(r"([0-9]+(?:\.[0-9]+)?)\s*ms\b", res.stdout))
        ms = float(m.group(1)) if m else None
    if res.returncode != 0 or ms is None:
        print(f"note: CPU backend output not understood (rc {res.returncode}); kept raw output")
        return None
    b, h, s, d = ATTN["batch"], ATTN["heads"], ATTN["seqlen"], ATTN["head_dim"]
    return dict(problem=f"attention B{b} H{h} N{s} D{d}", step="flashcpp CPU backend fp32",
                time_ms=ms, metric="TFLOP/s", value=attention_flops() / ms / 1e9, note="cpu")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ladder-bin", required=True, help="path to the flashcpp-ladder executable")
    ap.add_argument("--out", required=True, help="output folder (CSV, PNG)")
    ap.add_argument("--reps", type=int, default=20, help="timed runs per case (median), >= 20")
    ap.add_argument("--cpu-bench", default=None,
                    help="optional flashcpp-bench executable: adds the CPU backend's attention time")
    args = ap.parse_args()
    reps = max(20, args.reps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    ladder_csv = out / "ladder.csv"
    subprocess.run([args.ladder_bin, "--csv", str(ladder_csv), "--reps", str(reps)], check=True)
    with ladder_csv.open() as f:
        steps = [dict(r, time_ms=float(r["time_ms"]), value=float(r["value"]),
                      speedup_vs_prev=float(r["speedup_vs_prev"])) for r in csv.DictReader(f)]
    device = steps[0]["device"] if steps else torch.cuda.get_device_name()

    peers = time_peers(reps)
    cpu = cpu_backend_row(args.cpu_bench, out)
    if cpu:
        peers.setdefault(cpu["problem"], []).append(cpu)

    # One table: each problem's ladder steps, then its peers. The first peer of a problem
    # (torch.softmax, torch.matmul, SDPA fp32) is the reference for the ratio column.
    rows = []
    problems = list(dict.fromkeys([s["problem"] for s in steps] + list(peers)))
    for problem in problems:
        ref = peers.get(problem, [None])[0]
        for s in [s for s in steps if s["problem"] == problem]:
            rows.append(dict(problem=problem, kind="ladder", step=s["step"], time_ms=s["time_ms"],
                             metric=s["metric"], value=s["value"],
                             speedup_vs_prev=s["speedup_vs_prev"] or "",
                             ratio_to_peer=ref["time_ms"] / s["time_ms"] if ref else "",
                             peer=ref["step"] if ref else ""))
        for p in peers.get(problem, []):
            rows.append(dict(problem=problem, kind="peer", step=p["step"], time_ms=p["time_ms"],
                             metric=p["metric"], value=p["value"], speedup_vs_prev="",
                             ratio_to_peer=ref["time_ms"] / p["time_ms"], peer=ref["step"]))

    with (out / "combined.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) + ["device"])
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, device=device))

    plot(rows, device, out / "ladder.png")

    print(f"\nladder vs PyTorch {torch.__version__} on {device} (median of {reps})")
    print(f"{'problem':<28} {'step':<30} {'time ms':>10} {'throughput':>16} {'vs prev':>8} {'vs peer':>8}")
    for r in rows:
        sp = f"{r['speedup_vs_prev']:.2f}x" if r["speedup_vs_prev"] else ""
        ratio = f"{r['ratio_to_peer']:.2f}" if r["ratio_to_peer"] != "" else ""
        print(f"{r['problem']:<28} {r['step']:<30} {r['time_ms']:>10.4f} "
              f"{r['value']:>8.1f} {r['metric']:<7} {sp:>8} {ratio:>8}")
    print(f"\nwrote {out / 'combined.csv'}" + (f" and {out / 'ladder.png'}" if (out / "ladder.png").exists() else ""))
    return 0


def plot(rows, device: str, path: Path) -> None:
    """One panel per problem: a bar per step (ladder blue, peers grey), time on a log axis."""
    try:
        import matplotlib
    except ImportError:
        print("note: matplotlib not installed; no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = list(dict.fromkeys(r["problem"] for r in rows))
    fig, axes = plt.subplots(1, len(problems), figsize=(4.2 * len(problems), 4.8), squeeze=False)
    for ax, problem in zip(axes[0], problems):
        rs = [r for r in rows if r["problem"] == problem]
        colors = ["tab:blue" if r["kind"] == "ladder" else "tab:gray" for r in rs]
        bars = ax.bar(range(len(rs)), [r["time_ms"] for r in rs], color=colors)
        ax.set_yscale("log")
        ax.set_xticks(range(len(rs)), [r["step"] for r in rs], rotation=40, ha="right", fontsize=8)
        ax.set_title(problem, fontsize=10)
        ax.set_ylabel("time (ms, log scale)")
        for bar, r in zip(bars, rs):
            ax.annotate(f"{r['value']:.0f} {r['metric']}" if r["value"] >= 10 else
                        f"{r['value']:.2f} {r['metric']}",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
    fig.suptitle(f"flashcpp teaching ladder vs PyTorch peers, {device} (blue: ladder, grey: peers)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)


if __name__ == "__main__":
    sys.exit(main())
