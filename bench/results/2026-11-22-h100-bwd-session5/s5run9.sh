# session 5 run 9 (final bench, final code): bwd + fwd+bwd, all D, vs cuDNN and FA2; and bwd d64/d128 against the session-start kernels, same machine
B=build/sub; R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
mkdir -p /tmp/base && tar cf - --exclude=./build . | tar xf - -C /tmp/base && (cd /tmp/base && patch -R -p1 -s < $OLDPWD/build/devstage/s5.patch) || { echo "patch failed"; exit 1; }
(cd /tmp/base && cmake -S . -B build/base -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=ON -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128" -DPython_EXECUTABLE=$(command -v python3) > $R/base-build.log 2>&1 && nice cmake --build build/base -j 6 >> $R/base-build.log 2>&1; echo "base build rc=$?" >> $R/base-build.log) &
(cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=ON -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128;256" -DPython_EXECUTABLE=$(command -v python3) && cmake --build $B -j 12) > $R/build.log 2>&1; echo "build rc=$? ${SECONDS}s"
export PYTHONPATH=$PWD/$B/python
timeout 300 python3 bench/sdpa_compare.py --out $R/bench --modes bwd,fwd+bwd --heads-dims 64,128,256 --seqlens 512,2k,8k,16k --impls flashcpp,cudnn,fa2 --no-plots > $R/bench.log 2>&1; echo "bench rc=$? ${SECONDS}s"; pack
wait; tail -1 $R/base-build.log
for who in new base; do
  if [ $who = new ]; then export PYTHONPATH=$PWD/$B/python; else export PYTHONPATH=/tmp/base/build/base/python; fi
  timeout 60 python3 bench/sdpa_compare.py --out $R/bench-$who --modes bwd --heads-dims 64,128 --seqlens 2k,16k --impls flashcpp,cudnn --no-plots > $R/bench-$who.log 2>&1; echo "bench $who rc=$? ${SECONDS}s"; pack
done
paste <(cut -c1-62 $R/bench-new/table.txt) <(cut -c45- $R/bench-base/table.txt) | tail -10
tail -40 $R/bench/table.txt
