# Session 7 run 1: wave quantization check. Backward time against the CTA count (64 x H CTAs at
# these shapes, 132 SMs): H*64 = 3840 (29.1 or 14.5 waves), 3968, 4096, 4224 (exact waves).
R=$OUT/q; mkdir -p $R; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
cmake -S . -B build/q -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCPP_CUDA=ON -DFLASHCPP_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(command -v python3) -DFLASHCPP_CUDA_ARCHS=90a -DFLASHCPP_DTYPES=bf16 "-DFLASHCPP_HEAD_DIMS=64;128" > $R/build.log 2>&1 && cmake --build build/q -j 16 >> $R/build.log 2>&1; echo "build rc=$? ${SECONDS}s"
export PYTHONPATH=build/q/python PYTHONUNBUFFERED=1
for hid in 3840 3968 4096 4224; do
  python3 bench/sdpa_compare.py --no-plots --modes bwd --heads-dims 64,128 --seqlens 2k,8k --tokens 8192 --hidden $hid --causal off --impls flashcpp,cudnn --out $R/h$hid > $R/h$hid.log 2>&1
  echo "hidden $hid rc=$?"
done
python3 - <<'PY'
import csv, glob, os
out = os.environ["OUT"] + "/q"
rows = []
for f in sorted(glob.glob(out + "/h*/*.csv")):
    rows += list(csv.DictReader(open(f)))
print("impl D N H ctas ms tflops")
for r in sorted(rows, key=lambda r: (r["impl"], int(r["D"]), int(r["Nq"]), int(r["H"]))):
    kb = (int(r["Nk"]) + 127) // 128
    print(r["impl"], r["D"], r["Nq"], r["H"], kb * int(r["H"]) * int(r["B"]), r["ms"], r["tflops"])
PY
tar czf $OUT/r.tgz -C $OUT q
