#!/usr/bin/env bash
# One device-machine session for the sm90 forward: build (bf16+fp16, d64/128/256, sm80+sm90a),
# run the sm90 and sm80 GPU tests (under a timeout: a desynced mbarrier hangs), then time
# flashcpp sm90 against PyTorch cuDNN and FA2 on the training grid and print a table last.
#   src/cuda/sm90/tools/gpu_check.sh OUT_DIR [build|test|bench ...]   (default: all)
set -uo pipefail
out="${1:?usage: gpu_check.sh OUT_DIR [stage ...]}"
shift
stages="${*:-build test bench}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
cd "$root"
build=build/sm90-gpu
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [[ $stages == *build* ]]; then
  cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON \
    -DFLASHCPP_CUDA_ARCHS="80;90a" -DFLASHCPP_HEAD_DIMS="64;128;256" -DFLASHCPP_DTYPES="bf16;fp16" \
    -DFLASHCPP_BUILD_LADDER=OFF -DFLASHCPP_BUILD_BENCH=ON -DFLASHCPP_PTXAS_VERBOSE=ON \
    >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
  cmake --build $build -j 16 >"$out/build.log" 2>&1 || { grep -B2 -A10 "error" "$out/build.log" | head -60; exit 1; }
  grep -A3 "Compiling entry function.*sm90" "$out/build.log" | grep -v "^--" >"$out/ptxas_sm90.log"
  echo "build ok"
fi
if [[ $stages == *test* ]]; then
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  timeout 240 $build/tests/cpp/flashcpp_tests --gtest_filter='CudaSm90Forward*' >"$out/test_sm90.log" 2>&1
  echo "sm90 tests rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$out/test_sm90.log" | tr '\n' ' ')"
  grep -E "FAILED|Failure|error" "$out/test_sm90.log" | head -30
  FLASHCPP_ENABLE_SM90=1 timeout 120 $build/tests/cpp/flashcpp_tests \
    --gtest_filter='CudaSm90Forward.Automatic*' >"$out/test_env.log" 2>&1
  echo "env-switch tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$out/test_env.log" | tr '\n' ' ')"
  timeout 180 $build/tests/cpp/flashcpp_tests --gtest_filter='CudaForward*' >"$out/test_sm80.log" 2>&1
  echo "sm80 tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$out/test_sm80.log" | tr '\n' ' ')"
fi
if [[ $stages == *bench* ]]; then
  : >"$out/bench.txt"
  for d in 64 128 256; do
    for n in 4096 16384; do
      for c in 0 1; do
        flag=""
        ((c)) && flag="--causal"
        timeout 60 $build/bench/flashcpp-bench --backend cuda_sm90 --dtype bf16 --batch $((16384 / n)) \
          --heads $((2048 / d)) --head-dim $d --seqlen-q $n $flag --reps 30 --warmup 5 --no-check \
          >"$out/fc_${d}_${n}_${c}.txt" 2>&1
        ms=$(sed -n 's/.*median \([0-9.]*\) ms.*/\1/p' "$out/fc_${d}_${n}_${c}.txt")
        kern=$(sed -n 's/.*kernel \([^,]*\),.*/\1/p' "$out/fc_${d}_${n}_${c}.txt")
        echo "flashcpp D=$d N=$n causal=$c ms=${ms:-nan} kernel=$kern" >>"$out/bench.txt"
      done
    done
  done
  rm -f "$out"/fc_*.txt
  timeout 240 python3 src/cuda/sm90/tools/peers_tflops.py >>"$out/bench.txt" 2>&1
  python3 - "$out/bench.txt" <<'PY'
import re, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"^(?:flashcpp|peer (\w+)) D=(\d+) N=(\d+) causal=(\d) ms=([0-9.]+)", line)
    if not m:
        continue
    who = m.group(1) or "flashcpp"
    d, n, c, ms = int(m.group(2)), int(m.group(3)), int(m.group(4)), float(m.group(5))
    flops = 4 * (16384 // n) * (2048 // d) * n * n * d / (2 if c else 1)
    rows.setdefault((d, n, c), {})[who] = flops / ms / 1e9
print(f"{'D':>4} {'N':>6} {'causal':>6} {'cudnn':>7} {'fa2':>7} {'sm90':>7} {'/cudnn':>7} {'/fa2':>6}")
for (d, n, c), r in sorted(rows.items()):
    f, cd, fa = r.get("flashcpp", 0), r.get("cudnn", 0), r.get("fa2", 0)
    print(f"{d:>4} {n:>6} {c:>6} {cd:7.1f} {fa:7.1f} {f:7.1f} {f / cd if cd else 0:7.2f} {f / fa if fa else 0:6.2f}")
PY
fi
