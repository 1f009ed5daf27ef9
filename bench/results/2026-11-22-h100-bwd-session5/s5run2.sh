# session 5 run 2: + masked/unmasked split, d64 and d128
B=build/gpu; R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
mkdir -p /tmp/base && tar cf - --exclude=./build . | tar xf - -C /tmp/base && (cd /tmp/base && patch -R -p1 -s < $OLDPWD/build/devstage/s5.patch) || { echo "patch failed"; exit 1; }
(cd /tmp/base && cmake -S . -B build/base -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=ON -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128" -DPython_EXECUTABLE=$(command -v python3) > $R/base-build.log 2>&1 && nice cmake --build build/base -j 6 >> $R/base-build.log 2>&1; echo "base build rc=$?" >> $R/base-build.log) &
timeout 280 scripts/gpu_workflow.sh $R/wf build > $R/wf-build.log 2>&1 || { tail -30 $R/wf-build.log; grep -B2 -A10 "error" $R/wf/logs/build-output.log | head -60; pack; exit 1; }
grep -A3 "bwd_kernel\|bwd_dq_convert\|bwd_prepass" $R/wf/logs/ptxas.log | grep -E "spill" | sort | uniq -c | head
timeout 100 $B/tests/cpp/flashcpp_tests --gtest_filter='CudaSm90Backward.*:CudaBackward.*' > $R/test.log 2>&1; echo "test rc=$?"; grep -E "FAILED|PASSED" $R/test.log | head; pack
wait; tail -1 $R/base-build.log
for who in new base; do
  if [ $who = new ]; then export PYTHONPATH=$PWD/$B/python; else export PYTHONPATH=/tmp/base/build/base/python; fi
  timeout 100 python3 bench/sdpa_compare.py --out $R/bench-$who --modes bwd --heads-dims 64,128 --seqlens 2k,8k,16k --impls flashcpp,cudnn --no-plots > $R/bench-$who.log 2>&1; echo "bench $who rc=$?"; pack
done
paste <(cut -c1-62 $R/bench-new/table.txt) <(cut -c45- $R/bench-base/table.txt) | tail -14
