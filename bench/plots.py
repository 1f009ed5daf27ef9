"""One PNG per (dtype, head dim, mode), a panel each for non-causal and causal: grouped bars per
sequence length, one bar per implementation, TFLOP/s on the bars (FlashAttention-paper style).
Decode runs (bench/decode_compare.py): one PNG per (dtype, head dim, new tokens), a panel per
batch size, grouped bars of GB/s per cache length, one bar per implementation and layout, and a
line at the copy bandwidth.

Works from CSV rows (dicts with the columns of report.CSV_COLUMNS, or DECODE_CSV_COLUMNS), so a
committed results.csv can be re-plotted: `python3 bench/plots.py OUT/results.csv`.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Sequence

from grid import EXPANDED, decode_series, size_label
from report import decode_series_order

IMPL_ORDER = ("cudnn", "cudnn_fp8", "fa2", "mem_eff", "flex", "flashcpp")
COLORS = {"cudnn": "#76b900", "cudnn_fp8": "#3d6b00", "fa2": "#1f77b4", "mem_eff": "#9467bd", "flex": "#ff7f0e",
          "flashcpp": "#d62728", "paged16": "#e8605e", "paged64": "#f29a98",
          "paged256": "#f9cdcc"}


def group_rows(rows: Sequence[Dict[str, str]]) -> Dict[tuple, List[Dict[str, str]]]:
    """(dtype, D, mode) -> rows (both causal settings)."""
    groups: Dict[tuple, List[Dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["dtype"], int(r["D"]), r["mode"]), []).append(r)
    return groups


def plot_file_name(dtype: str, d: int, mode: str) -> str:
    return f"{dtype}_d{d}_{mode.replace('+', '_')}.png"


def _panel(ax, group: Sequence[Dict[str, str]], title: str) -> None:
    ns = sorted({int(r["Nq"]) for r in group})
    present = {r["impl"] for r in group}
    impls = [i for i in IMPL_ORDER if i in present] + sorted(present - set(IMPL_ORDER))
    value = {(r["impl"], int(r["Nq"])): float(r["tflops"]) for r in group}
    width = 0.8 / max(1, len(impls))
    top = max(value.values()) if value else 1.0
    for j, impl in enumerate(impls):
        xs, ys = [], []
        for i, n in enumerate(ns):
            if (impl, n) in value:
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(value[(impl, n)])
        ax.bar(xs, ys, width, label=impl, color=COLORS.get(impl))
        for x, y in zip(xs, ys):
            ax.text(x, y + top * 0.01, f"{y:.0f}", ha="center", va="bottom",
                    fontsize=6 if len(impls) > 3 else 8, rotation=90 if len(impls) > 3 else 0)
    ax.set_xticks(range(len(ns)))
    ax.set_xticklabels([size_label(n) for n in ns])
    ax.set_xlabel("sequence length N (batch = tokens / N)")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(0, top * 1.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=min(5, len(impls)), loc="upper left")
    ax.grid(axis="y", alpha=0.3)


def _pyplot():
    """matplotlib's pyplot with the Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib  # noqa: PLC0415
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("plots: matplotlib is not installed, no PNG written", file=sys.stderr)
        return None
    return plt


def write_plots(rows: Sequence[Dict[str, str]], out_dir: str, device: str = "") -> List[str]:
    """One PNG per (dtype, head dim, mode), a panel per causal setting; returns the paths
    ([] when matplotlib is missing)."""
    plt = _pyplot()
    if plt is None:
        return []
    paths = []
    for (dtype, d, mode), group in sorted(group_rows(rows).items()):
        causals = sorted({int(r["causal"]) for r in group})
        n_count = len({int(r["Nq"]) for r in group})
        fig, axes = plt.subplots(1, len(causals), squeeze=False,
                                 figsize=(len(causals) * max(5.5, 1.2 * n_count + 2), 4.4))
        for ax, c in zip(axes[0], causals):
            _panel(ax, [r for r in group if int(r["causal"]) == c],
                   f"{'causal' if c else 'non-causal'}")
        head = f"Attention {mode}, head dim {d}, {dtype}" + (f" ({device})" if device else "")
        fig.suptitle(head, fontsize=11)
        fig.tight_layout()
        path = os.path.join(out_dir, plot_file_name(dtype, d, mode))
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def decode_plot_file_name(dtype: str, d: int, nnew: int) -> str:
    return f"decode_{dtype}_d{d}_nnew{nnew}.png"


def copy_gbps_of(rows: Sequence[Dict[str, str]]) -> float:
    """The run's copy bandwidth, from any measured row (gbps / pct_copy)."""
    for r in rows:
        if float(r["pct_copy"] or 0) > 0:
            return float(r["gbps"]) * 100.0 / float(r["pct_copy"])
    return 0.0


def _decode_panel(ax, value: Dict[tuple, float], series: Sequence[str], labels: Dict[str, str],
                  batch: int, lengths: Sequence[int], copy: float, top: float) -> None:
    width = 0.8 / max(1, len(series))
    for j, name in enumerate(series):
        xs, ys = [], []
        for i, n in enumerate(lengths):
            if (name, batch, n) in value:
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(value[(name, batch, n)])
        ax.bar(xs, ys, width, label=labels[name], color=COLORS.get(name))
        for x, y in zip(xs, ys):
            ax.text(x, y + top * 0.01, f"{y:.0f}", ha="center", va="bottom", fontsize=6,
                    rotation=90 if len(series) > 3 else 0)
    if copy > 0:
        ax.axhline(copy, color="black", linestyle="--", linewidth=1, label=f"copy {copy:.0f} GB/s")
    ax.set_xticks(range(len(lengths)))
    ax.set_xticklabels([f"L {size_label(n)}" for n in lengths])
    ax.set_ylabel("GB/s")
    ax.set_ylim(0, top * 1.3)
    ax.set_title(f"batch {batch}", fontsize=10)
    ax.legend(fontsize=7, ncol=min(6, len(series) + 1), loc="upper left")
    ax.grid(axis="y", alpha=0.3)


def write_decode_plots(rows: Sequence[Dict[str, str]], out_dir: str,
                       device: str = "") -> List[str]:
    """One PNG per (dtype, head dim, new tokens) of a decode run, a panel per batch size:
    grouped bars per cache length, one bar per implementation and layout, the copy bandwidth
    as a dashed line; returns the paths ([] when matplotlib is missing)."""
    plt = _pyplot()
    if plt is None:
        return []
    groups: Dict[tuple, List[Dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["dtype"], int(r["D"]), int(r["Nq"])), []).append(r)
    paths = []
    for (dtype, d, nnew), group in sorted(groups.items()):
        value = {(decode_series(r["impl"], r["layout"]), int(r["B"]), int(r["Nk"])):
                 float(r["gbps"]) for r in group}
        series = decode_series_order(s for s, _, _ in value)
        labels = {s: s for s in series}
        for r in group:
            if r["layout"] == EXPANDED:
                labels[r["impl"]] = f"{r['impl']} (K/V expanded)"
        batches = sorted({b for _, b, _ in value})
        lengths = sorted({n for _, _, n in value})
        copy = copy_gbps_of(group)
        top = max(list(value.values()) + [copy])
        fig, axes = plt.subplots(len(batches), 1, squeeze=False,
                                 figsize=(max(6.0, 1.3 * len(lengths) + 2), 3.0 * len(batches)))
        for ax, b in zip(axes[:, 0], batches):
            _decode_panel(ax, value, series, labels, b, lengths, copy, top)
        axes[-1, 0].set_xlabel("cache length L (every sequence full); "
                               "GB/s = (K + V + Q + O bytes) / median time")
        head = (f"Decode, {dtype}, head dim {d}, {nnew} new token{'s' if nnew > 1 else ''}"
                + (f" ({device})" if device else ""))
        fig.suptitle(head, fontsize=11)
        fig.tight_layout()
        path = os.path.join(out_dir, decode_plot_file_name(dtype, d, nnew))
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Re-plot a results.csv written by sdpa_compare.py "
                                            "or decode_compare.py")
    p.add_argument("csv")
    p.add_argument("--out", help="folder for the PNGs (default: the CSV's folder)")
    a = p.parse_args(argv)
    import csv  # noqa: PLC0415
    with open(a.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    device = rows[0]["device"] if rows else ""
    write = write_decode_plots if rows and "layout" in rows[0] else write_plots
    for path in write(rows, a.out or os.path.dirname(os.path.abspath(a.csv)), device):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
