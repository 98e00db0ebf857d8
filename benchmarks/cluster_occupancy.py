#!/usr/bin/env python3
"""How many 2- and 4-CTA clusters the GPU holds at once, per sm90 configuration (cuOccupancyMaxActiveClusters), beside
what a manifest built without a GPU assumes (launch.resident_clusters: SMs / 2 for pairs, whole clusters per GPC of
at most 18 SMs for 2x2): where a persistent grid of cluster tiles is larger than what is
resident, the last clusters wait for others to finish their whole tile loop and the run takes about twice as long.

    PYTHONPATH=$PWD python3 benchmarks/cluster_occupancy.py [--out DIR]

Each configuration is compiled for its product, its cubin loaded with the driver API, its dynamic shared memory
limit raised, and the driver asked; one row per configuration: shared memory per CTA, clusters resident, the
product's cluster tiles.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import detected_gpu, run_main, write_report  # noqa: E402

CASES = [  # (M, N, K, A, B, cta, stages, cluster, swapped)
    (513, 4096, 4096, "row", "col", "128x144", 6, "2x1", True), (513, 4096, 4096, "row", "col", "128x144", 4, "2x1", True),
    (513, 4096, 4096, "row", "col", "128x160", 4, "2x1", True), (513, 4096, 4096, "row", "col", "128x160", 6, "2x1", True),
    (777, 4096, 4096, "row", "col", "128x208", 4, "2x1", True), (777, 4096, 4096, "row", "col", "128x224", 4, "2x1", True),
    (300, 8192, 8192, "row", "col", "128x160", 4, "2x1", True), (4096, 4096, 4096, "row", "row", "128x256", 4, "2x1", False),
    (4096, 4096, 4096, "row", "row", "128x256", 3, "2x1", False), (4096, 4096, 4096, "row", "col", "256x128", 4, "1x2", False),
    (128, 8192, 8192, "row", "row", "64x128", 6, "2x1", False), (2048, 4096, 4096, "row", "col", "128x144", 6, "2x1", False),
    (2520, 616, 12280, "row", "row", "128x128", 6, "2x2", False), (4096, 4096, 4096, "row", "col", "128x128", 4, "2x2", False),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from cuda.bindings import driver

    from gemmgen import Problem
    from gemmgen.codegen.nvrtc import compile_many
    from gemmgen.families.rules import check
    from gemmgen.families.sm90_wgmma.config import Sm90Config
    from gemmgen.families.sm90_wgmma.launch import manifest_launches, resident_clusters, work_units
    from gemmgen.runtime import tma
    from gemmgen.runtime.device import Device

    gpu = detected_gpu()
    plans = []
    for m, n, k, a, b, cta, stages, cluster, swapped in CASES:
        problem = Problem.create(m, n, k, "bf16", a, b)
        cm, cn = map(int, cta.split("x"))
        wm = 64 if cm <= 128 or cn > 128 else 128
        config = Sm90Config.from_dict({
            "family": "sm90_wgmma", "cta": f"{cm}x{cn}x64", "warp": f"{wm}x{cn}x64", "mma": f"64x{cn}x16",
            "stages": stages, "raster": {"order": "row", "group": 8}, "cluster": cluster,
            "warp_specialized": True, "persistent": True, "swap_ab": swapped})
        broken = check(config, gpu, gpu.arch, problem)
        if broken:
            print(f"{config.tag} at {problem.label}: {broken[0]}")
            continue
        plans.append((problem, config, harness.kernel_for(problem, config, gpu.arch)))
    built = compile_many([k for _, _, k in plans], None)
    rows = []
    with Device() as dev:
        dev.make_current()
        for (problem, config, kernel), compiled in zip(plans, built):
            if isinstance(compiled, Exception):
                print(f"{config.tag}: compile failed")
                continue
            runs, _, _ = manifest_launches(kernel, problem, dev.props.sm_count)
            main = next(r for r in runs if r["entry"] == kernel.name)
            err, module = driver.cuModuleLoadData(compiled.cubin)
            assert err == driver.CUresult.CUDA_SUCCESS, err
            err, function = driver.cuModuleGetFunction(module, kernel.name.encode())
            assert err == driver.CUresult.CUDA_SUCCESS, err
            tma.prepare_function(function, main["dynamic_smem"])
            resident = tma.max_active_clusters(function, main)
            tiles = work_units(kernel, problem)
            row = {"problem": problem.label, "config": config.tag, "smem_bytes": main["dynamic_smem"],
                   "clusters_resident": resident, "assumed": resident_clusters(dev.props.sm_count, config.cluster.size),
                   "cluster_tiles": tiles, "waves": -(-tiles // resident)}
            rows.append(row)
            print(f"{problem.label:24s} {config.tag[11:80]:70s} smem {main['dynamic_smem']:6d}  resident "
                  f"{resident:3d} (assumed {row['assumed']})  cluster tiles {tiles:4d}  waves {row['waves']}", flush=True)
            driver.cuModuleUnload(module)
    if args.out:
        print("written:", write_report(args.out, "cluster_occupancy.json", {"gpu": gpu.key, "rows": rows}))
    return 0


if __name__ == "__main__":
    run_main(main, "cluster_occupancy.py")
