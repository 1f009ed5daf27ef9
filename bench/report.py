"""Results of a run: the CSV, the printed table, summary.md, status.csv and meta.json.

Pure Python (torch is imported only inside `collect_meta`, and only if it is installed).
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import math
import os
import platform
import re
import subprocess
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from grid import Case, gbps, mode_bytes, mode_flops, tflops

CSV_COLUMNS = ("impl", "device", "dtype", "D", "causal", "B", "H", "Hkv", "Nq", "Nk", "mode",
               "ms", "tflops", "gbps")
STATUS_COLUMNS = ("impl", "dtype", "D", "causal", "B", "H", "Hkv", "Nq", "Nk", "mode", "status",
                  "max_err", "note")
# Column order of the table; flashcpp comes after its peers, then the ratios.
IMPL_ORDER = ("cudnn", "fa2", "mem_eff", "flex", "flashcpp")
RATIO_BASES = ("cudnn", "fa2")

OK, NA, WRONG = "ok", "n/a", "wrong"


@dataclasses.dataclass
class Result:
    """One cell: an implementation on a case in a mode. `ms` is set only when status is ok."""

    impl: str
    case: Case
    mode: str
    status: str
    ms: Optional[float] = None
    reason: str = ""
    max_err: Optional[float] = None

    @property
    def tflops(self) -> float:
        return tflops(mode_flops(self.case, self.mode), self.ms) if self.ms else math.nan

    @property
    def gbps(self) -> float:
        return gbps(mode_bytes(self.case, self.mode), self.ms) if self.ms else math.nan


def _fmt(x: float, digits: int = 4) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def csv_rows(results: Iterable[Result], device: str) -> List[Dict[str, str]]:
    """Only measured cells; n/a and wrong cells go to status.csv with their reason."""
    rows = []
    for r in results:
        if r.status != OK:
            continue
        c = r.case
        rows.append({
            "impl": r.impl, "device": device, "dtype": c.dtype, "D": str(c.D),
            "causal": str(int(c.causal)), "B": str(c.B), "H": str(c.H), "Hkv": str(c.Hkv),
            "Nq": str(c.Nq), "Nk": str(c.Nk), "mode": r.mode, "ms": f"{r.ms:.6f}",
            "tflops": f"{r.tflops:.2f}", "gbps": f"{r.gbps:.1f}",
        })
    return rows


def write_csv(path: str, results: Iterable[Result], device: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(csv_rows(results, device))


def read_csv(path: str) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_status_csv(path: str, results: Iterable[Result]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(STATUS_COLUMNS)
        for r in results:
            c = r.case
            w.writerow([r.impl, c.dtype, c.D, int(c.causal), c.B, c.H, c.Hkv, c.Nq, c.Nk, r.mode,
                        r.status, "" if r.max_err is None else f"{r.max_err:.3e}",
                        " ".join(r.reason.split())])


def cell_text(r: Optional[Result]) -> str:
    if r is None:
        return "-"
    if r.status == OK:
        return f"{r.tflops:.1f}"
    return "WRONG" if r.status == WRONG else "n/a"


def table_rows(results: Sequence[Result], impls: Sequence[str]) -> Tuple[List[str], List[List[str]]]:
    """Header and rows of the final table: one row per (case, mode), in the order first run."""
    impls = [i for i in IMPL_ORDER if i in impls] + [i for i in impls if i not in IMPL_ORDER]
    bases = [b for b in RATIO_BASES if b in impls and "flashcpp" in impls]
    header = ["case", "mode"] + [f"{i}" for i in impls] + [f"flashcpp/{b}" for b in bases]
    by_key: Dict[Tuple[Case, str], Dict[str, Result]] = {}
    for r in results:
        by_key.setdefault((r.case, r.mode), {})[r.impl] = r
    rows = []
    for (case, mode), cells in by_key.items():
        row = [case.label, mode] + [cell_text(cells.get(i)) for i in impls]
        mine = cells.get("flashcpp")
        for b in bases:
            other = cells.get(b)
            if mine and other and mine.status == OK and other.status == OK:
                row.append(f"{other.ms / mine.ms:.2f}x")
            else:
                row.append("-")
        rows.append(row)
    return header, rows


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool = False) -> str:
    """Aligned plain-text table (first column left, the rest right), or a markdown table."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        out = []
        for i, (x, w) in enumerate(zip(cells, widths)):
            out.append(str(x).ljust(w) if i < 2 else str(x).rjust(w))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep] + [line(r) for r in rows])


def failure_lines(results: Iterable[Result]) -> List[str]:
    """One line per cell that was not measured, with its reason (deduplicated)."""
    seen = set()
    out = []
    for r in results:
        if r.status == OK:
            continue
        reason = " ".join(r.reason.split())[:300]
        err = f" (max err {r.max_err:.3g})" if r.max_err is not None else ""
        line = f"{r.impl} {r.case.label} {r.mode}: {r.status}{err}: {reason}"
        if line not in seen:
            seen.add(line)
            out.append(line)
    return out


def summary_markdown(results: Sequence[Result], impls: Sequence[str], meta: Dict[str, object],
                     command: str, plots: Sequence[str]) -> str:
    header, rows = table_rows(results, impls)
    lines = [f"# Side-by-side attention benchmark, {meta.get('date', '')} on {meta.get('device', '')}",
             "",
             "TFLOP/s (higher is better); `flashcpp/X` is X's median time over flashcpp's "
             "(above 1.00x: flashcpp is faster). FLOPs and timing rules: `docs/benchmarking.md`.",
             "",
             "| | |", "|---|---|"]
    for key in ("device", "driver", "torch", "cuda", "cudnn", "triton", "flashcpp", "sdpa_layout",
                "reps", "date"):
        if key in meta:
            lines.append(f"| {key} | {meta[key]} |")
    lines += ["", f"Command: `{command}`", "", format_table(header, rows, markdown=True), ""]
    failures = failure_lines(results)
    if failures:
        lines += ["## Cells not measured", ""] + [f"- {f}" for f in failures] + [""]
    if plots:
        lines += ["## Plots", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots] + [""]
    lines += ["Files: `results.csv` (measured cells), `status.csv` (every cell with its check "
              "result), `meta.json`, `table.txt`.", ""]
    return "\n".join(lines)


def device_slug(device: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3' (for bench/results/<date>-<device>/)."""
    s = device.lower().replace("nvidia", "")
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "unknown-device"


def default_out_dir(repo_root: str, device: str, date: Optional[str] = None) -> str:
    date = date or datetime.date.today().isoformat()
    return os.path.join(repo_root, "bench", "results", f"{date}-{device_slug(device)}")


def _run(cmd: List[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def collect_meta() -> Dict[str, object]:
    """Device, driver, torch / CUDA / cuDNN / Triton versions, date, host (the protocol's list)."""
    meta: Dict[str, object] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "host": platform.node(), "python": platform.python_version(),
    }
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                "--format=csv,noheader"])
    if smi:
        parts = [p.strip() for p in smi.splitlines()[0].split(",")]
        meta["device"] = parts[0]
        if len(parts) > 1:
            meta["driver"] = parts[1]
        if len(parts) > 2:
            meta["memory"] = parts[2]
        if len(parts) > 3:
            meta["max_sm_clock"] = parts[3]
        meta["nvidia_smi"] = smi
    try:
        import torch  # noqa: PLC0415 (lazy: --help and the tests run without torch)
        meta["torch"] = torch.__version__
        meta["cuda"] = torch.version.cuda
        meta["cudnn"] = torch.backends.cudnn.version()
        if torch.cuda.is_available():
            meta.setdefault("device", torch.cuda.get_device_name())
            p = torch.cuda.get_device_properties(torch.cuda.current_device())
            meta["sm_count"] = p.multi_processor_count
            meta["capability"] = f"{p.major}.{p.minor}"
            meta["l2_bytes"] = getattr(p, "L2_cache_size", None)
    except ImportError:
        pass
    try:
        import triton  # noqa: PLC0415
        meta["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import flashcpp  # noqa: PLC0415
        meta["flashcpp"] = getattr(flashcpp, "__version__", "unknown")
    except Exception as e:  # noqa: BLE001 (any import failure is recorded, not fatal)
        meta["flashcpp"] = f"import failed: {type(e).__name__}: {e}"
    meta.setdefault("device", "unknown")
    return meta


def write_meta(path: str, meta: Dict[str, object]) -> None:
    with open(path, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
