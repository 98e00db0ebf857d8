#!/bin/bash
# Sustained A/B runs at 4096^3 (2026-11-23, ninth session): the store warp and a raster group of 16 on the
# stored (sustained-timed) winner, each B verified first, A, B and cuBLAS timed with gemmgen.bench's sustained
# policy (1 s back to back, then 0.5 s timed) in 5 interleaved rounds. Run on the GPU machine from the repo root:
#   bash scripts/lab_sustained.sh $OUT
set -u
out=${1:?usage: lab_sustained.sh OUTDIR}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || { echo "lab_sustained: the optuna wheels in .whl/ did not install"; exit 2; }
stamp=$(date -u +%Y%m%d)
for step in "store_warp:--config-set store_warp=true" "raster16:--config-set raster.group=16"; do
  name=${step%%:*}; flags=${step#*:}
  mkdir -p "$out/$name"
  timeout 280 python3 scripts/ab_lab.py --timing sustained --shapes sq4096 --rounds 5 $flags \
      --verify 1000x3000x4104:rc --verify 3000x1000x2056:cr --out "$out/$name" 2>&1 | tee "$out/ab_lab-$stamp-sustained-$name.log" | tail -6
  cp "$out/$name/ab_lab.json" "$out/ab_lab-$stamp-sustained-$name.json" 2>/dev/null
done
