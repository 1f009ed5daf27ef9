# session 5 run 3: per-kernel times (ncu gpu__time_duration) of one backward, flashcpp and cuDNN, D128 and D64 at N = 2k
B=build/gpu; R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
if ! ls $B/python/flashcpp* >/dev/null 2>&1; then timeout 280 scripts/gpu_workflow.sh $R/wf build > $R/wf-build.log 2>&1 || { tail -30 $R/wf-build.log; pack; exit 1; }; fi
export PYTHONPATH=$PWD/$B/python
for D in 128 64; do for impl in flashcpp cudnn; do
timeout 60 ncu --profile-from-start off --metrics gpu__time_duration.sum --csv python3 bench/sdpa_compare.py --driver --impls $impl --heads-dims $D --seqlens 2048 --causal off --modes bwd --driver-iters 1 > $R/ncu_${impl}_d$D.csv 2>&1; echo "== $impl D$D"; python3 -c "
import csv,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
h=rows[0]; k=h.index('Kernel Name'); v=h.index('Metric Value')
[print(r[k][:80], r[v]) for r in rows[1:]]" $R/ncu_${impl}_d$D.csv | tail -8; done; done; pack
