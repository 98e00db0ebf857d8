"""The suite's table over several suites (one table, a geomean per suite) and the check of each winner at two other
shapes it serves (tune/serve_check.py): the logic on the CPU; the verification itself runs on the GPU
(GpuBenchmark.verify through the measuring worker; benchmarks and the lead's H100 run)."""
from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

import test_search
from gemmgen.model.arch import lookup_gpu
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Kernel, TileConfig
from gemmgen.runtime.manifest import make_manifest
from gemmgen.runtime.serve import check_serves
from gemmgen.tune.serve_check import ShapeCheck, other_shapes, summary, verify_other_shapes
from gemmgen.tune.suite_file import load_suites
from gemmgen.tune.suite import SuiteReport, SuiteRow

H100 = lookup_gpu("h100")
SM80 = TileConfig.from_dict({"family": "sm80_mma", "cta": "128x128x32", "warp": "64x64x32", "mma": "16x8x16",
                             "stages": 3, "smem_layout": "swizzle", "raster": {"order": "row", "group": 8}})


def manifest_of(problem: Problem, config: TileConfig = SM80) -> dict:
    return make_manifest(Kernel(H100.arch, problem.operands, config), problem)


@pytest.mark.parametrize("dims, layouts", [((4096, 4096, 4096), ("row", "row")), ((16, 4096, 4096), ("row", "col")),
                                           ((4095, 4095, 4095), ("row", "row")), ((1, 4096, 4096), ("row", "col"))])
def test_two_other_shapes_are_served_differ_from_the_tuned_one_and_step_off_the_tile_grid(dims, layouts):
    problem = Problem.create(*dims, "bf16", *layouts)
    manifest = manifest_of(problem)
    shapes = other_shapes(manifest)
    kernel = Kernel(H100.arch, problem.operands, SM80)
    assert len(shapes) == 2 and len(set(shapes)) == 2
    step = manifest["serves"]["multiple_of"]
    for other in shapes:
        assert (other.m, other.n, other.k) != dims
        check_serves(kernel, other)  # inside what the manifest claims, exactly
        assert all(abs(a - b) <= step[axis] for a, b, axis in zip((other.m, other.n, other.k), dims, "MNK"))
    if dims[0] > 1:
        assert shapes[0].m == dims[0] - 1  # M - 1 first: a partial CTA tile in M


@pytest.mark.parametrize("lds, layouts", [((4097, 0, 0), ("row", "row")), ((0, 4099, 0), ("row", "col")),
                                          ((0, 0, 12288), ("col", "row"))])
def test_the_other_shapes_of_a_view_keep_its_gaps(lds, layouts):
    """A winner tuned on a view is checked on views: each leading dimension moves with its operand's width."""
    problem = Problem.create(2048, 4096, 4096, "bf16", *layouts).with_leading(*lds)
    shapes = other_shapes(manifest_of(problem))
    assert len(shapes) == 2
    packed = problem.with_shape(problem.m, problem.n, problem.k)
    for other in shapes:
        grown = other.with_shape(other.m, other.n, other.k)
        assert (other.lda - grown.lda, other.ldb - grown.ldb, other.ldc - grown.ldc) == (
            problem.lda - packed.lda, problem.ldb - packed.ldb, problem.ldc - packed.ldc)


def test_a_swapped_tile_keeps_m_within_its_m_max():
    from gemmgen.families.rules import check
    from gemmgen.tune.search import default_engines

    problem = Problem.create(64, 4096, 4096, "bf16", "row", "col")
    swapped = [c for c in default_engines(0).enumerate(problem, H100, H100.arch)
               if getattr(c, "swap_ab", False) and c.cta.n == 64 and not check(c, H100, H100.arch, problem)]
    assert swapped, "the sm90 space offers 64-wide swapped tiles for M = 64"
    manifest = manifest_of(problem, swapped[0])
    assert manifest["serves"]["m_max"] == 64
    shapes = other_shapes(manifest)
    assert len(shapes) == 2 and all(p.m <= 64 for p in shapes) and shapes[0].m == 63


class FakeVerifier:
    """Answers verify() like WorkerBenchmark: ok, or a wrong result at one shape."""

    def __init__(self, wrong_at=()):
        self.wrong_at, self.calls = set(wrong_at), []

    def verify(self, manifest, cubin, problem):
        label = f"{problem.m}x{problem.n}x{problem.k}"
        self.calls.append((label, manifest["problem"]["M"], manifest["launches"][0]["grid"]))
        if label in self.wrong_at:
            return SimpleNamespace(ok=False, rel_error=0.4, reason="wrong result: relative error 4.000e-01")
        return SimpleNamespace(ok=True, rel_error=2e-3, reason="")


def test_each_other_shape_is_verified_with_its_own_launches_and_a_failure_is_reported():
    problem = Problem.create(4096, 4096, 4096, "bf16")
    manifest = manifest_of(problem)
    shapes = [f"{p.m}x{p.n}x{p.k}" for p in other_shapes(manifest)]
    fake = FakeVerifier(wrong_at=[shapes[1]])
    checks = verify_other_shapes(manifest, b"cubin", fake)
    assert [c.label for c in checks] == shapes and [c.ok for c in checks] == [True, False]
    # Each verification got the manifest rebuilt for its shape (its problem and grid), not the tuned one's.
    assert [m for _, m, _ in fake.calls] == [int(s.split("x")[0]) for s in shapes]
    assert summary(checks).startswith(f"FAIL {shapes[1]}: wrong result")
    assert summary(checks[:1]) == f"1/1 ok ({shapes[0]})"
    assert summary(verify_other_shapes(manifest, b"cubin", object())) == "not run (no GPU)"
    assert summary(()) == "-"


def test_a_tuned_suite_row_carries_its_winners_check_at_two_other_shapes(tmp_path, monkeypatch):
    from gemmgen.tune.search import Engines
    from gemmgen.tune.suite_file import Shape
    from gemmgen.tune.suite import tune_row

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    engines = test_search.engines()
    engines = Engines(engines.enumerate, engines.predict, engines.compiler,
                      lambda kernel, problem, compiled: make_manifest(kernel, problem), engines.nvrtc_version)

    class Measurer(test_search.Recorded, FakeVerifier):
        def __init__(self):
            test_search.Recorded.__init__(self)
            FakeVerifier.__init__(self)

    shape = Shape("sq", 4096, 4096, 4096, suite="public")
    row = tune_row(shape, "bf16", H100, Measurer(), test_search.options(tmp_path), engines=engines)
    assert row.tflops and row.suite == "public" and len(row.other_shapes) == 2
    assert all(c.ok for c in row.other_shapes) and summary(row.other_shapes).startswith("2/2 ok (4095x4104x4096")


def row(suite, name, dtype, ratio, checks=()):
    return SuiteRow(name, 64, 64, 64, dtype, 100.0 * ratio, 100.0, ratio, 1.0, suite=suite, other_shapes=checks)


def test_several_suites_make_one_table_with_a_geomean_per_suite():
    ok = (ShapeCheck(63, 72, 64, True, 1e-3), ShapeCheck(65, 64, 72, True, 1e-3))
    rows = (row("public", "sq", "bf16", 1.0, ok), row("public", "llm", "bf16", 1.21, ok),
            row("hard", "mis", "bf16", 4.0, (ShapeCheck(62, 65, 64, False, 0.5, "wrong result"),)),
            row("hard", "m1", "bf16", 1.0))
    report = SuiteReport(H100, "results/shapes.yaml, results/hard.yaml", "now", rows, False, "H100")
    assert report.suites() == ["public", "hard"]
    assert report.geomeans("public")["bf16"] == pytest.approx(1.1)
    assert report.geomeans("hard")["all"] == pytest.approx(2.0)
    assert report.geomeans()["all"] == pytest.approx((1.0 * 1.21 * 4.0 * 1.0) ** 0.25)
    md = report.markdown()
    head = next(line for line in md.splitlines() if line.startswith("| suite"))
    assert "| ratio |" in head and "| other shapes verified |" in head
    assert "| hard | mis |" in md and "FAIL 62x65x64: wrong result" in md and "2/2 ok (63x72x64, 65x64x72)" in md
    assert "Geomean ratio to cuBLAS, suite public: bf16 1.100x" in md
    assert "Geomean ratio to cuBLAS, suite hard: bf16 2.000x" in md and "every suite" in md
    data = report.to_dict()
    assert set(data["geomean_ratio_by_suite"]) == {"public", "hard"}
    assert data["rows"][2]["other_shapes"][0]["ok"] is False
    single = replace(report, rows=rows[:2])
    assert "| suite" not in single.markdown() and single.geomean_lines() == [
        "Geomean ratio to cuBLAS: bf16 1.100x, all 1.100x"]


def test_suite_names_come_from_the_file_and_must_be_unique(tmp_path):
    from gemmgen.tune.suite_file import SuiteFileError

    a, b, c = tmp_path / "shapes.yaml", tmp_path / "hard.yaml", tmp_path / "x" / "hard.yaml"
    c.parent.mkdir()
    a.write_text("suite: public\nshapes:\n  - {name: sq, M: 64, N: 64, K: 64}\n")
    b.write_text("shapes:\n  - {name: sq, M: 63, N: 64, K: 64}\n")
    c.write_text("shapes:\n  - {name: m1, M: 1, N: 64, K: 64}\n")
    assert [(s.suite, s.name) for s in load_suites([str(a), str(b)])] == [("public", "sq"), ("hard", "sq")]
    with pytest.raises(SuiteFileError, match="suite names must be unique"):
        load_suites([str(b), str(c)])


def store_two_records() -> None:
    """Tune records in $GEMMGEN_RESULTS for 256x256x256 (50 TFLOP/s) and 255x256x256 (80), cuBLAS at 40 in both."""
    from gemmgen.tune.results import record_path

    for m, tflops in ((256, 50.0), (255, 80.0)):
        path = record_path(H100, Problem.create(m, 256, 256, "bf16"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"winner": {"tflops": tflops, "kernel": "k", "config": SM80.to_dict()},
                                    "cublas": {"tflops": 40.0}, "elapsed_s": 3.0}))


def test_suite_from_results_prints_two_suites_as_one_table(capsys, tmp_path, monkeypatch):
    from gemmgen.cli import main

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    a, b = tmp_path / "shapes.yaml", tmp_path / "hard.yaml"
    a.write_text("suite: public\nshapes:\n  - {name: sq, M: 256, N: 256, K: 256}\n")
    b.write_text("suite: hard\nshapes:\n  - {name: mis, M: 255, N: 256, K: 256}\n  - {name: again, M: 256, N: 256, K: 256}\n")
    store_two_records()
    assert main(["suite", str(a), str(b), "--gpu", "h100", "--dtypes", "bf16", "--from-results"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["suite", "shape", "M"]
    assert "public" in lines[2] and "1.25x" in lines[2] and "hard" in lines[3] and "2.00x" in lines[3]
    assert "same problem as public/sq" in lines[4]
    assert "geomean ratio to cuBLAS, suite public: bf16 1.250x" in out
    assert "geomean ratio to cuBLAS, suite hard: bf16 1.581x" in out  # 2.00x and 1.25x
    written = tmp_path / "results" / "h100-sxm" / "suite-public+hard.json"
    assert f"written: {written.with_suffix('.md')}" in out  # results/h100-sxm/suite.md (one suite's) is kept
    assert json.loads(written.read_text())["geomean_ratio_by_suite"]["hard"]["bf16"] == pytest.approx(1.581, 1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dims, layouts", [((256, 256, 256), ("row", "row")), ((255, 264, 200), ("row", "col"))])
def test_on_the_gpu_the_models_pick_verifies_at_two_other_shapes_it_serves(dims, layouts):
    """The verification itself: the model's pick, compiled, through the measuring worker (fresh inputs, D poisoned
    first) at two other shapes its manifest serves."""
    from gemmgen.tune.search import default_engines
    from gemmgen.tune.worker import WorkerBenchmark

    problem = Problem.create(*dims, "bf16", *layouts)
    result_engines = default_engines(0)
    from gemmgen.tune.search import dry_run

    pick = dry_run(problem, H100, top_k=1, engines=result_engines).pick
    assert pick is not None
    compiled = result_engines.compiler.submit(pick.kernel).result()
    manifest = result_engines.manifest(pick.kernel, problem, compiled)
    with WorkerBenchmark(watchdog_s=60.0) as bench:
        checks = verify_other_shapes(manifest, compiled.cubin, bench)
    assert len(checks) == 2 and all(c.ok for c in checks), checks
    assert all(c.rel_error is not None and c.rel_error < 2e-2 for c in checks)


def test_a_run_of_some_shapes_writes_beside_the_suites_table_not_over_it(capsys, tmp_path, monkeypatch):
    from gemmgen.cli import main

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text("shapes:\n  - {name: sq, M: 256, N: 256, K: 256}\n  - {name: mis, M: 255, N: 256, K: 256}\n")
    store_two_records()
    folder = tmp_path / "results" / "h100-sxm"
    assert main(["suite", str(shapes), "--gpu", "h100", "--dtypes", "bf16", "--from-results"]) == 0
    whole = (folder / "suite.md").read_text()
    assert "| sq |" in whole and "| mis |" in whole
    assert main(["suite", str(shapes), "--gpu", "h100", "--dtypes", "bf16", "--from-results", "--only", "mis"]) == 0
    assert f"written: {folder / 'suite-partial.md'}" in capsys.readouterr().out
    assert (folder / "suite.md").read_text() == whole
    partial = json.loads((folder / "suite-partial.json").read_text())
    assert [r["name"] for r in partial["rows"]] == ["mis"]


def test_a_sustained_run_is_named_as_one(tmp_path, monkeypatch):
    from gemmgen.tune.suite import SuiteReport

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    md, js = SuiteReport(H100, "shapes.yaml", "2026-11-26", (), False).write(("partial", "sustained"))
    assert (md.name, js.name) == ("suite-partial-sustained.md", "suite-partial-sustained.json")


class RetimeMeasurer:
    """A GPU stand-in for --retime: the kernel at `kernel_s` seconds per problem (M -> s), cuBLAS at `cublas_s`;
    M in `broken` fails its measurement."""

    def __init__(self, kernel_s: dict, cublas_s: float, broken=()):
        self.kernel_s, self.cublas_s, self.broken = kernel_s, cublas_s, set(broken)
        self.order: "list[str]" = []

    def measure(self, manifest, cubin, problem):
        self.order.append("ours")
        if problem.m in self.broken:
            return SimpleNamespace(ok=False, time_s=None, reason="CUDA error: illegal address")
        return SimpleNamespace(ok=True, time_s=self.kernel_s[problem.m], reason="")

    def cublas_time(self, problem, fresh=False):
        assert fresh   # cuBLAS timed again beside each round, not remembered from another time
        self.order.append("cublas")
        return self.cublas_s


def retimed_report(tmp_path, monkeypatch, measurer, on_row=None):
    from gemmgen.tune.suite_file import Shape
    from gemmgen.tune.suite import report_from_results, verify_stored_winners

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    store_two_records()   # stored: 256^3 at 50 TFLOP/s, 255x256x256 at 80, cuBLAS 40 in both (1.25x, 2.00x)
    shapes = [Shape("sq", 256, 256, 256, suite="public"), Shape("mis", 255, 256, 256, suite="hard")]
    report = report_from_results(shapes, ["bf16"], H100, source="a, b")
    engines = test_search.engines()
    try:
        return verify_stored_winners(report, shapes, ["bf16"], measurer, engines, verify=False, retime=True,
                                     on_row=on_row)
    finally:
        engines.close()


def test_retime_times_each_stored_winner_beside_cublas_and_flags_one_that_fell(tmp_path, monkeypatch):
    from gemmgen.tune.suite import RETIME_ROUNDS, retime_change, retimed_slower

    flops = 2 * 256 ** 3
    # Now: 256^3 runs at 1.25x cuBLAS as stored; 255x256x256 at 1.50x where 2.00x was stored (25% below).
    cublas_s = flops / 40e12
    measurer = RetimeMeasurer({256: cublas_s / 1.25, 255: cublas_s / 1.5}, cublas_s)
    shown = []
    report = retimed_report(tmp_path, monkeypatch, measurer, on_row=shown.append)
    assert [r.name for r in shown] == ["sq", "mis"] and shown[1].now_ratio == pytest.approx(1.5)   # progress
    sq, mis = report.rows
    assert sq.now_ratio == pytest.approx(1.25) and sq.now_tflops == pytest.approx(50.0)
    assert mis.now_ratio == pytest.approx(1.5)
    assert retime_change(sq) == "+0.0%" and retime_change(mis) == "-25.0% SLOWER"
    assert [r.name for r in retimed_slower(report)] == ["mis"]
    assert measurer.order == ["ours", "cublas"] * RETIME_ROUNDS * 2   # interleaved, every round
    headers = [h for h, _ in report.columns()]
    assert headers[-4:] == ["TFLOP/s now", "ratio now", "since stored", "note"]
    assert "-25.0% SLOWER" in report.markdown() and "other shapes verified" not in headers


def test_retime_reports_a_failed_measurement_in_the_note(tmp_path, monkeypatch):
    from gemmgen.tune.suite import retimed_slower

    measurer = RetimeMeasurer({256: 1e-5}, 1e-5, broken=[255])
    report = retimed_report(tmp_path, monkeypatch, measurer)
    sq, mis = report.rows
    assert sq.now_ratio == pytest.approx(1.0) and mis.now_ratio is None
    assert mis.note == "retime failed: CUDA error: illegal address"
    assert retimed_slower(report) == [sq]   # 1.00x now against 1.25x stored


@pytest.mark.parametrize("argv, message", [
    (["--retime"], "--retime goes with --from-results"),
    (["--dry-run", "--retime"], "a dry run measures nothing"),
    (["--from-results", "--timing", "stream"], "--from-results and --timing cannot be used together"),
])
def test_retime_without_stored_records_is_refused_in_one_line(capsys, tmp_path, argv, message):
    from gemmgen.cli import main

    suite = tmp_path / "s.yaml"
    suite.write_text("suite: s\nshapes:\n  - {name: sq, M: 256, N: 256, K: 256}\n")
    assert main(["suite", str(suite), "--gpu", "h100", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_an_installed_gemmgen_builds_the_table_from_the_shipped_records_as_lookup_reads_them(capsys, tmp_path,
                                                                                            monkeypatch):
    """Installed from a wheel (no checkout beside the package), `suite results/shapes.yaml --from-results` read only
    <data dir>/results and refused ("needs a stored winner ... nothing written") while `lookup` answered from the
    records shipped with gemmgen. It now reads them in the same order: the user's records, then the shipped ones."""
    from gemmgen.cli import main
    from gemmgen.model import paths

    shipped = paths.ROOT / "results"
    monkeypatch.delenv("GEMMGEN_RESULTS", raising=False)
    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(paths, "ROOT", tmp_path / "site-packages")      # no checkout's results/ to write into
    monkeypatch.setattr(paths, "SHIPPED_RESULTS", shipped)               # <prefix>/share/gemmgen/results
    suite = tmp_path / "shapes.yaml"
    suite.write_text("shapes:\n  - {name: sq4096, M: 4096, N: 4096, K: 4096}\n  - {name: sq1024, M: 1024, N: 1024, K: 1024}\n")
    assert main(["lookup", "4096", "4096", "4096", "--gpu", "h100"]) == 0
    assert "exact match" in capsys.readouterr().out
    assert main(["suite", str(suite), "--gpu", "h100", "--dtypes", "bf16", "--from-results"]) == 0
    out = capsys.readouterr().out
    assert "sq4096" in out and "sq1024" in out and "not tuned yet" not in out
    written = tmp_path / "data" / "results" / "h100-sxm" / "suite.json"
    assert written.is_file() and f"written: {written.with_suffix('.md')}" in out
    # A record of the user's own shadows the shipped one.
    own = json.loads((shipped / "h100-sxm" / "tunes" / "1024x1024x1024_bf16_rr_bf16_linear.json").read_text())
    own["winner"]["tflops"] = own["cublas"]["tflops"] * 2
    mine = tmp_path / "data" / "results" / "h100-sxm" / "tunes" / "1024x1024x1024_bf16_rr_bf16_linear.json"
    mine.parent.mkdir(parents=True)
    mine.write_text(json.dumps(own))
    assert main(["suite", str(suite), "--gpu", "h100", "--dtypes", "bf16", "--from-results"]) == 0
    assert "2.00x" in capsys.readouterr().out
