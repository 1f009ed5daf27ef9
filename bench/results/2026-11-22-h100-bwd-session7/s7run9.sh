# Session 7 run 9: dK/dV stored with TMA from shared memory (split-by-keys tiles), A/B against
# main, with racecheck on the patched tree; 3 rounds.
x=s7_tma_epilogue
AB_ROUNDS=3 AB_RACECHECK='CudaSm90Backward.BhsdStrides:CudaSm90Backward.UnseenRowsAndKeysGiveZero:CudaSm90Backward.ReportsBackendAndKernel:CudaSm90Backward.GqaAndMqaHeadDim256' bash scripts/ab_bench.sh $OUT/$x build/devstage/$x.patch > $OUT/$x.log 2>&1; echo "$x rc=$?"
tar czf $OUT/r.tgz -C $OUT $x $x.log
cat $OUT/$x.log | grep -v "^mode\|^bwd"; cat $OUT/$x/summary.txt
