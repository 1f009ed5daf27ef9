# session 5 run 10: backward tests in a subset build (sm90a, bf16, d64/d128: unbuilt cases skip) and the full ctest in a full build
R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
(cmake -S . -B build/sub -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128" > $R/sub-build.log 2>&1 && nice cmake --build build/sub -j 6 >> $R/sub-build.log 2>&1; echo "sub build rc=$?" >> $R/sub-build.log) &
timeout 280 scripts/gpu_workflow.sh $R/wf build > $R/wf-build.log 2>&1 || { tail -30 $R/wf-build.log; pack; exit 1; }
echo "build done ${SECONDS}s"
timeout 150 scripts/gpu_workflow.sh $R/wf test > $R/wf-test.log 2>&1; echo "test rc=$? ${SECONDS}s"; grep -E "tests passed|Total Test" $R/wf/logs/test.log; pack
build/gpu/tests/cpp/flashcpp_tests --gtest_filter='CudaSm90Backward.*:CudaBackward.*' > $R/full-bwd-tests.log 2>&1; echo "full bwd tests rc=$?"; grep -E "PASSED|SKIPPED|FAILED" $R/full-bwd-tests.log | head
wait; tail -1 $R/sub-build.log
timeout 100 build/sub/tests/cpp/flashcpp_tests --gtest_filter='CudaSm90Backward.*:CudaBackward.*' > $R/sub-bwd-tests.log 2>&1; echo "subset bwd tests rc=$?"; grep -E "^\[  (PASSED|SKIPPED|FAILED) " $R/sub-bwd-tests.log | head -30; pack
timeout 120 build/sub/tests/cpp/flashcpp_tests > $R/sub-all-tests.log 2>&1; echo "subset all tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |tests ran" $R/sub-all-tests.log | head -20; grep -c "^\[  SKIPPED \]" $R/sub-all-tests.log; pack
