"""Nothing lost on faults (issue 24), each shown by injection: a disk that fills (os.write or os.fsync raising
ENOSPC) while a record, a report or a bundle is written leaves the old one intact and no temporary file behind;
Ctrl-C during the finalist rounds keeps every finished trial in the study and the record."""
from __future__ import annotations

import errno
import json
import time
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gemmgen.model.errors import InvalidInput  # noqa: E402


def disk_full_after(monkeypatch, calls: int, which: str = "write"):
    """os.write (or os.fsync) succeeds `calls` times, then fails with ENOSPC, as on a disk that fills; a
    successful os.write writes only half of what it is asked (as a real one may), so the loop is exercised."""
    real = getattr(os, which)
    count = {"n": 0}

    def failing(fd, *rest):
        count["n"] += 1
        if count["n"] > calls:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if which == "write":
            data = rest[0]
            return real(fd, data[: max(1, len(data) // 2)])
        return real(fd, *rest)

    monkeypatch.setattr(os, which, failing)
    return count


def only_files(folder: Path) -> "dict[str, bytes]":
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("which, calls", [("write", 0), ("write", 3), ("fsync", 0)])
def test_a_record_write_that_fills_the_disk_leaves_the_old_record(tmp_path, monkeypatch, which, calls):
    from gemmgen.tune.results import write_json_atomic

    path = tmp_path / "tunes" / "p.json"
    write_json_atomic(path, {"trials": [1, 2, 3]})
    before = only_files(path.parent)
    disk_full_after(monkeypatch, calls, which)
    with pytest.raises(OSError) as info:
        write_json_atomic(path, {"trials": list(range(5000))})
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert only_files(path.parent) == before  # the old record, and no temporary file beside it


def test_a_suite_report_write_that_fills_the_disk_leaves_the_old_report(tmp_path, monkeypatch, h100):
    from gemmgen.tune.suite import SuiteReport

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    report = SuiteReport(h100, "shapes.yaml", "2026-11-25", (), dry_run=False)
    md, js = report.write()
    before = only_files(md.parent)
    disk_full_after(monkeypatch, 1)
    with pytest.raises(OSError):
        report.write()
    monkeypatch.undo()
    assert only_files(md.parent) == before


def _bundle(tmp_path, stages: int, cubin: bytes):
    from conftest import make_config
    from gemmgen import Arch, Kernel, Problem
    from gemmgen.tune.export import export_bundle

    problem = Problem.create(256, 256, 256)
    kernel = Kernel(Arch.SM80, problem.operands, make_config("sm80_mma", "128x128x32", "64x64x32", "16x8x16", stages))
    compiled = SimpleNamespace(cubin=cubin, source=f"// kernel source, {stages} stages\n" * 200)
    return export_bundle(tmp_path / "out", kernel, problem, compiled, measured=None, verification=None,
                         environment={}, manifest_fn=lambda k, p, c: {"name": "the_kernel", "config": k.config.to_dict()})


@pytest.mark.parametrize("calls", [0, 1, 2, 4])
def test_a_disk_that_fills_mid_export_leaves_the_old_bundle_intact(tmp_path, monkeypatch, calls):
    old = _bundle(tmp_path, 3, b"\x7fELF old cubin" * 1000)
    before = only_files(old.manifest_path.parent)
    assert sorted(before) == ["the_kernel.cu", "the_kernel.cubin", "the_kernel.json"]
    disk_full_after(monkeypatch, calls)  # fails in the cubin, the source or the manifest
    with pytest.raises(InvalidInput, match="--out must be a directory gemmgen can create and write"):
        _bundle(tmp_path, 4, b"\x7fELF new cubin" * 1000)
    monkeypatch.undo()
    assert only_files(old.manifest_path.parent) == before  # every file as it was; no staging folder left
    new = _bundle(tmp_path, 4, b"\x7fELF new cubin" * 1000)  # with room again, the export replaces all three
    assert json.loads(new.manifest_path.read_text())["config"]["stages"] == 4
    assert new.cubin_path.read_bytes().startswith(b"\x7fELF new")


def test_ctrl_c_during_the_finalist_rounds_keeps_every_finished_trial(tmp_path, monkeypatch):
    import optuna
    import test_search as ts

    from gemmgen.tune.search import tune

    class CtrlCInFinalists(ts.Recorded):
        """Measures the search's trials, then raises KeyboardInterrupt at the first finalist measurement."""

        def __init__(self, trials):
            super().__init__()
            self.trials = trials

        def measure(self, manifest, cubin, problem):
            if len(self.calls) >= self.trials:
                raise KeyboardInterrupt
            return super().measure(manifest, cubin, problem)

    monkeypatch.setenv("GEMMGEN_RESULTS", str(tmp_path / "results"))
    bench = CtrlCInFinalists(trials=6)
    with pytest.raises(KeyboardInterrupt):
        tune(ts.PROBLEM, ts.GPU, bench, ts.options(tmp_path, trials=6, top_k=4), engines=ts.engines())
    assert len(bench.calls) == 6  # every trial was measured before the finalists began

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    [name] = [n for n in names if "quarantine" not in n and "/finalists-" not in n]  # not the finalist round's
    finished = [t for t in optuna.load_study(study_name=name, storage=storage).trials if t.state.is_finished()
                and t.user_attrs.get("measured")]
    assert len(finished) == 6
    [record_path] = (tmp_path / "results").rglob("*.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "interrupted"
    assert len([t for t in record["trials"] if t["measured"]]) == 6

    again = ts.Recorded()  # the rerun measures no trial again: straight to the finalists
    options = ts.options(tmp_path, trials=6, top_k=4)
    started = time.monotonic()
    result = tune(ts.PROBLEM, ts.GPU, again, options, engines=ts.engines())
    assert result.counts["measured"] == 0 and result.counts["resumed"] == 6 and result.winner is not None
    # Regression: the interrupted leader kept its finalist lease, so the rerun waited out --grace (60 s) first.
    assert time.monotonic() - started < options.grace_s / 2
