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
#    on every cooperative data-parallel winner; verified on odd shapes (K-major A: odd3000's 1x2 192x192 needs it).
step storewarp python3 scripts/ab_lab.py --set epi_store_warp=true --rounds 7 \
  --shapes sq4096,llm_qkv,sq8192,llm_up,llm_down,sq1024,skinny_m128,odd3000 \
  --verify 1000x3000x4104:rc --verify 1000x3000x1000:rr
# 2. cuBLAS's 4096^3 tile (256x128, 1x2 cluster, scripts/cublas_kernels.py) with and without the store warp.
step storewarp_256 python3 scripts/ab_lab.py --set epi_store_warp=true --rounds 7 --shapes sq4096,llm_qkv \
  --config scripts/configs/sm90_256x128_s4_cl1x2.yaml --config scripts/configs/sm90_256x128_s3_cl1x2.yaml
