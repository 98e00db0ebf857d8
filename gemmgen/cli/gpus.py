"""`gemmgen gpus`: the GPU catalogue, and what the driver finds on this machine."""
from __future__ import annotations

from ..model.arch import catalogue
from ..runtime.detect import detect_gpu
from ._common import print_json, table


def register(subparsers) -> None:
    parser = subparsers.add_parser("gpus", help="list the GPU catalogue and the GPU found here",
                                   description="List the GPU catalogue (dense tensor rates with fp32 "
                                               "accumulation) and the result of GPU detection.")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def _rate(gpu, dtype: str) -> str:
    rates = dict(gpu.tensor_flops)
    return f"{rates[dtype] / 1e12:.0f}" if dtype in rates else "-"


def run(args) -> int:
    gpus = catalogue()
    found = detect_gpu()
    if args.json:
        print_json({"gpus": [_gpu_dict(g) for g in gpus.values()], "detected": found.to_dict()})
        return 0
    rows = [[g.key, g.name, g.arch.value, g.sm_count, f"{g.boost_clock_mhz:.0f}", _rate(g, "bf16"), _rate(g, "e4m3"),
             _rate(g, "f32"), f"{g.fp32_simt_flops / 1e12:.1f}", f"{g.dram_bandwidth / 1e12:.2f}",
             f"{g.power_limit_w:.0f}" if g.power_limit_w else "-",
             f"{g.l2_bytes / 2**20:.0f}", f"{g.smem_per_sm // 1024}/{g.smem_per_block_optin // 1024}",
             f"{g.regs_per_sm // 1024}K", ", ".join(g.aliases)]
            for g in gpus.values()]
    print(table(rows, ["key", "name", "arch", "SMs", "MHz", "bf16/f16 TF", "fp8 TF", "tf32 TF", "fp32 TF",
                       "DRAM TB/s", "W", "L2 MB", "smem KB SM/blk", "regs/SM", "aliases"]))
    print("\nsources:")
    for g in gpus.values():
        print(f"  {g.key}: {g.source}" + (f" ({g.notes})" if g.notes else ""))
    print(f"\ndetected: {found.reason}")
    return 0


def _gpu_dict(g) -> dict:
    return {"key": g.key, "name": g.name, "aliases": list(g.aliases), "arch": g.arch.value, "sm_count": g.sm_count,
            "boost_clock_mhz": g.boost_clock_mhz, "tensor_flops": dict(g.tensor_flops),
            "fp32_simt_flops": g.fp32_simt_flops, "dram_bandwidth": g.dram_bandwidth,
            "memory_bus_bits": g.memory_bus_bits, "memory_clock_mhz": g.memory_clock_mhz,
            "power_limit_w": g.power_limit_w, "l2_bytes": g.l2_bytes,
            "smem_per_sm": g.smem_per_sm, "smem_per_block_optin": g.smem_per_block_optin,
            "regs_per_sm": g.regs_per_sm, "max_threads_per_sm": g.max_threads_per_sm,
            "max_ctas_per_sm": g.max_ctas_per_sm, "source": g.source, "notes": g.notes}
