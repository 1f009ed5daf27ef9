#!/usr/bin/env bash
# Same-machine A/B of a kernel change: the working tree ("base") against the working tree with a
# patch applied ("new"). Both are built the same way, "new" runs its tests (and racecheck), then
# the two are benchmarked in alternating order so that clock and power drift fall on both sides.
#
#   dev/ab_bench.sh OUT_DIR PATCH [sdpa_compare.py args ...]
#
# To compare the tree against an older revision instead, make the patch here with
#   git diff BASE_REV -- src > build/devstage/ab.patch
# and set AB_REVERSE=1: "base" is then the tree with the patch reversed (BASE_REV), "new" the tree.
# Environment:
#   AB_CMAKE_ARGS  extra CMake flags (default: sm90a, bf16, head dims 64;128;256)
#   AB_TESTS       gtest filter run on "new" (default CudaBackward*/sm90; "" skips)
#   AB_RACECHECK   gtest filter run on "new" under compute-sanitizer racecheck ("" skips)
#   AB_ROUNDS      benchmark rounds, each runs both trees (default 2)
# Prints ratios new/base (time) per cell last (also OUT_DIR/summary.txt); OUT_DIR/ab.csv has
# every cell of every round. The device tool returns a limited number of files: pack OUT_DIR
# (tar) when running it there.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${1:?usage: dev/ab_bench.sh OUT_DIR PATCH [sdpa_compare args]}"
patch_file="$(realpath "${2:?usage: dev/ab_bench.sh OUT_DIR PATCH [sdpa_compare args]}")"
shift 2
bench_args=("$@")
((${#bench_args[@]})) || bench_args=(--modes bwd --heads-dims 64,128 --seqlens 2k,8k --impls flashcpp,cudnn)
python="${PYTHON:-python3}"
cmake_args="${AB_CMAKE_ARGS:--DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 -DFLASHCPP_HEAD_DIMS=64;128;256}"
tests="${AB_TESTS-CudaBackward*/sm90}"
racecheck="${AB_RACECHECK-}"
rounds="${AB_ROUNDS:-2}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1

# Two source trees outside the repository: /tmp/ab/base and /tmp/ab/new.
rm -rf /tmp/ab && mkdir -p /tmp/ab/base /tmp/ab/new
for who in base new; do tar cf - --exclude=./build . | tar xf - -C /tmp/ab/$who; done
if [[ "${AB_REVERSE:-0}" == 1 ]]; then
  (cd /tmp/ab/base && patch -p1 -R -s <"$patch_file") || { echo "patch -R failed"; exit 2; }
else
  (cd /tmp/ab/new && patch -p1 -s <"$patch_file") || { echo "patch failed"; exit 2; }
fi

build_tree() {  # build_tree WHO JOBS
  local dir=/tmp/ab/$1
  # shellcheck disable=SC2086  # cmake_args is a list of flags
  cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON \
    -DFLASHCPP_BUILD_PYTHON=ON -DFLASHCPP_PTXAS_VERBOSE=ON -DPython_EXECUTABLE="$(command -v "$python")" \
    $cmake_args && cmake --build "$dir/build" -j "$2"
}
jobs=$(nproc)
start=$SECONDS
build_tree base $((jobs / 2)) >"$out/build-base.log" 2>&1 &
base_pid=$!
build_tree new $((jobs - jobs / 2)) >"$out/build-new.log" 2>&1
new_rc=$?
wait $base_pid
base_rc=$?
echo "build: new rc=$new_rc base rc=$base_rc ($((SECONDS - start)) s)"
((new_rc == 0 && base_rc == 0)) || { tail -n 30 "$out/build-new.log" "$out/build-base.log"; exit 3; }
for who in base new; do
  # every kernel of the build, sm80 fallbacks compiled for sm_90 included
  echo "spills ($who): $(grep -h "bytes spill" "$out/build-$who.log" | grep -cv " 0 bytes spill stores, 0 bytes spill loads") kernels with spills"
done

test_bin=/tmp/ab/new/build/tests/cpp/flashcpp_tests
if [[ -n "$tests" ]]; then
  "$test_bin" --gtest_filter="$tests" >"$out/tests-new.log" 2>&1
  echo "tests (new, $tests): rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)  \]' "$out/tests-new.log" | tr '\n' ' ')"
fi
if [[ -n "$racecheck" ]]; then
  compute-sanitizer --tool racecheck --error-exitcode 3 "$test_bin" --gtest_filter="$racecheck" >"$out/racecheck-new.log" 2>&1
  echo "racecheck (new): rc=$? $(grep -h 'RACECHECK SUMMARY' "$out/racecheck-new.log")"
fi

for ((round = 1; round <= rounds; round++)); do
  order=(new base)
  ((round % 2)) || order=(base new)
  for who in "${order[@]}"; do
    PYTHONPATH=/tmp/ab/$who/build/python "$python" bench/sdpa_compare.py --no-plots \
      --out "$out/bench-$who-$round" "${bench_args[@]}" >"$out/bench-$who-$round.log" 2>&1 ||
      echo "bench $who round $round failed: $(tail -n 2 "$out/bench-$who-$round.log")"
  done
done

"$python" - "$out" "$rounds" <<'PY' | tee "$out/summary.txt"
import csv, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = []  # (who, round, impl, cell, ms)
for who in ("base", "new"):
    for r in range(1, rounds + 1):
        try:
            with open(f"{out}/bench-{who}-{r}/results.csv") as f:
                for row in csv.DictReader(f):
                    cell = (row["mode"], row["dtype"], int(row["D"]), int(row["causal"]), int(row["Nq"]))
                    rows.append((who, r, row["impl"], cell, float(row["ms"])))
        except FileNotFoundError:
            pass
with open(f"{out}/ab.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["tree", "round", "impl", "mode", "dtype", "D", "causal", "N", "ms"])
    for who, r, impl, cell, ms in rows:
        w.writerow([who, r, impl, *cell, ms])
cells = sorted({c for _, _, _, c, _ in rows})
peers = sorted({i for _, _, i, _, _ in rows if i != "flashcpp"})
def ms(who, impl, cell):
    v = [m for w_, _, i, c, m in rows if w_ == who and i == impl and c == cell]
    return statistics.median(v) if v else float("nan")
print(f"{'mode':8} {'D':>4} {'mask':>6} {'N':>6} {'base ms':>9} {'new ms':>9} {'new/base':>9}"
      + "".join(f" {'base/' + p:>12} {'new/' + p:>12}" for p in peers))
for cell in cells:
    mode, _, d, causal, n = cell
    b, nw = ms("base", "flashcpp", cell), ms("new", "flashcpp", cell)
    line = f"{mode:8} {d:4} {'causal' if causal else 'none':>6} {n:6} {b:9.3f} {nw:9.3f} {nw / b:9.3f}"
    for p in peers:  # speed-ups over the peer (> 1 is faster), peer timed in both trees' runs
        pm = statistics.median([m for _, _, i, c, m in rows if i == p and c == cell] or [float("nan")])
        line += f" {pm / b:12.3f} {pm / nw:12.3f}"
    print(line)
PY
