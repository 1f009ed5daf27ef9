# session 4 run 5: the final commit (tile field dq_turns) on the GPU: build, backward tests, d64/d128 bwd bench
B=build/gpu; R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
timeout 220 scripts/gpu_workflow.sh $R/wf build > $R/wf-build.log 2>&1 || { tail -30 $R/wf-build.log; pack; exit 1; }
grep -A3 "bwd_kernel\|bwd_dq_convert\|bwd_prepass" $R/wf/logs/ptxas.log | grep -E "spill" | sort | uniq -c | head
timeout 100 $B/tests/cpp/flashcpp_tests --gtest_filter='CudaSm90Backward.*:CudaBackward.*' > $R/test.log 2>&1; echo "test rc=$?"; grep -E "FAILED|PASSED" $R/test.log | head; pack
export PYTHONPATH=$PWD/$B/python
timeout 100 python3 bench/sdpa_compare.py --out $R/bench --modes bwd --heads-dims 64,128 --seqlens 2k,16k --impls flashcpp,cudnn --no-plots > $R/bench.log 2>&1; echo "bench rc=$?"; pack
cat $R/bench/table.txt | tail -10
