# Session 7 run 4: a share of the exponentials on the FMA pipe (exp2_fma), every 2nd and every
# 4th column pair, each against main (42e9aca), alternating rounds.
for x in s7_fmaexp2 s7_fmaexp4; do
  AB_ROUNDS=2 bash scripts/ab_bench.sh $OUT/$x build/devstage/$x.patch > $OUT/$x.log 2>&1; echo "$x rc=$?"
done
tar czf $OUT/r.tgz -C $OUT s7_fmaexp2 s7_fmaexp4 s7_fmaexp2.log s7_fmaexp4.log
for x in s7_fmaexp2 s7_fmaexp4; do echo "== $x"; grep "tests (new" $OUT/$x.log; cat $OUT/$x/summary.txt; done
