# session 4 run 3 (final): build all, full ctest, torch tests, bwd + fwd+bwd bench all D vs cuDNN and FA2
B=build/gpu; R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
timeout 200 scripts/gpu_workflow.sh $R/wf build > $R/wf-build.log 2>&1 || { tail -30 $R/wf-build.log; pack; exit 1; }
grep -A3 "bwd_kernel\|bwd_dq_convert\|bwd_prepass" $R/wf/logs/ptxas.log | grep -E "spill" | sort | uniq -c | head
timeout 130 scripts/gpu_workflow.sh $R/wf test > $R/wf-test.log 2>&1; echo "test rc=$?"; tail -2 $R/wf/summary.txt; pack
export PYTHONPATH=$PWD/$B/python
timeout 60 python3 -m pytest -q tests/python/test_torch_cuda.py tests/python/test_transformers.py > $R/pytest.log 2>&1; echo "pytest rc=$?"; tail -1 $R/pytest.log; pack
timeout 190 python3 bench/sdpa_compare.py --out $R/bench --modes bwd,fwd+bwd --heads-dims 64,128,256 --seqlens 512,2k,8k,16k --impls flashcpp,cudnn,fa2 --no-plots > $R/bench.log 2>&1; echo "bench rc=$?"; pack
cat $R/bench/table.txt | tail -50
