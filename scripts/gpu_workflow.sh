#!/usr/bin/env bash
# The GPU workflow, the same every session: build every kernel, run the GPU tests, the
# sanitizers, the Python tests, the side-by-side benchmark, the decode benchmark and the
# teaching ladder (tutorial/).
#
#   scripts/gpu_workflow.sh OUT_DIR [STAGE ...]
#   stages: build test sanitize python bench decode ladder   (default: all, in that order)
#           cp: the context-parallel benchmark at world size 1 over NCCL (ring_attention's
#               overhead over plain flashcpp; not in the default list)
#           cpmulti: on a machine with several GPUs, the context-parallel tests over NCCL
#               (one GPU a rank) and the benchmark at world size = the GPU count, with one
#               ring step's timeline (not in the default list)
#
# Logs go to OUT_DIR/logs/<stage>.log, benchmark output to OUT_DIR/bench, OUT_DIR/decode and
# OUT_DIR/ladder, and OUT_DIR/summary.txt gets one line per stage; the summary and the
# benchmark tables are printed last. Needs .deps/ from scripts/bootstrap.sh (carry it to the
# GPU machine).
# Environment: BENCH_ARGS (extra flags for bench/sdpa_compare.py, e.g. "--quick"),
# DECODE_ARGS (extra flags for bench/decode_compare.py; its default grid takes ~1-2 minutes),
# SANITIZE_FILTER (gtest filter for compute-sanitizer), BUILD_DIR (default build/gpu),
# CP_ARGS (extra flags for bench/context_parallel.py; default lengths 32k, 64k, 128k),
# CP_SEQLENS (lengths for cpmulti; default 32k,64k,128k).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${1:?usage: scripts/gpu_workflow.sh OUT_DIR [STAGE ...]}"
shift
stages=("$@")
((${#stages[@]})) || stages=(build test sanitize python bench decode ladder)
build="${BUILD_DIR:-build/gpu}"
python="${PYTHON:-python3}"
mkdir -p "$out/logs"
summary="$out/summary.txt"
export PYTHONUNBUFFERED=1

run_stage() {  # run_stage NAME COMMAND...: log, time and record the result of one stage
  local name="$1"
  shift
  local start=$SECONDS
  echo "== $name: $*"
  "$@" >"$out/logs/$name.log" 2>&1
  local rc=$?
  local verdict=PASS
  ((rc == 0)) || verdict="FAIL(rc=$rc)"
  printf '%-9s %-12s %4ss  %s\n' "$name" "$verdict" "$((SECONDS - start))" "$(tail -n 1 "$out/logs/$name.log" | cut -c1-100)" | tee -a "$summary"
  return $rc
}

stage_build() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON \
    -DFLASHCPP_HEAD_DIM_PAIRS=192x128 \
    -DFLASHCPP_BUILD_PYTHON=ON -DFLASHCPP_BUILD_TUTORIAL=ON -DFLASHCPP_PTXAS_VERBOSE=ON \
    -DPython_EXECUTABLE="$(command -v "$python")" &&
    cmake --build "$build" -j "$(nproc)" | tee "$out/logs/build-output.log"
  local rc=${PIPESTATUS[0]}
  # the resource report (registers, shared memory, stack frame, spills) of every kernel
  grep -A3 "Compiling entry function" "$out/logs/build-output.log" >"$out/logs/ptxas.log" || true
  return $rc
}

stage_test() {
  ctest --test-dir "$build" --output-on-failure &&
    # the switch back to the sm80 kernels for the automatic backend (read once per process)
    FLASHCPP_DISABLE_SM90=1 "$build/tests/cpp/flashcpp_tests" --gtest_filter='CudaForwardSm90.Automatic*:CudaBackwardSm90.Automatic*'
}

stage_sanitize() {
  local tests="$build/tests/cpp/flashcpp_tests"
  # small problems that still cross tile edges, masks, split-KV, both architectures' forward
  # kernels and both backwards (sm80: atomic and deterministic dQ, varlen; sm90a: split by
  # keys at d64/d128, by head dim at d256; the KV-cache append, decode and combine; kernels
  # given device-side lengths beyond their buffers; D != Dv on sm90a, 192x128; the FP8 forward,
  # padded and varlen)
  local filter="${SANITIZE_FILTER:-CudaForward.ReportsBackendAndKernel/*:CudaForward.BhsdStrides/*:CudaForward.RowsWithoutVisibleKeys*:CudaForwardSm80.SplitKvForced/*:CudaBackward.BhsdStrides/*:CudaBackward.UnseenRowsAndKeysGiveZero/*:CudaBackward.VarlenWithEmptySequences/*:CudaForward.VarlenWithEmptySequence/*:CudaHiddenKeys.NanInTheNextVarlenSequence/*:CudaBackwardSm90.ReportsBackendAndKernel/*:CudaBackwardSm90.GqaAndMqaHeadDim256/*:CudaForwardSm90.HeadDimPairVarlenSplitPaddingStrides/*:CudaBackwardSm90.HeadDimPairVarlenPaddingStrides/*:KvCacheCuda.ContiguousCache:KvCacheCuda.PagedCache:KvCacheCuda.EveryPageSize:KvCacheCuda.ForcedSplits:KvCacheCuda.ValueHeadDimDiffers:KvCacheCuda.Masks:KvCacheCuda.GraphReplaysWithNewLengths:KvCacheCuda.Fp8Cache:CudaDeviceLengths.*:CudaFp8Forward.ExactPHeadDims:CudaFp8Forward.ExactPVarlen}"
  compute-sanitizer --tool memcheck --error-exitcode 3 "$tests" --gtest_filter="$filter" &&
    compute-sanitizer --tool racecheck --error-exitcode 3 "$tests" --gtest_filter="$filter"
}

stage_python() { PYTHONPATH="$root/$build/python" "$python" -m pytest -q -rs tests/python; }

stage_bench() {
  PYTHONPATH="$root/$build/python" "$python" bench/sdpa_compare.py --out "$out/bench" ${BENCH_ARGS:-}
}

stage_decode() {
  PYTHONPATH="$root/$build/python" "$python" bench/decode_compare.py --out "$out/decode" ${DECODE_ARGS:-} &&
    # flashcpp over an fp8 (e4m3) cache, same grid
    PYTHONPATH="$root/$build/python" "$python" bench/decode_compare.py --dtype e4m3 \
      --out "$out/decode-e4m3" ${DECODE_ARGS:-}
}

stage_cp() {
  mkdir -p "$out/cp"
  PYTHONPATH="$root/$build/python" "$python" -m torch.distributed.run --standalone \
    --nproc_per_node 1 bench/context_parallel.py --seqlens 32k,64k,128k --reps 20 \
    --json "$out/cp/world1.json" ${CP_ARGS:-}
}

stage_cpmulti() {
  local gpus
  gpus="$(nvidia-smi -L | wc -l)"
  mkdir -p "$out/cp"
  # NVLink multicast stays off on shared hosts (it can take the host's GPUs out of service).
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  PYTHONPATH="$root/$build/python" "$python" -m pytest -q -rs tests/python/test_distributed_cuda.py &&
    PYTHONPATH="$root/$build/python" "$python" -m torch.distributed.run --standalone \
      --nproc_per_node "$gpus" bench/context_parallel.py --seqlens "${CP_SEQLENS:-32k,64k,128k}" \
      --mask both --reps 10 --json "$out/cp/world$gpus.json" --trace "$out/cp/trace" ${CP_ARGS:-}
}

stage_ladder() {
  PYTHONPATH="$root/$build/python" "$python" tutorial/bench/ladder_compare.py \
    --ladder-bin "$build/tutorial/flashcpp-ladder" --cpu-bench "$build/bench/flashcpp-bench" \
    --out "$out/ladder"
}

{
  echo "# $(date -u +%F\ %T) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)"
} >>"$summary"
failed=0
for s in "${stages[@]}"; do
  run_stage "$s" "stage_$s" || failed=1
  if [[ $s == build && $failed -ne 0 ]]; then break; fi
done

echo
echo "==== summary ($out/summary.txt)"
cat "$summary"
for table in "$out/bench/table.txt" "$out/decode/table.txt" "$out/decode-e4m3/table.txt" \
  "$out/ladder/table.txt"; do
  [[ -f $table ]] && { echo; cat "$table"; }
done
exit $failed
