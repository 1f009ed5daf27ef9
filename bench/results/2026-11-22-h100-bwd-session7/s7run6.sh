# Session 7 run 6: the benchmark grid on main (sm90a/bf16 build of D 64/128/256), rounds of 2.
R=$OUT/grid; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
cmake -S . -B build/g -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(command -v python3) -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128;256" > $R/build.log 2>&1 && cmake --build build/g -j 16 >> $R/build.log 2>&1; echo "build rc=$? ${SECONDS}s"
PYTHONPATH=build/g/python timeout 480 python3 bench/sdpa_compare.py --modes bwd,fwd+bwd --heads-dims 64,128,256 --seqlens 512,2k,8k,16k --causal both --impls flashcpp,cudnn,fa2 --no-plots --out $R/bench > $R/bench.log 2>&1; echo "bench rc=$? ${SECONDS}s"
tar czf $OUT/r.tgz -C $OUT grid
tail -60 $R/bench/table.txt
