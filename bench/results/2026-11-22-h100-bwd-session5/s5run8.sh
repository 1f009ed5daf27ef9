# session 5 run 8 (validation of the final code: + d64 dQ reductions from registers): full build, full ctest, sanitizers, torch tests
B=build/gpu; R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
timeout 280 scripts/gpu_workflow.sh $R/wf build > $R/wf-build.log 2>&1 || { tail -30 $R/wf-build.log; grep -B2 -A10 "error" $R/wf/logs/build-output.log | head -60; pack; exit 1; }
echo "build done ${SECONDS}s"; grep -A3 "bwd_kernel\|bwd_dq_convert\|bwd_prepass" $R/wf/logs/ptxas.log | grep -E "spill" | sort | uniq -c | head
timeout 150 scripts/gpu_workflow.sh $R/wf test > $R/wf-test.log 2>&1; echo "test rc=$? ${SECONDS}s"; tail -3 $R/wf/logs/test.log; pack
SANITIZE_FILTER='CudaSm90Backward.UnseenRowsAndKeysGiveZero:CudaSm90Backward.BhsdStrides:CudaSm90Backward.GqaAndMqaHeadDim256' timeout 120 scripts/gpu_workflow.sh $R/wf sanitize > $R/wf-sanitize.log 2>&1; echo "sanitize rc=$? ${SECONDS}s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $R/wf/logs/sanitize.log; pack
export PYTHONPATH=$PWD/$B/python
timeout 200 python3 -m pytest -q tests/python/test_torch_cuda.py tests/python/test_transformers.py > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -1 $R/pytest.log; pack
cat $R/wf/summary.txt
