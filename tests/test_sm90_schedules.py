"""The sm90_wgmma ping-pong schedule, Stream-K and fused split-K: rules, manifests, SASS and GPU checks."""
from __future__ import annotations

import pytest

from gemmgen.families import rules as constraints

from gemmgen.tune import utility
from gemmgen.model.arch import Arch
from gemmgen.model.errors import CompileError, InvalidInput
from gemmgen.families.sm90_wgmma import context as sm90_context
from gemmgen.families.sm90_wgmma.config import Schedule
from gemmgen.families.sm90_wgmma import launch as sm90
from gemmgen.families.sm90_wgmma import rules as sm90_rules
from gemmgen.model.problem import Problem
from gemmgen.codegen.render import render
from gemmgen.rank.space import enumerate_space
from gemmgen.model.tiles import Cluster, Kernel, Shape3, TileConfig
from sm90_helpers import H100, compile_sm90, count, hopper_config, ops, sass_counts, splitk_config


# --- ping-pong schedule -------------------------------------------------------------------------------
def pingpong_config(cta="128x128x64", stages=6, **changes) -> TileConfig:
    from dataclasses import replace
    from gemmgen.families.sm90_wgmma.config import Schedule
    return replace(hopper_config(cta, cta, stages), schedule=Schedule.PINGPONG, **changes)


def test_pingpong_is_named_only_when_chosen_and_round_trips():
    cooperative = hopper_config()
    assert "_pp" not in cooperative.tag and not cooperative.tag.endswith("pp")
    assert cooperative.to_dict()["schedule"] == "cooperative"
    config = pingpong_config()
    assert config.tag == cooperative.tag.replace("cta128x256x64_w64x256x64_mma64x256x16_s4",
                                                 "cta128x128x64_w128x128x64_mma64x128x16_s6") + "_pp"
    assert TileConfig.from_dict(config.to_dict()) == config
    assert TileConfig.from_text(config.to_yaml()) == config
    legacy = cooperative.to_dict()
    del legacy["schedule"]  # records written before the field read as cooperative
    assert TileConfig.from_dict(legacy) == cooperative


def test_pingpong_runs_two_consumer_warpgroups_over_one_warpgroup_tile():
    config = pingpong_config()
    assert config.warps_m * config.warps_n == 1 and config.threads == 384
    assert constraints.check(config, H100, Arch.SM90A, operands=ops()) == []
    # Two warpgroups' epilogue staging, as the cooperative 128x256 (8 consumer warps).
    # Six 32 KB stages leave each of the 8 consumer warps 4 store boxes (4 KB) of its 8-box share.
    assert sm90_rules.epi_boxes(config, ops()) == 4
    assert constraints.smem_bytes(config, ops()) == 6 * 32768 + 8 * 4 * sm90_rules.EPI_BOX_BYTES + 2048
    params = sm90_context.context(Kernel(Arch.SM90A, ops(), config))
    assert params["pingpong"] and params["consumers"] == 2 and params["setmaxnreg"]
    entry = sm90.launch(Kernel(Arch.SM90A, ops(), config), Problem.create(4096, 4096, 4096), sm_count=132)
    assert entry["block"] == [384, 1, 1] and entry["grid"] == [132, 1, 1]


@pytest.mark.parametrize("changes,rule", [
    ({"warp": Shape3(64, 128, 64)}, "warpgroup tile must equal the CTA tile"),
    ({"persistent": False}, "ping-pong needs the persistent tile loop"),
])
def test_pingpong_rejects_what_the_template_does_not_implement(changes, rule):
    config = pingpong_config(**changes)
    assert any(rule in v.rule for v in constraints.check(config, H100, Arch.SM90A, operands=ops()))


@pytest.mark.parametrize("cluster", [Cluster(2, 1), Cluster(1, 2)])
def test_pingpong_with_a_cluster_multicasts_and_releases_each_stage_to_both_ctas(cluster):
    # Verified on the H100 2026-11-23 (35/35 checks, docs/perf-notes.md "Ping-pong with clusters"); slower
    # than the cooperative winners there, so the search space does not offer it.
    config = pingpong_config(cluster=cluster)
    assert constraints.check(config, H100, Arch.SM90A, operands=ops()) == []
    kernel = Kernel(Arch.SM90A, ops(), config)
    source = render(kernel)
    assert "mbar_init(empty_bar + 8 * s, 4 * RING_CTAS);" in source
    assert f"CL_M = {cluster.m}, CL_N = {cluster.n}" in source
    compiled = compile_sm90(kernel)
    counts = sass_counts(compiled.cubin)
    assert count(counts, "UTMALDG") > 0 and count(counts, "LDL") == 0 and count(counts, "STL") == 0
    assert compiled.resources.spill_bytes == 0


def test_pingpong_rejects_split_k_and_the_sm80_family():
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    from gemmgen.families.sm90_wgmma.config import Schedule
    split = pingpong_config(decomposition=Decomposition(DecompKind.SPLIT_K, 2))
    assert any("data-parallel" in v.rule for v in constraints.check(split, H100, Arch.SM90A, operands=ops()))
    # The schedule is an sm90 knob: an sm80 configuration cannot even carry it.
    sm80 = {"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16", "stages": 3}
    with pytest.raises(InvalidInput, match="family sm80_mma has no knob schedule"):
        TileConfig.from_dict(dict(sm80, schedule="pingpong"))
    assert not constraints.check(TileConfig.from_dict(dict(sm80, schedule="cooperative")), H100)


def test_pingpong_render_orders_mainloops_with_named_barriers():
    source = render(Kernel(Arch.SM90A, ops(), pingpong_config()))
    assert "bar.sync %0, %1;" in source and "bar.arrive %0, %1;" in source
    assert "mbar_init(empty_bar + 8 * s, 4 * RING_CTAS);" in source  # one warpgroup releases each stage
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in source
    cooperative = render(Kernel(Arch.SM90A, ops(), hopper_config()))
    assert "named_bar" not in cooperative and "CONSUMERS * 4 * RING_CTAS" in cooperative


def test_pingpong_space_configs_survive_the_tuner_encoding():
    from gemmgen.rank.ranking import SearchSpace
    valid = enumerate_space("sm90_wgmma", H100, Arch.SM90A, operands=ops())
    pingpong = [c for c in valid if c.schedule.value == "pingpong"]
    assert pingpong, "the space should offer ping-pong tiles"
    space = SearchSpace(valid, lambda c: constraints.check(c, H100, Arch.SM90A, operands=ops()))
    for config in pingpong + valid[:5]:
        assert space.decode(space.params(config)) == config


@pytest.mark.parametrize("cta,stages,dtype,a,b", [
    ("128x128x64", 6, "bf16", "row", "col"), ("128x128x64", 4, "f16", "col", "row"),
    ("64x256x64", 5, "bf16", "row", "row"), ("64x256x64", 5, "f16", "col", "col")])
def test_pingpong_compiles_to_hgmma_and_tma_without_local_memory(cta, stages, dtype, a, b):
    compiled = compile_sm90(Kernel(Arch.SM90A, ops(dtype, a, b), pingpong_config(cta, stages)))
    counts = sass_counts(compiled.cubin)
    assert count(counts, "HGMMA") > 0 and count(counts, "UTMALDG") > 0
    assert count(counts, "LDL") == 0 and count(counts, "STL") == 0 and compiled.resources.spill_bytes == 0
    assert count(counts, "BAR") >= 2, "the mainloop turn barriers (bar.sync / bar.arrive) are missing"


# --- Stream-K (data-parallel waves + K-split remainder, fixed up in-kernel) ------------------------------
def streamk_config(cta="128x256x64", warp="64x256x64", stages=4, **changes) -> TileConfig:
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    return replace(hopper_config(cta, warp, stages), decomposition=Decomposition(DecompKind.STREAM_K), **changes)


def range_begin(c: int, rem: int, k_tiles: int, grid: int) -> int:
    r = rem * k_tiles
    q = r // grid
    return c * q + min(c, r - q * grid)


def walk(tiles: int, grid: int, k_tiles: int):
    """Python transcription of the template's Stream-K Walk: every CTA's units as (tile, z, kt0, kcount)."""
    rem = tiles % grid
    slices = 1 if rem == 0 else min(grid // rem, k_tiles, 16)
    if slices == 1:
        if rem > 0 and k_tiles >= 2:
            slices = -(rem * k_tiles // grid)   # range mode: -q
        else:
            rem = 0
    dp = tiles - rem
    per_cta = []
    for g in range(grid):
        units, u = [], g
        while u < dp:
            units.append((u, 0, 0, k_tiles))
            u += grid
        if slices < 0:
            # The template's next(), state for state: u = dp + cursor, + R while a tail is pending, INT_MAX when done.
            total, end = rem * k_tiles, range_begin(g + 1, rem, k_tiles, grid)
            u = dp + range_begin(g, rem, k_tiles, grid)
            for _ in range(4):
                it = u - dp
                tail = it >= total
                if tail:
                    it -= total
                if it >= end:
                    break
                tr = it // k_tiles
                boundary = (tr + 1) * k_tiles
                kt0 = it - tr * k_tiles
                if not tail and kt0 > 0 and boundary < end:
                    t, kt0, kc = dp + tr + 1, 0, end - boundary
                    u = dp + total + it
                else:
                    t, kc = dp + tr, min(boundary, end) - it
                    u = 2**31 - 1
                units.append((t, int(kt0 + kc < k_tiles), kt0, kc))
            else:
                raise AssertionError(f"CTA {g}'s range walk does not end")
        else:
            while u < dp + rem * slices:
                v = u - dp
                z = v // rem
                kt0 = z * k_tiles // slices
                units.append((dp + v - z * rem, z, kt0, (z + 1) * k_tiles // slices - kt0))
                u += grid
        per_cta.append(units)
    return per_cta, dp, rem, slices


def range_contributors(g: int, t: int, dp: int, rem: int, k_tiles: int, grid: int) -> "list[int]":
    """The template's owner loop: the CTAs before g whose ranges end inside remainder tile t."""
    tile_start = (t - dp) * k_tiles
    lo = g
    while lo > 0 and range_begin(lo, rem, k_tiles, grid) > tile_start:
        lo -= 1
    return list(range(lo, g))


@pytest.mark.parametrize("tiles,grid,k_tiles", [(288, 132, 47), (64, 132, 16), (32, 132, 1024), (132, 132, 16),
                                                (1, 132, 1), (3584, 132, 64), (8192, 132, 64), (20, 132, 3),
                                                (512, 132, 64), (2048, 132, 128), (768, 132, 64), (131, 132, 2),
                                                (100, 132, 5), (67, 132, 1), (1000, 132, 7)])
def test_streamk_walk_covers_every_k_tile_of_every_tile_once_and_each_cta_owes_at_most_one_partial(
        tiles, grid, k_tiles):
    per_cta, dp, rem, slices = walk(tiles, grid, k_tiles)
    covered = {}
    for units in per_cta:
        # At most one remainder partial handed over per CTA (its slot and flag), and in range mode it comes
        # first, before the CTA's own owner piece (so no CTA waits before it has signalled); a range's pieces
        # start at K tile 0 or end at its tile's last, so concurrent CTAs stay near one K offset.
        partials = [i for i, (t, z, _, _) in enumerate(units) if t >= dp and z > 0]
        assert len(partials) <= 1
        if slices >= 0:
            assert sum(1 for t, z, _, _ in units if t >= dp) <= 1  # one remainder unit per CTA
        else:
            pieces = [u for u in units if u[0] >= dp]
            assert len(pieces) <= 2
            if partials:
                assert partials[0] == next(i for i, (t, _, _, _) in enumerate(units) if t >= dp)
            if len(pieces) == 2:
                assert pieces[0][2] == 0 and pieces[1][2] + pieces[1][3] == k_tiles
        for t, z, kt0, kc in units:
            assert kc >= 1
            for kt in range(kt0, kt0 + kc):
                covered[(t, kt)] = covered.get((t, kt), 0) + 1
    assert covered == {(t, kt): 1 for t in range(tiles) for kt in range(k_tiles)}
    if slices < 0:
        # Every piece without its tile's last K tile is added by exactly that tile's owner (the CTA holding
        # it), found by the owner loop the template runs.
        owner = {t: g for g, units in enumerate(per_cta) for t, z, kt0, kc in units if t >= dp and kt0 + kc == k_tiles}
        added = {g: t for t in owner for g in range_contributors(owner[t], t, dp, rem, k_tiles, grid)}
        handed = {g: t for g, units in enumerate(per_cta) for t, z, _, _ in units if t >= dp and z > 0}
        assert added == handed
    # The host's grid and the model's slice count agree with the kernel's.
    assert slices <= 16 and (rem == 0 or slices < 0 or rem * slices <= grid)


def test_streamk_manifest_sizes_flags_and_partials_and_zeroes_the_flags_once():
    from gemmgen.runtime.manifest import make_manifest
    problem = Problem.create(3000, 3000, 3000, "bf16", "row", "row")
    kernel = Kernel(Arch.SM90A, problem.operands, streamk_config())
    manifest = make_manifest(kernel, problem)
    (main,) = manifest["launches"]
    assert main["grid"] == [132, 1, 1] and main["cluster"] == [1, 1, 1]
    assert manifest["workspace_bytes"] == 192 * 4 + 132 * 128 * 256 * 4   # 132 flags padded to 192, one tile each
    assert manifest["workspace_zero"] == {"bytes": 192 * 4, "when": "bind"}
    assert sm90.streamk_slices(kernel, problem, 132) == (264, 5)   # 288 tiles: 2 waves + 24 tiles x 5 slices
    # 4096^3: 512 tiles, the last wave 116 of 132: range mode over every CTA.
    big = Problem.create(4096, 4096, 4096, "bf16", "row", "row")
    assert sm90.streamk_slices(kernel, big, 132) == (396, 0)
    assert make_manifest(kernel, big)["launches"][0]["grid"] == [132, 1, 1]
    # Fewer tiles than SMs: the grid is still every SM, the tiles cut into slices.
    small = Problem.create(1024, 1024, 1024, "bf16", "row", "row")
    k128 = Kernel(Arch.SM90A, small.operands, streamk_config("128x128x64", "64x128x64"))
    assert make_manifest(k128, small)["launches"][0]["grid"] == [128, 1, 1]   # 64 tiles x 2 slices
    assert sm90.streamk_slices(k128, small, 128) == (0, 2)


def test_split_k_and_dp_manifests_say_their_workspace_needs_no_zeroing_but_sm80_split_k_does():
    from gemmgen.runtime.manifest import make_manifest, workspace_zero
    problem = Problem.create(1024, 1024, 65536, "bf16", "row", "row")
    split = make_manifest(Kernel(Arch.SM90A, problem.operands, splitk_config(4)), problem)
    assert split["workspace_zero"] == {"bytes": 0, "when": "run"}
    sm80 = TileConfig.from_dict({"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16",
                                 "stages": 3, "decomposition": {"kind": "splitk", "splits": 4}})
    m80 = make_manifest(Kernel(Arch.SM80, problem.operands, sm80), problem)
    assert m80["workspace_zero"] == {"bytes": m80["workspace_bytes"], "when": "run"}
    # A manifest from before the key existed keeps format 1's contract: all of it, before every run.
    assert workspace_zero({"workspace_bytes": 64}) == {"bytes": 64, "when": "run"}
    with pytest.raises(InvalidInput):
        workspace_zero({"workspace_bytes": 64, "workspace_zero": {"bytes": 8, "when": "sometimes"}})


@pytest.mark.parametrize("changes,rule", [
    ({"persistent": False}, "Stream-K needs the persistent tile loop"),
    ({"schedule": Schedule.PINGPONG}, "Stream-K is implemented for the cooperative schedule"),
])
def test_streamk_rejects_what_the_template_does_not_implement(changes, rule):
    config = streamk_config(**changes)
    assert any(rule in v.rule for v in constraints.check(config, H100, Arch.SM90A, operands=ops()))
    assert not constraints.check(streamk_config(), H100, Arch.SM90A, operands=ops())


def test_streamk_kernel_compiles_without_local_memory_and_renders_the_fixup():
    kernel = Kernel(Arch.SM90A, ops(b="row"), streamk_config())
    source = render(kernel)
    assert "struct Walk {\n    int u, rem, slices;" in source and "sk_wait(flags + v + z * stride, leader)" in source
    assert "sk_wait(flags + c * CL_SIZE + me, leader)" in source   # range mode
    assert "sk_range_begin(blockIdx.x / CL_SIZE + 1" in source
    assert "ld.acquire.gpu.global.u32" in source and "fence.acq_rel.gpu;" in source
    assert "sk_wait" not in render(Kernel(Arch.SM90A, ops(), hopper_config()))
    compiled = compile_sm90(kernel)
    assert compiled.spill_bytes == 0 and "C7514" not in compiled.log
    counts = sass_counts(compiled.cubin)
    assert count(counts, "HGMMA") > 0 and count(counts, "UTMALDG") > 0
    assert count(counts, "LDL") == 0 and count(counts, "STL") == 0


@pytest.mark.slow
def test_streamk_tiles_compile_without_spills_in_every_layout_and_epilogue():
    # Range mode and the short epilogue left the consumers' registers on a knife edge (docs/perf-notes.md,
    # "Stream-K range mode"): every Stream-K tile of the space, all four layouts, plain and bias+GELU epilogues,
    # D through TMA stores. (With plain stores of D, ldc not a multiple of 8, 256x128 and 64x256 spill 8-24 bytes
    # with bias: a known limitation, listed in the README.)
    from gemmgen.codegen.nvrtc import compile_many
    tiles = [("128x256x64", "64x256x64", 3), ("128x256x64", "64x256x64", 4), ("256x128x64", "128x128x64", 4),
             ("128x128x64", "64x128x64", 4), ("128x128x64", "64x128x64", 6)]
    kernels = [Kernel(Arch.SM90A, ops(dtype, a, b, bias, act), streamk_config(cta, warp, stages))
               for cta, warp, stages in tiles for a in ("row", "col") for b in ("row", "col")
               for dtype, bias, act in (("bf16", False, "none"), ("f16", True, "gelu"))]
    results = compile_many(kernels)
    failures = [r for r in results if isinstance(r, CompileError)]
    assert not failures, str(failures[0])
    assert not [r.name for r in results if r.spill_bytes or r.resources.wgmma_serialized or "C7514" in r.log]


def test_model_prices_streamk_by_its_remainder_slices():
    from gemmgen.rank.predict import predict
    odd = Problem.create(3000, 3000, 3000, "bf16", "row", "row")
    sk, dp = predict(odd, streamk_config(), H100), predict(odd, hopper_config(), H100)
    assert sk.wave_efficiency > 0.95 > dp.wave_efficiency   # 2 waves + 1/5 of one vs 3 waves for 2.18
    assert sk.time_s < dp.time_s
    # A last wave more than half full (116 of 132 tiles at 4096^3) runs in range mode: the wave takes 57 of the
    # tile's 64 K iterations, and the model charges the partials' trip through L2.
    square = Problem.create(4096, 4096, 4096, "bf16", "row", "row")
    sk, dp = predict(square, streamk_config(), H100), predict(square, hopper_config(), H100)
    assert dp.wave_efficiency == pytest.approx(512 / 528)
    assert sk.wave_efficiency == pytest.approx((512 / 132) / (3 + 57 / 64))
    assert sk.dram_bytes > dp.dram_bytes


# --- fused split-K (the reduction inside the GEMM launch) ---------------------------------------------
def fused_config(splits: int, cta="64x128x64", warp="64x128x64", stages=6) -> TileConfig:
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    return replace(hopper_config(cta, warp, stages), decomposition=Decomposition(DecompKind.SPLIT_K, splits, True))


def test_fused_split_k_is_named_round_trips_and_leaves_unfused_records_unchanged():
    from gemmgen.rank.ranking import axis_values, config_from_axes
    fused = fused_config(8)
    assert fused.decomposition.tag == "splitk8f" and "_splitk8f_" in fused.tag
    assert fused.to_dict()["decomposition"] == {"kind": "splitk", "splits": 8, "fused": True}
    assert TileConfig.from_dict(fused.to_dict()) == fused
    assert config_from_axes("sm90_wgmma", axis_values(fused)) == fused
    plain = splitk_config(8)
    assert plain.to_dict()["decomposition"] == {"kind": "splitk", "splits": 8}   # as before the field existed
    assert plain.decomposition.tag == "splitk8"
    with pytest.raises(InvalidInput):
        TileConfig.from_dict(dict(fused.to_dict(), decomposition={"kind": "splitk", "splits": 8, "fused": "yes"}))


def test_fused_reduction_is_a_split_k_option_of_the_sm90_family_only():
    from dataclasses import replace
    from gemmgen.model.tiles import DecompKind, Decomposition
    assert not constraints.check(fused_config(8), H100, Arch.SM90A, operands=ops())
    dp = replace(hopper_config(), decomposition=Decomposition(DecompKind.DATA_PARALLEL, 1, True))
    assert any("a fused reduction is a split-K option" in v.rule
               for v in constraints.check(dp, H100, Arch.SM90A, operands=ops()))
    sm80 = TileConfig.from_dict({"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16",
                                 "stages": 3, "decomposition": {"kind": "splitk", "splits": 4, "fused": True}})
    assert any("family sm80_mma has no fused split-K reduction" in v.rule
               for v in constraints.check(sm80, H100, Arch.SM90A, operands=ops()))


def test_fused_split_k_manifest_is_one_launch_with_counters_zeroed_once_then_partials():
    from gemmgen.runtime.manifest import make_manifest
    problem = Problem.create(16, 4096, 4096, "bf16", "row", "row")
    kernel = Kernel(Arch.SM90A, problem.operands, fused_config(8))
    manifest = make_manifest(kernel, problem)
    (main,) = manifest["launches"]
    # 1 x 32 tiles of 64x128: 32 counters padded to 64 words, then 8 slices of 16 x 4096 fp32 partials.
    assert manifest["workspace_bytes"] == 64 * 4 + 8 * 16 * 4096 * 4
    assert manifest["workspace_zero"] == {"bytes": 64 * 4, "when": "bind"}
    assert main["grid"] == [132, 1, 1]                       # 256 units on the persistent grid
    assert sm90.fused_counter_words(kernel, problem) == 64


def test_fused_split_k_renders_the_arrival_and_no_reduce_entry_and_compiles_without_local_memory():
    kernel = Kernel(Arch.SM90A, ops(b="row"), fused_config(4, "128x256x64", "64x256x64", 4))
    source = render(kernel)
    assert "atom.add.acq_rel.gpu.global.u32" in source and "fused_reduce_tile(partials" in source
    assert "_reduce(" not in source.replace("fused_reduce_tile(", "")
    assert "atom.add" not in render(Kernel(Arch.SM90A, ops(b="row"), splitk_config(4)))
    compiled = compile_sm90(kernel)
    assert compiled.spill_bytes == 0 and "C7514" not in compiled.log
    counts = sass_counts(compiled.cubin)
    assert count(counts, "HGMMA") > 0 and count(counts, "LDL") == 0 and count(counts, "STL") == 0
    assert count(counts, "ATOMG") + count(counts, "RED") > 0


def test_the_model_prices_fused_split_k_above_the_reduction_launch_where_it_measured_slower():
    from gemmgen.rank.predict import predict
    problem = Problem.create(16, 4096, 4096, "bf16", "row", "row")
    fused = predict(problem, fused_config(8), H100)
    plain = predict(problem, splitk_config(8, "64x128x64", "64x128x64", 6), H100)
    # Fitted to the H100: one SM reducing each tile cost more than the second launch saved (1.10x at 16x4096x4096).
    assert fused.time_s > plain.time_s


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,a,b,dtype,splits", [
    (16, 4096, 4096, "row", "row", "bf16", 8),
    (1000, 1096, 3000, "col", "row", "f16", 4),
    (65, 201, 1104, "row", "col", "bf16", 16),
])
def test_fused_split_k_gives_the_separate_reductions_bits_and_leaves_its_counters_zero(m, n, k, a, b, dtype, splits):
    """Same inputs through split-K with the reduction launch and with the fused reduction, three runs each
    (the counters must come back to zero between runs): bitwise the same D, finite, and close to float64."""
    import numpy as np
    from gemmgen.runtime import device
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.codegen.nvrtc import compile_kernel

    problem = Problem.create(m, n, k, dtype, a, b)
    sizes = {"A": m * k, "B": k * n, "D": m * n}
    outs = []
    with device.Device() as dev:
        bufs = {name: dev.alloc(count * 2) for name, count in sizes.items()}
        utility.fill_uniform(dev, bufs["A"], dtype, sizes["A"], seed=21)
        utility.fill_uniform(dev, bufs["B"], dtype, sizes["B"], seed=22)
        for fused in (False, True):
            from dataclasses import replace
            config = fused_config(splits)
            config = replace(config, decomposition=replace(config.decomposition, fused=fused))
            kernel = Kernel(Arch.SM90A, problem.operands, config)
            manifest = make_manifest(kernel, problem)
            module = dev.load(compile_kernel(kernel).cubin)
            workspace = dev.alloc(manifest["workspace_bytes"])
            dev.poison(workspace, "f32")                      # binding zeroes the counters, nothing else
            seq = dev.prepare(manifest, module, {name: buf.ptr for name, buf in bufs.items()}, workspace)
            runs = []
            for _ in range(3):
                dev.poison(bufs["D"], dtype)
                seq.run(0)
                dev.synchronize(kernel.name)
                runs.append(dev.copy_to_host(bufs["D"], np.uint16, sizes["D"]))
            if fused:
                words = sm90.fused_counter_words(kernel, problem)
                assert not dev.copy_to_host(workspace, np.uint32, words).any()   # every counter reset
            assert all(np.array_equal(runs[0], r) for r in runs[1:])
            outs.append(runs[0])
            dev.free(workspace)
            dev.unload(module)
        raw = {name: dev.copy_to_host(buf, np.uint16, sizes[name]) for name, buf in bufs.items()}
        for buf in bufs.values():
            dev.free(buf)
    assert np.array_equal(outs[0], outs[1])
    to64 = lambda name: device.to_float32(raw[name], dtype).astype(np.float64)
    av = to64("A").reshape(m, k) if a == "row" else to64("A").reshape(k, m).T
    bv = to64("B").reshape(k, n) if b == "row" else to64("B").reshape(n, k).T
    got = device.to_float32(outs[1], dtype).reshape(m, n)
    ref = av @ bv
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2


def test_ping_pong_on_an_m_major_a_is_charged_and_the_model_leaves_it_at_7408x1256x1032_cc():
    # Measured on the H100 (2026-11-27): ping-pong tiles ran 1.35-1.46x their price with a column-major A, the
    # cooperative ones at 0.88-0.98x; at 7408x1256x1032 cc the model's ping-pong pick ran 56.4 us where a cooperative
    # 128x144 2x1 tile ran 43.8 (docs/perf-notes.md, "Ping-pong on an M-major A").
    from dataclasses import replace

    from gemmgen.families.sm90_wgmma import FAMILY, PINGPONG_MN_A_EFFICIENCY
    from gemmgen.families.sm90_wgmma.config import Schedule
    from gemmgen.rank.space import default_config
    from sm90_helpers import H100, hopper_config

    pp = replace(hopper_config("128x128x64", "128x128x64", stages=6), schedule=Schedule.PINGPONG)
    cc, rc = Problem.create(7408, 1256, 1032, "bf16", "col", "col"), Problem.create(7408, 1256, 1032, "bf16", "row", "col")
    on_rc = FAMILY.compute_efficiency(pp, rc)   # the turns' charge alone (tests below)
    assert FAMILY.compute_efficiency(pp, cc) == pytest.approx(PINGPONG_MN_A_EFFICIENCY * on_rc)
    assert PINGPONG_MN_A_EFFICIENCY < 1.0
    assert FAMILY.compute_efficiency(replace(pp, schedule=Schedule.COOPERATIVE), cc) == 1.0
    # fp8: A is packed K-major first, so it pays only the turns (and its copy's rows are aligned)
    fp8 = Problem.create(7408, 1256, 1032, "e4m3", "col", "col")
    assert FAMILY.compute_efficiency(pp, fp8) == pytest.approx(1.0 / (1.0 + 1.8 / 17))
    assert default_config(cc, H100).schedule is not Schedule.PINGPONG


def test_ping_pong_pays_for_its_turns_on_short_k_loops_and_on_rows_across_128_byte_lines():
    # Measured on the H100 (2026-11-27, docs/perf-notes.md "Ping-pong on short k-loops"): against the cooperative
    # kernels timed beside them, ping-pong ran 1.3-1.75x its price at 5-27 k-tiles, about 1.0x at 64 and more, and
    # ~8% slower again on rows that straddle 128-byte lines; the model's ping-pong picks at 3861x3576x1712 rr and
    # 2088x2800x1224 rc ran 120 and 47 us where cooperative 128x128 2x1 tiles ran 95 and 35.
    from dataclasses import replace

    from gemmgen.families.sm90_wgmma import FAMILY, PINGPONG_TURN_KTILES, PINGPONG_UNALIGNED_EFFICIENCY
    from gemmgen.families.sm90_wgmma.config import Schedule
    from gemmgen.rank.space import default_config
    from sm90_helpers import H100, hopper_config

    pp = replace(hopper_config("128x128x64", "128x128x64", stages=6), schedule=Schedule.PINGPONG)
    coop = replace(pp, schedule=Schedule.COOPERATIVE)

    def eff(m, n, k, a="row", b="col", config=pp):
        return FAMILY.compute_efficiency(config, Problem.create(m, n, k, "bf16", a, b))

    # The charge falls with the k-tiles a tile runs, and is capped below 7 of them.
    assert eff(4096, 4096, 512) < eff(4096, 4096, 2048) < eff(4096, 4096, 8192) < 1.0
    assert eff(4096, 4096, 8192) == pytest.approx(1.0 / (1.0 + PINGPONG_TURN_KTILES / 128))
    assert eff(4096, 4096, 64) == eff(4096, 4096, 448)
    # Rows across 128-byte lines (K = 1224: 2448-byte rows of A and of the column-major B) cost a further share;
    # rows that are not 16-byte multiples are packed into an aligned copy first and do not.
    assert eff(2088, 2800, 1224) == pytest.approx(eff(2088, 2800, 1280) * PINGPONG_UNALIGNED_EFFICIENCY, rel=0.03)
    assert eff(2088, 2800, 1283) == pytest.approx(eff(2088, 2800, 1344))   # both 21 k-tiles
    assert eff(2088, 2800, 1224, config=coop) == 1.0
    for m, n, k, a, b in ((3861, 3576, 1712, "row", "row"), (2088, 2800, 1224, "row", "col"),
                          (589, 2992, 1176, "row", "col")):
        assert default_config(Problem.create(m, n, k, "bf16", a, b), H100).schedule is Schedule.COOPERATIVE


def test_rows_across_128_byte_lines_cost_a_tile_by_its_requests_per_flop():
    # TMA rows that straddle 128-byte lines cost per request (H100, docs/perf-notes.md "odd3000" and "Ping-pong on
    # short k-loops"): 1.28x at 128x256, 1.50x at 128x128 (odd3000); at 7408x800x8776 cc 80-wide tiles ran 1.2-1.4x
    # their price where 208-wide ones ran 0.87-0.94x, and the model's pick moved from 192x80 (261 us) to 128x208 2x1
    # (174 us). Narrow tiles make more requests per FLOP, and a cluster's multicast divides them.
    from dataclasses import replace

    from gemmgen.model.arch import lookup_gpu
    from gemmgen.model.tiles import Cluster
    from gemmgen.rank.predict import predict
    from gemmgen.rank.space import default_config
    from sm90_helpers import hopper_config

    h100 = lookup_gpu("h100")
    straddling = Problem.create(7408, 800, 8776, "bf16", "col", "col")   # 14816- and 17552-byte rows
    aligned = straddling.with_leading(lda=7424, ldb=8832)                 # the same product in wider arrays

    def slowdown(config):   # of the main loop (the aligned product is power-bound, which hides it in the total)
        return predict(straddling, config, h100).compute_s / predict(aligned, config, h100).compute_s

    narrow, wide = hopper_config("128x80x64", "64x80x64", stages=6), hopper_config("128x208x64", "64x208x64", stages=4)
    assert slowdown(narrow) > slowdown(wide) * 1.04 > 1.3
    paired = replace(narrow, cluster=Cluster(2, 1))   # multicast halves B's requests
    assert slowdown(paired) < slowdown(narrow)
    cfg = default_config(straddling, h100)
    assert cfg.cta.n >= 144, cfg.tag


def test_ping_pong_pays_the_epilogue_of_its_last_tile():
    # Ping-pong hides a tile's epilogue behind the other consumer's main loop, but nothing runs after a CTA's last
    # tile. Charged nothing for it, the model picked ping-pong tiles for short products with one tile a CTA; measured
    # on the H100 (2026-11-28, docs/perf-notes.md "Ping-pong's last epilogue"), old pick against new: 88x8808x384 cc
    # 9.67 -> 5.78 us (64x256 ping-pong -> 128x80 1x2), 1616x1184x768 rc 9.22 -> 7.09 (128x128 ping-pong ->
    # cooperative), and 8 of 9 other moved picks faster.
    from dataclasses import replace

    from gemmgen.families.sm90_wgmma.config import Schedule
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.rank.predict import ModelParams, predict
    from gemmgen.rank.space import default_config
    from sm90_helpers import H100, hopper_config

    gpu = lookup_gpu("h100")
    for m, n, k, a, b in ((88, 8808, 384, "col", "col"), (1616, 1184, 768, "row", "col")):
        assert default_config(Problem.create(m, n, k, "bf16", a, b), H100).schedule is Schedule.COOPERATIVE
    # The charge is one tile's epilogue (its D at the SM's share of DRAM) whatever the tile count: 4096^3 runs about
    # four tiles a CTA, 1024x4096x4096 one, and both pay the same one.
    pp = replace(hopper_config("128x128x64", "128x128x64", stages=6), schedule=Schedule.PINGPONG)
    p = ModelParams()
    one_epilogue = 128 * 128 * 2 / (gpu.dram_bandwidth * p.dram_efficiency / gpu.sm_count)
    for m in (1024, 4096):
        got = predict(Problem.create(m, 4096, 4096, "bf16", "row", "col"), pp, gpu, p)
        assert got.overhead_s == pytest.approx(p.launch_overhead_s + p.dram_latency_s + one_epilogue, rel=1e-6)
