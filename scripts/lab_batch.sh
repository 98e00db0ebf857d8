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
# 1. sm80_mma: a k-tile's interior copies spread over k-steps 0..2 (copy_spread) instead of A's at step 0 and B's at
#    step 1; scripts/mma_ceiling.py measured +3-4% for spreading in the bare loop. The 4096^3 and 8192^3 sweep leaders.
step copy_spread python3 scripts/ab_lab.py --set copy_spread=true --rounds 7 --no-winner --shapes sq4096,sq8192 \
  --config scripts/configs/sm80_128x256x64_s4.yaml --config scripts/configs/sm80_128x128x64_s3.yaml \
  --config scripts/configs/sm80_256x128x64_s3.yaml --verify 1000x3000x4104:rc --verify 4097x1000x3000:cr
