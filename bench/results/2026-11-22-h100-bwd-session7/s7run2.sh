# Session 7 run 2: STSM for the dS store, A/B against main; then Nsight Compute source counters
# (per-SASS stall samples) of the patched d128 kernel at N = 8k.
R=$OUT/ab; AB_ROUNDS=2 bash scripts/ab_bench.sh $R build/devstage/stsm.patch > $OUT/ab.log 2>&1; echo "ab rc=$?"
P=$OUT/prof; mkdir -p $P
PYTHONPATH=/tmp/ab/new/build/python timeout 200 python3 scripts/profile.py --impl flashcpp --kernel 'regex:bwd_kernel' --D 128 --N 8192 --mode bwd --iters 1 --out $P/fc --extra "--section SourceCounters --section InstructionStats" > $P/fc.txt 2>&1; echo "prof rc=$?"
ncu --import $P/fc/report.ncu-rep --page source --csv --print-source sass > $P/source_sass.csv 2> $P/source_err.txt; echo "source rc=$? $(wc -l < $P/source_sass.csv) lines"
tar czf $OUT/r.tgz -C $OUT ab prof ab.log
tail -5 $P/source_err.txt; cat $R/summary.txt
