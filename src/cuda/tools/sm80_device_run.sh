#!/bin/bash
# One device-machine call for the sm80 forward (docs/perf-notes-sm80.md): the CUDA forward
# tests, the TFLOP/s probe next to PyTorch's FA2 in the same run, an optional tile-variant
# probe, and Nsight Compute on our kernel for the head dims in $NCU_DIMS (default 128, empty:
# none; FA2's d128 kernel too when NCU_FA2 is set). FLASHCPP_PROBE_N=1024,4096 sweeps N
# (B = 16384 / N) in both probes. Logs go to $OUT; the table last.
#
# Binaries prebuilt on the development machine (same nvcc 13.0, -DFLASHCPP_CUDA_ARCHS=90) are
# taken from $BIN when they start there; otherwise they are built here with the configure of
# the issue (ARCHS "80;90a", falling back to "80;90" if the sm90a sources do not compile).
#   $BIN/flashcpp_tests, $BIN/flashcpp_fwd_tflops, optional $BIN/flashcpp_fwd_tflops_variant
#   and $BIN/flashcpp_tests_variant (another tile table, built from a patched copy)
set -u
OUT=${OUT:-/tmp/sm80_out}
BIN=${BIN:-.gpubin}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"

T=$BIN/flashcpp_tests
P=$BIN/flashcpp_fwd_tflops
PV=$BIN/flashcpp_fwd_tflops_variant
if ! "$T" --gtest_list_tests > /dev/null 2>&1 || ! ldd "$P" > /dev/null 2>&1; then
  echo "prebuilt binaries do not start here: building"
  cfg() {
    cmake -S . -B build/gpu -G Ninja -DFLASHCPP_CUDA=ON -DFLASHCPP_CUDA_ARCHS="$1" \
      -DFLASHCPP_HEAD_DIMS="64;128;256" -DFLASHCPP_DTYPES=bf16 -DFLASHCPP_BUILD_LADDER=OFF \
      -DFLASHCPP_CUDA_TFLOPS_TOOL=ON -DFLASHCPP_PTXAS_VERBOSE=ON
  }
  { cfg "80;90a" && ninja -C build/gpu -j16 flashcpp_tests flashcpp_fwd_tflops; } > "$OUT/build.log" 2>&1 ||
    { rm -rf build/gpu; { cfg "80;90" && ninja -C build/gpu -j16 flashcpp_tests flashcpp_fwd_tflops; } >> "$OUT/build.log" 2>&1; } ||
    { tail -30 "$OUT/build.log"; exit 1; }
  T=build/gpu/tests/cpp/flashcpp_tests
  P=build/gpu/src/cuda/flashcpp_fwd_tflops
  PV=
fi

timeout 300 "$T" --gtest_filter='CudaForward*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')"
grep -E '^\[  FAILED' "$OUT/tests.log" | head -20
if [ -n "$PV" ] && [ -x "$BIN/flashcpp_tests_variant" ]; then
  timeout 200 "$BIN/flashcpp_tests_variant" --gtest_filter='CudaForward*' > "$OUT/tests_variant.log" 2>&1
  echo "variant tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests_variant.log" | tr '\n' ' ')"
fi

"$P" > "$OUT/tflops.csv" 2>&1
python3 src/cuda/tools/torch_fa2_tflops.py > "$OUT/fa2.csv" 2>&1
[ -n "$PV" ] && [ -x "$PV" ] && "$PV" > "$OUT/tflops_variant.csv" 2>&1
"$P" > "$OUT/tflops_repeat.csv" 2>&1

METRICS=smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
for D in ${NCU_DIMS-128}; do
  timeout 150 ncu --clock-control none -k regex:fwd_kernel --launch-skip 5 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section InstructionStats --metrics "$METRICS" \
    "$P" "$D" > "$OUT/ncu_d$D.txt" 2>&1
done
if [ -n "${NCU_FA2:-}" ]; then
  # FA2's d128 non-causal kernel: 2 cases x 35 launches of d64 come first.
  timeout 120 ncu --clock-control none -k regex:flash_fwd --launch-skip 75 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section InstructionStats --metrics "$METRICS" \
    python3 src/cuda/tools/torch_fa2_tflops.py > "$OUT/ncu_fa2_d128.txt" 2>&1
fi

python3 - "$OUT" <<'EOF'
import csv, os, re, sys
out = sys.argv[1]
def rows(name):
    path = os.path.join(out, name)
    if not os.path.exists(path): return []
    return [r for r in csv.DictReader(l for l in open(path) if "," in l)]
def key(r): return (int(r.get("N", 4096)), int(r["D"]), int(r["causal"]))
ours = {key(r): r for r in rows("tflops.csv") if r.get("tflops")}
fa2 = {key(r): float(r["tflops"]) for r in rows("fa2.csv") if r.get("tflops")}
var = {key(r): r for r in rows("tflops_variant.csv") if r.get("tflops")}
rep = {key(r): float(r["tflops"]) for r in rows("tflops_repeat.csv") if r.get("tflops")}
for name in sorted(n for n in os.listdir(out) if n.startswith("ncu_")):
    path = os.path.join(out, name)
    keep = [l.rstrip() for l in open(path) if re.search(r"Duration|Registers Per|Achieved Occ|smsp__inst_executed.sum|issue_active|hmma|local_op|mem_shared|Warp Cycles Per Issued|L1/TEX Cache|==ERR|error", l)]
    print(f"--- {name}"); print("\n".join(keep[:24]))
print(f"device: {open(os.path.join(out, 'device.txt')).read().strip()}")
print("N     D    causal  flashcpp  fa2     ratio  repeat  variant(kernel: tflops)")
for k in sorted(ours):
    o = float(ours[k]["tflops"]); f = fa2.get(k, float("nan"))
    v = var.get(k)
    vs = f"{v['kernel']}: {float(v['tflops']):.1f}" if v else ""
    print(f"{k[0]:<6}{k[1]:<5}{k[2]:<8}{o:<10.1f}{f:<8.1f}{o / f:<7.2f}{rep.get(k, float('nan')):<8.1f}{vs}")
print("kernels:", sorted({r["kernel"] for r in ours.values()}))
EOF
