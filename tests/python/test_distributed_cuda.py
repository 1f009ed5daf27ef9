"""flashcpp.distributed on several GPUs: one GPU a rank, NCCL, ring and Ulysses attention
forward and backward against one-GPU flashcpp and float64 (the cases are GPU_CASES in
_ring_cases.py). Skipped where fewer GPUs than ranks are present or flashcpp has no CUDA."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")

import flashcpp  # noqa: E402

import _ring_cases  # noqa: E402
from _ranks import assert_all_ok, run_ranks  # noqa: E402


@pytest.mark.parametrize("world_size", [2, 4])
def test_ring_attention_on_gpus_matches_one_gpu(world_size):
    if not (torch.cuda.is_available() and flashcpp.cuda_available()):
        pytest.skip("needs CUDA GPUs and flashcpp built with CUDA")
    if not dist.is_nccl_available():
        pytest.skip("torch.distributed has no NCCL")
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, found {torch.cuda.device_count()}")
    outcome = run_ranks(_ring_cases.run_gpu_cases, world_size, 500 + world_size,
                        backend="nccl", pg_timeout_s=120.0, deadline_s=600.0)
    names = assert_all_ok(outcome)
    assert names[0] == [case["name"] for case in _ring_cases.GPU_CASES]
