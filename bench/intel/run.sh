#!/bin/bash
# Usage: make a folder with this script, gpt2_torch.py, stripped build/kiln, kiln_cpu_tests, kiln_gemm_bench
# (and for ab.sh a second kiln as kiln_old) and lib/ with their Debian libraries (ldd build/kiln), copy it to
# the machine, run it there. bench/RESULTS.md "An Intel Xeon ..." has what it printed.
# Intel measurements on the lent machine: kernel tests, gemm % of peak, GPT-2-shaped model kiln vs torch eager
cd "$(dirname "$0")"; D=$PWD; export LD_LIBRARY_PATH=$D/lib; O=${OUT:-/tmp/out}; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
lscpu | grep -E "Model name|Flags" | cut -c1-200
./kiln --version
[ -n "$SKIPK" ] || { echo "== kiln_cpu_tests"; timeout 120 taskset -c 0-1 ./kiln_cpu_tests --gtest_brief=1 2>&1 | tail -15; }
[ -n "$SKIPK" ] || { echo "== gemm bench"; timeout 150 taskset -c 2 ./kiln_gemm_bench 0.25 2>&1 | tail -40; }
echo "== gemm f32 rows"; timeout 150 taskset -c 2 ./kiln_gemm_bench 0.2 2>&1 | grep -v "^qd8" | head -60

for seq in 128 1; do
  W=/tmp/g$seq; taskset -c 4-5 /opt/torch/.venv/bin/python gpt2_torch.py $W $seq || continue
  ./kiln lower --spec $W/model_spec.json --backend xnnpack --out $W/x.pte -q || continue
  ./kiln lower --spec $W/model_spec.json --backend xnnpack --quantize 8da4w --out $W/q.pte -q
  ./kiln run $W/x.pte -i $W/in.npy -o $W/got.npy 2>&1 | tail -2
  /opt/torch/.venv/bin/python -c "import numpy as n;a=n.load('$W/got.npy');b=n.load('$W/ref.npy');print('kiln vs eager max abs diff',abs(a-b).max(),'max|ref|',abs(b).max())" 2>&1 | tail -1
  for th in 1 2; do for eng in kiln xnnpack; do
    echo "kiln seq $seq threads $th engine $eng: $(taskset -c 4-5 ./kiln bench $W/x.pte -i $W/in.npy --iters 15 --threads $th --engine $eng --json)"
  done; echo "kiln 8da4w seq $seq threads $th: $(taskset -c 4-5 ./kiln bench $W/q.pte -i $W/in.npy --iters 15 --threads $th --json)"; done
done
