#!/usr/bin/env bash
# The CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer (CMake preset "sanitize":
# every target built with -fsanitize=address,undefined, no recovery: the first report fails).
#   scripts/sanitize.sh            C++: the CPU tests of flashcpp_tests and the bench's --json
#                                  test (the consumer project test is left out: it builds an
#                                  uninstrumented copy)
#   scripts/sanitize.sh --python   also the Python module (preset "sanitize-python", in the venv
#                                  scripts/python_tests.sh made) and the pytest suite, with the
#                                  sanitizer runtimes preloaded into the uninstrumented python
#   extra arguments after the options go to ctest (e.g. -R Issue23)
# CI runs the C++ part (scripts/test.sh); it takes about 6 minutes on 2 cores from a cold cache.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${JOBS:-$(nproc)}"
python=0
if [[ "${1:-}" == "--python" ]]; then
  python=1
  shift
fi

cmake --preset sanitize >/dev/null
cmake --build --preset sanitize -j "$jobs" --target flashcpp_tests flashcpp-bench
ctest --preset sanitize -j "$jobs" -E '^consumer\.' "$@"

if ((python)); then
  venv="${FLASHCPP_VENV:-$root/.venv}"
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "sanitize: no venv at $venv; run scripts/python_tests.sh first" >&2
    exit 1
  fi
  cmake --preset sanitize-python -DPython_EXECUTABLE="$venv/bin/python" >/dev/null
  cmake --build --preset sanitize-python -j "$jobs" --target flashcpp_python
  runtimes="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libubsan.so)"
  cd "$root/tests/python"
  # CPython's own allocations are never freed at exit: leak detection is off for Python.
  LD_PRELOAD="$runtimes" ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    PYTHONPATH="$root/build/sanitize-python/python" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider .
fi
