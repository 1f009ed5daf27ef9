#!/usr/bin/env bash
# The main job: build flashcpp-bench and run one attention problem on the best backend present
# (the GPU if there is one, else the CPU backend, with no CUDA compiled), checked against the
# float64 reference. Extra arguments go to flashcpp-bench (try --help, or --json for one JSON
# object). Safe to repeat.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# --help answers at once, before any bootstrap or build: the flags are flashcpp-bench's usage
# text, read from its source.
for arg in "$@"; do
  if [[ "$arg" == "--help" || "$arg" == "-h" ]]; then
    echo "usage: scripts/run.sh [flashcpp-bench flags]   (builds flashcpp-bench first)"
    echo
    sed -n '/kUsage = R"(/,/^)";/p' bench/bench_args.cpp | sed '1s/.*R"(//; $d'
    exit 0
  fi
done

scripts/bootstrap.sh >/dev/null
if command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi -L >/dev/null 2>&1; then
  preset=gpu
else
  preset=cpu
fi
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)" --target flashcpp-bench >/dev/null
exec "build/$preset/bench/flashcpp-bench" "$@"
