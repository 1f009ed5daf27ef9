# Session 7 run 5: validation of main (full build, ctest, sanitizers, Python tests).
R=$OUT/wf; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
timeout 585 bash scripts/gpu_workflow.sh $R build test sanitize python > $R/workflow.out 2>&1
echo "rc=$?"
rm -f $R/logs/build-output.log
tar czf $OUT/r.tgz -C $OUT wf
cat $R/summary.txt; grep -c "bytes spill" $R/logs/ptxas.log; grep -B3 "[1-9][0-9]* bytes spill stores" $R/logs/ptxas.log | grep -o "bwd_kernel[^']*\|fwd_kernel[^']*\|[0-9]* bytes spill stores" | head -20
