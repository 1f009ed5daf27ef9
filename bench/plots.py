"""One PNG per (dtype, head dim, mode), a panel each for non-causal and causal: grouped bars per
sequence length, one bar per implementation, TFLOP/s on the bars (FlashAttention-paper style).

Works from CSV rows (dicts with the columns of report.CSV_COLUMNS), so a committed results.csv
can be re-plotted: `python3 bench/plots.py OUT/results.csv`.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Sequence

IMPL_ORDER = ("cudnn", "fa2", "mem_eff", "flex", "flashcpp")
COLORS = {"cudnn": "#76b900", "fa2": "#1f77b4", "mem_eff": "#9467bd", "flex": "#ff7f0e",
          "flashcpp": "#d62728"}


def _n_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


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
    ax.set_xticklabels([_n_label(n) for n in ns])
    ax.set_xlabel("sequence length N (batch = tokens / N)")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(0, top * 1.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=min(5, len(impls)), loc="upper left")
    ax.grid(axis="y", alpha=0.3)


def write_plots(rows: Sequence[Dict[str, str]], out_dir: str, device: str = "") -> List[str]:
    """One PNG per (dtype, head dim, mode), a panel per causal setting; returns the paths
    ([] when matplotlib is missing)."""
    try:
        import matplotlib  # noqa: PLC0415
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("plots: matplotlib is not installed, no PNG written", file=sys.stderr)
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Re-plot a results.csv written by sdpa_compare.py")
    p.add_argument("csv")
    p.add_argument("--out", help="folder for the PNGs (default: the CSV's folder)")
    a = p.parse_args(argv)
    import csv  # noqa: PLC0415
    with open(a.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    device = rows[0]["device"] if rows else ""
    for path in write_plots(rows, a.out or os.path.dirname(os.path.abspath(a.csv)), device):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
