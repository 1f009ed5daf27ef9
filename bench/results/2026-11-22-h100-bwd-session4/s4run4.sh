# session 4 run 4: torch tests (longer timeout), Nsight Compute profiles of the d64 backward (flashcpp vs cuDNN, N = 4k)
B=build/gpu; R=$OUT/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C $OUT r; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
[ -f $B/python/flashcpp/__init__.py ] || ls $B/python | head
if ! ls $B/python/flashcpp* >/dev/null 2>&1; then timeout 200 scripts/gpu_workflow.sh $R/wf build > $R/wf-build.log 2>&1 || { tail -30 $R/wf-build.log; pack; exit 1; }; fi
export PYTHONPATH=$PWD/$B/python
timeout 100 python3 scripts/profile.py --kernel 'regex:bwd_kernel' --impl flashcpp --D 64 --N 4096 --mode bwd --out $R/prof_fc_d64 > $R/prof_fc_d64.txt 2>&1
timeout 100 python3 scripts/profile.py --kernel 'regex:bprop' --impl cudnn --D 64 --N 4096 --mode bwd --out $R/prof_cudnn_d64 > $R/prof_cudnn_d64.txt 2>&1
rm -f $R/prof_*/*.ncu-rep; pack
timeout 240 python3 -m pytest -q tests/python/test_torch_cuda.py tests/python/test_transformers.py > $R/pytest.log 2>&1; echo "pytest rc=$?"; tail -1 $R/pytest.log; pack
tail -40 $R/prof_fc_d64.txt; tail -40 $R/prof_cudnn_d64.txt
