# For the next session (not run yet): the persistent backward v3 against main, same machine.
# From the repository root on the GPU machine (carry .deps):
#   bash bench/results/2026-11-22-h100-bwd-session5/experiments/persistent-bwd-v3-ab.sh
# "new" = this tree with persistent-bwd-v3.patch applied, "base" = this tree.
X=bench/results/2026-11-22-h100-bwd-session5/experiments
R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
conf() { cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=ON -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128;256" -DPython_EXECUTABLE=$(command -v python3); }
mkdir -p /tmp/new && tar cf - --exclude=./build . | tar xf - -C /tmp/new && (cd /tmp/new && patch -p1 -s < $X/persistent-bwd-v3.patch) || { echo "patch failed"; exit 1; }
(conf build/base > $R/base-build.log 2>&1 && nice cmake --build build/base -j 7 >> $R/base-build.log 2>&1; echo "base build rc=$?" >> $R/base-build.log) &
(cd /tmp/new && conf build/new && cmake --build build/new -j 9) > $R/new-build.log 2>&1; echo "new build rc=$? ${SECONDS}s"
grep -A3 "bwd_kernel" $R/new-build.log | grep -E "spill" | sort | uniq -c
timeout 90 /tmp/new/build/new/tests/cpp/flashcpp_tests --gtest_filter='CudaSm90Backward.*' > $R/new-tests.log 2>&1; echo "new tests rc=$?"; grep -E "^\[  (PASSED|SKIPPED|FAILED) " $R/new-tests.log | head; pack
timeout 90 compute-sanitizer --tool racecheck /tmp/new/build/new/tests/cpp/flashcpp_tests --gtest_filter='CudaSm90Backward.UnseenRowsAndKeysGiveZero:CudaSm90Backward.BhsdStrides' > $R/new-racecheck.log 2>&1; echo "racecheck rc=$?"; grep "RACECHECK SUMMARY" $R/new-racecheck.log; pack
wait; tail -1 $R/base-build.log
for who in new base; do
  if [ $who = new ]; then export PYTHONPATH=/tmp/new/build/new/python; else export PYTHONPATH=$PWD/build/base/python; fi
  timeout 120 python3 bench/sdpa_compare.py --out $R/bench-$who --modes bwd --heads-dims 64,128,256 --seqlens 512,2k,16k --impls flashcpp,cudnn --no-plots > $R/bench-$who.log 2>&1; echo "bench $who rc=$? ${SECONDS}s"; pack
done
paste <(cut -c1-62 $R/bench-new/table.txt) <(cut -c45- $R/bench-base/table.txt) | tail -18
