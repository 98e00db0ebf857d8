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
  timeout 240 "$@" --out "$OUT/$tag" > "$OUT/$tag/log.txt" 2>&1
  echo "== $tag rc $?"; tail -8 "$OUT/$tag/log.txt"
}
# 1. Where the 128x256 tile's epilogue goes (fill vs stores) and the main loop's FLOP per SM clock.
step timeline python3 scripts/timeline.py --shapes sq1024,sq4096,llm_qkv,sq8192 --runs 5
# 2. D's stores spread over the next tile's first k-tiles (one box per k-tile) instead of a burst per tile.
step spread python3 scripts/ab_lab.py --set epi_defer_store=2 --shapes sq2048,sq4096,llm_qkv --rounds 7 \
  --verify 1000x3000x1000:rr --verify 1000x3000x4104:rc
# 3. 128 persistent CTAs at 4096^3 (512 tiles in exactly 4 waves) instead of 132.
step grid128 python3 scripts/ab_lab.py --set launch_grid=128 --shapes sq4096,llm_qkv --rounds 9
# 4. The whole space through the tuner's worker again: Stream-K's staging region shrank to its two boxes
#    (constraints.sm90_epi_boxes, 2026-11-23, compiled but not yet run on the GPU).
step space python3 scripts/space_check.py
# 5. sm80 family: is its 21% copy cost the burst, the 16 cp.async per thread per k-tile, or the bytes? Spread copies,
#    and the same bytes as two cp.async.bulk row copies per thread, beside the earlier kernels.
echo "== mma_ceiling"; timeout 120 python3 scripts/mma_ceiling.py 2>&1 | tail -24
