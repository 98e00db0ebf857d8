"""sm80_gemv: few rows of D times a row-major B on CUDA cores: its rules, launches, SASS and GPU results."""
from __future__ import annotations

import pytest

import gemmgen
from gemmgen.codegen.nvrtc import compile_kernel
from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts
from gemmgen.families import rules as constraints
from gemmgen.model.arch import Arch, lookup_gpu
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Kernel, TileConfig
from gemmgen.runtime.manifest import make_manifest
from space_helpers import broken, compile_cache, heaviest_compile_without_spills  # noqa: F401 (a fixture)

H100 = lookup_gpu("h100")
FAMILY = gemmgen.families.get("sm80_gemv")


def gemv(rows=16, cols=256, unroll=4, k_warps=1, splits=1, fused=False) -> TileConfig:
    d = {"family": "sm80_gemv", "cta": f"{rows}x{cols}x{unroll}", "warp": f"{rows}x256x{unroll}", "mma": "1x1x1",
         "stages": 1, "k_warps": k_warps}
    if splits > 1:
        d["decomposition"] = {"kind": "splitk", "splits": splits, **({"fused": True} if fused else {})}
    return TileConfig.from_dict(d)


def test_gemv_cuts_k_into_up_to_64_slices_where_other_families_stop_at_16():
    problem = Problem.create(1, 612, 10469, "bf16", "row", "row")
    assert broken(gemv(rows=1, k_warps=8, splits=64), problem) == []
    assert any("split-K factor must be 2..64" in r for r in broken(gemv(rows=1, k_warps=8, splits=128), problem))
    sm90 = TileConfig.from_dict({"family": "sm90_wgmma", "cta": "64x16x64", "warp": "64x16x64", "mma": "64x16x16",
                                 "stages": 6, "warp_specialized": True, "persistent": True, "swap_ab": True,
                                 "decomposition": {"kind": "splitk", "splits": 32}})
    assert any("split-K factor must be 2..16" in r for r in broken(sm90, problem))


def test_gemv_takes_row_major_b_and_either_a_and_names_the_rule_for_others():
    config = gemv(unroll=2)
    assert broken(config, Problem.create(16, 4095, 4095, "bf16", "row", "row")) == []
    assert broken(config, Problem.create(3, 4096, 4096, "f16", "col", "row")) == []
    assert any("row-major B" in r for r in broken(config, Problem.create(16, 4096, 4096, "bf16", "row", "col")))
    assert any("M must be at most CTA tile M" in r for r in broken(config, Problem.create(17, 4096, 4096, "bf16",
                                                                                             "row", "row")))
    assert any("CUDA cores" in r for r in broken(TileConfig.from_dict({**config.to_dict(), "mma": "16x8x16"}),
                                            Problem.create(16, 4096, 4096, "bf16", "row", "row")))
    assert any("warp tile N must be 256" in r for r in broken(
        TileConfig.from_dict({**config.to_dict(), "warp": "16x128x2", "cta": "16x256x2"}), None))
    # Registers: 16 rows of sums with 4 rows of B in flight would spill (the rows' A values are live together).
    assert any("registers" in r for r in broken(gemv(unroll=4), None))


def test_config_round_trips_and_names_its_k_warps():
    config = gemv(k_warps=4, splits=8)
    assert TileConfig.from_dict(config.to_dict()) == config
    assert config.tag.endswith("_kw4") and config.threads == 128


def test_split_k_launches_partials_then_the_shared_reduction_and_stages_a_in_shared_memory():
    problem = Problem.create(5, 4095, 4095, "bf16", "row", "row")
    config = gemv(rows=8, cols=512, unroll=2, k_warps=4, splits=8)
    launches = FAMILY.launches(Kernel(Arch.SM90A, problem.operands, config), problem)
    main, reduce = launches.launches
    assert main["grid"] == [8, 1, 8] and main["block"] == [256, 1, 1]
    # A staged as fp32 [128][8] = 4 KB; then the four K groups park 8 rows x 512 columns of sums: 64 KB.
    assert main["dynamic_smem"] == max(128 * 8 * 4, 4 * 8 * 512 * 4)
    assert reduce["entry"].endswith("_reduce") and launches.workspace_bytes == 8 * 5 * 4095 * 4


@pytest.mark.parametrize("n,dtype,a", [(4096, "bf16", "row"), (4095, "bf16", "row"), (4093, "f16", "col")])
def test_sass_streams_b_as_16_byte_vectors_into_ffma_without_local_memory(n, dtype, a):
    """Aligned rows of B load 16 bytes at a time; unaligned ones too (shifted pairs); the products are FFMAs (no
    tensor-core instruction); nothing in local memory."""
    problem = Problem.create(16, n, 4096, dtype, a, "row", bias=True, activation="gelu")
    compiled = compile_kernel(Kernel(Arch.SM90A, problem.operands, gemv(unroll=2, k_warps=2, splits=2)), H100)
    counts = instruction_counts(dump_sass(compiled.cubin))
    assert count_prefix(counts, "FFMA") >= 16 * 8 * 2 and count_prefix(counts, "HMMA") == 0
    assert sum(v for op, v in counts.items() if op.startswith("LDG") and ".128" in op) > 0
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0, compiled.resources
    assert compiled.spill_bytes == 0


@pytest.mark.slow
def test_the_heaviest_configs_of_the_space_compile_without_spills():
    problem = Problem.create(16, 4095, 4095, "bf16", "row", "row")
    heaviest_compile_without_spills(FAMILY, H100, problem, lambda c: (c.cta.n, c.k_warps), at_least=20)


GPU_CASES = [  # (M, N, K, bias, activation, alpha, beta, config[, A layout])
    (1, 4096, 4096, False, "none", 1.0, 0.0, gemv(rows=1, k_warps=4, splits=8)),
    (1, 4095, 4095, False, "none", 1.0, 0.0, gemv(rows=1, unroll=8, k_warps=2, splits=16)),
    (16, 4095, 4095, True, "gelu", 1.0, 0.0, gemv(unroll=2, k_warps=4, splits=8)),
    (9, 4093, 4097, False, "none", 1.0, 0.5, gemv(cols=512, unroll=2, k_warps=2, splits=3), "col"),
    (2, 9, 13, False, "none", 1.0, 0.5, gemv(rows=2, unroll=2)),
    (1, 1, 1, False, "none", 1.0, 0.0, gemv(rows=1)),
    (3, 5, 7, True, "relu", 2.0, 0.0, gemv(rows=4, k_warps=2), "col"),
    (7, 1001, 999, True, "gelu", 1.0, 0.0, gemv(rows=8, unroll=4, k_warps=8)),
    (6, 1003, 517, True, "silu", 1.0, 0.5, gemv(rows=8, unroll=2, k_warps=2, splits=2)),
    (16, 520, 333, False, "none", 0.5, 1.5, gemv(cols=512, unroll=1, k_warps=4, splits=4)),
    (4, 50257, 768, True, "none", 1.0, 0.0, gemv(rows=4, cols=512, unroll=4, k_warps=2)),
    # fused split-K: the column block's last slice sums the partials
    (1, 4095, 4095, False, "none", 1.0, 0.0, gemv(rows=1, unroll=8, k_warps=2, splits=16, fused=True)),
    (5, 3001, 2999, True, "gelu", 1.0, 0.5, gemv(rows=8, unroll=4, k_warps=4, splits=8, fused=True), "col"),
    (16, 70, 4100, False, "none", 1.0, 0.0, gemv(cols=512, unroll=2, k_warps=2, splits=4, fused=True)),
    # 32 and 64 K slices (few column blocks over a long K); slices past K's end read nothing and write zeros
    (1, 612, 10469, False, "none", 1.0, 0.0, gemv(rows=1, unroll=4, k_warps=8, splits=64)),
    (3, 1001, 5001, True, "gelu", 1.0, 0.5, gemv(rows=4, unroll=8, k_warps=4, splits=32, fused=True), "col"),
    (11, 280, 1499, False, "none", 1.0, 0.0, gemv(rows=16, unroll=2, k_warps=8, splits=64)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"{c[0]}x{c[1]}x{c[2]}_{(c[8:] or ['row'])[0]}" for c in GPU_CASES])
def test_gemv_matches_the_reference_on_the_gpu(case):
    from gemmgen.tune.bench import GpuBenchmark

    m, n, k, bias, activation, alpha, beta, config, *layout = case
    problem = Problem.create(m, n, k, "bf16", layout[0] if layout else "row", "row", alpha=alpha, beta=beta,
                             bias=bias, activation=activation)
    assert constraints.check(config, H100, Arch.SM90A, problem) == []
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    bench = GpuBenchmark(seed=m * 7 + n)
    try:
        result = bench.verify(make_manifest(kernel, problem), compile_kernel(kernel).cubin, problem)
    finally:
        bench.close()
    assert result.ok, result


def test_every_gpu_case_is_a_configuration_the_rules_accept():
    """The GPU cases above run only where a driver is found: their configurations are checked here on the CPU."""
    for m, n, k, bias, activation, alpha, beta, config, *layout in GPU_CASES:
        problem = Problem.create(m, n, k, "bf16", layout[0] if layout else "row", "row", alpha=alpha, beta=beta,
                                 bias=bias, activation=activation)
        assert constraints.check(config, H100, Arch.SM90A, problem) == [], (m, n, k, config.tag)


def test_fused_split_k_is_one_launch_with_counters_zeroed_once_at_the_head_of_the_workspace():
    problem = Problem.create(1, 4095, 4095, "bf16", "row", "row")
    config = TileConfig.from_dict({**gemv(rows=1, k_warps=4).to_dict(),
                                   "decomposition": {"kind": "splitk", "splits": 8, "fused": True}})
    assert broken(config, problem) == []
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    launches = FAMILY.launches(kernel, problem)
    assert [launch["entry"] for launch in launches.launches] == [kernel.name]
    assert launches.workspace_bytes == 64 * 4 + 8 * 1 * 4095 * 4
    assert launches.workspace_zero == {"bytes": 256, "when": "bind"}
    source = compile_kernel(kernel, H100)
    counts = instruction_counts(dump_sass(source.cubin))
    assert count_prefix(counts, "ATOMG") > 0 and count_prefix(counts, "LDL") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,a", [(1, 4095, 4095, "row"), (5, 3001, 2999, "col")])
def test_a_loaded_fused_kernel_stays_correct_call_after_call(tmp_path, m, n, k, a):
    """The arrival counters live in the loaded kernel's workspace, zeroed once: each call's last slice must put
    them back to zero, or the next call would sum too early. Four calls on fresh inputs, D poisoned each time."""
    torch = pytest.importorskip("torch")
    from gemmgen.tune.export import export_bundle

    problem = Problem.create(m, n, k, "bf16", a, "row")
    config = gemv(rows=8 if m > 1 else 1, unroll=4, k_warps=4, splits=8, fused=True)
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    export_bundle(tmp_path, kernel, problem, compile_kernel(kernel), measured=None, verification=None,
                  environment={})
    gemm = gemmgen.load(tmp_path)
    torch.backends.cuda.matmul.allow_tf32 = False
    for _ in range(4):
        A = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        A = A.t().contiguous().t() if a == "col" else A
        B = torch.randn(k, n, device="cuda").to(torch.bfloat16)
        D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(A, B, D)
        torch.cuda.synchronize()
        ref = A.double() @ B.double()
        assert torch.isfinite(D).all()
        assert float((D.double() - ref).norm() / ref.norm()) < 1e-2
