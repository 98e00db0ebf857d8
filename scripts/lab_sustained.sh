#!/bin/bash
# Sustained A/B runs (ninth session, 2026-11-23): each step is ab_lab.py with gemmgen.bench's sustained policy
# (1 s back to back, then 0.5 s timed), A = the stored winner, B verified first (incl. two odd problems), A, B and
# cuBLAS in 5 interleaved rounds. Run on the GPU machine from the repo root:
#   bash scripts/lab_sustained.sh $OUT [STEP ...]      (default: every step below not marked as run)
# Steps: name:shapes:ab_lab flags. Already run (results/h100-sxm/lab/ab_lab-20261123-sustained-*):
#   store_warp:sq4096:--config-set store_warp=true       B/A 1.003
#   raster16:sq4096:--config-set raster.group=16         B/A 1.005
set -u
out=${1:?usage: lab_sustained.sh OUTDIR [STEP ...]}
shift
steps=("$@")
if [ ${#steps[@]} -eq 0 ]; then
  steps=("sw_lsu1:sq4096,llm_qkv:--config-set store_warp=true --set sw_lsu=1"
         "sw_lsu2:sq4096,llm_qkv:--config-set store_warp=true --set sw_lsu=2")
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || { echo "lab_sustained: the optuna wheels in .whl/ did not install"; exit 2; }
stamp=$(date -u +%Y%m%d)
for step in "${steps[@]}"; do
  name=${step%%:*}; rest=${step#*:}; shapes=${rest%%:*}; flags=${rest#*:}
  mkdir -p "$out/$name"
  timeout 280 python3 scripts/ab_lab.py --timing sustained --shapes "$shapes" --rounds 5 $flags \
      --verify 1000x3000x4104:rc --verify 3000x1000x2056:cr --out "$out/$name" 2>&1 \
      | tee "$out/ab_lab-$stamp-sustained-$name.log" | grep -v '^round' | tail -8
  cp "$out/$name/ab_lab.json" "$out/ab_lab-$stamp-sustained-$name.json" 2>/dev/null
done
