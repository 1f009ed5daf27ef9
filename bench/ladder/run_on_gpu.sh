#!/usr/bin/env bash
# One pass of the ladder on a GPU machine: build, test, benchmark against PyTorch, sanitize.
# Usage: bench/ladder/run_on_gpu.sh OUT_DIR   (run from the repository root; .deps/ present)
set -uo pipefail
out="${1:?usage: run_on_gpu.sh OUT_DIR}"
mkdir -p "$out/res"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
date -u +%Y-%m-%d >> "$out/device.txt"

# Build the ladder only (target flashcpp-ladder pulls in flashcpp_ladder, nothing else).
bin=build/ladder/src/cuda/ladder/flashcpp-ladder
lib=build/ladder/src/cuda/ladder/libflashcpp_ladder.a
if ! { cmake -S . -B build/ladder -G Ninja -DFLASHCPP_CUDA=ON -DFLASHCPP_CUDA_ARCHS="80;90a" \
         -DFLASHCPP_HEAD_DIMS=128 -DFLASHCPP_DTYPES=bf16 -DFLASHCPP_BUILD_TESTS=OFF \
         -DFLASHCPP_BUILD_BENCH=OFF && cmake --build build/ladder -j16 --target flashcpp-ladder; } \
       > "$out/build.log" 2>&1; then
  echo "cmake build failed (tail below); building with nvcc directly"
  tail -15 "$out/build.log"
  mkdir -p build/ladder-nvcc && cd build/ladder-nvcc || exit 1
  nvcc -std=c++20 -O3 -I../../src -I../../include -gencode arch=compute_90,code=sm_90 \
    -c ../../src/cuda/ladder/*.cu || exit 1
  ar rcs libflashcpp_ladder.a ./*.o && cd ../.. || exit 1
  lib=build/ladder-nvcc/libflashcpp_ladder.a
  bin=build/ladder-nvcc/flashcpp-ladder
  g++ -std=c++20 -O2 -Isrc -Iinclude -I/usr/local/cuda/include bench/ladder/ladder_bench.cpp "$lib" \
    -L/usr/local/cuda/lib64 -lcublas -lcudart -o "$bin" || exit 1
fi

# Tests (tests/cpp/ladder_test.cpp) against GoogleTest's sources from .deps.
g="$PWD/.deps/googletest/googletest"
g++ -std=c++20 -O1 -DFLASHCPP_TEST_WITH_LADDER -Isrc -Iinclude -I/usr/local/cuda/include -I"$g/include" \
  -I"$g" tests/cpp/ladder_test.cpp "$g/src/gtest-all.cc" "$g/src/gtest_main.cc" "$lib" \
  -L/usr/local/cuda/lib64 -lcudart -pthread -o build/ladder_tests || exit 1
build/ladder_tests 2>&1 | tee "$out/tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|MISMATCH|error" | head -40

# Benchmark: the ladder and its PyTorch peers.
PYTHONUNBUFFERED=1 python3 bench/ladder/ladder_compare.py --ladder-bin "$bin" --out "$out/res" \
  2>&1 | tee "$out/compare.log"

# Sanitizers on the small test shapes (memcheck for out-of-bounds, racecheck for shared memory).
timeout 45 compute-sanitizer --tool memcheck --print-limit 5 build/ladder_tests > "$out/sanitize.log" 2>&1
echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY' "$out/sanitize.log" | tail -1)"
timeout 45 compute-sanitizer --tool racecheck --print-limit 5 build/ladder_tests \
  --gtest_filter='LadderMatmul.Tiled*:LadderSoftmax.*:LadderAttention.Scalar*' >> "$out/sanitize.log" 2>&1
echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/sanitize.log" | tail -1)"
tail -25 "$out/compare.log"
