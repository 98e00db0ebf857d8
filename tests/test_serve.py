"""One compiled kernel serves every problem its operand description and family rules allow: the loader checks a
new shape exactly and computes its launches. CPU parts here; on a GPU, shapes other than the bundle's run against
torch.matmul."""
from __future__ import annotations

import pytest

from gemmgen import Arch, Kernel, Problem, TileConfig
from gemmgen.model.arch import lookup_gpu
from gemmgen.model.errors import InvalidInput
from gemmgen.rank.space import default_config, enumerate_space
from gemmgen.runtime.manifest import make_manifest
from gemmgen.runtime.serve import check_serves, kernel_of, manifest_for, problem_from_shapes

H100 = lookup_gpu("h100")


def kernel_for(problem, config=None):
    return Kernel(Arch.SM90A, problem.operands, config or default_config(problem, H100))


def test_a_kernel_serves_other_shapes_with_their_own_grid_and_the_same_parameters():
    base = Problem.create(4096, 4096, 4096)
    kernel = kernel_for(base)
    manifest = make_manifest(kernel, base)
    assert kernel_of(manifest) == kernel and manifest["serves"]["multiple_of"] == {"M": 1, "N": 8, "K": 8}
    other = problem_from_shapes(base, (1000, 2048), (2048, 512), (1000, 512))
    served = manifest_for(manifest, kernel, other)
    assert served["problem"]["M"] == 1000 and served["launches"][0]["block"] == manifest["launches"][0]["block"]
    names = [p["name"] for p in served["launches"][0]["params"]]
    assert names == [p["name"] for p in manifest["launches"][0]["params"]]
    scalars = {p["name"]: p["value"] for p in served["launches"][0]["params"] if p["kind"] == "scalar"}
    assert (scalars["M"], scalars["N"], scalars["K"]) == (1000, 512, 2048)


def test_a_bundle_from_an_earlier_gemmgen_keeps_the_parameters_its_cubin_takes():
    # sm90 kernels exported before 2026-11-27 take no edge maps: their launches at another shape must not gain them
    # (parameters are passed by position), and a parameter this gemmgen no longer builds is refused by name.
    base = Problem.create(4096, 4096, 4096, b="col")
    # 1x1 clusters: neither operand is multicast, so both take an edge map.
    kernel = kernel_for(base, TileConfig.from_dict({"family": "sm90_wgmma", "cta": "128x256x64", "warp": "64x256x64",
                                                    "mma": "64x256x16", "stages": 4, "warp_specialized": True,
                                                    "persistent": True}))
    manifest = make_manifest(kernel, base)
    names = [p["name"] for p in manifest["launches"][0]["params"]]
    assert "tmAe" in names and "tmBe" in names
    old = dict(manifest, launches=[dict(launch, params=[p for p in launch["params"] if p["name"] not in ("tmAe", "tmBe")])
                                   for launch in manifest["launches"]])
    other = problem_from_shapes(base, (1000, 2048), (2048, 520), (1000, 520))
    served = manifest_for(old, kernel, other)
    assert [p["name"] for p in served["launches"][0]["params"]] == [n for n in names if n not in ("tmAe", "tmBe")]
    assert [p["name"] for p in manifest_for(manifest, kernel, other)["launches"][0]["params"]] == names
    unknown = dict(manifest, launches=[dict(launch, params=launch["params"] + [{"name": "gone", "kind": "scalar",
                                                                               "ctype": "int", "value": 0}])
                                       for launch in manifest["launches"]])
    with pytest.raises(InvalidInput, match="re-export the bundle"):
        manifest_for(unknown, kernel, other)


@pytest.mark.parametrize("shapes,rule", [
    (((64, 4100), (4100, 64), (64, 64)), "alignment"),          # K not a multiple of 8: TMA strides
    (((64, 64), (65, 64), (64, 64)), "A: M x K, B: K x N"),     # inconsistent shapes
])
def test_a_shape_the_kernel_cannot_serve_is_refused_naming_the_rule(shapes, rule):
    base = Problem.create(4096, 4096, 4096)
    kernel = kernel_for(base)
    with pytest.raises(InvalidInput, match=rule):
        check_serves(kernel, problem_from_shapes(base, *shapes))


def test_family_limits_follow_the_problem_split_k_slices_and_the_swapped_tile():
    skinny = Problem.create(16, 4096, 4096, "bf16", "row", "col")
    swapped = [c for c in enumerate_space("sm90_wgmma", H100, problem=skinny) if c.swap_ab and c.cta.n < 128]
    wide = next(c for c in enumerate_space("sm90_wgmma", H100, problem=skinny) if c.swap_ab and c.cta.n >= 128
                and c.cta.m >= 128)
    # A wide swapped tile serves M up to four of its token columns; a skinny one M up to its N.
    assert make_manifest(kernel_for(skinny, wide), skinny)["serves"]["m_max"] == 4 * wide.cta.n
    check_serves(kernel_for(skinny, wide), problem_from_shapes(skinny, (4 * wide.cta.n - 3, 4096), (4096, 4096),
                                                               (4 * wide.cta.n - 3, 4096)))
    with pytest.raises(InvalidInput, match="skinny"):
        check_serves(kernel_for(skinny, wide), problem_from_shapes(skinny, (4 * wide.cta.n + 8, 4096), (4096, 4096),
                                                                   (4 * wide.cta.n + 8, 4096)))
    kernel = kernel_for(skinny, swapped[0])
    assert make_manifest(kernel, skinny)["serves"]["m_max"] == swapped[0].cta.n
    check_serves(kernel, problem_from_shapes(skinny, (8, 4096), (4096, 4096), (8, 4096)))
    with pytest.raises(InvalidInput, match="skinny"):
        check_serves(kernel, problem_from_shapes(skinny, (swapped[0].cta.n + 8, 4096), (4096, 4096),
                                                 (swapped[0].cta.n + 8, 4096)))
    split = next(c for c in enumerate_space("sm90_wgmma", H100, problem=skinny)
                 if c.decomposition.splits > 2 and not c.swap_ab)
    kernel = kernel_for(skinny, split)
    k_min = make_manifest(kernel, skinny)["serves"]["k_min"]
    short = k_min - 1 - split.cta.k + 8  # one K tile fewer than slices, still 16-byte rows
    with pytest.raises(InvalidInput, match="split-K factor"):
        check_serves(kernel, problem_from_shapes(skinny, (16, short), (short, 4096), (16, 4096)))
    check_serves(kernel, problem_from_shapes(skinny, (16, k_min + 7), (k_min + 7, 4096), (16, 4096)))


def test_operands_past_the_familys_indexing_are_refused():
    base = Problem.create(4096, 4096, 4096)
    kernel = kernel_for(base)
    # sm90_wgmma's offsets are 64-bit: A of 2.8e9 elements is served; a dimension past int is not.
    check_serves(kernel, problem_from_shapes(base, (70000, 40000), (40000, 64), (70000, 64)))
    with pytest.raises(InvalidInput, match="32-bit"):
        check_serves(kernel, problem_from_shapes(base, (2**31, 8), (8, 64), (2**31, 64)))
    sm80 = Kernel(Arch.SM80, base.operands, default_config(base, lookup_gpu("a100")))
    with pytest.raises(InvalidInput, match="32-bit"):
        check_serves(sm80, problem_from_shapes(base, (70000, 40000), (40000, 64), (70000, 64)))


# --- on the GPU ---------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("tuned,calls", [
    ((4096, 4096, 4096), [(4096, 4096, 4096), (1000, 3000, 520), (8, 64, 4096), (4097, 1000, 64)]),
    ((16, 4096, 4096), [(16, 4096, 4096), (1, 1000, 4096), (12, 512, 8)]),
    ((1024, 1024, 65536), [(1024, 1024, 65536), (300, 200, 10000)]),
])
def test_a_loaded_kernel_computes_other_shapes_as_torch_does(tmp_path, tuned, calls):
    torch = pytest.importorskip("torch")
    import gemmgen
    from gemmgen.codegen.nvrtc import compile_kernel
    from gemmgen.tune.export import export_bundle

    problem = Problem.create(*tuned, "bf16", "row", "col")
    kernel = kernel_for(problem)
    export_bundle(tmp_path, kernel, problem, compile_kernel(kernel), measured=None, verification=None, environment={})
    gemm = gemmgen.load(tmp_path)
    for m, n, k in calls:
        A = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()   # column-major K x N
        D = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(A, B, D)
        torch.cuda.synchronize()
        ref = A.double() @ B.double()
        err = float((D.double() - ref).norm() / ref.norm())
        assert err < 1e-2, (kernel.name, (m, n, k), err)


def test_a_3xtf32_kernel_refuses_a_k_whose_three_segments_overflow_its_int_k():
    # Regression: 3xTF32 passes 3 x K (rounded up to whole k-tiles) as its `int` K scalar; at K = 2e9 the manifest
    # said K = 6e9, which the launch wrapped to 1.7e9, and `gemmgen compile` wrote the bundle without a word.
    from gemmgen.families.rules import check

    config = TileConfig.from_dict({"family": "sm90_wgmma", "cta": "128x128x32", "warp": "64x128x32",
                                   "mma": "64x128x8", "stages": 4, "warp_specialized": True, "persistent": True,
                                   "promote": 8, "split3": True})
    fits = Problem.create(64, 64, (2**31 - 1) // 3 // 32 * 32, "f32", fp32_math="3xtf32")
    assert check(config, H100, Arch.SM90A, fits) == []
    over = Problem.create(64, 64, fits.k + 32, "f32", fp32_math="3xtf32")
    assert any("three K segments" in v.rule for v in check(config, H100, Arch.SM90A, over))
    with pytest.raises(InvalidInput, match="three K segments"):
        check_serves(kernel_for(fits, config), over)
    assert make_manifest(kernel_for(fits, config), fits)["serves"]["k_max"] == fits.k   # what a launcher reads


@pytest.mark.parametrize("dtype,k,operand", [("bf16", 2**31 - 1, "A"), ("e4m3", 2**31 - 8, "A")])
def test_a_packed_copy_whose_rounded_rows_overflow_its_int_leading_dimension_is_refused(dtype, k, operand):
    # Regression: `gemmgen compile 2 2 2147483647 --gpu h100` wrote lda = 2147483648 (A's misaligned rows packed,
    # rounded up to 128 bytes) into an `int` scalar and into the pack launch's ld_dst: both wrapped negative.
    from gemmgen.families.rules import check

    config = TileConfig.from_dict({"family": "sm90_wgmma", "cta": "128x128x64", "warp": "64x128x64",
                                   "mma": "64x128x16", "stages": 4, "warp_specialized": True, "persistent": True})
    if dtype == "e4m3":
        config = TileConfig.from_dict(dict(config.to_dict(), cta="128x128x128", warp="64x128x128", mma="64x128x32"))
    problem = Problem.create(2, 2, k, dtype)
    rules = [v.rule for v in check(config, H100, Arch.SM90A, problem)]
    assert any(f"packed copy of {operand}" in r for r in rules), rules
    assert not any("packed copy" in v.rule for v in check(config, H100, Arch.SM90A, Problem.create(2, 2, 2**31 - 256,
                                                                                                     dtype)))
