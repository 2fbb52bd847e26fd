#!/bin/bash
# Usage: make a folder with this script, gpt2_torch.py, stripped build/kiln, kiln_cpu_tests, kiln_gemm_bench
# (and for ab.sh a second kiln as kiln_old) and lib/ with their Debian libraries (ldd build/kiln), copy it to
# the machine, run it there. bench/RESULTS.md "An Intel Xeon ..." has what it printed.
# old (KC=768 everywhere) vs new (KC=128 on Intel) kiln on a GPT-2-small-shaped model, alternating; kernel tests
cd "$(dirname "$0")"; export LD_LIBRARY_PATH=$PWD/lib
lscpu | grep "Model name"; ./kiln --version; ./kiln_old --version
timeout 60 ./kiln_cpu_tests --gtest_brief=1 2>&1 | tail -2
timeout 100 taskset -c 3 ./kiln_gemm_bench 0.15 2>&1 | sed -n '/^f32-gemm/,/^f32-gemv/p' | grep -E "avx512|variant"
W=/tmp/g128; taskset -c 4-5 /opt/torch/.venv/bin/python gpt2_torch.py $W 128
./kiln lower --spec $W/model_spec.json --backend xnnpack --out $W/x.pte -q
for th in 1 2; do for r in 1 2 3; do for b in kiln kiln_old; do
  printf "%s threads %s round %s: " $b $th $r
  taskset -c 4-5 ./$b bench $W/x.pte -i $W/in.npy --iters 8 --threads $th --json | grep -E '"median_ms"|f32_gemm"' | tr -d '\n '; echo
done; done; done
