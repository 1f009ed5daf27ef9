# Session 7 run 7: a second measurement of the target cells (bwd, D 64/128, N 2k/8k, both masks,
# flashcpp and cuDNN, 3 rounds), and 2-second sustained loops at D128 N = 2k (clocks.py).
R=$OUT/t; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
cmake -S . -B build/g -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(command -v python3) -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128" > $R/build.log 2>&1 && cmake --build build/g -j 16 >> $R/build.log 2>&1; echo "build rc=$? ${SECONDS}s"
export PYTHONPATH=build/g/python
timeout 300 python3 bench/sdpa_compare.py --modes bwd --heads-dims 64,128 --seqlens 2k,8k --causal both --impls flashcpp,cudnn --rounds 3 --no-plots --out $R/bench > $R/bench.log 2>&1; echo "bench rc=$? ${SECONDS}s"
timeout 120 python3 build/devstage/clocks.py 128 2048 8 16 > $R/clocks_d128_2k.txt 2>&1; echo "clocks rc=$?"
tar czf $OUT/r.tgz -C $OUT t
tail -12 $R/bench/table.txt; cat $R/clocks_d128_2k.txt
