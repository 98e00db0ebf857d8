"""CPU checks of the device scripts whose figures docs/perf-notes.md quotes: what they build is what they claim."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def test_space_check_covers_every_sm90_configuration_twice_with_feasible_layouts():
    import space_check
    from gemmgen.families import rules as constraints
    from gemmgen.model.arch import Arch, lookup_gpu
    from gemmgen.model.problem import Problem
    from gemmgen.rank.space import enumerate_space
    from gemmgen.model.tiles import Family

    runs = space_check.cases(0)
    configs = enumerate_space("sm90_wgmma", lookup_gpu("h100"), Arch.SM90A, operands=Problem.create(8, 8, 8).operands)
    per_config = Counter(index for index, _, _ in runs)
    assert len(per_config) == len(configs) and set(per_config.values()) == {2}
    for _, problem, kernel in runs:
        assert constraints.check(kernel.config, lookup_gpu("h100"), Arch.SM90A, operands=problem.operands) == []
        assert not kernel.config.swap_ab or problem.m <= kernel.config.cta.n   # swapped tiles on skinny M only
    assert any(kernel.config.swap_ab for _, _, kernel in runs)
    assert [r for r in runs if "_swap" in r[2].name] == space_check.cases(0, "_swap")
    assert {p.a_layout.value + p.b_layout.value for _, p, _ in runs} == {"rowrow", "rowcol", "colrow", "colcol"}
    assert any(p.epilogue.beta != 0 and p.epilogue.bias for _, p, _ in runs)   # the general epilogue path runs too


@pytest.mark.slow
def test_mma_ceiling_kernels_are_mma_sync_and_ldmatrix_without_local_memory():
    import mma_ceiling
    from gemmgen.codegen.nvrtc import compile_source
    from gemmgen.codegen.sass import count_prefix, dump_sass, instruction_counts

    cubin, log = compile_source("mma_loop", f"#define CHAINS {mma_ceiling.CHAINS}\n" + mma_ceiling.SOURCE,
                                ("--gpu-architecture=sm_90a", "-std=c++17", "--ptxas-options=-v"))
    counts = instruction_counts(dump_sass(cubin))
    assert count_prefix(counts, "HMMA.16816") >= mma_ceiling.CHAINS + 32 and count_prefix(counts, "LDSM") >= 8
    # mode 2's cp.async copies and mode 3's bulk copies (two 128-byte rows per thread per k-tile)
    assert count_prefix(counts, "LDGSTS") >= 16 and count_prefix(counts, "UBLKCP") == 2
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
    assert "0 bytes spill stores" in log


def test_ab_lab_launch_grid_resizes_the_persistent_grid_in_whole_clusters():
    import ab_lab
    from gemmgen.model.arch import Arch
    from gemmgen.runtime.manifest import make_manifest
    from gemmgen.model.tiles import Kernel

    for shape in ("sq4096", "llm_qkv"):
        problem, config = ab_lab.stored_winner(shape)
        kernel = Kernel(Arch.SM90A, problem.operands, config)
        manifest = make_manifest(kernel, problem)
        ab_lab.adjust_manifest(manifest, kernel, {"launch_grid": 129}, problem)
        size = config.cluster.size
        assert manifest["launches"][0]["grid"][0] == 129 // size * size
    assert "launch_grid" in ab_lab.LAUNCH_ONLY   # a launch change: the template is not asked for it


@pytest.mark.slow
@pytest.mark.parametrize("mode", [1, 2])
def test_ab_lab_deferred_and_spread_stores_compile_without_spills(mode):
    # epi_defer_store 1: all of a warp's boxes after the next tile's first k-tile; 2: one box per k-tile.
    import ab_lab
    from gemmgen.model.arch import Arch
    from gemmgen.model.tiles import Kernel

    from dataclasses import replace
    problem, config = ab_lab.stored_winner("sq4096")
    # The deferred stores are the consumers' own: whatever the stored winner is, time it without a store warp.
    config = replace(config, store_warp=False)
    source, (cubin, log, resources) = ab_lab.build(Kernel(Arch.SM90A, problem.operands, config),
                                                   {"epi_defer_store": mode})
    # Only the spread mode stores a single box, pend_next, inside the k-loop.
    assert ("stage + pend_next * EPI_BOX_BYTES" in source) == (mode == 2)
    assert all(r.spill_bytes == 0 for r in resources.values())


def test_hopper_lab_encodes_the_d_tensor_map_the_launch_asks_for():
    # hopper_lab.py predated TMA stores and launched them without tmD; its launches now carry every map.
    import hopper_lab
    from gemmgen.model.arch import Arch
    from gemmgen.families.sm90_wgmma import launch as sm90
    from gemmgen.model.problem import Problem
    from gemmgen.model.tiles import Kernel

    class FakeTma:
        @staticmethod
        def encode(spec, ptr):
            return (spec["name"], ptr)

    class Tensor:
        def __init__(self, ptr):
            self.ptr = ptr

        def data_ptr(self):
            return self.ptr

    kernel = Kernel(Arch.SM90A, hopper_lab.operands(), hopper_lab.config())
    launch = sm90.launch(kernel, Problem.create(256, 256, 128), 132)
    specs = {p["name"]: p for p in launch["params"] if p["kind"] == "tensormap"}
    values = hopper_lab.tensormaps(FakeTma, specs, Tensor(16), Tensor(32), Tensor(48))
    assert set(values) == set(specs) == {"tmA", "tmB", "tmD"}
    assert values["tmD"] == ("tmD", 48)


def test_timeline_summary_reads_fill_epilogue_clock_and_flop_per_clock():
    # Two CTAs, two tiles each: stamps in ns, then %clock64 at the same moments (scripts/timeline.py's layout).
    import timeline
    slots, grid = timeline.TL_SLOTS, 2
    ns = [0] * (2 * grid * slots)
    for c in range(grid):
        row, clk = c * slots, (grid + c) * slots
        marks = {0: 1000, 1: 1100, 2: 2000, 3: 9000,          # entry, start barrier, first data, exit
                 4: 4000, 5: 4300, 6: 4500,                    # tile 0: main loop end, fill end, epilogue end
                 7: 6500, 8: 6800, 9: 7000}                    # tile 1
        for slot, t in marks.items():
            ns[row + slot] = t + 100 * c
            ns[clk + slot] = 2 * (t - 2000) + 10_000           # a 2 GHz clock: 2 cycles per ns
    out = timeline.summarize(ns, grid, tile_flops=16000.0)
    assert out["tiles_per_cta"] == 2 and out["mainloop_per_tile_us"] == 2.0
    assert out["fill_per_tile_us"] == 0.3 and out["epilogue_per_tile_us"] == 0.5
    assert out["sm_mhz"] == 2000.0 and out["mainloop_clk_per_tile"] == 4000
    assert out["mainloop_flop_per_clk"] == 4.0
    assert out["launch_skew_us"] == 0.1 and out["last_exit_us"] == 8.1


def test_power_probe_reports_time_and_energy_per_gemm_and_exits_2_without_a_driver():
    import subprocess

    import power_probe

    # 1000 GEMMs of 1.374e11 FLOP in 0.18 s using 126 J: 180 us and 126 mJ each, 700 W.
    row = power_probe.summarize(1000, 0.18, 126_000.0, [1590, 1600, 1610], [690.0, 710.0], 2.0 * 4096 ** 3)
    assert row["us"] == pytest.approx(180.0) and row["mj_per_gemm"] == pytest.approx(126.0)
    assert row["watts"] == pytest.approx(700.0) and row["sm_mhz"] == 1600 and row["sampled_watts"] == 700.0
    assert row["tflops"] == pytest.approx(2.0 * 4096 ** 3 / 180e-6 / 1e12) and row["energy_source"] == "counter"
    # A counter that did not advance: the energy is the sampled power over the run.
    still = power_probe.summarize(1000, 0.18, 0.0, [1600], [700.0], 2.0 * 4096 ** 3)
    assert still["energy_source"] == "sampled" and still["mj_per_gemm"] == pytest.approx(126.0)
    try:
        power_probe.Nvml()
        pytest.skip("NVML is present: this check is for machines without a driver")
    except Exception:
        pass
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "power_probe.py"), "--out", "/tmp/power_probe_test"],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "NVML" in proc.stderr


def test_ab_lab_refuses_lab_switches_that_would_leave_the_store_warp_waiting():
    import ab_lab
    from dataclasses import replace

    from gemmgen.model.arch import Arch
    from gemmgen.model.tiles import Kernel

    problem, config = ab_lab.stored_winner("sq4096")
    kernel = Kernel(Arch.SM90A, problem.operands, replace(config, store_warp=True))
    for switch in ({"skip_epilogue": 1}, {"epi_defer_store": 1}):
        with pytest.raises(SystemExit, match="store warp"):
            ab_lab.build(kernel, switch)


def test_kernel_trace_exits_2_with_one_line_without_a_driver():
    import subprocess

    from gemmgen.model.errors import NoGpu
    try:
        from gemmgen.runtime.device import Device
        Device().open().close()
        pytest.skip("a CUDA driver is present: this check is for machines without one")
    except NoGpu:
        pass
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "kernel_trace.py"), "--out", "/tmp/kernel_trace_test"],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "no GPU available" in proc.stderr.splitlines()[-1]
