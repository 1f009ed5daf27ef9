# session 5 run 7 (experiment): dQ added to dq_accum with float4 reductions from registers (d64, d128) against HEAD (smem stage + bulk reduction), same machine
B=build/sub; R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
mkdir -p /tmp/base && tar cf - --exclude=./build . | tar xf - -C /tmp/base && (cd /tmp/base && patch -R -p1 -s < $OLDPWD/build/devstage/s5x.patch) || { echo "patch failed"; exit 1; }
(cd /tmp/base && cmake -S . -B build/base -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=ON -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128" -DPython_EXECUTABLE=$(command -v python3) > $R/base-build.log 2>&1 && nice cmake --build build/base -j 7 >> $R/base-build.log 2>&1; echo "base build rc=$?" >> $R/base-build.log) &
(cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=ON -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128" -DPython_EXECUTABLE=$(command -v python3) && cmake --build $B -j 9) > $R/build.log 2>&1; echo "build rc=$? ${SECONDS}s"
timeout 60 $B/tests/cpp/flashcpp_tests --gtest_filter='CudaSm90Backward.*:CudaBackward.*:-*256*' > $R/test.log 2>&1; echo "test rc=$?"; grep -E "FAILED|PASSED" $R/test.log | head; pack
wait; tail -1 $R/base-build.log; echo "${SECONDS}s"
for who in new base new2 base2; do
  case $who in new*) export PYTHONPATH=$PWD/$B/python;; *) export PYTHONPATH=/tmp/base/build/base/python;; esac
  timeout 60 python3 bench/sdpa_compare.py --out $R/bench-$who --modes bwd --heads-dims 64,128 --seqlens 2k,8k,16k --impls flashcpp,cudnn --no-plots > $R/bench-$who.log 2>&1; echo "bench $who rc=$? ${SECONDS}s"; pack
done
paste <(cut -c1-62 $R/bench-new/table.txt) <(cut -c45- $R/bench-base/table.txt) | tail -13
paste <(cut -c1-62 $R/bench-new2/table.txt) <(cut -c45- $R/bench-base2/table.txt) | tail -12
