#!/usr/bin/env python3
"""Decode benchmark: a few new tokens attending over a full KV cache. flashcpp
(`flashcpp.attention_with_kvcache`, contiguous and paged caches) against cuDNN and
FlashAttention-2 through PyTorch SDPA (contiguous cache), in GB/s next to the device-to-device
copy bandwidth measured in the same process (docs/benchmarking.md, "Decode").

  python3 bench/decode_compare.py               # B 1/8/64 x L 1k..64k, Nnew 1 (~1-2 minutes)
  python3 bench/decode_compare.py --quick       # two cells: B 8, L 1k and 16k
  python3 bench/decode_compare.py --nnew 1,4,16 --layouts contiguous,paged16,paged256
  python3 bench/decode_compare.py --no-graph    # each call timed on its own (host-bound cells)
  python3 bench/decode_compare.py --dtype e4m3  # flashcpp over an fp8 (e4m3) cache

Every row is timed as replays of a CUDA graph of its calls (--graph, the default), as an
inference engine runs its decode steps; a row whose capture fails is timed per call (`p`).

Writes results.csv, status.csv, meta.json, table.txt, summary.md and one PNG per number of new
tokens into --out (default bench/results/<date>-<device>/decode/).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
import traceback
import warnings
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grid as G  # noqa: E402
import report as R  # noqa: E402
import sdpa_compare as SC  # noqa: E402
import timing as T  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECODE_IMPLS = ("flashcpp", "cudnn", "fa2")
SDPA_IMPLS = ("cudnn", "fa2")
COPY_BYTES = 1 << 30
# A cell of a few MB needs tens of input sets to touch 3x the L2 between two uses of a set.
MAX_SETS = 64
# A case runs the layouts whose caches, all at once, fit in this fraction of the GPU's memory
# (the rest is the CUDA context, cuDNN's workspace and the allocator's slack).
MEM_FRACTION = 0.7


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Decode (KV cache) benchmark: flashcpp's contiguous and paged caches vs "
                    "cuDNN / FlashAttention-2 through SDPA, in GB/s against the copy bandwidth "
                    "(docs/benchmarking.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Sizes take a k suffix (1k = 1024). See docs/benchmarking.md.")
    p.add_argument("--batches", default=None,
                   help="batch sizes B (default " + ",".join(map(str, G.DECODE_BATCHES)) + ")")
    p.add_argument("--lengths", default=None,
                   help="cache lengths L, every sequence full (default 1k,4k,16k,64k)")
    p.add_argument("--nnew", default=None,
                   help="new tokens per sequence, e.g. 1,4,16 (default "
                        + ",".join(map(str, G.DECODE_NNEW)) + ")")
    p.add_argument("--layouts", default=",".join(G.DEFAULT_LAYOUTS),
                   help=f"cache layouts of flashcpp, from {','.join(G.LAYOUTS)}; contiguous "
                        "always runs (the peers' layout and the paged rows' base)")
    p.add_argument("--impls", default=",".join(DECODE_IMPLS),
                   help=f"subset of {','.join(DECODE_IMPLS)}")
    p.add_argument("--dtype", choices=("bf16", "fp16", G.FP8_CACHE), default="bf16",
                   help="element type; e4m3: an fp8 KV cache with bf16 queries (flashcpp only: "
                        "SDPA reads no fp8 cache), bytes counted at 1 per cached element")
    p.add_argument("--hq", type=int, default=G.DECODE_HQ, help="query heads (default 32)")
    p.add_argument("--hkv", type=int, default=G.DECODE_HKV, help="key/value heads (default 8)")
    p.add_argument("--head-dim", type=int, default=G.DECODE_HEAD_DIM, help="D (default 128)")
    p.add_argument("--reps", type=int, default=SC.MIN_REPS,
                   help=f"timed calls per cell and round, median reported (>= {SC.MIN_REPS})")
    p.add_argument("--rounds", type=int, default=2,
                   help="timing rounds per cell, the implementations' order rotating each round")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True,
                   help="time replays of a CUDA graph of each row's calls, time per call = "
                        "replay time / calls (default); --no-graph: CUDA events around each "
                        "Python call, which small cells spend waiting for the host")
    p.add_argument("--quick", action="store_true",
                   help="two cells: B 8, L 1k and 16k (explicit --batches / --lengths win)")
    p.add_argument("--sdpa-layout", choices=("bshd-view", "bhsd"), default="bshd-view",
                   help="what the SDPA peers get: [B, Hkv, L, D] views of flashcpp's contiguous "
                        "[B, L, Hkv, D] cache (default), or contiguous BHSD copies")
    p.add_argument("--mem-fraction", type=float, default=MEM_FRACTION,
                   help="share of the GPU's memory a case's caches may hold (default 0.7)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="output folder (default bench/results/<date>-<device>/decode/)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        a.impl_list = G.parse_choice_list(a.impls, DECODE_IMPLS, "implementation")
        if a.dtype == G.FP8_CACHE:
            a.impl_list = [x for x in a.impl_list if x == "flashcpp"] or ["flashcpp"]
        layouts = G.parse_choice_list(a.layouts, G.LAYOUTS, "layout")
        a.layout_list = [G.CONTIGUOUS] + [x for x in layouts if x != G.CONTIGUOUS]
        batches = G.QUICK_DECODE_BATCHES if a.quick else G.DECODE_BATCHES
        lengths = G.QUICK_DECODE_LENGTHS if a.quick else G.DECODE_LENGTHS
        a.batch_list = G.parse_size_list(a.batches) if a.batches else list(batches)
        a.length_list = G.parse_size_list(a.lengths) if a.lengths else list(lengths)
        a.nnew_list = G.parse_size_list(a.nnew) if a.nnew else list(G.DECODE_NNEW)
        a.cases = G.decode_grid([a.dtype], a.batch_list, a.length_list, a.nnew_list,
                                hq=a.hq, hkv=a.hkv, head_dim=a.head_dim)
    except ValueError as e:
        p.error(str(e))
    if a.reps < 1 or a.rounds < 1:
        p.error("--reps and --rounds must be positive")
    if not 0 < a.mem_fraction <= 1:
        p.error("--mem-fraction must be in (0, 1]")
    return a


def copy_bandwidth(reps: int) -> float:
    """GB/s of a device-to-device copy of COPY_BYTES (bytes read + bytes written over the
    median time), timed like the cells."""
    import torch  # noqa: PLC0415
    src = torch.randn(COPY_BYTES // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    st = T.time_calls(lambda i: dst.copy_(src), reps=reps)
    return G.gbps(2 * COPY_BYTES, st["median"])


def timed_fns(ready: dict, n_sets: int, graph: bool):
    """What time_interleaved times for each row of `ready` (series -> Entry), and series ->
    calls per replay for those that are graphs (timing.capture). Without `graph`, or where the
    capture raised (entry.reason then says why), the row is timed per call, in a HostClock."""
    fns, calls = {}, {}
    n = T.graph_calls(n_sets)
    for name, entry in ready.items():
        if graph:
            try:
                with entry.peer.context():
                    fns[name], calls[name] = T.capture(entry.fn, n_sets, n), n
                continue
            except Exception as e:  # noqa: BLE001 (not capturable: timed per call, marked p)
                # an invalidated capture raises again on leaving torch.cuda.graph: the first
                # error says why
                why = "timed per call: CUDA graph capture failed: " + _reason(e.__context__ or e)
                entry.reason = "; ".join(x for x in (entry.reason, why) if x)
        fns[name] = HostClock(entry.fn)
    return fns, calls


class HostClock:
    """Wraps fn(i) and adds up the host's time inside the calls: when it comes near the GPU's
    median time per call, the GPU was waiting for the host (R.HOST_BOUND_FRACTION)."""

    def __init__(self, fn):
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, i):
        t = time.perf_counter()
        res = self.fn(i)
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return res

    @property
    def ms_per_call(self) -> float:
        return 1e3 * self.seconds / max(1, self.calls)


@dataclasses.dataclass
class Entry:
    """One row of a case: a peer on a layout, made and checked, ready to time (fn) or not."""

    impl: str
    layout: str
    peer: object = None
    fn: object = None
    max_err: Optional[float] = None
    ran: str = ""
    status: str = R.OK
    reason: str = ""

    @property
    def series(self) -> str:
        return G.decode_series(self.impl, self.layout)


def make_and_check(entry: Entry, ref_bhsd) -> Entry:
    """Makes the prepared peer's decode call and compares one call with the reference; a
    failure sets entry.status (n/a: it raised, wrong: outside reference.TOLERANCE)."""
    import reference  # noqa: PLC0415
    peer = entry.peer
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with peer.context():
                fn = peer.make("fwd")
                res = fn(0)
                out = res[0] if isinstance(res, (tuple, list)) else res
                err = reference.relative_error(peer.to_bhsd(out), ref_bhsd)
                entry.ran = peer.describe()
    except Exception as e:  # noqa: BLE001 (unsupported shape, OOM: n/a)
        entry.status, entry.reason = R.NA, _reason(e, caught if "caught" in locals() else ())
        return entry
    entry.max_err = err
    bad = reference.verdict({"out": err})
    if bad:
        entry.status, entry.reason = R.WRONG, bad + (f" (ran {entry.ran})" if entry.ran else "")
    else:
        entry.fn = fn
    return entry


def memory_left(a) -> float:
    """Bytes a case may still allocate: --mem-fraction of the GPU's memory less what is held."""
    import torch  # noqa: PLC0415
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return a.mem_fraction * total - torch.cuda.memory_allocated()


def _reason(e: BaseException, caught=()) -> str:
    import torch  # noqa: PLC0415
    text = SC.short_reason(e, caught)
    if os.environ.get("BENCH_TRACEBACK"):
        traceback.print_exception(e)
    return ("out of memory: " + text) if isinstance(e, torch.cuda.OutOfMemoryError) else text


def expanded_entry(name: str, case: G.Case, sets, a, ref_bhsd, refused: str) -> Entry:
    """The SDPA peer `name` again on K/V repeated to Hq heads (contiguous [B, Hq, L, D]), for a
    backend that refused enable_gqa; n/a when those copies do not fit in the memory left."""
    import peers as P  # noqa: PLC0415
    entry = Entry(name, G.EXPANDED)
    need = len(sets) * G.kv_bytes(case, case.H)
    left = memory_left(a)
    if need > left:
        entry.status = R.NA
        entry.reason = (f"enable_gqa refused ({refused}); K/V expanded to {case.H} heads would "
                        f"need {need / 2**30:.2f} GiB, {left / 2**30:.2f} GiB left")
        return entry
    group = case.H // case.Hkv

    def wide(t):  # [B, L, Hkv, D] -> a [B, L, Hq, D] view of contiguous [B, Hq, L, D] memory
        return t.transpose(1, 2).repeat_interleave(group, dim=1).transpose(1, 2)
    entry.peer = P.SdpaPeer(name, a.sdpa_layout)
    entry.peer.prepare(dataclasses.replace(case, Hkv=case.H),
                       [P.InputSet(s.q, wide(s.k), wide(s.v), None) for s in sets])
    make_and_check(entry, ref_bhsd)
    if entry.status == R.OK:
        entry.reason = f"read K/V expanded to {case.H} heads; with enable_gqa: {refused}"
    else:
        entry.reason = (f"with enable_gqa: {refused}; with K/V expanded to {case.H} heads: "
                        f"{entry.reason}")
    return entry


def run_case(case: G.Case, a, usable, copy_gbps: float, l2: float, log) -> list:
    """Builds the inputs of one case, checks every (implementation, layout), times those that
    passed together (timing.time_interleaved), and returns a DecodeResult for each. Its inputs
    are freed when it returns."""
    import peers as P  # noqa: PLC0415
    import reference  # noqa: PLC0415

    def result(impl, layout, status, **kw):
        return R.DecodeResult(impl, case, G.DECODE_MODE, status, layout=layout,
                              copy_gbps=copy_gbps, **kw)

    flash = "flashcpp" in usable
    sdpa = [n for n in SDPA_IMPLS if n in usable]
    layouts = a.layout_list if flash else [G.CONTIGUOUS]
    n_sets = G.rotation_sets(G.decode_bytes(case), l2, MAX_SETS)
    extra = n_sets * G.kv_bytes(case) if sdpa and a.sdpa_layout == "bhsd" else 0.0
    budget = memory_left(a)
    kept, dropped, need = G.plan_layouts(case, layouts, n_sets, budget, extra)
    results = []
    for layout in dropped:
        why = (f"does not fit: {n_sets} set(s) of this layout with those before it need more "
               f"than {budget / 2**30:.2f} GiB ({a.mem_fraction:g} of the GPU's memory)")
        impls = (["flashcpp"] if flash else []) + (sdpa if layout == G.CONTIGUOUS else [])
        results += [result(n, layout, R.NA, reason=why) for n in impls]
    if not kept:
        return results
    log(f"    {n_sets} input set(s), {need / 2**30:.2f} GiB; layouts {', '.join(kept)}")

    try:
        sets = P.make_decode_inputs(case, kept, n_sets, seed=a.seed)
        s0 = sets[0]
        ref = reference.compute_decode(s0.q, s0.k, s0.v, P.softmax_scale(case))
        ref_bhsd = ref.transpose(1, 2)
    except Exception as e:  # noqa: BLE001
        why = "inputs or reference failed: " + _reason(e)
        log(f"    {why}")
        rows = [("flashcpp", x) for x in kept if flash] + [(n, G.CONTIGUOUS) for n in sdpa]
        return results + [result(n, x, R.NA, reason=why) for n, x in rows]

    entries = []
    for layout in kept if flash else []:
        entry = Entry("flashcpp", layout, P.FlashcppKVCachePeer(layout))
        entry.peer.available()
        entry.peer.prepare(case, sets)
        entries.append(make_and_check(entry, ref_bhsd))
    for name in sdpa:
        entry = Entry(name, G.CONTIGUOUS, P.SdpaPeer(name, a.sdpa_layout))
        entry.peer.prepare(case, [s.contiguous() for s in sets])
        make_and_check(entry, ref_bhsd)
        if entry.status == R.NA and case.H != case.Hkv:
            entry.peer.release()
            entry = expanded_entry(name, case, sets, a, ref_bhsd, entry.reason)
        entries.append(entry)

    ready = {e.series: e for e in entries if e.status == R.OK}
    fns, calls = timed_fns(ready, n_sets, a.graph)
    try:
        stats = T.time_interleaved(
            fns, n_sets=n_sets, reps=a.reps, rounds=a.rounds,
            contexts={name: e.peer.context for name, e in ready.items()}, calls=calls)
    except Exception as e:  # noqa: BLE001 (a failure outside any one fn: every row n/a)
        stats = {name: e for name in ready}
    for entry in entries:
        st = stats.get(entry.series)
        if entry.status == R.OK and isinstance(st, BaseException):
            entry.status, entry.reason = R.NA, _reason(st)
        if entry.status != R.OK:
            log(f"    {entry.series:9s} {entry.status}: {entry.reason[:160]}")
            results.append(result(entry.impl, entry.layout, entry.status, max_err=entry.max_err,
                                  reason=entry.reason))
            continue
        n = calls.get(entry.series)
        if n:
            r = result(entry.impl, entry.layout, R.OK, ms=st["median"], max_err=entry.max_err)
            timed = (f"CUDA graph of {n} calls, {T.replays(a.reps, n)} replays a round "
                     "(host time not measured)")
        else:
            host_ms = fns[entry.series].ms_per_call
            r = result(entry.impl, entry.layout, R.OK, ms=st["median"], max_err=entry.max_err,
                       timing=R.PER_CALL,
                       host_bound=host_ms >= R.HOST_BOUND_FRACTION * st["median"])
            timed = f"host {host_ms * 1e3:.1f} us/call" + (" (host-bound)" if r.host_bound else "")
        notes = [f"p10 {st['p10']:.4f} ms, p90 {st['p90']:.4f} ms", timed]
        notes += [f"ran {entry.ran}"] if entry.ran else []
        notes += [entry.reason] if entry.reason else []
        r.reason = "; ".join(notes)
        log(f"    {entry.series:9s} {st['median']:9.4f} ms {r.gbps:7.0f} GB/s {r.pct_copy:4.0f}% "
            f"of copy  max err {entry.max_err:.2e}  {'; '.join(notes[1:])}")
        results.append(r)
    return results


def run_grid(a, copy_gbps: float, results: list, log=print) -> None:
    """Appends the DecodeResults of every case to `results` as it goes (an interrupted run
    still has what was measured)."""
    import peers as P  # noqa: PLC0415
    usable = []
    for name in a.impl_list:
        why = (P.FlashcppKVCachePeer() if name == "flashcpp" else P.SdpaPeer(name)).available()
        if why is None:
            usable.append(name)
            continue
        log(f"  {name}: unavailable: {why}")
        layouts = a.layout_list if name == "flashcpp" else [G.CONTIGUOUS]
        results += [R.DecodeResult(name, c, G.DECODE_MODE, R.NA, reason=why, layout=x,
                                   copy_gbps=copy_gbps) for c in a.cases for x in layouts]
    l2 = SC.l2_bytes()
    for ci, case in enumerate(a.cases):
        log(f"[{ci + 1}/{len(a.cases)}] {R.decode_case_label(case)} ({case.label})")
        results += run_case(case, a, usable, copy_gbps, l2, log)
        SC.quiet_sync()  # the case's inputs, freed on return, go back to the driver


def main(argv=None) -> int:
    a = parse_args(argv)
    if SC.torch_cuda_missing("decode_compare"):
        return 2
    if a.reps < SC.MIN_REPS:
        print(f"warning: --reps {a.reps} is below the {SC.MIN_REPS} of docs/benchmarking.md",
              file=sys.stderr)

    meta = R.collect_meta()
    device = str(meta.get("device", "unknown"))
    out = a.out or os.path.join(R.default_out_dir(REPO_ROOT, device), "decode")
    os.makedirs(out, exist_ok=True)
    args = argv if argv is not None else sys.argv[1:]
    command = "python3 bench/decode_compare.py " + " ".join(shlex.quote(x) for x in args)
    copy_gbps = copy_bandwidth(a.reps)
    SC.quiet_sync()  # its 2 GiB go back before the first case
    timing = R.GRAPH if a.graph else R.PER_CALL
    meta.update({"mode": G.DECODE_MODE, "command": command, "timing": timing,
                 **({"graph_calls": T.GRAPH_CALLS} if a.graph else {}),
                 "reps": a.reps, "rounds": a.rounds, "impls": a.impl_list,
                 "layouts": a.layout_list, "sdpa_layout": a.sdpa_layout,
                 "mem_fraction": a.mem_fraction, "copy_bytes": COPY_BYTES,
                 "copy_gbps": round(copy_gbps, 1)})
    R.write_meta(os.path.join(out, "meta.json"), meta)
    print(f"device {device}, torch {meta.get('torch')}, CUDA {meta.get('cuda')}, "
          f"cuDNN {meta.get('cudnn')}, driver {meta.get('driver')}; copy {copy_gbps:.0f} GB/s; "
          f"timing {timing}; "
          f"{len(a.cases)} cases x {len(a.impl_list)} impls, layouts {','.join(a.layout_list)} "
          f"-> {out}", flush=True)

    t0 = time.time()
    results = []
    try:
        run_grid(a, copy_gbps, results, log=lambda s: print(s, flush=True))
    except (Exception, KeyboardInterrupt):  # noqa: BLE001 (write what was measured, then fail)
        traceback.print_exc()
        meta["interrupted"] = True
    meta["elapsed_s"] = round(time.time() - t0, 1)
    R.write_meta(os.path.join(out, "meta.json"), meta)
    R.write_csv(os.path.join(out, "results.csv"), results, device, R.DECODE_CSV_COLUMNS)
    R.write_status_csv(os.path.join(out, "status.csv"), results, R.DECODE_STATUS_COLUMNS)
    plots = []
    if not a.no_plots:
        import plots as PL  # noqa: PLC0415
        plots = PL.write_decode_plots(R.csv_rows(results, device), out, device)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(R.decode_summary_markdown(results, meta, command, plots))
    header, rows = R.decode_table_rows(results, timing)
    text = "\n".join([f"{device}: " + "\n".join(R.decode_legend(results, copy_gbps, timing)),
                      R.format_table(header, rows, left=1)])
    with open(os.path.join(out, "table.txt"), "w") as f:
        f.write(text + "\n")
    failures = R.failure_lines(results)
    print()
    if failures:
        print("not measured:")
        for line in failures:
            print("  " + line)
        print()
    print(f"wrote {out} ({meta['elapsed_s']} s)")
    print(text)
    return 1 if meta.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
