#!/bin/bash
# The device experiments prepared but not yet run (docs/perf-notes.md, "What is left"), in one device call:
#   run(command="bash scripts/lab_batch.sh", carry=[".whl"])   after ../shared/tools/device-prep has filled .whl/
# Each step writes its JSON and log under $OUT/<step>/ and prints the table that ends its log.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || { echo "lab_batch: the optuna wheels in .whl/ did not install"; exit 2; }
OUT=${OUT:-lab_out}
step() {
  tag=$1; shift
  mkdir -p "$OUT/$tag"
  timeout 200 "$@" --out "$OUT/$tag" > "$OUT/$tag/log.txt" 2>&1
  echo "== $tag rc $?"; tail -14 "$OUT/$tag/log.txt"
}
# 1. Energy per GEMM beside cuBLAS, sustained (scripts/power_probe.py; its first run's sq4096 cuBLAS row was a 44 ms
#    burst, fixed since): at the power cap, is our 4096^3 winner slower at cuBLAS's energy per product, or does it
#    spend more? With cuBLAS's own tile and the store warp (2.2% faster than the winner sustained).
step power python3 scripts/power_probe.py --shapes sq4096,llm_qkv,sq8192 --rounds 3 --seconds 1.5 \
  --config scripts/configs/sm90_256x128_s4_cl1x2.yaml --config scripts/configs/sm90_128x256_s3_sw.yaml
