#!/usr/bin/env python3
"""Context-parallel benchmark: flashcpp.distributed.ring_attention (or ulysses_attention) over
the ranks of a torchrun job, against plain flashcpp on one GPU, per sequence length.

  torchrun --nproc_per_node 4 bench/context_parallel.py                      # 32k..512k
  torchrun --nproc_per_node 1 bench/context_parallel.py --seqlens 32k,128k   # overhead, W = 1
  torchrun --nproc_per_node 2 bench/context_parallel.py --device cpu --seqlens 64 \\
      --heads 2 --head-dim 16 --dtype fp32 --reps 2 --warmup 1               # CPU/gloo smoke

The sequence length N is the whole sequence: each rank holds N / W tokens (zig-zag shards).
Per length and mode (fwd, fwd+bwd) it prints the median time of a step over the slowest rank,
tokens/s and TFLOP/s per GPU, and the one-GPU run of the whole sequence in the same job (each
rank runs it on its own GPU at the same time): `per-GPU efficiency` = one-GPU time / (W * ring
time). Communication is shown separately: `comm` is the ring's transfers alone, one after
another as the ring needs them (nothing to overlap with), `compute` the ring's attention and
merges with the transfers left out, and `exposed` = ring - compute, the part of the transfers
that the overlap did not hide. GPU times come from CUDA events, CPU times from the clock.
NCCL on GPUs, gloo on CPUs. --json PATH writes every row as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import flashcpp.torch as fa
from flashcpp import distributed as cp
from flashcpp.distributed import ring as ring_module

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_size(text: str) -> int:
    text = text.strip().lower()
    return int(text[:-1]) * 1024 if text.endswith("k") else int(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqlens", default="32k,64k,128k,256k,512k",
                   help="whole-sequence lengths N (k = 1024)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16, help="query heads")
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (default: --heads)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--mask", choices=["causal", "full", "both"], default="causal")
    p.add_argument("--modes", default="fwd,fwd+bwd")
    p.add_argument("--variant", choices=["ring", "ulysses"], default="ring")
    p.add_argument("--layout", choices=["zigzag", "contiguous"], default="zigzag")
    p.add_argument("--reps", type=int, default=10, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-single", action="store_true",
                   help="skip the one-GPU run of the whole sequence (too large for one GPU)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--json", default=None, help="write the rows to this file (rank 0)")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="record one ring step's GPU timeline per rank into DIR (GPUs only)")
    return p


class _Clock:
    """Times one step: CUDA events on GPUs, the host clock on CPUs."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def time_ms(self, fn) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        begin = time.perf_counter()
        fn()
        return (time.perf_counter() - begin) * 1e3


def median_over_ranks(clock: _Clock, fn, reps: int, warmup: int, device) -> float:
    """The slowest rank's median time of fn, each step started together (barrier)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        times.append(clock.time_ms(fn))
    worst = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()


class _LocalRing:
    """A ring that sends nothing: the shard a rank 'receives' is its own (same shape under even
    zig-zag shards), so the ring's compute runs with its transfers left out."""

    def __init__(self, ring):
        self.world_size, self.rank = ring.world_size, ring.rank

    def shift(self, send, receive, first_tag=0):
        received = list(send)

        class _Done:
            @staticmethod
            def wait():
                return received
        return _Done()


def attention_flops(batch, heads, n, d, causal, backward) -> float:
    pairs = n * n / 2 if causal else n * n
    forward = 4 * batch * heads * pairs * d  # Q.K^T and P.V
    return forward * (3.5 if backward else 1.0)  # the backward is 2.5x the forward


def run_row(args, n, causal, mode, clock, device, group_ring):
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = DTYPES[args.dtype]
    hkv = args.kv_heads or args.heads
    backward = mode == "fwd+bwd"
    # the same seed on every rank: all ranks shard the same whole sequence
    g = torch.Generator(device=device).manual_seed(1234)

    def make(heads, rows):
        return torch.randn(args.batch, rows, heads, args.head_dim, generator=g, device=device,
                           dtype=dtype)

    q_full, k_full, v_full = make(args.heads, n), make(hkv, n), make(hkv, n)
    shards = [cp.shard_sequence(t, rank, world, layout=args.layout).requires_grad_(backward)
              for t in (q_full, k_full, v_full)]
    dout = torch.randn_like(shards[0])
    whole = None if args.no_single else (q_full, k_full, v_full)
    del q_full, k_full, v_full  # with --no-single, the shards alone stay in memory

    def step(attend, inputs, gradient):
        def run():
            out = attend(*inputs)
            if backward:
                out.backward(gradient)
        return run

    options = dict(causal=causal)
    if args.variant == "ring":
        attend = lambda q, k, v: cp.ring_attention(q, k, v, layout=args.layout, seq_len=n,
                                                   **options)
    else:
        attend = lambda q, k, v: cp.ulysses_attention(q, k, v, layout=args.layout, seq_len=n,
                                                      **options)
    row = dict(variant=args.variant, world_size=world, seq_len=n, batch=args.batch,
               heads=args.heads, kv_heads=hkv, head_dim=args.head_dim, dtype=args.dtype,
               causal=causal, mode=mode, layout=args.layout)
    row["ring_ms"] = median_over_ranks(clock, step(attend, shards, dout), args.reps,
                                       args.warmup, device)
    if args.variant == "ring":
        row.update(_ring_parts(args, n, causal, backward, shards, dout, clock, device,
                               group_ring))
    if whole is not None:
        full = [t.requires_grad_(backward) for t in whole]
        plain = lambda q, k, v: fa.attention(q, k, v, **options)
        row["single_ms"] = median_over_ranks(clock, step(plain, full, torch.randn_like(full[0])),
                                             args.reps, args.warmup, device)
    flops = attention_flops(args.batch, args.heads, n, args.head_dim, causal, backward)
    row["tokens_per_s_per_gpu"] = args.batch * n / world / (row["ring_ms"] * 1e-3)
    row["tflops_per_gpu"] = flops / world / (row["ring_ms"] * 1e-3) / 1e12
    if "single_ms" in row:
        row["single_tflops"] = flops / (row["single_ms"] * 1e-3) / 1e12
        row["per_gpu_efficiency"] = row["single_ms"] / (world * row["ring_ms"])
    return row


def _ring_parts(args, n, causal, backward, shards, dout, clock, device, ring):
    """compute-only and comm-only times of the ring's step (see the module's docstring)."""
    q, k, v = (t.detach() for t in shards)
    left, right = ring_module.mask_bounds(causal, (-1, -1))
    options = ring_module._Options(None, 0.0, "auto", False)
    local = ring_module._padded_schedule(_LocalRing(ring), n, args.layout, left, right)
    schedule = ring_module._padded_schedule(ring, n, args.layout, left, right)

    def compute():
        out, lse = ring_module._ring_forward(q, k, v, local, options)
        if backward:
            ring_module._ring_backward(dout, q, k, v, out, lse, local, options)

    def comm():
        world = ring.world_size
        k_held, v_held = k, v
        for step in range(world - 1):  # the forward's K/V (and the backward's again)
            incoming = schedule.kv_lengths[schedule.held(step + 1)]
            k_held, v_held = ring.shift([k_held, v_held], [
                ring_module._kv_like(k, incoming), ring_module._kv_like(v, incoming)]).wait()
        if backward and world > 1:
            k_held, v_held = k, v
            for step in range(world - 1):
                incoming = schedule.kv_lengths[schedule.held(step + 1)]
                k_held, v_held = ring.shift([k_held, v_held], [
                    ring_module._kv_like(k, incoming), ring_module._kv_like(v, incoming)]).wait()
            dk = torch.zeros_like(k, dtype=torch.float32)
            dv = torch.zeros_like(v, dtype=torch.float32)
            for step in range(world):  # dK/dV in float32 (the last hop in k's dtype) to the owner
                incoming = schedule.kv_lengths[schedule.held(step + 1)]
                kind = k.dtype if step == world - 1 else torch.float32
                dk, dv = ring.shift([dk.to(kind), dv.to(kind)], [
                    ring_module._kv_like(k, incoming, kind),
                    ring_module._kv_like(v, incoming, kind)]).wait()

    parts = dict(compute_ms=median_over_ranks(clock, compute, args.reps, args.warmup, device),
                 comm_ms=median_over_ranks(clock, comm, args.reps, args.warmup, device))
    return parts


def _union(intervals):
    """Merged [start, end) intervals, sorted."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _covered(intervals, cover) -> float:
    """Length of the parts of `intervals` (merged) that lie inside `cover` (merged)."""
    total, j = 0.0, 0
    for start, end in intervals:
        while j < len(cover) and cover[j][1] <= start:
            j += 1
        k = j
        while k < len(cover) and cover[k][0] < end:
            total += min(end, cover[k][1]) - max(start, cover[k][0])
            k += 1
    return total


def kernel_overlap(events) -> dict:
    """From a profiler's kernel events (name, start_us, duration_us): NCCL kernel time, compute
    kernel time and the NCCL time that ran while compute ran (all in ms, over the unions)."""
    nccl = _union((e[1], e[1] + e[2]) for e in events if "nccl" in e[0].lower())
    compute = _union((e[1], e[1] + e[2]) for e in events if "nccl" not in e[0].lower())
    length = lambda spans: sum(b - a for a, b in spans)
    return dict(nccl_ms=length(nccl) / 1e3, compute_ms=length(compute) / 1e3,
                overlapped_ms=_covered(nccl, compute) / 1e3,
                span_ms=(max(b for _, b in nccl + compute) - min(a for a, _ in nccl + compute))
                / 1e3 if nccl + compute else 0.0)


def trace_step(args, n, device, folder):
    """One causal fwd+bwd ring step of length n under torch.profiler on every rank."""
    from torch.profiler import ProfilerActivity, profile

    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = DTYPES[args.dtype]
    hkv = args.kv_heads or args.heads
    g = torch.Generator(device=device).manual_seed(99)
    shards = [cp.shard_sequence(torch.randn(args.batch, n, h, args.head_dim, generator=g,
                                            device=device, dtype=dtype), rank, world,
                                layout=args.layout).requires_grad_()
              for h in (args.heads, hkv, hkv)]
    dout = torch.randn_like(shards[0])

    def step():
        out = cp.ring_attention(*shards, causal=True, layout=args.layout, seq_len=n)
        out.backward(dout)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    os.makedirs(folder, exist_ok=True)
    prof.export_chrome_trace(os.path.join(folder, f"ring_rank{rank}.json"))
    kernels = [(e.name, e.time_range.start, e.time_range.elapsed_us())
               for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    parts = kernel_overlap(kernels)
    summary = torch.tensor([parts["nccl_ms"], parts["compute_ms"], parts["overlapped_ms"],
                            parts["span_ms"]], dtype=torch.float64, device=device)
    every = [torch.empty_like(summary) for _ in range(world)]
    dist.all_gather(every, summary)
    if rank == 0:
        for r, values in enumerate(every):
            nccl_ms, compute_ms, overlapped_ms, span_ms = values.tolist()
            share = overlapped_ms / nccl_ms if nccl_ms else 0.0
            print(f"trace N={n} rank {r}: step {span_ms:8.3f} ms on the GPU, compute kernels "
                  f"{compute_ms:8.3f} ms, NCCL kernels {nccl_ms:8.3f} ms, of which "
                  f"{overlapped_ms:8.3f} ms ({100 * share:5.1f}%) ran beside compute "
                  f"-> {folder}/ring_rank{r}.json", flush=True)


def format_row(row) -> str:
    text = (f"{row['variant']:7s} W={row['world_size']} N={row['seq_len']:>7d} "
            f"{'causal' if row['causal'] else 'full':6s} {row['mode']:7s} "
            f"step {row['ring_ms']:9.3f} ms  {row['tokens_per_s_per_gpu']:11.0f} tok/s/GPU  "
            f"{row['tflops_per_gpu']:7.2f} TFLOP/s/GPU")
    if "compute_ms" in row:
        exposed = row["ring_ms"] - row["compute_ms"]
        text += (f"  compute {row['compute_ms']:9.3f}  comm {row['comm_ms']:8.3f}  "
                 f"exposed {exposed:8.3f} ms")
    if "single_ms" in row:
        text += (f"  | one GPU {row['single_ms']:9.3f} ms {row['single_tflops']:7.2f} TFLOP/s"
                 f"  per-GPU efficiency {row['per_gpu_efficiency']:.3f}")
    return text


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    device_kind = args.device
    if device_kind == "auto":
        device_kind = "cuda" if torch.cuda.is_available() else "cpu"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")
    if device_kind == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    clock = _Clock(device)
    ring = ring_module.Ring(None)
    masks = {"causal": [True], "full": [False], "both": [True, False]}[args.mask]
    rows = []
    for n in [parse_size(s) for s in args.seqlens.split(",")]:
        for causal in masks:
            for mode in args.modes.split(","):
                if mode not in ("fwd", "fwd+bwd"):
                    raise SystemExit(f"--modes: expected fwd and/or fwd+bwd, got {mode!r}")
                row = run_row(args, n, causal, mode, clock, device, ring)
                rows.append(row)
                if dist.get_rank() == 0:
                    print(format_row(row), flush=True)
    if args.trace and device.type == "cuda":
        trace_step(args, parse_size(args.seqlens.split(",")[0]), device, args.trace)
    if args.json and dist.get_rank() == 0:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device) if device.type == "cuda"
                       else "cpu", "torch": torch.__version__, "argv": sys.argv,
                       "rows": rows}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
