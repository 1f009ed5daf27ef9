"""The GPU-free parts of the decode benchmark (bench/decode_compare.py): the grid and its flags,
byte counts, the memory plan, the shuffled page table, CSV rows, the table, plots. The parts
that need torch run on the CPU where torch is installed; the end-to-end cell needs a GPU."""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)

import decode_compare as DC  # noqa: E402
import grid as G  # noqa: E402
import peers as P  # noqa: E402
import plots as PL  # noqa: E402
import report as R  # noqa: E402
import timing as T  # noqa: E402

GIB = 2**30
H100_MEMORY = 79.1 * GIB  # torch's total_memory of an H100 80GB HBM3


def dcase(B=8, L=4096, nnew=1, hq=32, hkv=8, d=128, dtype="bf16"):
    return G.Case(dtype=dtype, D=d, causal=False, B=B, H=hq, Hkv=hkv, Nq=nnew, Nk=L)


# ---------------------------------------------------------------- grid and flags


def test_default_grid():
    a = DC.parse_args([])
    assert [(c.B, c.Nk) for c in a.cases] == [(b, n) for b in (1, 8, 64)
                                             for n in (1024, 4096, 16384, 65536)]
    for c in a.cases:
        assert (c.dtype, c.H, c.Hkv, c.D, c.Nq, c.causal) == ("bf16", 32, 8, 128, 1, False)
    assert a.layout_list == ["contiguous", "paged16", "paged64"]
    assert a.impl_list == ["flashcpp", "cudnn", "fa2"]
    assert a.reps == 100 and a.rounds == 2 and a.mem_fraction == 0.7
    assert a.graph and not DC.parse_args(["--no-graph"]).graph


def test_quick_is_two_cells():
    a = DC.parse_args(["--quick"])
    assert [(c.B, c.Nk) for c in a.cases] == [(8, 1024), (8, 16384)]
    assert DC.parse_args(["--quick", "--lengths", "4k"]).length_list == [4096]


def test_flags():
    a = DC.parse_args(["--batches", "2,16", "--lengths", "2k", "--nnew", "4,16",
                       "--layouts", "paged256,paged16", "--impls", "fa2,flashcpp", "--hq", "16",
                       "--hkv", "2", "--head-dim", "64", "--dtype", "fp16", "--out", "/tmp/x"])
    # contiguous always runs, first; the paged layouts in canonical order
    assert a.layout_list == ["contiguous", "paged16", "paged256"]
    assert a.impl_list == ["flashcpp", "fa2"] and a.out == "/tmp/x"
    assert [(c.Nq, c.B) for c in a.cases] == [(4, 2), (4, 16), (16, 2), (16, 16)]
    assert {(c.H, c.Hkv, c.D, c.Nk, c.dtype) for c in a.cases} == {(16, 2, 64, 2048, "fp16")}


@pytest.mark.parametrize("argv", [["--layouts", "paged32"], ["--impls", "mem_eff"],
                                  ["--hq", "30"], ["--mem-fraction", "0"], ["--reps", "0"]])
def test_bad_flags_exit(argv, capsys):
    with pytest.raises(SystemExit):
        DC.parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_help_runs_without_torch():
    res = subprocess.run([sys.executable, os.path.join(BENCH, "decode_compare.py"), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--layouts" in res.stdout and "--quick" in res.stdout
    assert "--no-graph" in res.stdout


def test_decode_modules_do_not_import_torch_at_top_level():
    code = ("import sys; sys.path.insert(0, %r); import decode_compare, peers, reference, grid, "
            "plots, report; print('torch' in sys.modules)" % BENCH)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_decode_grid_is_registered_and_checks_heads():
    assert G.GRIDS["decode"] is G.decode_grid
    with pytest.raises(ValueError, match="multiple"):
        G.decode_grid(["bf16"], [1], [1024], [1], hq=32, hkv=6)


# ---------------------------------------------------------------- bytes, layouts, memory


def test_decode_bytes():
    c = dcase(B=64, L=65536)
    assert G.kv_bytes(c) == 16 * GIB  # the brief's 64 x 64k x 8 x 128 x 2 bytes x 2
    q = 64 * 1 * 32 * 128 * 2
    assert G.decode_bytes(c) == 16 * GIB + 2 * q
    assert G.mode_bytes(c, "decode") == G.decode_bytes(c)
    # a peer that read K/V expanded to Hq heads read 4x the K/V bytes
    assert G.decode_bytes(c, kv_heads=32) == 64 * GIB + 2 * q
    assert G.mode_flops(c, "decode") == 4 * 64 * 32 * 1 * 65536 * 128


def test_fp8_cache_bytes_and_flags():
    # e4m3: one byte per cached element, bf16 queries and output
    c = dcase(B=64, L=65536, dtype=G.FP8_CACHE)
    q = 64 * 1 * 32 * 128 * 2
    assert G.kv_bytes(c) == 8 * GIB
    assert G.decode_bytes(c) == 8 * GIB + 2 * q
    assert G.cache_bytes(dcase(B=2, L=1000, dtype=G.FP8_CACHE), "paged16") == \
        2 * (2 * 65 * 16) * 8 * 128 + 2 * 64 * 4
    a = DC.parse_args(["--dtype", "e4m3"])
    assert a.impl_list == ["flashcpp"] and {x.dtype for x in a.cases} == {"e4m3"}


def test_layout_names():
    assert [G.page_size(x) for x in G.LAYOUTS] == [0, 16, 64, 256]
    assert G.decode_series("flashcpp", "contiguous") == "flashcpp"
    assert G.decode_series("flashcpp", "paged64") == "paged64"
    assert G.decode_series("cudnn", G.EXPANDED) == "cudnn"
    assert G.size_label(65536) == "64k" and G.size_label(1000) == "1000"


def test_cache_bytes():
    c = dcase(B=2, L=1000, hkv=8, d=128)
    assert G.cache_bytes(c, "contiguous") == G.kv_bytes(c)
    # 1000 rows in pages of 16: 63 pages, + 2 spare per sequence; the table has 64 columns
    row = 8 * 128 * 2
    assert G.pages_per_sequence(1000, 16) == 63
    assert G.cache_bytes(c, "paged16") == 2 * (2 * 65 * 16) * row + 2 * 64 * 4


def test_plan_layouts_on_an_80gb_h100():
    c = dcase(B=64, L=65536)
    budget = 0.7 * H100_MEMORY
    kept, dropped, used = G.plan_layouts(c, ["contiguous", "paged16", "paged64"], 1, budget)
    assert kept == ["contiguous", "paged16", "paged64"] and not dropped
    assert 48 * GIB < used < 51 * GIB
    kept, dropped, _ = G.plan_layouts(c, G.LAYOUTS, 1, budget)
    assert kept == ["contiguous", "paged16", "paged64"] and dropped == ["paged256"]
    # SDPA's contiguous BHSD copies (--sdpa-layout bhsd) take the room of one layout
    kept, dropped, _ = G.plan_layouts(c, ["contiguous", "paged16", "paged64"], 1, budget,
                                      extra=G.kv_bytes(c))
    assert dropped == ["paged64"]
    # nothing runs without the contiguous cache
    kept, dropped, _ = G.plan_layouts(c, ["contiguous", "paged16"], 1, 10 * GIB)
    assert kept == [] and dropped == ["contiguous", "paged16"]
    # the whole default grid fits on an H100
    for case in DC.parse_args([]).cases:
        n_sets = G.rotation_sets(G.decode_bytes(case), 50 * 2**20, DC.MAX_SETS)
        assert not G.plan_layouts(case, G.DEFAULT_LAYOUTS, n_sets, budget)[1], case.label


def test_rotation_of_small_caches():
    l2 = 50 * 2**20
    # B1 L1k: 4 MB of K/V, 38 sets to touch 3x the L2 between two uses of a set
    assert G.rotation_sets(G.decode_bytes(dcase(B=1, L=1024)), l2, DC.MAX_SETS) == 38
    assert G.rotation_sets(G.decode_bytes(dcase(B=8, L=1024)), l2, DC.MAX_SETS) == 5
    assert G.rotation_sets(G.decode_bytes(dcase(B=64, L=1024)), l2, DC.MAX_SETS) == 1


# ---------------------------------------------------------------- page table


def test_shuffled_page_table():
    rows, num_pages = P.shuffled_page_table(4, 10, seed="0/0/paged16")
    assert num_pages == 4 * 12
    assert len(rows) == 4 and all(len(r) == 11 for r in rows)
    named = [p for r in rows for p in r]
    assert len(set(named)) == len(named) and all(0 <= p < num_pages for p in named)
    assert num_pages - len(named) == 4  # one page per sequence named by nothing
    assert named != sorted(named)  # shuffled
    assert P.shuffled_page_table(4, 10, seed="0/0/paged16") == (rows, num_pages)
    assert P.shuffled_page_table(4, 10, seed="0/1/paged16")[0] != rows


def test_page_pool_round_trip_on_cpu():
    torch = pytest.importorskip("torch")
    B, L, page = 3, 50, 16  # a partial last page
    cache = torch.randn(B, L, 2, 8)
    rows, num_pages = P.shuffled_page_table(B, G.pages_per_sequence(L, page), seed=1)
    table = torch.tensor(rows, dtype=torch.int32)
    pool = P._page_pool(cache, table, page, num_pages)
    assert pool.shape == (num_pages, page, 2, 8)
    for b in range(B):
        pages = pool[table[b, :4].long()].reshape(4 * page, 2, 8)
        assert torch.equal(pages[:L], cache[b])
        assert pages[L:].isnan().all()  # the rest of the last page
        assert pool[table[b, 4].long()].isnan().all()  # the page past the length
    named = set(table.flatten().tolist())
    for p in set(range(num_pages)) - named:
        assert pool[p].isnan().all()


# ---------------------------------------------------------------- reference and the check


def test_compute_decode_matches_expanded_math_on_cpu():
    torch = pytest.importorskip("torch")
    import reference  # noqa: PLC0415
    g = torch.Generator().manual_seed(0)
    B, Nq, Hq, Hkv, L, D = 2, 3, 8, 2, 37, 16
    q = torch.randn(B, Nq, Hq, D, generator=g)
    k = torch.randn(B, L, Hkv, D, generator=g)
    v = torch.randn(B, L, Hkv, D, generator=g)
    scale = 0.25
    out = reference.compute_decode(q, k, v, scale)
    assert out.dtype == torch.float64 and out.shape == (B, Nq, Hq, D)
    ke = k.double().repeat_interleave(Hq // Hkv, dim=2)  # query head h reads kv head h // 4
    ve = v.double().repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), ke) * scale
    want = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), ve)
    assert torch.allclose(out, want, atol=1e-12)


class FakePeer:
    """A prepared peer whose decode call returns `value` (BSHD)."""

    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def context(self):
        return contextlib.nullcontext()

    def make(self, mode):
        assert mode == "fwd"

        def fn(i):
            if self.error:
                raise self.error
            return self.value
        return fn

    def to_bhsd(self, t):
        return t.transpose(1, 2)

    def describe(self):
        return "fake kernel"


def test_make_and_check_on_cpu():
    torch = pytest.importorskip("torch")
    ref = torch.randn(2, 1, 4, 8, dtype=torch.float64)

    def check(impl, layout, peer):
        return DC.make_and_check(DC.Entry(impl, layout, peer), ref.transpose(1, 2))
    ok = check("flashcpp", "paged16", FakePeer(ref.float()))
    assert ok.status == R.OK and ok.fn is not None and ok.max_err < 1e-6
    assert ok.ran == "fake kernel" and ok.series == "paged16"
    bad = check("cudnn", "contiguous", FakePeer(ref.float() * 1.5))
    assert bad.status == R.WRONG and bad.fn is None and "out err" in bad.reason
    nan = ref.float().clone()
    nan[0, 0, 0, 0] = math.nan  # a page past the length was read
    assert check("flashcpp", "paged64", FakePeer(nan)).status == R.WRONG
    na = check("fa2", "contiguous", FakePeer(error=RuntimeError("no kernel")))
    assert na.status == R.NA and "no kernel" in na.reason


def test_host_clock_counts_calls():
    clock = DC.HostClock(lambda i: i * 2)
    assert [clock(i) for i in range(3)] == [0, 2, 4]
    assert clock.calls == 3 and clock.ms_per_call >= 0.0


# ---------------------------------------------------------------- CUDA graph timing


def test_graph_calls_are_whole_passes_over_the_input_sets():
    assert T.GRAPH_CALLS == 20
    # B1 L1k rotates 38 sets: one graph of 38 calls, so that every set is used in turn
    assert [T.graph_calls(n) for n in (1, 2, 3, 5, 7, 38, 64)] == [20, 20, 21, 20, 21, 38, 64]


def test_replays_keep_at_least_100_calls_and_10_replays():
    assert T.replays(100, 20) == 10  # 200 calls: 10 replays is the floor
    assert T.replays(500, 20) == 25 and T.replays(500, 21) == 24  # 504 calls
    assert T.replays(100, 64) == 10 and T.replays(5, 20) == 10


def test_time_interleaved_divides_replays_by_their_calls(monkeypatch):
    asked = {}

    def fake_timed_calls(fn, n_sets, reps):
        asked[fn.__name__] = (n_sets, reps)
        return [fn(0)] * reps

    def graph(i):  # a replay of 20 calls, 2 ms
        return 2.0

    def single(i):  # one call, 0.5 ms
        return 0.5

    monkeypatch.setattr(T, "timed_calls", fake_timed_calls)
    stats = T.time_interleaved({"graph": graph, "single": single}, n_sets=5, reps=100, rounds=2,
                               calls={"graph": 20})
    assert asked == {"graph": (5, 10), "single": (5, 100)}
    assert stats["graph"]["median"] == pytest.approx(0.1) and stats["graph"]["n"] == 20
    assert stats["single"]["median"] == 0.5 and stats["single"]["n"] == 200


def test_timed_fns_falls_back_per_call_when_the_capture_raises(monkeypatch):
    pytest.importorskip("torch")  # _reason looks for torch's OutOfMemoryError
    captured = []

    def fake_capture(fn, n_sets, calls):
        if fn(0) == "cudnn":
            try:
                raise RuntimeError("operation not permitted when stream is capturing")
            except RuntimeError:  # leaving torch.cuda.graph raises again: the first error wins
                raise RuntimeError("capture invalidated")  # noqa: B904
        captured.append((fn(0), n_sets, calls))
        return lambda i: None

    def entry(impl, reason=""):
        e = DC.Entry(impl, "contiguous", FakePeer(impl), reason=reason)
        e.fn = e.peer.make("fwd")
        return e
    ready = {"flashcpp": entry("flashcpp"), "cudnn": entry("cudnn", "read K/V expanded")}
    monkeypatch.setattr(T, "capture", fake_capture)
    fns, calls = DC.timed_fns(ready, 3, graph=True)
    assert captured == [("flashcpp", 3, 21)] and calls == {"flashcpp": 21}
    assert isinstance(fns["cudnn"], DC.HostClock) and not isinstance(fns["flashcpp"], DC.HostClock)
    assert ready["cudnn"].reason == ("read K/V expanded; timed per call: CUDA graph capture "
                                     "failed: RuntimeError: operation not permitted when stream "
                                     "is capturing")
    assert ready["flashcpp"].reason == ""
    fns, calls = DC.timed_fns(ready, 3, graph=False)
    assert calls == {} and all(isinstance(f, DC.HostClock) for f in fns.values())


# ---------------------------------------------------------------- results, CSV, table


COPY = 3000.0


def ms_for(case, gbps, kv_heads=0):
    return G.decode_bytes(case, kv_heads) / (gbps * 1e9) * 1e3


def fake_results():
    rs = []
    for L in (1024, 65536):
        c = dcase(B=8, L=L)
        rs.append(R.DecodeResult("cudnn", c, "decode", R.OK, ms=ms_for(c, 1500.0, 32),
                                 layout=G.EXPANDED, copy_gbps=COPY, max_err=1e-3))
        # the short cell's capture failed: timed per call, and host-bound
        rs.append(R.DecodeResult("fa2", c, "decode", R.OK, ms=ms_for(c, 2400.0), copy_gbps=COPY,
                                 max_err=1e-3, timing=R.PER_CALL if L == 1024 else R.GRAPH,
                                 host_bound=L == 1024))
        rs.append(R.DecodeResult("flashcpp", c, "decode", R.OK, ms=ms_for(c, 2700.0),
                                 copy_gbps=COPY, max_err=1e-3))
        rs.append(R.DecodeResult("flashcpp", c, "decode", R.OK, ms=ms_for(c, 2430.0),
                                 layout="paged16", copy_gbps=COPY, max_err=1e-3))
        rs.append(R.DecodeResult("flashcpp", c, "decode", R.WRONG, layout="paged64",
                                 copy_gbps=COPY, max_err=math.inf, reason="out err inf > 0.02"))
    return rs


def test_decode_result_bytes_and_pct():
    r = fake_results()[1]
    assert r.gbps == pytest.approx(2400.0) and r.pct_copy == pytest.approx(80.0)
    e = fake_results()[0]  # expanded: its GB/s count the 32 heads it read
    assert e.gbps == pytest.approx(1500.0) and e.pct_copy == pytest.approx(50.0)
    assert e.series == "cudnn" and "expanded" in e.cell


def test_decode_csv_columns(tmp_path):
    path = tmp_path / "results.csv"
    R.write_csv(str(path), fake_results(), "NVIDIA H100 80GB HBM3", R.DECODE_CSV_COLUMNS)
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = [dict(zip(header, r)) for r in reader]
    assert header == ["impl", "device", "dtype", "D", "causal", "B", "H", "Hkv", "Nq", "Nk",
                      "mode", "ms", "tflops", "gbps", "layout", "pct_copy", "timing"]
    assert len(rows) == 8  # the wrong cell goes to status.csv only
    cudnn = rows[0]
    assert (cudnn["impl"], cudnn["layout"], cudnn["mode"], cudnn["Hkv"]) == (
        "cudnn", "expanded", "decode", "8")
    assert float(cudnn["gbps"]) == pytest.approx(1500.0, rel=1e-3)
    assert float(cudnn["pct_copy"]) == pytest.approx(50.0, rel=1e-3)
    assert {r["layout"] for r in rows} == {"expanded", "contiguous", "paged16"}
    assert [r["timing"] for r in rows if r["impl"] == "fa2"] == ["per-call", "graph"]


def test_decode_status_csv(tmp_path):
    path = tmp_path / "status.csv"
    R.write_status_csv(str(path), fake_results(), R.DECODE_STATUS_COLUMNS)
    rows = list(csv.DictReader(open(path, newline="")))
    assert list(rows[0]) == list(R.DECODE_STATUS_COLUMNS)
    wrong = [r for r in rows if r["status"] == "wrong"]
    assert len(wrong) == 2 and wrong[0]["layout"] == "paged64" and "inf" in wrong[0]["note"]


def test_decode_table():
    header, rows = R.decode_table_rows(fake_results())
    assert header == ["case", "cudnn", "fa2", "flashcpp", "paged16", "paged64",
                      "flashcpp/cudnn", "flashcpp/fa2", "paged16/contig", "paged64/contig"]
    short, long_ = rows
    assert short[0] == "B8 L1k" and long_[0] == "B8 L64k"
    assert short[1] == "1500 50% E" and short[2] == "2400 80% ph" and long_[2] == "2400 80%"
    assert short[3] == "2700 90%" and short[4] == "2430 81%" and short[5] == "WRONG"
    # ratios of times: cudnn read 4x the K/V bytes at 1500 GB/s
    c = dcase(B=8, L=1024)
    want = ms_for(c, 1500.0, 32) / ms_for(c, 2700.0)
    assert short[6] == f"{want:.2f}x" and short[7] == "1.12x"
    assert short[8] == "0.90x" and short[9] == "-"
    assert R.decode_case_label(dcase(B=1, L=4096, nnew=4)) == "B1 L4k Nnew4"
    # a per-call run (--no-graph) has no p: every row is per call
    per_call = [dataclasses.replace(r, timing=R.PER_CALL) for r in fake_results()]
    assert R.decode_table_rows(per_call, R.PER_CALL)[1][0][2] == "2400 80% h"


def test_decode_table_text_and_legend():
    header, rows = R.decode_table_rows(fake_results())
    lines = R.format_table(header, rows, left=1).splitlines()
    assert lines[0].startswith("case") and len(lines) == 2 + len(rows)
    # the first column left, the numbers right-aligned
    assert lines[2].split("  ")[0].rstrip() == "B8 L1k"
    assert lines[0].index("cudnn") + len("cudnn") == lines[2].index("50% E") + len("50% E")
    legend = R.decode_legend(fake_results(), COPY)
    assert "bf16 Hq 32, Hkv 8, D 128" in legend[0] and "3000 GB/s" in legend[0]
    assert "CUDA graphs of >= 20 calls" in legend[0] and "not measured" in legend[0]
    assert "E: read K/V expanded" in legend[1] and "80%" in legend[1]
    assert "p: timed per call, its CUDA graph capture failed" in legend[1]
    legend = R.decode_legend(fake_results(), COPY, R.PER_CALL)
    assert "timed per call (CUDA events around each Python call)" in legend[0]
    assert "p:" not in legend[1] and "h: host-bound" in legend[1]
    assert R.format_table(header, rows, markdown=True, left=1).splitlines()[1].startswith(
        "|---|---:")


def test_decode_summary_and_failures():
    meta = {"device": "NVIDIA H100 80GB HBM3", "driver": "580.1", "torch": "2.9.0",
            "cuda": "12.8", "cudnn": 91000, "copy_gbps": 3000.0, "date": "2026-01-01",
            "timing": "graph", "graph_calls": 20}
    md = R.decode_summary_markdown(fake_results(), meta, "python3 bench/decode_compare.py",
                                   ["/x/decode_bf16_d128_nnew1.png"])
    assert md.startswith("# Decode benchmark") and "| copy_gbps | 3000.0 |" in md
    assert "| cudnn | 91000 |" in md and "![decode_bf16_d128_nnew1.png]" in md
    assert "| timing | graph |" in md and "| graph_calls | 20 |" in md and "80% ph |" in md
    assert "flashcpp paged64 bf16 D128 Nq1 Nk1024 B8 H32/8 full: wrong" in md
    assert len(R.failure_lines(fake_results())) == 2


# ---------------------------------------------------------------- plots


def test_decode_plot(tmp_path):
    pytest.importorskip("matplotlib")
    rows = R.csv_rows(fake_results(), "NVIDIA H200")
    assert PL.copy_gbps_of(rows) == pytest.approx(COPY, rel=1e-3)
    paths = PL.write_decode_plots(rows, str(tmp_path), "NVIDIA H200")
    assert [os.path.basename(p) for p in paths] == ["decode_bf16_d128_nnew1.png"]
    with open(paths[0], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots_cli_redraws_a_decode_csv(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "results.csv"
    R.write_csv(str(path), fake_results(), "NVIDIA H200", R.DECODE_CSV_COLUMNS)
    assert PL.main([str(path)]) == 0
    assert (tmp_path / "decode_bf16_d128_nnew1.png").exists()


# ---------------------------------------------------------------- one cell on the GPU


def test_capture_replays_the_calls_in_order_on_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    sets = [torch.zeros(1, device="cuda") for _ in range(3)]
    order = torch.zeros((), dtype=torch.float64, device="cuda")

    def fn(i):  # counts the calls per set; `order` gets the sets' order as base-4 digits
        sets[i].add_(1)
        order.mul_(4).add_(i)
    replay = T.capture(fn, 3, 6)
    assert [t.item() for t in sets] == [1, 1, 1]  # the warm-up, outside the capture
    order.zero_()
    replay(0)
    replay(0)
    torch.cuda.synchronize()
    assert [t.item() for t in sets] == [5, 5, 5]
    assert order.item() == int("012012" * 2, 4)


@pytest.mark.parametrize("graph", ["--graph", "--no-graph"])
def test_decode_cell_on_gpu(graph):
    """A small case end to end (GQA, a partial last page, rotated input sets): every row is
    checked and either timed or n/a with a reason; FlashAttention-2 runs; with --graph,
    flashcpp's rows are timed as CUDA graphs, and any row that is not says why."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    a = DC.parse_args(["--batches", "2", "--lengths", "1000", "--hq", "8", "--hkv", "2",
                       "--head-dim", "64", "--layouts", "paged16", "--reps", "5", "--rounds", "1",
                       graph])
    peers = {n: P.FlashcppKVCachePeer() if n == "flashcpp" else P.SdpaPeer(n) for n in a.impl_list}
    usable = [n for n, peer in peers.items() if peer.available() is None]
    results = DC.run_case(a.cases[0], a, usable, 3000.0, DC.SC.l2_bytes(), log=lambda s: None)
    by = {r.series: r for r in results}
    assert by["fa2"].status == R.OK, by["fa2"].reason
    assert by["fa2"].ms > 0 and by["fa2"].gbps > 0
    for r in results:
        assert r.status in (R.OK, R.NA), (r.cell, r.reason)
        assert r.status == R.OK or r.reason
    for r in results:
        if r.status == R.OK and a.graph:
            assert r.timing == R.GRAPH or "CUDA graph capture failed" in r.reason, r.reason
        elif r.status == R.OK:
            assert r.timing == R.PER_CALL and "us/call" in r.reason
    if "flashcpp" in usable:
        assert {"flashcpp", "paged16"} <= set(by)
        if a.graph:
            assert by["flashcpp"].timing == by["paged16"].timing == R.GRAPH
