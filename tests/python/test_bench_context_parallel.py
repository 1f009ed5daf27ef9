"""bench/context_parallel.py end to end under torchrun, tiny and on the CPU (gloo): it runs,
and every row has the ring, compute, comm and one-GPU times. Skipped without PyTorch."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_context_parallel_bench_runs_on_cpu_gloo(tmp_path):
    result = tmp_path / "rows.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", os.path.join(ROOT, "bench", "context_parallel.py"),
               "--device", "cpu", "--seqlens", "48,1k", "--heads", "2", "--kv-heads", "1",
               "--head-dim", "16", "--dtype", "fp32", "--reps", "2", "--warmup", "1",
               "--json", str(result)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(result.read_text())["rows"]
    assert [(r["seq_len"], r["mode"]) for r in rows] == [
        (48, "fwd"), (48, "fwd+bwd"), (1024, "fwd"), (1024, "fwd+bwd")]
    for row in rows:
        assert row["world_size"] == 2 and row["causal"]
        for key in ("ring_ms", "compute_ms", "comm_ms", "single_ms", "tflops_per_gpu"):
            assert row[key] > 0, (key, row)
    assert "per-GPU efficiency" in done.stdout
