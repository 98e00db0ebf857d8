"""The tuning database (results/<gpu>/), lookup, and the export bundle."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import test_search as ts  # noqa: E402  (the synthetic space, model and replayed timings)

from gemmgen.model.problem import Problem  # noqa: E402


@pytest.fixture(autouse=True)
def _results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))


def test_atomic_write_leaves_only_the_final_file(tmp_path):
    from gemmgen.tune.results import write_json_atomic

    path = write_json_atomic(tmp_path / "a" / "r.json", {"x": 1})
    write_json_atomic(path, {"x": 2})
    assert json.loads(path.read_text()) == {"x": 2}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


class Peeking(ts.Recorded):
    """Reads the record on disk while the tune is still running."""

    def __init__(self, path, **kw):
        super().__init__(**kw)
        self.path, self.seen = path, []

    def measure(self, manifest, cubin, problem):
        if self.path.exists():
            record = json.loads(self.path.read_text())
            self.seen.append((record["status"], sum(1 for t in record["trials"] if t["measured"])))
        return super().measure(manifest, cubin, problem)


def test_record_is_written_during_the_tune_and_holds_everything_at_the_end(tmp_path):
    from gemmgen.tune.results import record_path
    from gemmgen.tune.search import tune

    path = record_path(ts.GPU, ts.PROBLEM)
    bench = Peeking(path, delay_s=0.35)
    result = tune(ts.PROBLEM, ts.GPU, bench, ts.options(tmp_path, trials=8, rounds=2), engines=ts.engines())
    assert result.record_path == path
    running = [n for status, n in bench.seen if status == "running"]
    assert running and max(running) >= 2  # crash-safe: the record grew while the search ran

    record = json.loads(path.read_text())
    assert record["status"] == "complete"
    assert Problem.from_dict(record["problem"]) == ts.PROBLEM
    env = record["environment"]
    assert env["gpu_name"] == ts.GPU.name and env["nvrtc_version"] == "13.5-fake"
    assert {"driver_version", "gemmgen_version"} <= set(env)
    measured = [t for t in record["trials"] if t["measured"]]
    assert len(measured) == 8
    assert all(t["state"] in ("COMPLETE", "FAIL") and t["config"] and t["config_tag"] for t in measured)
    assert all(t["time_s"] > 0 for t in measured if t["state"] == "COMPLETE")
    w = record["winner"]
    assert w["config_tag"] == result.winner.config.tag and w["rounds"] == 2
    assert w["min_time_s"] <= w["median_time_s"] <= w["max_time_s"]
    assert record["cublas"]["time_s"] == pytest.approx(0.000205)
    assert w["vs_cublas"] == pytest.approx(0.000205 / w["median_time_s"])


def _store(tmp_path, problem):
    from gemmgen.tune.search import tune

    return tune(problem, ts.GPU, ts.Recorded(), ts.options(tmp_path, trials=3, top_k=3, rounds=1, finalists=1),
                engines=ts.engines())


def test_lookup_answers_the_exact_problem_or_the_nearest_shape_and_says_which(tmp_path):
    from gemmgen.tune.results import NothingStored, lookup

    with pytest.raises(NothingStored):
        lookup(ts.PROBLEM, ts.GPU)
    small = Problem.create(1024, 1024, 1024, "bf16")
    _store(tmp_path, ts.PROBLEM)
    _store(tmp_path, small)
    exact = lookup(ts.PROBLEM, ts.GPU)
    assert exact.exact and exact.distance == 0 and exact.problem == ts.PROBLEM

    near = lookup(Problem.create(4096, 4096, 5000, "bf16"), ts.GPU)
    assert not near.exact and near.problem == ts.PROBLEM and near.distance == pytest.approx(abs(__import__(
        "math").log(5000 / 4096)))
    assert lookup(Problem.create(1500, 1024, 1024, "bf16"), ts.GPU).problem == small

    # Another dtype is answered from the nearest shape, flagged as different operands.
    other = lookup(Problem.create(4096, 4096, 4096, "f16"), ts.GPU)
    assert not other.exact and not other.same_operands


def test_lookup_of_a_view_is_exact_only_for_its_own_leading_dimensions_and_prefers_its_rows_alignment(tmp_path):
    """A view's leading dimensions decide the rows' alignment, so a packed shape's winner is not an exact answer for
    it; of two held records at the same shape, the one of the view's alignment class comes first."""
    from gemmgen.tune.results import lookup

    _store(tmp_path, ts.PROBLEM)                                         # 4096^3, rows 16-byte aligned
    unaligned = Problem.create(4096, 4096, 4095, "bf16")                # rows of A off 16-byte boundaries
    _store(tmp_path, unaligned)
    view = ts.PROBLEM.with_leading(4097, 0, 0)
    answer = lookup(view, ts.GPU)
    assert not answer.exact and answer.same_operands and answer.problem == unaligned
    aligned_view = lookup(ts.PROBLEM.with_leading(4104, 0, 0), ts.GPU)
    assert not aligned_view.exact and aligned_view.same_operands and aligned_view.problem == ts.PROBLEM
    other = lookup(ts.PROBLEM.with_leading(4100, 0, 0), ts.GPU)         # 8-byte rows: no record of that class
    assert not other.same_operands and other.other_alignment and other.problem.label.startswith("4096x4096x")
    assert lookup(ts.PROBLEM, ts.GPU).exact


def test_lookup_skips_unreadable_records(tmp_path):
    from gemmgen.tune.results import gpu_dir, lookup

    _store(tmp_path, ts.PROBLEM)
    (gpu_dir(ts.GPU) / "tunes" / "broken.json").write_text("{not json")
    assert lookup(ts.PROBLEM, ts.GPU).exact


def test_export_bundle_writes_cubin_source_and_manifest(tmp_path):
    from gemmgen.tune.export import export_bundle
    from gemmgen.tune.results import fingerprint
    from gemmgen.model.tiles import Kernel

    config = ts.ranking()[0].config
    kernel = Kernel(ts.GPU.arch, ts.PROBLEM.operands, config)
    compiled = ts.CountingCompiler().submit(kernel).result()
    bundle = export_bundle(tmp_path / "out", kernel, ts.PROBLEM, compiled,
                           measured={"time_s": 2e-4, "tflops": 687.0}, verification={"ok": True, "rel_error": 1e-3},
                           environment=fingerprint(ts.GPU), manifest_fn=ts.fake_manifest)
    assert bundle.cubin_path.read_bytes() == compiled.cubin
    assert bundle.source_path.read_text() == compiled.source
    manifest = json.loads(bundle.manifest_path.read_text())
    assert manifest["name"] == kernel.name and manifest["cubin"] == f"{kernel.name}.cubin"
    assert manifest["measured"]["time_s"] == 2e-4 and manifest["verification"]["ok"] is True
    assert manifest["config"] == config.to_dict() and manifest["environment"]["gpu_key"] == ts.GPU.key


def test_lookup_prefers_a_held_winner_that_fits_the_question_and_says_when_none_does(tmp_path):
    from gemmgen.tune.results import gpu_dir, lookup

    _store(tmp_path, ts.PROBLEM)
    tunes = gpu_dir(ts.GPU) / "tunes"
    big_path = next(tunes.glob("*.json"))
    record = json.loads(big_path.read_text())
    swapped = {"family": "sm90_wgmma", "cta": "64x16x64", "warp": "64x16x64", "mma": "64x16x16", "stages": 12,
               "raster": {"order": "row", "group": 8}, "warp_specialized": True, "persistent": True, "swap_ab": True}
    skinny = dict(record, problem=Problem.create(16, 4096, 4096).to_dict(), arch="sm_90a",
                  winner=dict(record["winner"], config=swapped))
    (tunes / "16x4096x4096_bf16_rr_bf16_linear.json").write_text(json.dumps(skinny))

    near = lookup(Problem.create(8, 4096, 4096), ts.GPU)        # the swapped 16-wide tile serves M = 8
    assert near.problem.m == 16 and near.fits
    # M = 40 is nearer 16x4096x4096 than 4096^3, but that winner's tile serves M <= 16: the fitting one is answered.
    wide = lookup(Problem.create(40, 4096, 4096), ts.GPU)
    assert wide.problem == ts.PROBLEM and wide.fits and wide.misfit == ""

    big_path.unlink()
    alone = lookup(Problem.create(40, 4096, 4096), ts.GPU)     # nothing fits: still answered, and says why
    assert alone.problem.m == 16 and not alone.fits and "skinny products" in alone.misfit
