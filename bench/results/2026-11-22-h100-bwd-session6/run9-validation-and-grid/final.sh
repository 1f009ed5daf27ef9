R=$OUT/wf; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
BENCH_ARGS="--modes bwd,fwd+bwd --heads-dims 64,128,256 --seqlens 512,2k,8k,16k --causal both --impls flashcpp,cudnn,fa2 --no-plots" timeout 585 bash scripts/gpu_workflow.sh $R build test sanitize python bench > $R/workflow.out 2>&1
echo "rc=$?"
rm -f $R/logs/build-output.log
tar czf $OUT/r.tgz -C $OUT wf; rm -rf $R/bench/*.png
cat $R/summary.txt; tail -40 $R/bench/table.txt 2>/dev/null
