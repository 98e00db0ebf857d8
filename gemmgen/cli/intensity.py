"""`gemmgen intensity`: FLOP per byte at each level of the tile hierarchy, and the bytes per clock
per SM each level must deliver to keep the tensor cores at peak.

With no --warp it prints the seed note's warp-level table for the note's warp shapes.
"""
from __future__ import annotations

from ..model.arch import DType, lookup_gpu
from ..model.errors import InvalidInput
from ..calc.intensity import SEED_WARP_SHAPES, cta_level, mma_level, seed_table, smem_level, warp_level
from ..model.tiles import Shape3
from ._common import float_arg, print_json, table, text_arg

DEFAULT_GPU = "rtx3090"  # the seed note's card, so the default output is reproducible anywhere


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "intensity", help="arithmetic intensity per tile level (seed-note table without --warp)",
        description="FLOP/byte per level of the tile hierarchy and the bytes/clock/SM each level needs at peak. "
                    "Without --warp: the seed note's warp-level table.")
    parser.add_argument("--warp", type=text_arg("--warp"), help="warp tile MxNxK, e.g. 64x64x32")
    parser.add_argument("--mma", default="16x8x16", type=text_arg("--mma"),
                        help="MMA instruction MxNxK (default 16x8x16)")
    parser.add_argument("--cta", type=text_arg("--cta"),
                        help="CTA tile MxNxK, e.g. 128x128x32 (adds the global->shared level)")
    parser.add_argument("--dtype", default="f16", type=text_arg("--dtype"),
                        help="input dtype: f16 (default), bf16, f32 (tf32 math), e4m3, e5m2")
    parser.add_argument("--gpu", default=DEFAULT_GPU, type=text_arg("--gpu"),
                        help=f"catalogue GPU for the peak rate (default {DEFAULT_GPU})")
    parser.add_argument("--peak-per-sm", dest="peak_per_sm", metavar="FLOP_PER_CLOCK",
                        type=float_arg("--peak-per-sm", 0, 1e9, lo_open=True),
                        help="override the tensor FLOP/clock/SM (6780 reproduces the seed note's bytes column)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def _check_nesting(outer: Shape3, inner: Shape3, outer_name: str, inner_name: str, k_too: bool) -> None:
    axes = ("m", "n", "k") if k_too else ("m", "n")
    for axis in axes:
        o, i = getattr(outer, axis), getattr(inner, axis)
        if o % i:
            raise InvalidInput(f"{outer_name} {axis.upper()} must be a multiple of {inner_name} {axis.upper()}",
                               f"{outer} vs {inner}")


def run(args) -> int:
    dtype = DType.parse(args.dtype)
    gpu = lookup_gpu(args.gpu)
    mma = Shape3.parse(args.mma, "MMA shape")
    warp = Shape3.parse(args.warp, "warp tile") if args.warp else None
    cta = Shape3.parse(args.cta, "CTA tile") if args.cta else None
    override = args.peak_per_sm
    peak = override if override is not None else gpu.tensor_flop_per_clock_per_sm(dtype)
    source = "--peak-per-sm" if override is not None else "catalogue"
    header = (f"{gpu.key} ({gpu.name}), {dtype.value} inputs, fp32 accumulate: "
              f"{peak:.1f} FLOP/clock/SM ({source})")

    if warp is None and cta is None:
        rows = seed_table(peak, mma, SEED_WARP_SHAPES, dtype)
        if args.json:
            print_json({"gpu": gpu.key, "dtype": dtype.value, "peak_per_sm": peak, "peak_source": source,
                        "mma": str(mma), "rows": [{"warp": str(r.shape), "mma": str(mma), "intensity": r.intensity,
                                                   "bytes_per_clock": r.bytes_per_clock} for r in rows]})
            return 0
        print(header)
        print("warp level as in the seed note: intensity = 1/(1/WM + 1/WN + 1/MmaK), bytes/clock = peak/intensity\n")
        print(table([[f"({r.shape.m}, {r.shape.n}, {r.shape.k})", f"({mma.m}, {mma.n}, {mma.k})",
                      f"{r.intensity:.3f}", f"{r.bytes_per_clock:.3f}"] for r in rows],
                    ["WarpShape", "InstructionShape", "Arithmetic intensity", "Bytes_per_clc"]))
        return 0

    levels = []
    if cta is not None:
        if warp is not None:
            _check_nesting(cta, warp, "CTA tile", "warp tile", k_too=False)
        else:   # the MMA instruction is the tile's step there too: a CTA tile of 8x8x8 over m16n8k16 was accepted
            _check_nesting(cta, mma, "CTA tile", "MMA", k_too=True)
        levels.append(cta_level(cta, dtype, peak))
    if warp is not None:
        _check_nesting(warp, mma, "warp tile", "MMA", k_too=True)
        levels.append(smem_level(warp, dtype, peak))
        levels.append(warp_level(warp, mma, peak, dtype))
    levels.append(mma_level(mma, dtype, peak))
    if args.json:
        print_json({"gpu": gpu.key, "dtype": dtype.value, "peak_per_sm": peak, "peak_source": source,
                    "levels": [lv.to_dict() for lv in levels]})
        return 0
    print(header + "\n")
    print(table([[lv.name, str(lv.shape), f"{lv.intensity:.3f}", f"{lv.bytes_per_clock:.3f}"] for lv in levels],
                ["level", "shape", "FLOP/byte", "bytes/clock/SM at peak"]))
    print("\nwhat each level counts:")
    for lv in levels:
        print(f"  {lv.name}: {lv.counts}")
    return 0
