"""Products nobody listed, on the CPU: random dtype, layouts, odd and tiny M/N/K, epilogues, fp8 scalings and row
sums (benchmarks/fuzz.py's draw, the GPU run's generator), each taken through the user's path as far as a
machine without a GPU goes: the model ranks every family's space, the pick is compiled to SASS, exported as a
bundle, and the bundle passes the checks gemmgen.load runs before it touches the driver (schema, cubin identity
and architecture, launches recomputed from the configuration). A product no family takes must be refused with a
named rule. On the H100, benchmarks/fuzz.py runs the same draws to the end (128 of 128 correct, 2026-11-25)."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fuzz import draw, problem_of, rank_one  # noqa: E402
from gemmgen import Kernel, lookup_gpu  # noqa: E402
from gemmgen.model.tiles import TileConfig  # noqa: E402

SEEDS = range(20)   # seed 1016 draws a 3xTF32 product


@pytest.fixture(scope="module", params=["h100", "a100"])
def compiled(request):
    """The drawn products, ranked for the GPU, and their picks compiled in one pool (a few seconds each). The
    A100's families take 16-bit inputs only: its fp8 and fp32 draws are the refusals."""
    try:
        from gemmgen.codegen.nvrtc import compile_many
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {exc}")
    arch = lookup_gpu(request.param).arch
    cases = []
    for seed in SEEDS:
        spec = draw(random.Random(1000 + seed))
        cases.append((spec, rank_one(spec, request.param)))
    todo = [(spec, Kernel(arch, problem_of(spec).operands, TileConfig.from_dict(r["config"])))
            for spec, r in cases if "config" in r]
    built = compile_many([k for _, k in todo], jobs=2)
    return cases, [(spec, kernel, result) for (spec, kernel), result in zip(todo, built)]


def test_every_drawn_product_gets_a_kernel_or_a_named_refusal(compiled):
    cases, built = compiled
    for spec, ranked in cases:
        if "refused" in ranked:
            assert ranked["refused"] and "\n" not in ranked["refused"], spec
        elif spec["dtype"] in ("bf16", "f16"):
            continue
        else:   # fp8 and fp32 need Hopper's families
            assert ranked["config"]["family"] == "sm90_wgmma", spec
    # Every 16-bit product has a kernel, but for the row sums of A, which only sm90_wgmma writes.
    sixteen = [ranked for spec, ranked in cases if spec["dtype"] in ("bf16", "f16") and not spec.get("row_sums")]
    assert sixteen and all("config" in ranked for ranked in sixteen), "every 16-bit product has a kernel"


def test_each_pick_compiles_to_tensor_core_sass_without_local_memory_and_exports_a_loadable_bundle(compiled,
                                                                                                 tmp_path):
    """(sm80_gemv's picks multiply on CUDA cores: FFMA stands for the tensor-core instruction there.)"""
    from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts
    from gemmgen.runtime.bundle import verify
    from gemmgen.tune.export import export_bundle

    _, built = compiled
    for spec, kernel, result in built:
        assert not isinstance(result, Exception), (spec, result)
        assert result.spill_bytes == 0 and result.resources.stack_bytes == 0, (spec, kernel.name)
        text = dump_sass(result.cubin)
        gemm = next(part for part in text.split("Function : ")[1:] if part.split()[0] == kernel.name)
        counts = instruction_counts(gemm)
        mma = "HGMMA" if kernel.config.family == "sm90_wgmma" else "HMMA"
        if kernel.config.family == "sm90_wgmma" and kernel.operands.a_dtype.bytes == 1:
            mma = "QGMMA"   # fp8 wgmma
        if kernel.config.family == "sm80_gemv":
            mma = "FFMA"    # few rows of D times a row-major B: CUDA-core FMAs
        assert count_prefix(counts, mma) > 0, (spec, kernel.name)
        assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0, (spec, kernel.name)
        folder = tmp_path / kernel.name[-40:]
        bundle = export_bundle(folder, kernel, problem_of(spec), result, measured=None, verification=None,
                               environment={})
        manifest = json.loads(bundle.manifest_path.read_text())
        verify(manifest, bundle.cubin_path.read_bytes())   # what gemmgen.load checks before the driver
