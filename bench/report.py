"""Results of a run: the CSV, the printed table, summary.md, status.csv and meta.json.

Pure Python (torch is imported only inside `collect_meta`, and only if it is installed).
The decode mode (bench/decode_compare.py) writes the same files from `DecodeResult`s: three more
CSV columns (`layout`, `pct_copy`, `timing`), a `layout` column in status.csv and its own table.
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

from grid import (CONTIGUOUS, EXPANDED, LAYOUTS, Case, decode_bytes, decode_series, gbps,
                  mode_bytes, mode_flops, size_label, tflops)
from timing import GRAPH_CALLS

CSV_COLUMNS = ("impl", "device", "dtype", "D", "causal", "B", "H", "Hkv", "Nq", "Nk", "mode",
               "ms", "tflops", "gbps")
DECODE_CSV_COLUMNS = CSV_COLUMNS + ("layout", "pct_copy", "timing")
STATUS_COLUMNS = ("impl", "dtype", "D", "causal", "B", "H", "Hkv", "Nq", "Nk", "mode", "status",
                  "max_err", "note")
DECODE_STATUS_COLUMNS = STATUS_COLUMNS[:10] + ("layout",) + STATUS_COLUMNS[10:]
# Column order of the table; flashcpp comes after its peers, then the ratios.
IMPL_ORDER = ("cudnn", "cudnn_fp8", "fa2", "mem_eff", "flex", "flashcpp")
# flashcpp/flashcpp_det (when --impls has both) is the deterministic backward's time over the
# default one's.
RATIO_BASES = ("cudnn", "cudnn_fp8", "fa2", "flashcpp_det")
# A decode cell is host-bound when the host spends at least this fraction of the median GPU
# time per call: the GPU then waits for launches, and the time says little about the kernel.
HOST_BOUND_FRACTION = 0.8
# How a decode row was timed: replays of a CUDA graph of its calls, or each call on its own.
GRAPH, PER_CALL = "graph", "per-call"

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

    @property
    def cell(self) -> str:
        """What the cell is, for the lines of cells not measured."""
        return f"{self.impl} {self.case.label} {self.mode}"

    def csv_row(self, device: str) -> Dict[str, str]:
        c = self.case
        return {"impl": self.impl, "device": device, "dtype": c.dtype, "D": str(c.D),
                "causal": str(int(c.causal)), "B": str(c.B), "H": str(c.H), "Hkv": str(c.Hkv),
                "Nq": str(c.Nq), "Nk": str(c.Nk), "mode": self.mode, "ms": f"{self.ms:.6f}",
                "tflops": f"{self.tflops:.2f}", "gbps": f"{self.gbps:.1f}"}

    def status_row(self) -> Dict[str, object]:
        c = self.case
        return {"impl": self.impl, "dtype": c.dtype, "D": c.D, "causal": int(c.causal), "B": c.B,
                "H": c.H, "Hkv": c.Hkv, "Nq": c.Nq, "Nk": c.Nk, "mode": self.mode,
                "status": self.status,
                "max_err": "" if self.max_err is None else f"{self.max_err:.3e}",
                "note": " ".join(self.reason.split())}


@dataclasses.dataclass
class DecodeResult(Result):
    """A decode cell: also the cache layout the implementation read (`contiguous`, `paged16`,
    ..., or `expanded`: K/V repeated to Hq heads for a peer whose backend refused GQA; its
    GB/s count the Hq heads it really read), the run's copy bandwidth, how it was timed
    (GRAPH or PER_CALL) and, timed per call, whether the host was too slow to keep the GPU busy
    (its per-call time is then mostly launch overhead; not measured for a graph)."""

    layout: str = CONTIGUOUS
    copy_gbps: float = math.nan
    timing: str = GRAPH
    host_bound: bool = False

    @property
    def gbps(self) -> float:
        heads = self.case.H if self.layout == EXPANDED else 0
        return gbps(decode_bytes(self.case, heads), self.ms) if self.ms else math.nan

    @property
    def pct_copy(self) -> float:
        return 100.0 * self.gbps / self.copy_gbps if self.copy_gbps > 0 else math.nan

    @property
    def series(self) -> str:
        return decode_series(self.impl, self.layout)

    @property
    def cell(self) -> str:
        return f"{self.impl} {self.layout} {self.case.label}"

    def csv_row(self, device: str) -> Dict[str, str]:
        row = super().csv_row(device)
        row.update(layout=self.layout, pct_copy=f"{self.pct_copy:.1f}", timing=self.timing)
        return row

    def status_row(self) -> Dict[str, object]:
        row = super().status_row()
        row["layout"] = self.layout
        return row


def _fmt(x: float, digits: int = 4) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def csv_rows(results: Iterable[Result], device: str) -> List[Dict[str, str]]:
    """Only measured cells; n/a and wrong cells go to status.csv with their reason."""
    return [r.csv_row(device) for r in results if r.status == OK]


def write_csv(path: str, results: Iterable[Result], device: str,
              columns: Sequence[str] = CSV_COLUMNS) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(csv_rows(results, device))


def read_csv(path: str) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_status_csv(path: str, results: Iterable[Result],
                     columns: Sequence[str] = STATUS_COLUMNS) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(r.status_row() for r in results)


def cell_text(r: Optional[Result]) -> str:
    if r is None:
        return "-"
    if r.status == OK:
        return f"{r.tflops:.1f}"
    return "WRONG" if r.status == WRONG else "n/a"


def table_rows(results: Sequence[Result], impls: Sequence[str]) -> Tuple[List[str], List[List[str]]]:
    """Header and rows of the final table: one row per (case, mode), in the order first run."""
    impls = [i for i in IMPL_ORDER if i in impls] + [i for i in impls if i not in IMPL_ORDER]
    # flashcpp and its environment variants (sdpa_compare --flashcpp-env: "flashcpp[value]")
    # each get a ratio to every base.
    mine = [i for i in impls if i == "flashcpp" or (i.startswith("flashcpp[") and i.endswith("]"))]
    bases = [b for b in RATIO_BASES if b in impls and mine]
    pairs = [(m, b) for m in mine for b in bases]
    header = ["case", "mode"] + [f"{i}" for i in impls] + [f"{m}/{b}" for m, b in pairs]
    by_key: Dict[Tuple[Case, str], Dict[str, Result]] = {}
    for r in results:
        by_key.setdefault((r.case, r.mode), {})[r.impl] = r
    rows = []
    for (case, mode), cells in by_key.items():
        row = [case.label, mode] + [cell_text(cells.get(i)) for i in impls]
        row += [speedup(cells.get(m), cells.get(b)) for m, b in pairs]
        rows.append(row)
    return header, rows


def speedup(mine: Optional[Result], other: Optional[Result]) -> str:
    """other's median time over mine ('1.10x': mine is 10% faster), '-' unless both ran."""
    if mine and other and mine.status == OK and other.status == OK:
        return f"{other.ms / mine.ms:.2f}x"
    return "-"


def decode_case_label(case: Case) -> str:
    """'B64 L16k' (and ' Nnew4' when more than one token is new)."""
    return f"B{case.B} L{size_label(case.Nk)}" + (f" Nnew{case.Nq}" if case.Nq != 1 else "")


def decode_cell_text(r: Optional[DecodeResult], timing: str = GRAPH) -> str:
    """'2810 84%' (GB/s, % of the copy bandwidth), with E when it read expanded K/V, p when it
    was timed per call in a run that timed graphs (`timing`), h when it was host-bound."""
    if r is None or r.status != OK:
        return cell_text(r)
    per_call = r.timing == PER_CALL and timing == GRAPH
    marks = ("E" if r.layout == EXPANDED else "") + ("p" if per_call else "") + (
        "h" if r.host_bound else "")
    return f"{r.gbps:.0f} {r.pct_copy:.0f}%" + (f" {marks}" if marks else "")


def decode_series_order(present: Iterable[str]) -> List[str]:
    """The peers, flashcpp, then flashcpp's paged rows (table columns and plot bars)."""
    present = set(present)
    order = [i for i in IMPL_ORDER if i in present] + [p for p in LAYOUTS if p in present]
    return order + sorted(present - set(order))


def decode_table_rows(results: Sequence[DecodeResult], timing: str = GRAPH
                      ) -> Tuple[List[str], List[List[str]]]:
    """One row per case: each series' GB/s and % of copy, flashcpp over each peer, each paged
    layout over flashcpp's contiguous cache (all ratios of median times, as in table_rows);
    `timing` is the run's (decode_cell_text)."""
    series = decode_series_order(r.series for r in results)
    mine = "flashcpp" if "flashcpp" in series else None
    bases = [b for b in RATIO_BASES if b in series and mine]
    paged = [p for p in series if p.startswith("paged") and mine]
    header = (["case"] + series + [f"flashcpp/{b}" for b in bases]
              + [f"{p}/contig" for p in paged])
    by_case: Dict[Case, Dict[str, DecodeResult]] = {}
    for r in results:
        by_case.setdefault(r.case, {})[r.series] = r
    rows = []
    for case, cells in by_case.items():
        row = [decode_case_label(case)]
        row += [decode_cell_text(cells.get(s), timing) for s in series]
        row += [speedup(cells.get(mine), cells.get(b)) for b in bases]
        row += [speedup(cells.get(p), cells.get(mine)) for p in paged]
        rows.append(row)
    return header, rows


def decode_legend(results: Sequence[DecodeResult], copy_gbps: float,
                  timing: str = GRAPH) -> List[str]:
    """The lines above the decode table: the problem, the units, how it was timed (the run's
    `timing`), the marks."""
    c = results[0].case if results else None
    problem = f"{c.dtype} Hq {c.H}, Hkv {c.Hkv}, D {c.D}, " if c else ""
    host_bound = f"the host's time per call >= {HOST_BOUND_FRACTION:.0%} of the median"
    if timing == GRAPH:
        how = (f"timed as CUDA graphs of >= {GRAPH_CALLS} calls, time per call = replay time / "
               "calls (the host's time is not in it, and not measured)")
        marks = ("p: timed per call, its CUDA graph capture failed (status.csv says why), "
                 f"and h if host-bound there ({host_bound})")
    else:
        how = "timed per call (CUDA events around each Python call)"
        marks = f"h: host-bound ({host_bound})"
    return [f"decode, {problem}every sequence full; GB/s = (K + V + Q + O bytes) / median time "
            f"and % of the device-to-device copy ({copy_gbps:.0f} GB/s, read + write); {how}",
            "A/B = B's median time over A's (above 1.00x: A is faster); "
            "E: read K/V expanded to Hq heads (GQA refused; its bytes counted); " + marks]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool = False,
                 left: int = 2) -> str:
    """Aligned plain-text table (the first `left` columns left, the rest right), or a markdown
    table."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join("---" if i < left else "---:" for i in range(len(header))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        out = []
        for i, (x, w) in enumerate(zip(cells, widths)):
            out.append(str(x).ljust(w) if i < left else str(x).rjust(w))
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
        line = f"{r.cell}: {r.status}{err}: {reason}"
        if line not in seen:
            seen.add(line)
            out.append(line)
    return out


def peer_ran_lines(results: Iterable[Result], per_impl: int = 4) -> List[str]:
    """What each peer (not flashcpp) says it ran in its measured cells, where it says so (the
    `ran ...` of the cell's note: cudnn_fp8's output type and cuDNN plan), deduplicated."""
    seen: Dict[str, List[str]] = {}
    for r in results:
        if r.status != OK or r.impl.startswith("flashcpp") or "; ran " not in r.reason:
            continue
        ran = seen.setdefault(r.impl, [])
        text = r.reason.split("; ran ", 1)[1]
        if text not in ran:
            ran.append(text)
    out = []
    for impl, ran in seen.items():
        out += [f"{impl}: {text}" for text in ran[:per_impl]]
        if len(ran) > per_impl:
            out.append(f"{impl}: ... {len(ran) - per_impl} more in status.csv")
    return out


def summary_markdown(results: Sequence[Result], impls: Sequence[str], meta: Dict[str, object],
                     command: str, plots: Sequence[str]) -> str:
    header, rows = table_rows(results, impls)
    intro = ("TFLOP/s (higher is better); `flashcpp/X` is X's median time over flashcpp's "
             "(above 1.00x: flashcpp is faster). FLOPs and timing rules: `docs/benchmarking.md`.")
    ran = peer_ran_lines(results)
    if ran:
        intro += "\n\nWhat the peers ran (their output type counts: see the notes):\n\n" + "\n".join(
            f"- {line}" for line in ran)
    return _summary("Side-by-side attention benchmark", intro,
                    format_table(header, rows, markdown=True), results, meta, command, plots)


def decode_summary_markdown(results: Sequence[DecodeResult], meta: Dict[str, object],
                            command: str, plots: Sequence[str]) -> str:
    timing = str(meta.get("timing", GRAPH))
    header, rows = decode_table_rows(results, timing)
    legend = decode_legend(results, float(meta.get("copy_gbps", math.nan)), timing)
    intro = "\n\n".join(legend + ["Bytes and timing rules: `docs/benchmarking.md` (decode)."])
    return _summary("Decode benchmark", intro, format_table(header, rows, markdown=True, left=1),
                    results, meta, command, plots)


def _summary(title: str, intro: str, table: str, results: Sequence[Result],
             meta: Dict[str, object], command: str, plots: Sequence[str]) -> str:
    lines = [f"# {title}, {meta.get('date', '')} on {meta.get('device', '')}", "", intro, "",
             "| | |", "|---|---|"]
    for key in ("device", "driver", "torch", "cuda", "cudnn", "cudnn_frontend", "triton",
                "flashcpp", "sdpa_layout", "copy_gbps", "timing", "graph_calls", "reps", "date"):
        if key in meta:
            lines.append(f"| {key} | {meta[key]} |")
    lines += ["", f"Command: `{command}`", "", table, ""]
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
