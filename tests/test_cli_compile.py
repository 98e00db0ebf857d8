"""The render, compile and space commands: files written, manifest per the docs, bad input exits 2 in one line."""
from __future__ import annotations

import json

import pytest

from gemmgen.cli import main


@pytest.fixture(autouse=True)
def compile_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path_factory.getbasetemp() / "cli-cache"))


def test_compile_writes_source_cubin_and_manifest(tmp_path, capsys):
    assert main(["compile", "1000", "17", "3000", "--gpu", "h100", "--arch", "sm_80", "--a", "col",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "registers" in out and "spill" in out
    manifests = list(tmp_path.glob("*.json"))
    assert len(manifests) == 1
    manifest = json.loads(manifests[0].read_text())
    name = manifest["name"]
    assert (tmp_path / f"{name}.cu").read_text().splitlines()[1] == f"// {name}"
    assert (tmp_path / f"{name}.cubin").read_bytes()[:4] == b"\x7fELF"
    assert manifest["format"] == "gemmgen-manifest/1" and manifest["arch"] == "sm_80"
    assert manifest["operands"]["a_layout"] == "col" and manifest["operands"]["align_b"] == 1  # N = 17
    launch = manifest["launches"][0]
    assert launch["entry"] == name and launch["dynamic_smem"] > 0
    assert [p["name"] for p in launch["params"]] == ["A", "B", "C", "D", "bias", "workspace", "M", "N", "K", "lda",
                                                     "ldb", "ldc", "ldd", "alpha", "beta"]
    assert launch["params"][0]["ctype"] == "const __nv_bfloat16*"
    assert {p["name"]: p.get("value") for p in launch["params"]}["lda"] == 1000  # col-major A: lda = M
    assert manifest["resources"]["registers"] > 0 and manifest["nvrtc_version"]


def test_compile_writes_a_bundle_the_runtime_accepts(tmp_path):
    """gemmgen.load checks a bundle before any launch (schema, cubin hash, architecture, launches): what compile
    writes passes those checks, and the manifest names the source beside the cubin."""
    from gemmgen.runtime.bundle import verify

    assert main(["compile", "1024", "1024", "1024", "--gpu", "h100", "--out", str(tmp_path)]) == 0
    manifest_path = next(tmp_path.glob("*.json"))
    manifest = json.loads(manifest_path.read_text())
    verify(manifest, (tmp_path / manifest["cubin"]).read_bytes())
    assert (tmp_path / manifest["source"]).is_file() and manifest["measured"] is None


@pytest.mark.parametrize("shape", [(1024, 1024, 1024, "row", "row"), (104, 14648, 376, "row", "row"),
                                   (16, 4096, 4096, "row", "col")])
def test_compile_picks_what_the_dry_run_ranks_first(shape):
    """compile, render and bench without --config take default_config: the dry run's first-ranked configuration
    (the same model, with the GPU's calibration, and the same tie-break)."""
    from gemmgen import Problem, lookup_gpu
    from gemmgen.rank.space import default_config
    from gemmgen.tune.engines import default_engines

    m, n, k, a, b = shape
    gpu = lookup_gpu("h100")
    problem = Problem.create(m, n, k, "bf16", a, b)
    engines = default_engines(1)
    try:
        _space, ranking = engines.ranked_space(problem, gpu, gpu.arch)
    finally:
        engines.close()
    assert default_config(problem, gpu).tag == ranking[0].config.tag


def test_compile_for_an_h100_pcie_writes_the_grid_and_workspace_of_its_sms(tmp_path):
    # Regression: the manifest's persistent grid was always one wave of an H100 SXM (132 CTAs), so `gemmgen compile
    # --gpu h100-pcie` wrote launches that a launcher in another language ran on 114 SMs with 18 CTAs waiting (and a
    # Stream-K workspace sized for 132). The bundle must still pass the loader's checks (gemmgen.load).
    from gemmgen.runtime.bundle import verify

    config = tmp_path / "cfg.yaml"
    config.write_text("family: sm90_wgmma\ncta: 128x128x64\nwarp: 64x128x64\nmma: 64x128x16\nstages: 4\n"
                      "warp_specialized: true\npersistent: true\ndecomposition: {kind: streamk}\n")
    out = tmp_path / "out"
    assert main(["compile", "2048", "2048", "2048", "--gpu", "h100-pcie", "--config", str(config),
                 "--out", str(out)]) == 0
    manifest = json.loads(next(out.glob("*.json")).read_text())
    assert manifest["launches"][0]["grid"] == [114, 1, 1]
    assert manifest["workspace_bytes"] < 132 * 128 * 128 * 4   # one fp32 partial tile per CTA, 114 of them
    verify(manifest, (out / manifest["cubin"]).read_bytes())


def test_split_k_manifest_lists_both_launches_and_the_workspace(tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("family: sm80_mma\ncta: 64x64x32\nwarp: 32x32x32\nmma: 16x8x16\nstages: 3\n"
                      "decomposition: {kind: splitk, splits: 4}\n")
    assert main(["compile", "100", "200", "4096", "--gpu", "h100", "--config", str(config),
                 "--out", str(tmp_path)]) == 0
    manifest = json.loads(next(tmp_path.glob("*.json")).read_text())
    main_launch, reduce = manifest["launches"]
    assert main_launch["grid"] == [2 * 4, 1, 4]
    assert reduce["entry"] == manifest["name"] + "_reduce" and reduce["dynamic_smem"] == 0
    assert manifest["workspace_bytes"] == 4 * 100 * 200 * 4


def test_render_takes_the_leading_dimensions_compile_takes(capsys):
    # Regression: render had no --lda/--ldb/--ldc ('unrecognized arguments'), so the kernel `gemmgen compile ...
    # --lda 4097` builds (A's rows off 16-byte boundaries: another alignment, name and source) could not be printed.
    from gemmgen import Arch, Kernel, Problem, lookup_gpu
    from gemmgen.rank.space import default_config

    assert main(["render", "512", "512", "512", "--lda", "513", "--gpu", "h100"]) == 0
    problem = Problem.create(512, 512, 512, lda=513)
    name = Kernel(Arch.SM90A, problem.operands, default_config(problem, lookup_gpu("h100"))).name
    assert "_a1x8x8_" in name and f"// {name}\n" in capsys.readouterr().out


def test_render_prints_the_source(capsys):
    assert main(["render", "64", "64", "64", "--gpu", "a100", "--dtype", "f16"]) == 0
    source = capsys.readouterr().out
    assert source.startswith("// ====") and "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in source


def test_space_lists_configurations(capsys):
    assert main(["space", "--gpu", "h100", "--arch", "sm_80"]) == 0
    lines = capsys.readouterr().out.splitlines()
    count = int(lines[0].split()[0])
    assert count == len(lines) - 1 and all(l.startswith("gemmgen_sm_80_") for l in lines[1:])


def test_space_compile_json_gives_null_registers_for_a_failed_compile(capsys, monkeypatch):
    # Regression: `gemmgen space --compile --json` wrote "registers": "" and "spill_bytes": "" for a configuration
    # NVRTC refused, strings in fields that are integers for every other one.
    from types import SimpleNamespace

    from gemmgen.codegen import nvrtc
    from gemmgen.model.errors import CompileError

    def compile_many(kernels, jobs=None, on_done=None):
        ok = SimpleNamespace(spill_bytes=0, entries=[], resources=SimpleNamespace(registers=128, wgmma_serialized=False))
        return [CompileError(k.name, [], "error: refused") if i == 0 else ok for i, k in enumerate(kernels)]

    monkeypatch.setattr(nvrtc, "compile_many", compile_many)
    assert main(["space", "--gpu", "rtx3090", "--compile", "--json"]) == 1
    results = json.loads(capsys.readouterr().out)["results"]
    assert results[0]["status"] == "FAILED" and results[0]["registers"] is None and results[0]["spill_bytes"] is None
    assert all(isinstance(r["registers"], int) for r in results[1:])


@pytest.mark.parametrize("argv,needle", [
    (["compile", "0", "16", "16", "--gpu", "h100"], "M must be a positive integer"),
    (["compile", "16", "16", "x", "--gpu", "h100"], "K must be a positive integer"),
    (["compile", "16", "16", "16", "--gpu", "h100", "--dtype", "int3"], "dtype"),
    (["compile", "16", "16", "16", "--gpu", "nosuchgpu"], "GPU must be one of"),
    (["compile", "16", "16", "16", "--gpu", "h100", "--arch", "sm_70"], "arch must be one of"),
    (["compile", "16", "16", "16", "--gpu", "a100", "--arch", "sm_90a"], "arch must not exceed"),
    (["compile", "16", "16", "16", "--gpu", "h100", "--config", "/no/such/file"], "--config must name"),
    (["render", "16", "16", "--gpu", "h100"], "three integers"),
    (["space", "--gpu", "h100", "--jobs", "0"], "--jobs"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, needle):
    if argv[0] == "compile":
        argv = argv + ["--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_infeasible_config_file_names_the_rule(tmp_path, capsys):
    config = tmp_path / "cfg.yaml"
    config.write_text("family: sm80_mma\ncta: 128x128x16\nwarp: 64x64x16\nmma: 16x8x16\nstages: 3\n")
    assert main(["compile", "64", "64", "64", "--gpu", "h100", "--config", str(config), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "multiple of 32" in err and err.count("\n") == 1


def test_bench_prints_the_prediction_a_tune_makes():
    """`gemmgen bench` shows the model's time beside the measured one: the calibrated model's, as the tuner's."""
    from gemmgen import Problem, lookup_gpu
    from gemmgen.cli.bench import _prediction_s
    from gemmgen.rank.calibration import calibrated_predict
    from gemmgen.rank.space import default_config

    gpu = lookup_gpu("h100")
    problem = Problem.create(1000, 777, 1104, "bf16", "row", "col")
    config = default_config(problem, gpu)
    assert _prediction_s(problem, config, gpu) == calibrated_predict(problem, config, gpu).time_s
