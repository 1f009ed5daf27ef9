#!/usr/bin/env python3
"""Side-by-side attention benchmark: flashcpp against cuDNN, FlashAttention-2, memory-efficient
(all three through PyTorch SDPA) and FlexAttention, in one process, case by case (the protocol
of docs/benchmarking.md).

  python3 bench/sdpa_compare.py                 # the full training grid, bf16
  python3 bench/sdpa_compare.py --quick         # a reduced grid (~1-2 minutes)
  python3 bench/sdpa_compare.py --driver --impls flashcpp --heads-dims 128 --seqlens 4k \\
      --causal on --modes fwd                   # run one cell a few times (for ncu)
  python3 bench/sdpa_compare.py --dtype e4m3 --modes fwd --heads-dims 128,256 --seqlens 16k \\
      --impls flashcpp                          # the FP8 forward (e4m3 q, k, v; bf16 out)

Writes results.csv, status.csv, meta.json, table.txt, summary.md and one PNG per head dim and
mode into --out (default bench/results/<date>-<device>/). docs/benchmarking.md explains them.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grid as G  # noqa: E402
import report as R  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_IMPLS = ("flashcpp", "cudnn", "fa2", "mem_eff", "flex")
# Accepted by --impls but not run by default: flashcpp_det, flashcpp with a deterministic
# backward (bench/peers.py), e.g. --impls flashcpp,flashcpp_det --modes bwd; flashcpp_fast, the
# FP8 forward with fp8_fast_accum; cudnn_fp8, cuDNN's FP8 forward (bench/cudnn_fp8_peer.py), e.g.
# --dtype e4m3 --modes fwd --impls flashcpp,flashcpp_fast,cudnn_fp8.
EXTRA_IMPLS = ("flashcpp_det", "flashcpp_fast", "cudnn_fp8")
MIN_REPS = 100


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="flashcpp vs cuDNN / FlashAttention-2 / mem-efficient / FlexAttention, "
                    "timed side by side (docs/benchmarking.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Sizes take a k suffix (1k = 1024). See docs/benchmarking.md.")
    p.add_argument("--heads-dims", default=None,
                   help="head dims D, comma-separated (default 64,128,256; H = hidden / D)")
    p.add_argument("--seqlens", default=None,
                   help="sequence lengths N = Nq = Nk (default 512,1k,2k,4k,8k,16k; B = tokens / N)")
    p.add_argument("--modes", default="fwd,bwd,fwd+bwd",
                   help="what is timed: fwd, bwd (backward given the forward's outputs), fwd+bwd")
    p.add_argument("--causal", choices=("off", "on", "both"), default="both")
    p.add_argument("--dtype", default="bf16",
                   help="bf16, fp16, e4m3 (fp8 q, k, v with per-tensor descales, bf16 out: "
                        "the forward only, flashcpp and cudnn_fp8 only), comma-separated")
    p.add_argument("--impls", default=",".join(ALL_IMPLS),
                   help=f"subset of {','.join(ALL_IMPLS + EXTRA_IMPLS)} "
                        f"(default {','.join(ALL_IMPLS)})")
    p.add_argument("--reps", type=int, default=MIN_REPS,
                   help=f"timed repetitions per cell, median reported (>= {MIN_REPS}; "
                        "docs/benchmarking.md)")
    p.add_argument("--rounds", type=int, default=2,
                   help="timing rounds per cell, the implementations' order rotating each round "
                        "(--reps calls per round; the median is over all of them)")
    p.add_argument("--quick", action="store_true",
                   help="reduced grid: D 128, N 1k and 4k, causal off and on, all modes")
    p.add_argument("--tokens", type=int, default=G.DEFAULT_TOKENS, help="B * N (default 16384)")
    p.add_argument("--hidden", type=int, default=G.DEFAULT_HIDDEN, help="H * D (default 2048)")
    p.add_argument("--sdpa-layout", choices=("bshd-view", "bhsd"), default="bshd-view",
                   help="what SDPA and flex get: [B,H,N,D] views of the BSHD inputs (default), "
                        "or contiguous BHSD copies")
    p.add_argument("--flashcpp-backend", default="auto", help="backend= for flashcpp.attention")
    p.add_argument("--flashcpp-env", default=None, metavar="VAR=V1,V2",
                   help="also time flashcpp with environment variable VAR set to each value, "
                        "one column flashcpp[V] each (variables flashcpp reads at every call, "
                        "e.g. FLASHCPP_SM80_FWD_TILE_D256=128x64_8w_kv2,64x64_4w)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="output folder (default bench/results/<date>-<device>/)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    d = p.add_argument_group("driver mode (for profilers: dev/profile.py)")
    d.add_argument("--driver", action="store_true",
                   help="run one cell (one impl, D, N, causal on/off, mode) --driver-iters times "
                        "between cudaProfilerStart/Stop after a warm-up; no check, no files")
    d.add_argument("--driver-iters", type=int, default=3)
    d.add_argument("--driver-warmup", type=int, default=3)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        a.dtypes = G.parse_choice_list(a.dtype, ("bf16", "fp16", G.FP8_CACHE), "dtype")
        a.mode_list = G.parse_choice_list(a.modes, G.TRAIN_MODES, "mode")
        a.impl_list = G.parse_choice_list(a.impls, ALL_IMPLS + EXTRA_IMPLS, "implementation")
        default_d = G.QUICK_HEAD_DIMS if a.quick else G.DEFAULT_HEAD_DIMS
        default_n = G.QUICK_SEQLENS if a.quick else G.DEFAULT_SEQLENS
        a.head_dims = G.parse_size_list(a.heads_dims) if a.heads_dims else list(default_d)
        a.seqlen_list = G.parse_size_list(a.seqlens) if a.seqlens else list(default_n)
        a.causal_list = G.causal_flags(a.causal)
        import peers as P  # noqa: PLC0415
        a.flashcpp_env_spec = P.parse_flashcpp_env(a.flashcpp_env) if a.flashcpp_env else None
        # Table columns: the implementations, then flashcpp's environment variants.
        a.columns = list(a.impl_list) + (
            [f"flashcpp[{v}]" for v in a.flashcpp_env_spec[1]] if a.flashcpp_env_spec else [])
        a.cases = G.training_grid(a.dtypes, a.head_dims, a.seqlen_list, a.causal_list,
                                  tokens=a.tokens, hidden=a.hidden)
    except ValueError as e:
        p.error(str(e))
    if a.reps < 1:
        p.error("--reps must be positive")
    if a.rounds < 1:
        p.error("--rounds must be positive")
    if a.driver:
        if a.flashcpp_env:
            p.error("--driver takes no --flashcpp-env (set the variable in the environment)")
        if len(a.cases) != 1 or len(a.mode_list) != 1 or len(a.impl_list) != 1:
            p.error("--driver needs exactly one impl, dtype, head dim, seqlen, causal (on/off) "
                    f"and mode; got {len(a.impl_list)} impls, {len(a.cases)} cases, "
                    f"{len(a.mode_list)} modes")
    return a


def short_reason(e: BaseException, caught=()) -> str:
    text = f"{type(e).__name__}: {e}"
    notes = [str(w.message) for w in caught if str(w.message) not in text]
    if notes:
        text += " | warnings: " + " / ".join(dict.fromkeys(notes))
    return " ".join(text.split())[:600]


def check_cell(peer, mode, fn, ref) -> tuple:
    """Runs fn once and compares with the reference: (errors dict, verdict or None)."""
    import reference  # noqa: PLC0415
    import peers as P  # noqa: PLC0415
    res = fn(0)
    if mode == "fwd":
        out = res[0] if isinstance(res, (tuple, list)) else res
        errs = reference.check(ref, out=peer.to_bhsd(out))
        return errs, reference.verdict(errs, fp8=peer.case.dtype == "e4m3")
    else:
        grads = [peer.to_bhsd(g) for g in P.grads_of(res)]
        out = fn.outputs(0) if hasattr(fn, "outputs") else None
        errs = reference.check(ref, out=None if out is None else peer.to_bhsd(out), grads=grads)
    return errs, reference.verdict(errs)


def make_and_check(peer, case, mode, ref):
    """Makes and checks one cell: (fn, max_err, ran) ready to time, or an n/a / wrong Result."""
    if mode in G.BACKWARD_MODES and not peer.has_backward:
        return R.Result(peer.name, case, mode, R.NA, reason="no backward")
    refusal = dtype_refusal(peer, case)
    if refusal or (case.dtype == G.FP8_CACHE and mode != "fwd"):
        return R.Result(peer.name, case, mode, R.NA,
                        reason=refusal or "fp8 (e4m3) is forward only")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with peer.context():
                fn = peer.make(mode)
                errs, bad = check_cell(peer, mode, fn, ref)
                ran = peer.describe()
        max_err = max(errs.values()) if errs else None
        if bad:
            return R.Result(peer.name, case, mode, R.WRONG, max_err=max_err,
                            reason=bad + (f" (ran {ran})" if ran else ""))
        return fn, max_err, ran
    except Exception as e:  # noqa: BLE001 (unsupported shape, OOM, compile failure: all n/a)
        return _na_result(peer, case, mode, e, caught if "caught" in locals() else ())


def dtype_refusal(peer, case) -> str:
    """Why the peer takes no q, k, v of the case's dtype, or ""."""
    if case.dtype == G.FP8_CACHE and not peer.takes_fp8:
        return "takes no fp8 (e4m3) q, k, v"
    if case.dtype != G.FP8_CACHE and not getattr(peer, "takes_16bit", True):
        return "takes only fp8 (e4m3) q, k, v (--dtype e4m3)"
    return ""


def _na_result(peer, case, mode, e, caught=()) -> R.Result:
    import torch  # noqa: PLC0415
    reason = short_reason(e, caught)
    if isinstance(e, torch.cuda.OutOfMemoryError):
        reason = "out of memory: " + reason
    if os.environ.get("BENCH_TRACEBACK"):
        traceback.print_exception(e)
    return R.Result(peer.name, case, mode, R.NA, reason=reason)


def run_mode(peers, case, mode, ref, reps, rounds, n_sets, log) -> list:
    """Checks every peer on one (case, mode), then times those that passed together
    (timing.time_interleaved: rounds in rotating order); one Result per peer, in peer order."""
    import timing  # noqa: PLC0415
    results, ready = {}, {}
    for peer in peers:
        checked = make_and_check(peer, case, mode, ref)
        if isinstance(checked, R.Result):
            results[peer.name] = checked
        else:
            ready[peer.name] = (peer, *checked)
    try:
        stats = timing.time_interleaved(
            {name: fn for name, (_, fn, _, _) in ready.items()}, n_sets=n_sets, reps=reps,
            rounds=rounds, contexts={name: peer.context for name, (peer, *_) in ready.items()})
    except Exception as e:  # noqa: BLE001 (a failure outside any one fn: every cell n/a)
        stats = {name: e for name in ready}
    for name, (peer, fn, max_err, ran) in ready.items():
        st = stats[name]
        if isinstance(st, BaseException):
            results[name] = _na_result(peer, case, mode, st)
            continue
        log(f"    {name:9s} {mode:8s} {st['median']:9.4f} ms  "
            f"(p10 {st['p10']:.4f}, p90 {st['p90']:.4f}, {st['n']} calls)  max err {max_err:.2e}  {ran}")
        note = f"p10 {st['p10']:.4f} ms, p90 {st['p90']:.4f} ms" + (f"; ran {ran}" if ran else "")
        results[name] = R.Result(name, case, mode, R.OK, ms=st["median"], max_err=max_err,
                                 reason=note)
    del ready
    quiet_sync()
    return [results[p.name] for p in peers]


def quiet_sync() -> None:
    """synchronize + empty_cache that never raise (a kernel fault makes every later CUDA call
    fail; the cells after it become n/a with that error, the run still writes its files)."""
    import torch  # noqa: PLC0415
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001
        print(f"    CUDA error after the cell: {short_reason(e)}", file=sys.stderr)


def l2_bytes() -> float:
    import torch  # noqa: PLC0415
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return float(getattr(p, "L2_cache_size", 0) or 50 * 2**20)


def run_grid(a, results, log=print) -> None:
    """Appends a Result per (impl, case, mode) to `results` as it goes (so an interrupted run
    still has what was measured)."""
    import peers as P  # noqa: PLC0415
    import reference  # noqa: PLC0415

    all_peers = P.make_peers(a.impl_list, a.sdpa_layout, a.flashcpp_backend, a.flashcpp_env_spec)
    usable = []
    for peer in all_peers:
        why = peer.available()
        if why:
            log(f"  {peer.name}: unavailable: {why}")
            for case in a.cases:
                for mode in a.mode_list:
                    results.append(R.Result(peer.name, case, mode, R.NA, reason=why))
        else:
            usable.append(peer)
    l2 = l2_bytes()
    need_grads = any(m in G.BACKWARD_MODES for m in a.mode_list)
    for ci, case in enumerate(a.cases):
        log(f"[{ci + 1}/{len(a.cases)}] {case.label}")
        n_sets = G.rotation_sets(G.mode_bytes(case, "fwd"), l2)
        sets = ref = None
        try:
            sets = P.make_input_sets(case, n_sets, seed=a.seed + ci)
            s0 = sets[0]
            ref = reference.compute(s0.q.transpose(1, 2), s0.k.transpose(1, 2),
                                    s0.v.transpose(1, 2), s0.dout.transpose(1, 2), case.causal,
                                    P.softmax_scale(case), grads=need_grads)
        except Exception as e:  # noqa: BLE001
            reason = "inputs or reference failed: " + short_reason(e)
            log(f"    {reason}")
            for peer in usable:
                for mode in a.mode_list:
                    results.append(R.Result(peer.name, case, mode, R.NA, reason=reason))
            sets = ref = None
            quiet_sync()
            continue
        prepared = []
        for peer in usable:  # once per case: flex compiles once per shape
            if dtype_refusal(peer, case):  # n/a in make_and_check
                prepared.append(peer)
                continue
            try:
                peer.prepare(case, sets)
                prepared.append(peer)
            except Exception as e:  # noqa: BLE001
                reason = "prepare failed: " + short_reason(e)
                log(f"    {peer.name:9s} n/a: {reason[:160]}")
                results += [R.Result(peer.name, case, m, R.NA, reason=reason) for m in a.mode_list]
        for mode in a.mode_list:
            for r in run_mode(prepared, case, mode, ref, a.reps, a.rounds, n_sets, log):
                if r.status != R.OK:
                    log(f"    {r.impl:9s} {mode:8s} {r.status}: {r.reason[:160]}")
                results.append(r)
        for peer in prepared:
            peer.release()
        del sets, ref
        quiet_sync()


def run_driver(a) -> int:
    """One cell, a few times, between cudaProfilerStart and Stop (ncu --profile-from-start off)."""
    import torch  # noqa: PLC0415
    import torch.cuda.profiler  # noqa: PLC0415
    import peers as P  # noqa: PLC0415
    case, mode = a.cases[0], a.mode_list[0]
    peer = P.make_peers(a.impl_list, a.sdpa_layout, a.flashcpp_backend)[0]
    why = peer.available()
    if why:
        print(f"driver: {peer.name} unavailable: {why}", file=sys.stderr)
        return 2
    sets = P.make_input_sets(case, 1, seed=a.seed)
    peer.prepare(case, sets)
    with peer.context():
        fn = peer.make(mode)
        for _ in range(a.driver_warmup):  # compiles, autotunes, first-call set-up
            fn(0)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for _ in range(a.driver_iters):
            fn(0)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(f"driver: {peer.name} {case.label} {mode}: {a.driver_iters} profiled runs")
    return 0


def torch_cuda_missing(prog: str) -> bool:
    """True (after saying why on stderr) when PyTorch or a CUDA device is missing."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        print(f"{prog}: PyTorch is not installed (it needs torch with CUDA and a GPU)",
              file=sys.stderr)
        return True
    if not torch.cuda.is_available():
        print(f"{prog}: no CUDA device visible", file=sys.stderr)
        return True
    return False


def main(argv=None) -> int:
    a = parse_args(argv)
    if torch_cuda_missing("sdpa_compare"):
        return 2
    if a.driver:
        return run_driver(a)
    if a.reps < MIN_REPS:
        print(f"warning: --reps {a.reps} is below the {MIN_REPS} of docs/benchmarking.md",
              file=sys.stderr)

    meta = R.collect_meta()
    device = str(meta.get("device", "unknown"))
    out = a.out or R.default_out_dir(REPO_ROOT, device)
    os.makedirs(out, exist_ok=True)
    command = "python3 bench/sdpa_compare.py " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    meta.update({"sdpa_layout": a.sdpa_layout, "reps": a.reps, "rounds": a.rounds,
                 "command": command,
                 "impls": a.columns, "modes": a.mode_list})
    R.write_meta(os.path.join(out, "meta.json"), meta)
    print(f"device {device}, torch {meta.get('torch')}, CUDA {meta.get('cuda')}, "
          f"cuDNN {meta.get('cudnn')}, driver {meta.get('driver')}; {len(a.cases)} cases x "
          f"{len(a.mode_list)} modes x {len(a.columns)} impls -> {out}", flush=True)

    t0 = time.time()
    results = []
    try:
        run_grid(a, results, log=lambda s: print(s, flush=True))
    except (Exception, KeyboardInterrupt):  # noqa: BLE001 (write what was measured, then fail)
        traceback.print_exc()
        meta["interrupted"] = True
    meta["elapsed_s"] = round(time.time() - t0, 1)
    frontend = sys.modules.get("cudnn")  # imported by the cudnn_fp8 peer, if it ran
    if frontend is not None and hasattr(frontend, "backend_version_string"):
        meta["cudnn_frontend"] = (f"{getattr(frontend, '__version__', '?')} on cuDNN "
                                  f"{frontend.backend_version_string()}")
    R.write_meta(os.path.join(out, "meta.json"), meta)
    R.write_csv(os.path.join(out, "results.csv"), results, device)
    R.write_status_csv(os.path.join(out, "status.csv"), results)
    plots = []
    if not a.no_plots:
        import plots as PL  # noqa: PLC0415
        plots = PL.write_plots(R.csv_rows(results, device), out, device)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(R.summary_markdown(results, a.columns, meta, command, plots))
    header, rows = R.table_rows(results, a.columns)
    table = R.format_table(header, rows)
    failures = R.failure_lines(results)
    ran = "".join(f"  {line}\n" for line in R.peer_ran_lines(results))
    ran = f"what the peers ran:\n{ran}" if ran else ""
    with open(os.path.join(out, "table.txt"), "w") as f:
        f.write(f"{device}: TFLOP/s, flashcpp/X = X's time over flashcpp's\n{table}\n{ran}")
    print()
    if failures:
        print("not measured:")
        for line in failures:
            print("  " + line)
        print()
    print(f"wrote {out} ({meta['elapsed_s']} s)")
    print(f"{device}: TFLOP/s, flashcpp/X = X's time over flashcpp's")
    print(table)
    print(ran, end="")
    return 1 if meta.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
