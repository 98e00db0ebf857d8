"""`gemmgen suite --gpus`: the suite's shapes spread over measuring workers (tune/suite_gpus.py), on the CPU with
the replay measurer and simulated GPUs, as tests/test_distributed.py runs `tune --gpus`.

The space and compiler are tests/test_search's synthetic ones (NVRTC on every shape would not fit CI). One shape
is made slow (its simulated GPU time per measurement is 150x the others'), so a worker that holds it must not hold
the others back: the rest go to the other worker.
"""
from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import pytest

import test_search
from gemmgen.tune.worker import ReplayBenchmark

SLOW = "2048x4096x4096"
SHAPES = ("shapes:\n"
          "  - {name: slow, M: 2048, N: 4096, K: 4096}\n"
          "  - {name: a, M: 4096, N: 4096, K: 4096}\n"
          "  - {name: b, M: 4096, N: 2048, K: 4096}\n"
          "  - {name: c, M: 4096, N: 4096, K: 2048}\n"
          "  - {name: a_again, M: 4096, N: 4096, K: 4096}\n")


class ShapeLoggingReplay(ReplayBenchmark):
    """The replay, logging '<worker pid> <MxNxK> <tag>' per measurement; the SLOW shape takes 150x longer."""

    def __init__(self, path, log):
        super().__init__(path)
        self.log = log

    def measure(self, manifest, cubin, problem):
        from gemmgen.model.tiles import TileConfig

        shape = f"{problem.m}x{problem.n}x{problem.k}"
        with open(self.log, "a") as out:
            out.write(f"{os.getppid()} {shape} {TileConfig.from_dict(manifest['config']).tag}\n")
        if shape == SLOW:
            time.sleep(1.5)
        return super().measure(manifest, cubin, problem)


def measurer(replay, log, spec):
    from gemmgen.tune.worker import WorkerBenchmark

    return WorkerBenchmark(functools.partial(ShapeLoggingReplay, replay, log), 30.0, lock_path=spec.lock_path)


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    return tmp_path


def test_suite_on_two_gpus_tunes_each_shape_once_on_one_worker_and_spreads_the_shapes(results_dir):
    from gemmgen.tune.parallel import plan_workers
    from gemmgen.tune.results import record_path
    from gemmgen.tune.search import TuneOptions
    from gemmgen.tune.suite_file import load_shapes
    from gemmgen.tune.suite_gpus import run_suite_on_gpus

    tmp = results_dir
    data = json.loads(test_search.RECORDED.read_text())
    data["delay_s"] = 0.01
    replay, log = tmp / "replay.json", tmp / "measured.log"
    replay.write_text(json.dumps(data))
    (tmp / "suite.yaml").write_text(SHAPES)
    shapes = load_shapes(tmp / "suite.yaml")
    options = TuneOptions(trials=5, patience=None, top_k=2, sampler="random", seed=3, finalists=2, rounds=1,
                          storage=f"sqlite:///{tmp / 'studies.db'}", replay=str(replay), jobs=0)
    specs = plan_workers(["0", "1"], replay=True)
    events = []
    report = run_suite_on_gpus(shapes, ["bf16"], test_search.GPU, options, specs,
                               functools.partial(measurer, str(replay), str(log)), source="suite.yaml",
                               engines_factory=test_search.engines, on_event=lambda k, i: events.append((k, i)),
                               poll_s=0.1)

    rows = {r.name: r for r in report.rows}
    assert [r.name for r in report.rows] == ["slow", "a", "b", "c", "a_again"]  # the file's order
    assert all(r.tflops and r.ratio for r in report.rows), [r.note for r in report.rows]
    assert rows["a_again"].note == "same problem as a; simulated (replayed timings)"
    assert rows["a_again"].tflops == rows["a"].tflops

    # Every shape has exactly one record, and it was tuned wholly by one worker: all its trials and all its
    # measurements (search and finalist rounds) by that worker.
    measured = [line.split() for line in log.read_text().splitlines()]
    workers_of = {}
    for pid, shape, _ in measured:
        workers_of.setdefault(shape, set()).add(pid)
    assert set(workers_of) == {f"{s.m}x{s.n}x{s.k}" for s in shapes}
    assert all(len(pids) == 1 for pids in workers_of.values()), workers_of
    records = sorted((tmp / "results" / "h100-sxm" / "tunes-replay").glob("*.json"))
    assert len(records) == 4
    for name in ("slow", "a", "b", "c"):
        row = rows[name]
        record = json.loads(record_path(test_search.GPU, shapes[[s.name for s in shapes].index(name)]
                                        .problem("bf16"), simulated=True).read_text())
        assert {t["worker"] for t in record["trials"] if t["measured"]} == {row.worker}
        assert record["winner"]["config_tag"] and record["winner"]["tflops"] == pytest.approx(row.tflops)

    # The work was spread, and pulled from one queue: while one worker held the slow shape, the other tuned all
    # three others (handed out in turn, it would have tuned two, the third waiting behind the slow shape).
    assert {r.worker for r in report.rows} == {s.label for s in specs}
    slow_worker = rows["slow"].worker
    other = next(s.label for s in specs if s.label != slow_worker)
    done = [i["row"].name for k, i in events if k == "row"]
    assert [rows[name].worker for name in done[:done.index("slow")]] == [other] * 3, done

    # Progress named each worker's GPU for the shape it was tuning.
    assigned = {(i["worker"], i["shape"]) for k, i in events if k == "shape_assigned"}
    assert {(rows[n].worker, n) for n in ("slow", "a", "b", "c")} == assigned
    assert any(k == "shape_trial" and i["worker"] == other for k, i in events)


def test_a_dead_workers_shape_is_given_once_more_then_reported():
    from gemmgen.tune.suite_gpus import _Dispatch

    book = _Dispatch([(0, "s0", "bf16", None), (1, "s1", "bf16", None)])
    assert book.next_for(0)[0] == 0 and book.next_for(1)[0] == 1
    assert book.lost(0) is None and [j[0] for j in book.pending] == [0]  # queued again, first
    assert book.next_for(1)[0] == 0
    assert book.lost(1)[0] == 0  # lost a second time: reported, not queued again
    assert not book.pending and book.lost(5) is None


def test_gpus_of_two_models_never_share_a_suite(monkeypatch):
    from gemmgen.model.errors import InvalidInput
    from gemmgen.tune import parallel

    monkeypatch.setattr(parallel, "physical_gpu", lambda i: (f"bus{i}", "h100-sxm" if i == 0 else "a100-sxm"))
    with pytest.raises(InvalidInput, match="GPUs of one model"):
        parallel.plan_workers(["0", "1"], replay=False)


def test_suite_gpus_without_a_gpu_is_one_line(capsys, tmp_path, monkeypatch):
    from gemmgen.cli import main

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr("gemmgen.runtime.detect.read_props", lambda ordinal=0: ({}, "no CUDA driver (test)"))
    shapes = tmp_path / "s.yaml"
    shapes.write_text("shapes:\n  - {name: tiny, M: 256, N: 256, K: 256}\n")
    assert main(["suite", str(shapes), "--gpus", "0,1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "--gpus needs GPUs" in err
    for flag in ("--dry-run", "--from-results"):
        assert main(["suite", str(shapes), "--gpu", "h100", "--gpus", "0,1", flag]) == 2
        err = capsys.readouterr().err
        assert f"{flag} and --gpus cannot be used together" in err and len(err.strip().splitlines()) == 1


def test_suite_gpus_on_the_command_line_shows_each_workers_gpu_and_one_table(capsys, tmp_path, monkeypatch):
    """The CLI end to end with real NVRTC and the replay: two suites, two simulated GPUs, one table."""
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except Exception:  # noqa: BLE001
        pytest.skip("NVRTC unavailable")
    from gemmgen.cli import main
    from gemmgen.model.problem import Problem
    from gemmgen.tune.search import default_engines

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "cache"))
    engines, gpu = default_engines(0), test_search.GPU
    shapes = {}
    for dims in ((256, 256, 256), (128, 256, 256)):
        problem = Problem.create(*dims, "bf16")
        shapes["x".join(map(str, dims))] = {"cublas_time_s": 1e-5, "timings": {
            c.tag: engines.predict(problem, c, gpu).time_s * 1.5 for c in engines.enumerate(problem, gpu, gpu.arch)}}
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps({"timings": {}, "shapes": shapes}))
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("suite: public\nshapes:\n  - {name: t1, M: 256, N: 256, K: 256}\n")
    b.write_text("suite: hard\nshapes:\n  - {name: t2, M: 128, N: 256, K: 256}\n")
    assert main(["suite", str(a), str(b), "--gpu", "h100", "--replay", str(replay), "--dtypes", "bf16", "--gpus",
                 "0,1", "--trials", "2", "--top-k", "2", "--finalists", "1", "--rounds", "1",
                 "--storage", f"sqlite:///{tmp_path / 'studies.db'}"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "2 workers, 2 problems" in captured.err
    assert {line.split("]")[0] + "]" for line in captured.err.splitlines() if line.startswith("[gpu")} == \
        {"[gpu0]", "[gpu1]"}  # each worker's GPU named in the progress
    out = captured.out.splitlines()
    assert out[0].split()[:2] == ["suite", "shape"] and "worker" in out[0] and "other shapes verified" in out[0]
    assert out[2].startswith("public") and out[3].startswith("hard")
    assert all("not run (no GPU)" in line for line in out[2:4])  # the replay verifies nothing
    assert "geomean ratio to cuBLAS, suite hard" in captured.out
