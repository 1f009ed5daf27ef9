R=$OUT/r; mkdir -p $R
cmake -S . -B build/p -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=ON -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 -DFLASHCPP_HEAD_DIMS=128 -DPython_EXECUTABLE=$(command -v python3) > $R/build.log 2>&1 && cmake --build build/p -j 16 >> $R/build.log 2>&1; echo "build rc=$? ${SECONDS}s"
export PYTHONPATH=$PWD/build/p/python
for n in 8192 2048; do
python3 scripts/profile.py --impl flashcpp --kernel 'regex:bwd_kernel' --D 128 --N $n --mode bwd --iters 1 --out $R/fc_$n > $R/fc_$n.txt 2>&1; echo "fc rc=$?"
python3 scripts/profile.py --impl cudnn --kernel 'regex:flash_bprop' --D 128 --N $n --mode bwd --iters 1 --out $R/cu_$n > $R/cu_$n.txt 2>&1; echo "cu rc=$?"
done
for f in $R/*.ncu-rep $R/*/report.ncu-rep; do [ -f $f ] && ncu --import $f --page raw --csv > ${f%.ncu-rep}.fullraw.csv 2>/dev/null; done
tar czf $OUT/r.tgz -C $OUT r
paste <(cut -c1-70 $R/fc_8192.txt) <(cut -c40-70 $R/cu_8192.txt) | tail -45
