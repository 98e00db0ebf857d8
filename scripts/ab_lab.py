#!/usr/bin/env python3
"""A/B one template parameter on the H100: the same configurations rendered with the parameter as gemmgen sets
it (A) and overridden (B), verified, then timed interleaved with cuBLAS (either family; stored winners are sm90).

    PYTHONPATH=$PWD python3 scripts/ab_lab.py --set prefetch_tensormaps=false --out $OUT [--rounds 5]

Cases: the stored winner (results/h100-sxm/tunes) of each suite shape named by --shapes (bf16, A and B
row-major), sm90 winners only. Every variant is verified first (gemmgen.tune.bench: fresh inputs, D and workspace
NaN-poisoned, fp32 cuBLAS reference) inside a watchdog worker; timing uses gemmgen.tune.bench (events behind a
stream-holding kernel, rotated inputs, median) with A, B and cuBLAS measured in every round, the order
reversed every other round. Prints a short table last and writes ab_lab.json to --out.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmgen.model.arch import Arch  # noqa: E402
from gemmgen.families.sm90_wgmma import launch as sm90  # noqa: E402
from gemmgen.runtime.manifest import make_manifest  # noqa: E402
from gemmgen.model.problem import Problem  # noqa: E402
from gemmgen.model.tiles import Family, Kernel, TileConfig  # noqa: E402

SUITE = {"sq1024": (1024, 1024, 1024), "sq2048": (2048, 2048, 2048), "sq4096": (4096, 4096, 4096),
         "sq8192": (8192, 8192, 8192), "llm_qkv": (4096, 6144, 4096), "llm_up": (4096, 28672, 4096),
         "llm_down": (4096, 4096, 14336), "skinny_m16": (16, 4096, 4096), "skinny_m128": (128, 8192, 8192),
         "largek": (1024, 1024, 65536), "odd3000": (3000, 3000, 3000)}


# --set keys that change the launch (adjust_manifest), not the template.
LAUNCH_ONLY = ("launch_cluster", "cluster_policy", "launch_grid")
# --set keys whose B variant may leave D unwritten or wrong by design: timed, not verified.
UNVERIFIABLE = ("skip_epilogue", "epi_no_wait", "sk_no_fixup")


def parse_value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def stored_winner(shape: str) -> "tuple[Problem, TileConfig]":
    """A suite shape's bf16 row-major problem and the configuration stored as its winner (results/h100-sxm/tunes)."""
    m, n, k = SUITE[shape]
    path = ROOT / "results" / "h100-sxm" / "tunes" / f"{m}x{n}x{k}_bf16_rr_bf16_linear.json"
    return Problem.create(m, n, k, "bf16"), TileConfig.from_dict(json.loads(path.read_text())["winner"]["config"])


def with_fields(cfg: TileConfig, fields: "list[tuple[str, str]]") -> TileConfig:
    """`cfg` with configuration fields replaced: (FIELD, VALUE) pairs, dotted for nested fields."""
    d = json.loads(json.dumps(cfg.to_dict()))
    for field, value in fields:
        *parents, leaf = field.split(".")
        node = d
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = parse_value(value)
    return TileConfig.from_dict(d)


def build(kernel: Kernel, override: dict) -> "tuple[str, object]":
    """Render with the family's template context (render.template_context) updated by `override`, compile with
    gemmgen's options."""
    from gemmgen.codegen.nvrtc import compile_source, options_for, parse_ptxas_log
    from gemmgen.codegen.render import environment, render, template_context

    params = template_context(kernel)
    override = {k: v for k, v in override.items() if k not in LAUNCH_ONLY}
    unknown = set(override) - set(params)
    if unknown:
        raise SystemExit(f"ab_lab: the template has no parameter {sorted(unknown)}")
    params.update(override)
    if params.get("epi_store_warp") and (params.get("skip_epilogue") or params.get("epi_defer_store")):
        # The store warp waits for every consumer warp's hand-over of every tile: an epilogue skipped or deferred
        # by a lab switch would leave it waiting for ever.
        raise SystemExit("ab_lab: the store warp cannot be combined with skip_epilogue or epi_defer_store")
    if override:
        source = environment().get_template(kernel.config.family.template).render(**params)
    else:
        source = render(kernel)   # variant A is exactly what gemmgen ships
    options = options_for(kernel)
    cubin, log = compile_source(kernel.name, source, options)
    return source, (cubin, log, parse_ptxas_log(log))


def unicast_boxes(manifest: dict, kernel: Kernel) -> None:
    """With multicast=false every CTA of a cluster loads its whole tiles: K-major boxes span the full tile rows
    (MN-major boxes are 64 x 64 either way)."""
    cfg = kernel.config
    kmajor = {"A": sm90.a_is_kmajor(kernel.operands), "B": sm90.b_is_kmajor(kernel.operands)}
    for launch in manifest["launches"]:
        for p in launch["params"]:
            if p.get("kind") == "tensormap" and kmajor.get(p["tensor"]):
                p["box"][1] = cfg.cta.m if p["tensor"] == "A" else cfg.cta.n


def adjust_manifest(manifest: dict, kernel: Kernel, override: dict, problem: Problem) -> None:
    """The launch parameters a template override changes: unicast boxes, and no D tensor map without TMA stores."""
    if override.get("multicast") is False:
        unicast_boxes(manifest, kernel)
    if override.get("launch_cluster"):
        # The same kernel launched as clusters of this many CTAs along x: placement alone, no cluster code.
        for launch in manifest["launches"]:
            size = int(override["launch_cluster"])
            launch["cluster"] = [size, 1, 1]
            launch["grid"][0] = max(size, launch["grid"][0] // size * size)
    if override.get("launch_grid"):
        # A persistent kernel on this many CTAs instead of one per SM (e.g. 128 at 4096^3: 512 128x256 tiles
        # in exactly 4 waves, as the public worklog ran); rounded down to whole clusters.
        for launch in manifest["launches"]:
            size = launch.get("cluster", [1, 1, 1])[0]
            launch["grid"][0] = max(size, int(override["launch_grid"]) // size * size)
    if override.get("cluster_policy"):
        for launch in manifest["launches"]:
            launch["cluster_policy"] = override["cluster_policy"]
    if override.get("epi_box_cols"):
        for launch in manifest["launches"]:
            launch["params"] = [sm90.tensormap_d_spec(problem, kernel.operands.c_dtype, int(override["epi_box_cols"]))
                                if p.get("name") == "tmD" else p for p in launch["params"]]
    if override.get("tma_store") is False:
        for launch in manifest["launches"]:
            launch["params"] = [p for p in launch["params"] if p.get("name") != "tmD"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[],
                    help="NAME=VALUE: a template parameter of variant B (repeatable)")
    ap.add_argument("--config-set", action="append", default=[],
                    help="FIELD=VALUE: a configuration field of variant B, dotted for nested ones "
                         "(e.g. decomposition.fused=true; repeatable)")
    ap.add_argument("--shapes", default="sq1024,sq2048,skinny_m16,skinny_m128,sq4096,largek")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--config", action="append", default=[],
                    help="a config YAML/JSON to run on every shape besides its stored winner (repeatable)")
    ap.add_argument("--no-winner", action="store_true",
                    help="run only the --config configurations, not the stored winners (e.g. sm80_mma ones)")
    ap.add_argument("--verify", action="append", default=[],
                    help="MxNxK:ab (e.g. 4097x1000x3000:rc) extra problems on which every B variant is verified")
    ap.add_argument("--timing", default="burst", help="gemmgen.tune.bench TIMINGS policy: burst (default) or sustained "
                                                      "(1 s back to back before each 0.5 s timing; far less spread)")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    override = {}
    for item in args.set:
        name, value = item.split("=", 1)
        override[name] = parse_value(value)
    config_override = [item.split("=", 1) for item in args.config_set]
    if not override and not config_override:
        raise SystemExit("ab_lab: give variant B a --set or a --config-set")

    def b_config(cfg: TileConfig) -> TileConfig:
        return with_fields(cfg, config_override)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cases = []
    for shape in args.shapes.split(","):
        problem, config = stored_winner(shape)
        extra = [TileConfig.from_text(Path(f).read_text(), f) for f in args.config]
        use_winner = not args.no_winner and config.family is Family.SM90_WGMMA
        if not args.no_winner and not use_winner:
            print(f"skip {shape}'s winner: it is {config.family.value}")
        for j, cfg in enumerate(([config] if use_winner else []) + extra):
            key = shape if use_winner and j == 0 else f"{shape}/{cfg.tag}"
            for label, ov, vcfg in (("A", {}, cfg), ("B", override, b_config(cfg))):
                kernel = Kernel(Arch.SM90A, problem.operands, vcfg)
                _, (cubin, log, resources) = build(kernel, ov)
                manifest = make_manifest(kernel, problem)
                adjust_manifest(manifest, kernel, ov, problem)
                cases.append({"shape": key, "variant": label, "problem": problem, "manifest": manifest,
                              "cubin": cubin, "config": vcfg.tag, "timed": True})
            for spec in args.verify:
                dims, lay = spec.split(":")
                vm, vn, vk = (int(x) for x in dims.split("x"))
                vp = Problem.create(vm, vn, vk, "bf16", {"r": "row", "c": "col"}[lay[0]], {"r": "row", "c": "col"}[lay[1]])
                vkernel = Kernel(Arch.SM90A, vp.operands, b_config(cfg))
                _, (vcubin, _, _) = build(vkernel, override)
                vmanifest = make_manifest(vkernel, vp)
                adjust_manifest(vmanifest, vkernel, override, vp)
                cases.append({"shape": f"verify {spec} {cfg.tag}", "variant": "B", "problem": vp,
                              "manifest": vmanifest, "cubin": vcubin, "config": cfg.tag,
                              "timed": False})
    print(f"{len(cases)} variants built; B sets {override} {config_override}", flush=True)

    from gemmgen.tune.worker import WorkerBenchmark

    worker = WorkerBenchmark()
    worker.start()
    for c in cases:
        switches = [name for name in UNVERIFIABLE if override.get(name)]
        if c["variant"] == "B" and switches:
            # D unwritten or wrong by design: timed only (the A variant is the same kernel as rendered, verified).
            c["verified"], c["rel_error"], c["reason"] = True, None, f"not verifiable: {switches}"
            print(f"  verify {c['shape']:12s} B skipped ({', '.join(switches)}: D not verifiable)", flush=True)
            continue
        o = worker.measure(c["manifest"], c["cubin"], c["problem"])
        c["verified"], c["rel_error"], c["reason"] = o.ok, o.rel_error, o.reason[:200]
        print(f"  verify {c['shape']:12s} {c['variant']} {'ok' if o.ok else 'FAIL ' + o.reason[:120]} "
              f"rel {o.rel_error}", flush=True)
    worker.close()

    from gemmgen.tune.bench import GpuBenchmark, timing_policy

    bench = GpuBenchmark(verify=False, policy=timing_policy(args.timing))
    times, cublas = {}, {}
    t0 = time.time()
    for r in range(args.rounds):
        bench._cublas.clear()  # cuBLAS re-timed in every round, next to both variants
        order = cases if r % 2 == 0 else list(reversed(cases))
        for c in order:
            if not c["verified"] or not c["timed"]:
                continue
            meas = bench.measure(c["manifest"], c["cubin"], c["problem"])
            if meas.ok:
                times.setdefault((c["shape"], c["variant"]), []).append(meas.time_s)
                cublas.setdefault((c["shape"], c["variant"]), []).append(bench.cublas_time(c["problem"], fresh=True))
        print(f"round {r + 1}/{args.rounds} at {time.time() - t0:.0f}s", flush=True)
    rows = []
    for shape in dict.fromkeys(c["shape"] for c in cases if c["timed"]):
        a, b = times.get((shape, "A")), times.get((shape, "B"))
        if not a or not b:
            rows.append({"shape": shape, "missing": True})
            continue
        ca = cublas[(shape, "A")]
        paired = statistics.median(tb / ta for ta, tb in zip(a, b))
        rows.append({"shape": shape, "A_us": statistics.median(a) * 1e6, "B_us": statistics.median(b) * 1e6,
                     "cublas_us": statistics.median(ca) * 1e6, "B_over_A_paired": paired,
                     "A_ratio": statistics.median(ca) / statistics.median(a),
                     "B_ratio": statistics.median(ca) / statistics.median(b)})
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "override": override,
              "config_override": config_override, "timing": args.timing,
              "device": bench.device.props.to_dict(), "rows": rows,
              "cases": [{k: v for k, v in c.items() if k in ("shape", "variant", "config", "verified", "rel_error",
                                                             "reason")} for c in cases]}
    (out / "ab_lab.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nverified {sum(c['verified'] for c in cases)}/{len(cases)}")
    print(f"A = as gemmgen renders; B = {override} {config_override}; {args.timing} timing; device {bench.device.props.name}")
    print(f"{'shape':12s} {'A us':>8s} {'B us':>8s} {'cuBLAS':>8s} {'B/A':>6s} {'A ratio':>8s} {'B ratio':>8s}")
    for row in rows:
        if row.get("missing"):
            print(f"{row['shape']:12s} (a variant failed)")
            continue
        print(f"{row['shape']:12s} {row['A_us']:8.2f} {row['B_us']:8.2f} {row['cublas_us']:8.2f} "
              f"{row['B_over_A_paired']:6.3f} {row['A_ratio']:8.3f} {row['B_ratio']:8.3f}")
    bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
