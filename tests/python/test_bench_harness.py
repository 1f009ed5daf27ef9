"""The GPU-free parts of the side-by-side benchmark (bench/sdpa_compare.py and its modules) and
of the profiling helper (dev/profile.py): FLOP and byte counts, the grid, argument parsing,
CSV / table / summary writing, plots, ncu CSV parsing. What needs torch and a GPU is skipped."""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)

import grid as G  # noqa: E402
import report as R  # noqa: E402
import plots as PL  # noqa: E402
import sdpa_compare as SC  # noqa: E402
import timing as T  # noqa: E402


def _load_profile_script():
    spec = importlib.util.spec_from_file_location("flashcpp_profile_script",
                                                  os.path.join(ROOT, "dev", "profile.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PROFILE = _load_profile_script()


def case(D=128, N=4096, causal=False, dtype="bf16", B=None, H=None, Hkv=None, Nk=None):
    H = H or 2048 // D
    return G.Case(dtype=dtype, D=D, causal=causal, B=B or 16384 // N, H=H, Hkv=Hkv or H,
                  Nq=N, Nk=Nk or N)


# ---------------------------------------------------------------- FLOPs, bytes, grid


def test_forward_flops_follow_bench_md():
    c = case(D=128, N=4096)
    assert G.forward_flops(c) == 4 * 4 * 16 * 4096 * 4096 * 128
    # causal with Nq == Nk: exactly half (N^2 / 2, the papers' convention)
    assert G.forward_flops(case(D=128, N=4096, causal=True)) == G.forward_flops(c) / 2


def test_mode_flops_ratios():
    c = case(D=64, N=1024)
    f = G.forward_flops(c)
    assert G.mode_flops(c, "fwd") == f
    assert G.mode_flops(c, "bwd") == 2.5 * f
    assert G.mode_flops(c, "fwd+bwd") == 3.5 * f


def test_training_grid_flops_constant_per_token_product():
    # B * N = 16k tokens and H * D = 2048: the non-causal forward is 4 * 16384 * N * 2048
    for n in G.DEFAULT_SEQLENS:
        for d in G.DEFAULT_HEAD_DIMS:
            assert G.forward_flops(case(D=d, N=n)) == 4 * 16384 * n * 2048


def test_attended_pairs_unequal_lengths_bottom_right():
    # Nq = 2, Nk = 5: query 0 sees keys 0..3, query 1 sees 0..4
    assert G.attended_pairs(2, 5, True) == 4 + 5
    # Nq > Nk: the first queries see nothing
    assert G.attended_pairs(5, 2, True) == 0 + 0 + 0 + 1 + 2
    assert G.attended_pairs(3, 7, False) == 21


def test_mode_bytes():
    c = case(D=128, N=1024, B=2, H=4)
    tensor = 2 * 1024 * 4 * 128 * 2
    lse = 2 * 4 * 1024 * 4
    assert G.mode_bytes(c, "fwd") == 4 * tensor
    assert G.mode_bytes(c, "bwd") == 5 * tensor + lse + 3 * tensor
    assert G.mode_bytes(c, "fwd+bwd") == 4 * tensor + lse + 8 * tensor + lse


def test_tflops_and_gbps():
    assert G.tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert G.gbps(3e9, 1.0) == pytest.approx(3000.0)
    assert math.isnan(G.tflops(1.0, 0.0))


def test_parse_sizes():
    assert G.parse_size("512") == 512
    assert G.parse_size("1k") == 1024
    assert G.parse_size("16K") == 16384
    assert G.parse_size_list("512,1k, 2k") == [512, 1024, 2048]
    with pytest.raises(ValueError):
        G.parse_size("1m")


def test_parse_choice_list_keeps_canonical_order():
    assert G.parse_choice_list("bwd,fwd", G.TRAIN_MODES, "mode") == ["fwd", "bwd"]
    with pytest.raises(ValueError, match="unknown mode"):
        G.parse_choice_list("fwd,decode", G.TRAIN_MODES, "mode")


def test_training_grid_shapes():
    cases = G.training_grid(["bf16"], [64, 128, 256], G.DEFAULT_SEQLENS, [False, True])
    assert len(cases) == 3 * 6 * 2
    for c in cases:
        assert c.H * c.D == 2048 and c.B * c.Nq == 16384 and c.Nq == c.Nk and c.Hkv == c.H
    with pytest.raises(ValueError):
        G.training_grid(["bf16"], [96 * 7], [1024], [False])


def test_rotation_sets():
    l2 = 50 * 2**20
    assert G.rotation_sets(200 * 2**20, l2) == 1          # the training grid: 256 MB per set
    assert G.rotation_sets(10 * 2**20, l2) == 8           # capped
    assert G.rotation_sets(60 * 2**20, l2) == 3


def test_case_label():
    assert case(D=128, N=4096, causal=True).label == "bf16 D128 N4096 B4 H16 causal"
    assert "Nq1 Nk4096" in case(D=128, N=1, Nk=4096, B=8, H=32, Hkv=8).label


# ---------------------------------------------------------------- argument parsing


def test_quick_grid():
    a = SC.parse_args(["--quick"])
    assert a.head_dims == [128] and a.seqlen_list == [1024, 4096]
    assert len(a.cases) == 4 and a.mode_list == ["fwd", "bwd", "fwd+bwd"]
    assert a.impl_list == ["flashcpp", "cudnn", "fa2", "mem_eff", "flex"]


def test_full_grid_default():
    a = SC.parse_args([])
    assert len(a.cases) == 36 and a.reps == 100 and a.dtypes == ["bf16"]


def test_flags():
    a = SC.parse_args(["--heads-dims", "64", "--seqlens", "1k,16k", "--causal", "on",
                       "--dtype", "fp16", "--impls", "flashcpp,cudnn", "--modes", "fwd",
                       "--reps", "200", "--sdpa-layout", "bhsd", "--out", "/tmp/x"])
    assert [(c.D, c.Nq, c.B, c.H, c.causal, c.dtype) for c in a.cases] == [
        (64, 1024, 16, 32, True, "fp16"), (64, 16384, 1, 32, True, "fp16")]
    assert a.impl_list == ["flashcpp", "cudnn"] and a.reps == 200 and a.sdpa_layout == "bhsd"


def test_deterministic_flashcpp_is_an_extra_impl():
    assert "flashcpp_det" not in SC.parse_args([]).impl_list
    a = SC.parse_args(["--impls", "flashcpp_det,flashcpp", "--modes", "bwd"])
    assert a.impl_list == ["flashcpp", "flashcpp_det"]


def test_cudnn_fp8_is_an_extra_impl():
    assert "cudnn_fp8" not in SC.parse_args([]).impl_list
    a = SC.parse_args(["--dtype", "e4m3", "--modes", "fwd", "--impls", "cudnn_fp8,flashcpp"])
    assert a.impl_list == ["flashcpp", "cudnn_fp8"]


def test_rounds_flag():
    assert SC.parse_args([]).rounds == 2
    assert SC.parse_args(["--rounds", "3"]).rounds == 3
    with pytest.raises(SystemExit):
        SC.parse_args(["--rounds", "0"])


def test_rotation_orders_put_each_impl_first_in_turn():
    orders = T.rotation_orders(["flashcpp", "cudnn", "fa2"], 3)
    assert orders == [["flashcpp", "cudnn", "fa2"], ["cudnn", "fa2", "flashcpp"],
                      ["fa2", "flashcpp", "cudnn"]]
    assert [o[0] for o in T.rotation_orders(["a", "b"], 4)] == ["a", "b", "a", "b"]
    assert T.rotation_orders([], 2) == []


def test_time_interleaved_keeps_timing_the_others_after_a_failure(monkeypatch):
    calls = []

    def fake_timed_calls(fn, n_sets, reps):
        calls.append(fn.__name__)
        fn(0)
        return [float(len(calls))] * reps

    def good(i):
        return i

    def bad(i):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(T, "timed_calls", fake_timed_calls)
    stats = T.time_interleaved({"good": good, "bad": bad}, reps=3, rounds=2)
    assert isinstance(stats["bad"], RuntimeError)
    assert stats["good"]["n"] == 6  # both rounds' calls
    assert calls == ["good", "bad", "good"]  # round 2 would start with bad: skipped


def test_bad_flags_exit(capsys):
    with pytest.raises(SystemExit):
        SC.parse_args(["--impls", "flashcpp,triton"])
    with pytest.raises(SystemExit):
        SC.parse_args(["--modes", "decode"])
    assert "unknown" in capsys.readouterr().err


def test_driver_needs_one_cell():
    with pytest.raises(SystemExit):
        SC.parse_args(["--driver", "--quick"])
    a = SC.parse_args(["--driver", "--impls", "flashcpp", "--heads-dims", "128", "--seqlens",
                       "4k", "--causal", "on", "--modes", "fwd"])
    assert len(a.cases) == 1 and a.cases[0].causal


def test_help_runs_without_torch():
    res = subprocess.run([sys.executable, os.path.join(BENCH, "sdpa_compare.py"), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--heads-dims" in res.stdout and "--quick" in res.stdout
    res = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "profile.py"), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--kernel" in res.stdout


def test_modules_do_not_import_torch_at_top_level():
    code = ("import sys; sys.path.insert(0, %r); import sdpa_compare, peers, reference, timing, "
            "plots, report, cudnn_fp8_peer; print('torch' in sys.modules)" % BENCH)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


# ---------------------------------------------------------------- results, CSV, table


def fake_results():
    rs = []
    for causal in (False, True):
        for n in (1024, 4096):
            c = case(D=128, N=n, causal=causal)
            f = G.forward_flops(c)
            for impl, tf in (("cudnn", 600.0), ("fa2", 330.0), ("mem_eff", 170.0),
                             ("flex", 450.0), ("flashcpp", 660.0)):
                ms = f / (tf * 1e12) * 1e3
                rs.append(R.Result(impl, c, "fwd", R.OK, ms=ms, max_err=1e-3))
            rs.append(R.Result("flashcpp", c, "bwd", R.NA, reason="NotImplementedError: no GPU backward"))
            rs.append(R.Result("cudnn", c, "bwd", R.OK, ms=2.5 * f / 500e12 * 1e3, max_err=2e-3))
            rs.append(R.Result("flex", c, "bwd", R.WRONG, reason="dq err 0.3 > 0.05", max_err=0.3))
    return rs


def test_csv_has_exactly_the_protocol_columns(tmp_path):
    path = tmp_path / "results.csv"
    R.write_csv(str(path), fake_results(), "NVIDIA H100 80GB HBM3")
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = list(reader)
    assert header == ["impl", "device", "dtype", "D", "causal", "B", "H", "Hkv", "Nq", "Nk",
                      "mode", "ms", "tflops", "gbps"]
    assert len(rows) == 4 * 5 + 4  # only measured cells
    first = dict(zip(header, rows[0]))
    assert first["impl"] == "cudnn" and first["device"] == "NVIDIA H100 80GB HBM3"
    assert first["causal"] == "0" and first["D"] == "128" and first["Nq"] == "1024"
    assert float(first["tflops"]) == pytest.approx(600.0, rel=1e-3)
    assert float(first["gbps"]) > 0


def test_status_csv_records_every_cell(tmp_path):
    path = tmp_path / "status.csv"
    R.write_status_csv(str(path), fake_results())
    rows = list(csv.DictReader(open(path, newline="")))
    assert len(rows) == len(fake_results())
    statuses = {r["status"] for r in rows}
    assert statuses == {"ok", "n/a", "wrong"}
    na = next(r for r in rows if r["status"] == "n/a")
    assert "NotImplementedError" in na["note"]


def test_table_rows_and_ratios():
    header, rows = R.table_rows(fake_results(), SC.ALL_IMPLS)
    assert header == ["case", "mode", "cudnn", "fa2", "mem_eff", "flex", "flashcpp",
                      "flashcpp/cudnn", "flashcpp/fa2"]
    fwd = rows[0]
    assert fwd[1] == "fwd"
    assert fwd[2] == "600.0" and fwd[6] == "660.0"
    assert fwd[7] == "1.10x" and fwd[8] == "2.00x"
    bwd = next(r for r in rows if r[1] == "bwd")
    assert bwd[6] == "n/a" and bwd[5] == "WRONG" and bwd[3] == "-" and bwd[7] == "-"


def test_table_has_the_deterministic_ratio_when_both_flashcpp_ran():
    c = case(D=128, N=1024)
    rs = [R.Result("flashcpp", c, "bwd", R.OK, ms=2.0, max_err=1e-3),
          R.Result("flashcpp_det", c, "bwd", R.OK, ms=2.2, max_err=1e-3)]
    header, rows = R.table_rows(rs, ["flashcpp", "flashcpp_det"])
    assert header == ["case", "mode", "flashcpp", "flashcpp_det", "flashcpp/flashcpp_det"]
    assert rows[0][4] == "1.10x"  # the deterministic one's time over the default one's


def test_table_has_the_cudnn_fp8_ratio():
    c = case(D=128, N=16384, dtype="e4m3")
    rs = [R.Result("flashcpp", c, "fwd", R.OK, ms=2.0, max_err=3e-2),
          R.Result("cudnn_fp8", c, "fwd", R.OK, ms=2.2, max_err=3e-2)]
    header, rows = R.table_rows(rs, ["flashcpp", "cudnn_fp8"])
    assert header == ["case", "mode", "cudnn_fp8", "flashcpp", "flashcpp/cudnn_fp8"]
    assert rows[0][4] == "1.10x"


def test_peer_ran_lines_name_cudnn_fp8s_output_type():
    c, c2 = case(D=128, N=4096, dtype="e4m3"), case(D=256, N=4096, dtype="e4m3")
    note = "p10 1.0 ms, p90 1.1 ms; ran O written in e4m3 (scale_o 1), mask none; cuDNN 9.19.0 x"
    rs = [R.Result("flashcpp", c, "fwd", R.OK, ms=2.0, reason="p10 1 ms; ran cuda_sm90 k"),
          R.Result("cudnn_fp8", c, "fwd", R.OK, ms=2.2, reason=note),
          R.Result("cudnn_fp8", c2, "fwd", R.OK, ms=2.2, reason=note),
          R.Result("cudnn", c, "fwd", R.OK, ms=2.2, reason="p10 1.0 ms, p90 1.1 ms")]
    lines = R.peer_ran_lines(rs)
    assert lines == ["cudnn_fp8: O written in e4m3 (scale_o 1), mask none; cuDNN 9.19.0 x"]
    md = R.summary_markdown(rs, ["flashcpp", "cudnn_fp8"], {}, "cmd", [])
    assert "- cudnn_fp8: O written in e4m3" in md


def test_table_has_ratios_for_flashcpp_env_variants():
    c = case(D=256, N=1024)
    rs = [R.Result("fa2", c, "fwd", R.OK, ms=2.0, max_err=1e-3),
          R.Result("flashcpp", c, "fwd", R.OK, ms=2.2, max_err=1e-3),
          R.Result("flashcpp[64x64_4w]", c, "fwd", R.OK, ms=1.6, max_err=1e-3)]
    header, rows = R.table_rows(rs, ["fa2", "flashcpp", "flashcpp[64x64_4w]"])
    assert header == ["case", "mode", "fa2", "flashcpp", "flashcpp[64x64_4w]", "flashcpp/fa2",
                      "flashcpp[64x64_4w]/fa2"]
    assert rows[0][5:] == ["0.91x", "1.25x"]


def test_flashcpp_env_spec_and_peers():
    import peers as P  # noqa: PLC0415
    assert P.parse_flashcpp_env("FLASHCPP_X_D256=a,b") == ("FLASHCPP_X_D256", ["a", "b"])
    for bad in ("FLASHCPP_X", "=a", "FLASHCPP_X=", "FLASHCPP X=a", "FLASHCPP_X=a,a"):
        with pytest.raises(ValueError):
            P.parse_flashcpp_env(bad)
    peers = P.make_peers(["fa2", "flashcpp"], flashcpp_backend="cuda_sm80",
                         flashcpp_env=("FLASHCPP_TEST_ENV_PEER", ["a", "b"]))
    assert [p.name for p in peers] == ["fa2", "flashcpp", "flashcpp[a]", "flashcpp[b]"]
    assert peers[2].backend == "cuda_sm80"
    os.environ.pop("FLASHCPP_TEST_ENV_PEER", None)
    with peers[3].context():
        assert os.environ["FLASHCPP_TEST_ENV_PEER"] == "b"
    assert "FLASHCPP_TEST_ENV_PEER" not in os.environ  # put back as it was: unset
    os.environ["FLASHCPP_TEST_ENV_PEER"] = "x"
    with peers[2].context():
        assert os.environ["FLASHCPP_TEST_ENV_PEER"] == "a"
    assert os.environ.pop("FLASHCPP_TEST_ENV_PEER") == "x"
    a = SC.parse_args(["--impls", "fa2,flashcpp", "--flashcpp-env", "FLASHCPP_TEST_ENV_PEER=a,b"])
    assert sorted(a.columns[:2]) == ["fa2", "flashcpp"]
    assert a.columns[2:] == ["flashcpp[a]", "flashcpp[b]"]
    with pytest.raises(SystemExit):
        SC.parse_args(["--flashcpp-env", "FLASHCPP_TEST_ENV_PEER"])


def test_table_without_flashcpp_has_no_ratio():
    rs = [r for r in fake_results() if r.impl != "flashcpp"]
    header, _ = R.table_rows(rs, ["cudnn", "fa2"])
    assert header == ["case", "mode", "cudnn", "fa2"]


def test_format_table_aligns():
    header, rows = R.table_rows(fake_results(), SC.ALL_IMPLS)
    text = R.format_table(header, rows)
    lines = text.splitlines()
    assert lines[0].startswith("case") and set(lines[1]) <= {"-", " "}
    assert len(lines) == 2 + len(rows)
    md = R.format_table(header, rows, markdown=True)
    assert md.splitlines()[1].startswith("|---|---|---:")


def test_summary_markdown_and_meta(tmp_path):
    meta = {"device": "NVIDIA H200", "driver": "580.1", "torch": "2.11.0", "cuda": "13.0",
            "cudnn": 91900, "date": "2026-11-22 10:00:00 UTC", "reps": 100}
    md = R.summary_markdown(fake_results(), SC.ALL_IMPLS, meta, "python3 bench/sdpa_compare.py",
                            [str(tmp_path / "bf16_d128_fwd.png")])
    assert "NVIDIA H200" in md and "| cudnn | 91900 |" in md
    assert "## Cells not measured" in md and "NotImplementedError" in md
    assert "![bf16_d128_fwd.png](bf16_d128_fwd.png)" in md
    R.write_meta(str(tmp_path / "meta.json"), meta)
    assert json.load(open(tmp_path / "meta.json"))["cudnn"] == 91900


def test_failure_lines_dedup():
    rs = fake_results()
    lines = R.failure_lines(rs + rs)
    assert len(lines) == len(R.failure_lines(rs)) == 8


def test_device_slug_and_out_dir():
    assert R.device_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert R.device_slug("NVIDIA H200") == "h200"
    assert R.default_out_dir("/r", "NVIDIA H200", "2026-11-22") == "/r/bench/results/2026-11-22-h200"


def test_collect_meta_without_gpu():
    meta = R.collect_meta()
    assert "date" in meta and "device" in meta and "flashcpp" in meta


def test_timing_summarize():
    s = T.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["n"] == 5
    assert s["p10"] == 1.0 and s["p90"] == 5.0


# ---------------------------------------------------------------- plots


def test_plots_written(tmp_path):
    pytest.importorskip("matplotlib")
    rows = R.csv_rows(fake_results(), "NVIDIA H100 80GB HBM3")
    paths = PL.write_plots(rows, str(tmp_path), "NVIDIA H100 80GB HBM3")
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["bf16_d128_bwd.png", "bf16_d128_fwd.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots_cli_from_csv(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "results.csv"
    R.write_csv(str(path), fake_results(), "NVIDIA H200")
    assert PL.main([str(path)]) == 0
    assert (tmp_path / "bf16_d128_fwd.png").exists()


# ---------------------------------------------------------------- GPU parts (skipped here)


def test_reference_and_peers_on_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import peers as P  # noqa: PLC0415
    import reference  # noqa: PLC0415
    c = case(D=64, N=256, B=2, H=4, causal=True)
    s = P.make_input_sets(c, 1)[0]
    ref = reference.compute(s.q.transpose(1, 2), s.k.transpose(1, 2), s.v.transpose(1, 2),
                            s.dout.transpose(1, 2), True, P.softmax_scale(c), grads=True)
    peer = P.make_peers(["mem_eff"])[0]
    peer.prepare(c, [s])
    with peer.context():
        fn = peer.make("bwd")
        errs, bad = SC.check_cell(peer, "bwd", fn, ref)
    assert bad is None, errs


# ---------------------------------------------------------------- profile.py


DETAILS_CSV = '''==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python3","h","flash_fwd_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","us","812.35"
"0","123","python3","h","flash_fwd_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Compute (SM) Throughput","%","71.2"
"0","123","python3","h","flash_fwd_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","DRAM Throughput","%","12.5"
"0","123","python3","h","flash_fwd_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Memory Workload Analysis","Memory Throughput","Gbyte/s","402.1"
"0","123","python3","h","flash_fwd_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Occupancy","Achieved Occupancy","%","18.6"
"0","123","python3","h","flash_fwd_kernel","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Launch Statistics","Registers Per Thread","register/thread","168"
'''
RAW_CSV = '''"ID","Process ID","Kernel Name","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active","l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","smsp__average_warps_issue_stalled_not_issued_per_issue_active.ratio"
"","","","%","byte","inst","inst","inst","inst"
"0","123","flash_fwd_kernel","63.4","1,024","1.25","0.40","2.10","9.9"
'''


def test_profile_parse(tmp_path):
    (tmp_path / "details.csv").write_text(DETAILS_CSV)
    (tmp_path / "raw.csv").write_text(RAW_CSV)
    text = PROFILE.parse_dir(str(tmp_path))
    assert "== 0: flash_fwd_kernel" in text
    assert "achieved occupancy" in text and "18.6 %" in text
    assert "registers per thread" in text and "168" in text
    assert "DRAM bandwidth" in text and "402.1 Gbyte/s" in text
    assert "tensor pipe (pipe_tensor_op_gmma_cycles_active)" in text and "63.4 %" in text
    assert "local (spill) load bytes" in text
    stalls = next(line for line in text.splitlines() if "top stalls" in line)
    assert stalls.index("wait 2.10") < stalls.index("barrier 1.25") < stalls.index("long_scoreboard")
    assert "not_issued" not in stalls


def test_profile_command_line():
    a = PROFILE.build_parser().parse_args(["--kernel", "regex:flash", "--impl", "flashcpp",
                                           "--D", "128", "--N", "4096", "--causal"])
    cmd = PROFILE.ncu_command(a, "/tmp/r", PROFILE.EXTRA_METRICS)
    assert cmd[:3] == [a.ncu, "--clock-control", "none"]
    assert ["-k", "regex:flash"] == cmd[cmd.index("-k"):cmd.index("-k") + 2]
    assert "--profile-from-start" in cmd and "WarpStateStats" in cmd
    drv = cmd[cmd.index("--driver") - 1:]
    assert drv[0].endswith("sdpa_compare.py")
    # the driver flags are accepted by the harness itself
    sa = SC.parse_args(drv[1:])
    assert sa.driver and sa.cases[0].D == 128 and sa.cases[0].Nq == 4096 and sa.cases[0].causal


# ---------------------------------------------------------------- flashcpp peer, CPU backend


@pytest.mark.parametrize("name", ["flashcpp", "flashcpp_det"])
@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd+bwd"])
def test_flashcpp_peer_modes_pass_the_check_on_cpu(mode, name):
    """The flashcpp peer's fwd / bwd / fwd+bwd callables and check_cell, end to end on the CPU
    backend (float32, GQA, causal with Nq != Nk): what runs on the GPU, minus the timing."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("flashcpp")
    import peers as P  # noqa: PLC0415
    import reference  # noqa: PLC0415
    c = case(D=32, N=37, Nk=50, B=2, H=4, Hkv=2, causal=True, dtype="fp32")
    g = torch.Generator().manual_seed(3)
    shapes = ((c.Nq, c.H), (c.Nk, c.Hkv), (c.Nk, c.Hkv), (c.Nq, c.H))
    sets = [P.InputSet(*(torch.randn(c.B, n, h, c.D, generator=g) for n, h in shapes))
            for _ in range(2)]
    s = sets[0]
    ref = reference.compute(s.q.transpose(1, 2), s.k.transpose(1, 2), s.v.transpose(1, 2),
                            s.dout.transpose(1, 2), c.causal, P.softmax_scale(c), grads=True)
    peer = P.make_peers([name], flashcpp_backend="cpu")[0]
    assert peer.name == name and peer.available() is None
    peer.prepare(c, sets)
    with peer.context():
        fn = peer.make(mode)
        errs, bad = SC.check_cell(peer, mode, fn, ref)
        fn(1)  # the timing cycles over every input set
    assert bad is None, errs
    expected = {"fwd": {"out"}, "bwd": {"out", "dq", "dk", "dv"}, "fwd+bwd": {"dq", "dk", "dv"}}
    assert set(errs) == expected[mode]
    assert max(errs.values()) < 1e-5, errs
    assert peer.describe().startswith("cpu ")


# ---------------------------------------------------------------- cuDNN FP8 peer, no GPU


def test_cudnn_fp8_peer_without_the_package_is_na(monkeypatch):
    """No cudnn frontend package: available() gives the reason (naming the wheel) instead of
    raising, and the run records n/a with it."""
    import peers as P  # noqa: PLC0415
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn raises ImportError
    peer = P.make_peers(["cudnn_fp8"])[0]
    why = peer.available()
    assert why and "nvidia-cudnn-frontend" in why and "import cudnn failed" in why
    assert not peer.has_backward and peer.takes_fp8


def test_cudnn_fp8_peer_takes_only_fp8_forward():
    import peers as P  # noqa: PLC0415
    peer = P.make_peers(["cudnn_fp8"])[0]
    bf16 = SC.make_and_check(peer, case(dtype="bf16"), "fwd", ref=None)
    assert bf16.status == R.NA and "only fp8" in bf16.reason
    bwd = SC.make_and_check(peer, case(dtype="e4m3"), "bwd", ref=None)
    assert bwd.status == R.NA and bwd.reason == "no backward"
    flashcpp = P.make_peers(["flashcpp"])[0]
    assert SC.dtype_refusal(flashcpp, case(dtype="e4m3")) == ""
    assert SC.dtype_refusal(P.make_peers(["cudnn"])[0], case(dtype="e4m3"))


def test_cudnn_fp8_graph_attempts():
    import cudnn_fp8_peer as CF  # noqa: PLC0415
    full = CF.graph_attempts(False, 4096, 4096)
    assert full[0] == CF.Attempt("bf16", "none") and {a.mask for a in full} == {"none"}
    assert [a.out for a in full][::4] == ["bf16", "fp16", "e4m3"]
    assert len(full) == len(set(full)) == 12
    causal = CF.graph_attempts(True, 4096, 4096)
    assert causal[0] == CF.Attempt("bf16", "bottom_right")
    assert {a.mask for a in causal} == {"bottom_right", "bottom_right_flag", "causal_flag"}
    # the plain causal flag is top-left aligned: not flashcpp's mask when Nq != Nk
    refusal = ("cudnnGraphNotSupportedError: no engine — python or backend — proposed a plan for "
               "this graph (the backend declined: sdpa fp8 forward with HALF/BFLOAT16 output is "
               "only supported on Blackwell; python engines declined: sdpa_fwd_prefill_sm90: x)")
    assert CF.backend_reason(refusal) == ("sdpa fp8 forward with HALF/BFLOAT16 output is only "
                                          "supported on Blackwell")
    assert CF.backend_reason("TypeError: y") == "TypeError: y"
    assert {a.mask for a in CF.graph_attempts(True, 1024, 4096)} == {"bottom_right",
                                                                     "bottom_right_flag"}
