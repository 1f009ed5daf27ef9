# session 4 run 1: d64 dQ turns. build, sm90/sm80 bwd tests, sanitizer subset, bwd bench D64/D128, ncu per kernel d64 2k
B=build/gpu; R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
timeout 200 scripts/gpu_workflow.sh $R/wf build > $R/wf-build.log 2>&1 || { tail -30 $R/wf-build.log; grep -B2 -A10 "error" $R/wf/logs/build-output.log | head -60; pack; exit 1; }
grep -A3 "bwd_kernel\|bwd_dq_convert\|bwd_prepass" $R/wf/logs/ptxas.log | grep -E "spill" | sort | uniq -c | head
timeout 120 $B/tests/cpp/flashcpp_tests --gtest_filter='CudaSm90Backward.*:CudaBackward.*' > $R/test.log 2>&1; echo "test rc=$?"; grep -E "FAILED|PASSED" $R/test.log | head; pack
SANITIZE_FILTER='CudaSm90Backward.UnseenRowsAndKeysGiveZero:CudaSm90Backward.ReportsBackendAndKernel' timeout 100 scripts/gpu_workflow.sh $R/wf sanitize > $R/wf-sanitize.log 2>&1; echo "sanitize rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $R/wf/logs/sanitize.log; pack
export PYTHONPATH=$PWD/$B/python
timeout 150 python3 bench/sdpa_compare.py --out $R/bench --modes bwd --heads-dims 64,128 --seqlens 512,2k,8k,16k --impls flashcpp,cudnn --no-plots > $R/bench.log 2>&1; echo "bench rc=$?"; pack
timeout 60 ncu --profile-from-start off --metrics gpu__time_duration.sum --csv python3 bench/sdpa_compare.py --driver --impls flashcpp --heads-dims 64 --seqlens 2048 --causal off --modes bwd --driver-iters 1 > $R/ncu_d64.csv 2>&1; python3 -c "
import csv,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
h=rows[0]; k=h.index('Kernel Name'); v=h.index('Metric Value')
[print(r[k][:50], r[v]) for r in rows[1:]]" $R/ncu_d64.csv | tail -8; pack
cat $R/bench/table.txt | tail -30
