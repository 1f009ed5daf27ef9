R=$OUT/sub; mkdir -p $R
cmake -S . -B build/sub -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=OFF -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128" > $R/build.log 2>&1 && cmake --build build/sub -j 16 --target flashcpp_tests >> $R/build.log 2>&1; echo "build rc=$? ${SECONDS}s"
timeout 300 build/sub/tests/cpp/flashcpp_tests --gtest_filter='Cuda*' > $R/tests.log 2>&1; echo "tests rc=$?"
grep -E "^\[  (PASSED|SKIPPED|FAILED) " $R/tests.log; grep -E "^\[  FAILED  \]|^\[  SKIPPED \]" $R/tests.log | sort | uniq | head -40
grep -m3 "no backward kernel\|no sm80 backward" $R/tests.log | cut -c1-400
tar czf $OUT/r.tgz -C $OUT sub
