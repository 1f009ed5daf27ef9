"""python -m flashcpp: the installation report and --explain (on the CPU backend here)."""

import subprocess
import sys

import flashcpp
from flashcpp import _build_info


def run_module(*args):
    done = subprocess.run([sys.executable, "-m", "flashcpp", *args], capture_output=True,
                          text=True, timeout=120, check=True)
    return done.stdout


def test_report_names_version_revision_build_and_driver():
    text = run_module()
    assert f"flashcpp {flashcpp.__version__} (git {_build_info.git_revision})" in text
    assert "kernels " in text and "driver " in text
    assert f"cuda_available() = {flashcpp.cuda_available()}" in text
    if _build_info.cuda:
        assert "sm" + _build_info.cuda_archs[0] in text
    # Whether flashcpp.jax has its XLA FFI handlers, as the module itself says.
    assert ("jax      XLA FFI handlers" in text) == flashcpp._C.has_xla_ffi


def test_explain_names_the_kernel_of_each_path():
    lines = run_module("--explain", "1", "48", "4", "32", "--hkv", "2", "--causal",
                       "--dtype", "fp32" if not flashcpp.cuda_available() else "bf16")
    assert "B=1 Nq=48 Nk=48 Hq=4 Hkv=2 D=32" in lines
    for path in ("forward", "backward", "decode"):
        line = next(line for line in lines.splitlines() if line.startswith(path))
        assert "(splits " in line or "not served" in line, line
