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
  echo "== $tag rc $?"; tail -8 "$OUT/$tag/log.txt"
}
# Stream-K range mode costs 11-23 us per launch more than the wave it saves (perf-notes "Stream-K range mode").
# Both steps ran on 2026-11-23 17:31 UTC (perf-notes "Where the cost is"); step 2's change is now the default, so
# re-running it compares the short path with itself. Replace them with the next experiments.
# 1. The range schedule without its fix-up (no partials, flags, adds; D wrong, timed only): is the cost the
#    fix-up, or the schedule itself?
step nofixup python3 scripts/ab_lab.py --no-winner --shapes sq4096,sq8192 --rounds 5 --set sk_no_fixup=true \
  --config scripts/configs/sm90_128x256_s3_streamk.yaml --config scripts/configs/sm90_128x256_s4_streamk.yaml
# 2. The short epilogue path for interior tiles (what data-parallel kernels run; Stream-K keeps the general one).
step epifast python3 scripts/ab_lab.py --no-winner --shapes sq4096,sq8192 --rounds 5 --set epi_fast=true \
  --config scripts/configs/sm90_128x256_s3_streamk.yaml --config scripts/configs/sm90_128x256_s4_streamk.yaml \
  --verify 4000x4000x120:rr --verify 4097x6144x4104:rc
