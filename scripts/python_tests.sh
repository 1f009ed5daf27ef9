#!/usr/bin/env bash
# Builds the flashcpp Python package (CPU backend only) into a virtual environment and runs the
# pytest suite in tests/python. Safe to repeat: the venv is reused, pip skips what is installed,
# and the CMake build folder (build/pip-<tag>) plus ccache make rebuilds incremental.
# Where the dependencies come from, in this order:
#   1. the venv (default <repo>/.venv) when it already holds the pinned versions below;
#   2. offline: when $PYTHON (python3) itself imports numpy, pytest, nanobind and
#      scikit_build_core (the GPU machine, which has no package registry), a venv at
#      build/venv-system with --system-site-packages that installs nothing but flashcpp;
#   3. otherwise the venv is created and the pins are installed from PyPI (CI).
#   FLASHCPP_VENV=/path   use another venv for 1 and 3 (default: <repo>/.venv)
#   FLASHCPP_TORCH_TESTS=1  also pin PyTorch and transformers (CI: .ci/run), so their tests
#                         run instead of skipping. PyPI's Linux torch wheel brings NVIDIA's
#                         CUDA libraries (~5.6 GB installed; ~75 s to download and install).
#   FLASHCPP_JAX_TESTS=1  also pin JAX for the CPU (jax[cpu] from PyPI: jax, jaxlib, scipy;
#                         ~520 MB installed; ~30 s to download and install, ~10 s from pip's
#                         cache), so flashcpp gets its XLA FFI handlers and the JAX jit/grad
#                         tests run (CI: .ci/run).
#   extra arguments       passed to pytest (e.g. -k torch -x)
# Exit status: pytest's (non-zero on any failure); 0 when every test passed or was skipped.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FLASHCPP_VENV:-$root/.venv}"
python="${PYTHON:-python3}"

# Pinned test and build dependencies (PyPI, Python 3.11). nanobind 3.1 is also what the GPU
# machine has; torch/transformers are optional (their tests skip when they are missing), and so
# is hypothesis where the venv is not ours (offline: test_properties.py skips without it).
pins=(numpy==2.3.5 pytest==8.4.2 nanobind==3.1.0 scikit-build-core==0.11.6 hypothesis==6.140.2)
if [[ "${FLASHCPP_TORCH_TESTS:-0}" == 1 ]]; then
  pins+=(torch==2.15.0 transformers==5.23.0)
fi
if [[ "${FLASHCPP_JAX_TESTS:-0}" == 1 ]]; then
  pins+=("jax[cpu]==0.10.2")  # jax and the same jaxlib
fi

has_pins() {
  "$1" - "${pins[@]}" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, wanted = pin.split("==")
    name = name.split("[")[0]  # jax[cpu]: the extra's packages come with jax's version
    assert version(name) == wanted, pin
PY
}

imports_deps() {
  "$1" -c "import numpy, pytest, nanobind, scikit_build_core" >/dev/null 2>&1
}

if [[ -x "$venv/bin/python" ]] && has_pins "$venv/bin/python"; then
  py="$venv/bin/python"
elif imports_deps "$python"; then
  # No pip download: the venv sees $python's packages (torch too, where installed) and gets
  # only flashcpp. --without-pip: the system's pip (python3 -m pip) does the install, into
  # the venv, and ensurepip may be missing (Debian without python3-venv).
  venv="$root/build/venv-system"
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "python_tests: $python has the dependencies; creating $venv (--system-site-packages)"
    "$python" -m venv --system-site-packages --without-pip "$venv"
  fi
  py="$venv/bin/python"
  "$py" -c "import numpy, pytest, nanobind, scikit_build_core as s; print('python_tests: offline,',
  'numpy', numpy.__version__, 'pytest', pytest.__version__, 'nanobind', nanobind.__version__,
  'scikit-build-core', s.__version__)"
else
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "python_tests: creating $venv"
    "$python" -m venv "$venv"
  fi
  py="$venv/bin/python"
  echo "python_tests: installing ${pins[*]}"
  "$py" -m pip install -q --disable-pip-version-check "${pins[@]}"
fi

# CPU-only build (pyproject.toml defaults FLASHCPP_CUDA to OFF), at most 2 parallel jobs.
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
echo "python_tests: pip install . (CPU backend)"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! (cd "$root" && "$py" -m pip install --disable-pip-version-check --no-build-isolation \
        --no-deps -v .) >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "python_tests: building the package failed" >&2
  exit 1
fi

# Run from outside the source tree so `import flashcpp` finds the installed package, not
# python/flashcpp (which has no compiled module).
cd "$root/tests/python"
set +e
"$py" -m pytest -q -rs -p no:cacheprovider "$@" .
status=$?
set -e
exit $status
