# session 5 run 4: sustained loops, SM clock and power: flashcpp vs cuDNN backward; per-kernel times at natural clocks
B=build/sub; R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $R/device.txt
(cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=ON -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128" -DPython_EXECUTABLE=$(command -v python3) && cmake --build $B -j 16) > $R/build.log 2>&1; echo "build rc=$? ${SECONDS}s"
export PYTHONPATH=$PWD/$B/python
timeout 60 python3 build/devstage/clocks.py 128 2048 8 16 2>&1 | tee $R/clocks_d128_2k.txt
timeout 60 python3 build/devstage/clocks.py 128 8192 2 16 2>&1 | tee $R/clocks_d128_8k.txt
timeout 60 python3 build/devstage/clocks.py 64 2048 8 32 2>&1 | tee $R/clocks_d64_2k.txt
pack
for N in 2048 8192; do for impl in flashcpp cudnn; do
timeout 60 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second --csv python3 bench/sdpa_compare.py --driver --impls $impl --heads-dims 128 --seqlens $N --causal off --modes bwd --driver-iters 1 > $R/ncu_${impl}_d128_$N.csv 2>&1; echo "== $impl D128 N$N"; python3 -c "
import csv,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
h=rows[0]; k=h.index('Kernel Name'); v=h.index('Metric Value'); m=h.index('Metric Name')
[print(r[k][:60], r[m][:30], r[v]) for r in rows[1:]]" $R/ncu_${impl}_d128_$N.csv | tail -8; done; done; pack
