#!/usr/bin/env bash
# The whole test suite, from a fresh clone, safe to repeat:
# bootstrap -> configure -> build -> ctest (C++) -> pytest (Python package on the CPU backend)
# -> the C++ CPU tests under ASan + UBSan (scripts/sanitize.sh; not on the GPU machine).
# Without a GPU the CUDA tests skip, and only one kernel instantiation per family is compiled
# (preset "ci": proves the kernels build); with a GPU every instantiation is built and run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="$(nproc)"

scripts/bootstrap.sh

if command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi -L >/dev/null 2>&1; then
  preset=gpu
elif command -v nvcc >/dev/null 2>&1; then
  preset=ci
else
  preset=cpu
fi
echo "test.sh: preset '$preset' ($jobs jobs)"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
ctest --preset "$preset" -j "$jobs"

if [[ -x scripts/python_tests.sh ]]; then
  scripts/python_tests.sh
fi

# The CPU suite again under AddressSanitizer + UBSan (its own build, build/sanitize). Off the
# GPU machine only (CI); FLASHCPP_SKIP_SANITIZE=1 skips it.
if [[ "$preset" != gpu && "${FLASHCPP_SKIP_SANITIZE:-0}" != 1 ]]; then
  scripts/sanitize.sh
fi
