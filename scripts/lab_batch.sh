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
# 1. D's TMA stores issued by the producer warpgroup's idle warp 1 (epi_store_warp) instead of each consumer warp,
#    on every cooperative data-parallel winner; verified on odd shapes in two layouts.
step storewarp python3 scripts/ab_lab.py --set epi_store_warp=true --rounds 7 \
  --shapes sq4096,llm_qkv,sq8192,llm_up,llm_down,sq1024,skinny_m128,odd3000 \
  --verify 1000x3000x4104:rc --verify 3000x1000x2056:cc
# 2. Where the tile's time goes with it (fill vs epilogue per tile).
step timeline python3 scripts/timeline.py --shapes sq4096,llm_qkv --runs 5 --set epi_store_warp=true
# 3. The s4 winners with 3 stages, so the warp's whole share of boxes fits at once (one group per tile).
step storewarp_s3 python3 scripts/ab_lab.py --set epi_store_warp=true --config-set stages=3 --rounds 5 \
  --shapes sq8192,llm_up,llm_down,sq4096
# 4. With the store warp on by default: the whole space through the tuner's worker, then the GPU tests.
sed -i 's/^STORE_WARP = False/STORE_WARP = True/' gemmgen/families/sm90.py
step space python3 scripts/space_check.py
echo "== pytest -m gpu (store warp on)"; timeout 150 python3 -m pytest -q -m gpu -x 2>&1 | tail -5
