#!/usr/bin/env python3
"""Nsight Compute on one kernel of one benchmark case, and a short table of what matters.

  dev/profile.py --kernel 'regex:flash' --impl flashcpp --D 128 --N 4096 --causal
  dev/profile.py --kernel 'regex:cudnn|sm90' --impl cudnn --D 128 --N 4096 --mode bwd

Runs `ncu --clock-control none --profile-from-start off -k <kernel>` on the driver mode of
bench/sdpa_compare.py, which runs the case a few times between cudaProfilerStart/Stop after a
warm-up (so compiles, autotuning and the inputs' set-up are never profiled). Keeps the raw
report (<out>/report.ncu-rep) and its CSV exports (details.csv, raw.csv) in the output folder
and prints occupancy, SM and tensor-pipe utilisation, DRAM / L2 / shared-memory throughput,
registers per thread, local-memory (spill) traffic and the top stall reasons.
`--parse-only DIR` re-reads the CSVs of an earlier run (used by the tests).
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "MemoryWorkloadAnalysis",
            "MemoryWorkloadAnalysis_Tables", "WarpStateStats", "ComputeWorkloadAnalysis")
# Metrics beyond the sections: tensor-pipe activity (hmma: mma.sync, gmma: Hopper wgmma), spill
# traffic, shared-memory wavefronts and bank conflicts, DRAM / L2 bytes. If this ncu rejects a
# metric, the run is repeated without the Hopper-only one, then with the sections alone.
HOPPER_METRICS = ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",)
EXTRA_METRICS = (
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes.sum.per_second",
    "lts__t_bytes.sum.per_second",
)

# (label, section name or None for any, metric name as on the details page)
DETAIL_ROWS: List[Tuple[str, Optional[str], str]] = [
    ("duration", "GPU Speed Of Light Throughput", "Duration"),
    ("SM frequency", "GPU Speed Of Light Throughput", "SM Frequency"),
    ("compute (SM) throughput", "GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    ("memory throughput", "GPU Speed Of Light Throughput", "Memory Throughput"),
    ("DRAM throughput", "GPU Speed Of Light Throughput", "DRAM Throughput"),
    ("L1/TEX throughput", "GPU Speed Of Light Throughput", "L1/TEX Cache Throughput"),
    ("L2 throughput", "GPU Speed Of Light Throughput", "L2 Cache Throughput"),
    ("DRAM bandwidth", "Memory Workload Analysis", "Memory Throughput"),
    ("L2 hit rate", "Memory Workload Analysis", "L2 Hit Rate"),
    ("mem pipes busy", "Memory Workload Analysis", "Mem Pipes Busy"),
    ("achieved occupancy", "Occupancy", "Achieved Occupancy"),
    ("theoretical occupancy", "Occupancy", "Theoretical Occupancy"),
    ("block limit registers", "Occupancy", "Block Limit Registers"),
    ("block limit shared mem", "Occupancy", "Block Limit Shared Mem"),
    ("registers per thread", "Launch Statistics", "Registers Per Thread"),
    ("block size", "Launch Statistics", "Block Size"),
    ("grid size", "Launch Statistics", "Grid Size"),
    ("dynamic shared mem / block", "Launch Statistics", "Dynamic Shared Memory Per Block"),
    ("waves per SM", "Launch Statistics", "Waves Per SM"),
    ("executed IPC (active)", "Compute Workload Analysis", "Executed Ipc Active"),
    ("SM busy", "Compute Workload Analysis", "SM Busy"),
    ("issue slots busy", "Compute Workload Analysis", "Issue Slots Busy"),
    ("warp cycles per issued instr", "Warp State Statistics", "Warp Cycles Per Issued Instruction"),
]
RAW_ROWS: List[Tuple[str, str]] = [
    ("local (spill) load bytes", "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"),
    ("local (spill) store bytes", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"),
    ("shared wavefronts", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"),
    ("shared bank conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"),
    ("shared (LSU) throughput", "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed"),
    ("DRAM bytes / s", "dram__bytes.sum.per_second"),
    ("L2 bytes / s", "lts__t_bytes.sum.per_second"),
]
STALL_RE = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
TENSOR_RE = re.compile(r"^sm__(pipe|inst_executed_pipe)_\w*tensor\w*\.(avg\.)?pct_of_peak_sustained_active$")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", default="regex:.",
                   help="ncu -k filter, e.g. 'regex:flash' or an exact kernel name")
    p.add_argument("--impl", default="flashcpp",
                   choices=("flashcpp", "cudnn", "fa2", "mem_eff", "flex", "flashcpp_fast",
                            "cudnn_fp8"))
    p.add_argument("--D", type=int, default=128, help="head dim (H = hidden / D)")
    p.add_argument("--N", default="4096", help="sequence length (B = tokens / N); 4k works")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--mode", default="fwd", choices=("fwd", "bwd", "fwd+bwd"))
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "e4m3"))
    p.add_argument("--sdpa-layout", default="bshd-view", choices=("bshd-view", "bhsd"))
    p.add_argument("--launch-skip", type=int, default=0,
                   help="matching launches to skip inside the profiled range")
    p.add_argument("--launch-count", type=int, default=1, help="matching launches to profile")
    p.add_argument("--iters", type=int, default=3, help="runs of the case in the profiled range")
    p.add_argument("--out", default=None, help="folder for the report (default build/profiles/<case>)")
    p.add_argument("--ncu", default=os.environ.get("NCU", "ncu"), help="ncu executable")
    p.add_argument("--python", default=sys.executable, help="python that has torch")
    p.add_argument("--extra", default="", help="more ncu flags, one string")
    p.add_argument("--parse-only", metavar="DIR",
                   help="only parse DIR/details.csv and DIR/raw.csv of an earlier run")
    return p


def case_name(a) -> str:
    return (f"{a.impl}_{a.dtype}_d{a.D}_n{a.N}_{'causal' if a.causal else 'full'}_"
            f"{a.mode.replace('+', '_')}")


def driver_command(a) -> List[str]:
    return [a.python, os.path.join(ROOT, "bench", "sdpa_compare.py"), "--driver",
            "--impls", a.impl, "--heads-dims", str(a.D), "--seqlens", str(a.N),
            "--causal", "on" if a.causal else "off", "--modes", a.mode, "--dtype", a.dtype,
            "--sdpa-layout", a.sdpa_layout, "--driver-iters", str(a.iters)]


def ncu_command(a, report: str, metrics: Tuple[str, ...]) -> List[str]:
    cmd = [a.ncu, "--clock-control", "none", "--profile-from-start", "off", "-k", a.kernel,
           "--launch-skip", str(a.launch_skip), "--launch-count", str(a.launch_count),
           "--target-processes", "all", "-f", "-o", report]
    for s in SECTIONS:
        cmd += ["--section", s]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    cmd += shlex.split(a.extra)
    return cmd + driver_command(a)


def read_csv_text(text: str) -> List[Dict[str, str]]:
    """ncu's CSV export, with any '==PROF==' lines before the header dropped."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


def parse_details(rows: List[Dict[str, str]]) -> Dict[str, Dict[Tuple[str, str], Tuple[str, str]]]:
    """kernel (ID: name) -> {(section, metric name): (value, unit)}."""
    kernels: Dict[str, Dict[Tuple[str, str], Tuple[str, str]]] = {}
    for r in rows:
        kernel = f"{r.get('ID', '?')}: {r.get('Kernel Name', '?')}"
        key = (r.get("Section Name", ""), r.get("Metric Name", ""))
        kernels.setdefault(kernel, {})[key] = (r.get("Metric Value", ""), r.get("Metric Unit", ""))
    return kernels


def parse_raw(rows: List[Dict[str, str]]) -> List[Dict[str, str]]:
    """The raw page: header of metric names, a row of units, then one row per kernel."""
    if rows and rows[0].get("ID", "") in ("", None):
        units = rows[0]
        data = rows[1:]
    else:
        units, data = {}, rows
    out = []
    for r in data:
        d = dict(r)
        d["__units__"] = units
        out.append(d)
    return out


def _num(text: str) -> Optional[float]:
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def summarize(details: Dict[Tuple[str, str], Tuple[str, str]], raw: Optional[Dict[str, str]],
              top_stalls: int = 6) -> List[Tuple[str, str]]:
    """(label, 'value unit') pairs for one kernel."""
    lines: List[Tuple[str, str]] = []
    for label, section, metric in DETAIL_ROWS:
        hit = details.get((section, metric)) if section else None
        if hit is None and sum(m == metric for _, _, m in DETAIL_ROWS) == 1:
            # section titles differ between ncu versions; a unique metric name is enough
            hit = next((v for (s, m), v in details.items() if m == metric), None)
        if hit is not None:
            lines.append((label, f"{hit[0]} {hit[1]}".strip()))
    if raw:
        units = raw.get("__units__", {})
        tensor = sorted(k for k in raw if TENSOR_RE.match(k))
        for k in tensor:
            lines.append((f"tensor pipe ({k.split('__', 1)[1].split('.')[0]})",
                          f"{raw[k]} {units.get(k, '%')}".strip()))
        for label, k in RAW_ROWS:
            if k in raw and raw[k] != "":
                lines.append((label, f"{raw[k]} {units.get(k, '')}".strip()))
        stalls = []
        for k, v in raw.items():
            m = STALL_RE.match(k)
            x = _num(v) if m else None
            if m and x is not None and m.group(1) not in ("not_issued",):
                stalls.append((x, m.group(1)))
        stalls.sort(reverse=True)
        if stalls:
            lines.append(("top stalls (cycles / issued instr)",
                          ", ".join(f"{name} {x:.2f}" for x, name in stalls[:top_stalls])))
    return lines


def render(kernels, raws) -> str:
    out = []
    for i, (kernel, details) in enumerate(kernels.items()):
        raw = raws[i] if i < len(raws) else None
        out.append(f"== {kernel}")
        lines = summarize(details, raw)
        width = max((len(l) for l, _ in lines), default=0)
        out += [f"  {label.ljust(width)}  {value}" for label, value in lines]
    return "\n".join(out) if out else "no kernel matched (check --kernel; ncu -k takes regex:...)"


def parse_dir(folder: str) -> str:
    with open(os.path.join(folder, "details.csv")) as f:
        kernels = parse_details(read_csv_text(f.read()))
    raws = []
    raw_path = os.path.join(folder, "raw.csv")
    if os.path.exists(raw_path):
        with open(raw_path) as f:
            raws = parse_raw(read_csv_text(f.read()))
    return render(kernels, raws)


def export(a, report: str, page: str) -> str:
    res = subprocess.run([a.ncu, "--import", report, "--csv", "--page", page],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"ncu --import --page {page} failed: {res.stderr.strip()[-2000:]}")
    return res.stdout


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.parse_only:
        print(parse_dir(a.parse_only))
        return 0
    if shutil.which(a.ncu) is None:
        print(f"profile: {a.ncu} not found (Nsight Compute; set --ncu or NCU)", file=sys.stderr)
        return 2
    out = a.out or os.path.join(ROOT, "build", "profiles", case_name(a))  # build/ is ignored
    os.makedirs(out, exist_ok=True)
    report = os.path.join(out, "report")
    log_path = os.path.join(out, "ncu.log")
    tiers = (HOPPER_METRICS + EXTRA_METRICS, EXTRA_METRICS, ())
    for tier, metrics in enumerate(tiers):
        cmd = ncu_command(a, report, metrics)
        print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        with open(log_path, "w") as f:
            f.write(res.stdout + "\n" + res.stderr)
        if res.returncode == 0 and os.path.exists(report + ".ncu-rep"):
            break
        text = (res.stdout + res.stderr).lower()
        if metrics and "metric" in text:
            print(f"profile: ncu rejected a metric, retrying with {len(tiers[tier + 1])} extra "
                  "metrics", file=sys.stderr)
            continue
        print(f"profile: ncu failed (rc {res.returncode}); see {log_path}:\n"
              f"{(res.stdout + res.stderr)[-3000:]}", file=sys.stderr)
        return 1
    for page in ("details", "raw"):
        with open(os.path.join(out, f"{page}.csv"), "w") as f:
            f.write(export(a, report + ".ncu-rep", page))
    table = parse_dir(out)
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(table + "\n")
    print(table)
    print(f"\nreport: {report}.ncu-rep (open with ncu-ui), CSVs and summary.txt in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
