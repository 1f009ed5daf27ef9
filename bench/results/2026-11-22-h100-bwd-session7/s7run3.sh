# Session 7 run 3: two patches against main, each its own A/B (alternating rounds):
#   B  = STSM for dS + no proxy fence after the dQ stage (the next dS fence covers it)
#   D2 = B + statistics loaded before the accumulator waits + the dS fence after dK's issue
for x in s7_stsm_fence s7_d2; do
  AB_ROUNDS=2 bash scripts/ab_bench.sh $OUT/$x build/devstage/$x.patch > $OUT/$x.log 2>&1; echo "$x rc=$?"
done
tar czf $OUT/r.tgz -C $OUT s7_stsm_fence s7_d2 s7_stsm_fence.log s7_d2.log
for x in s7_stsm_fence s7_d2; do echo "== $x"; grep "tests (new" $OUT/$x.log; cat $OUT/$x/summary.txt; done
