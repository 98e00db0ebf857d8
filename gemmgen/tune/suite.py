"""The benchmark suite: tune every shape of one or more YAML files in each dtype, side by side with cuBLAS.

A file (e.g. results/shapes.yaml) holds `[suite: NAME]` and `shapes: [{name, M, N, K, [a: row|col], [b: row|col]}]`;
the suite's name defaults to the file's stem. One measuring worker and one compile pool serve every tune, so cuBLAS
and gemmgen's kernels are timed in the same process on the same context (several GPUs: tune/suite_gpus.py, each
shape wholly on one). Each winner is also verified at two other shapes it serves (tune/serve_check.py). The table
goes to results/<gpu>/suite.md and .json: suite, shape, dtype, best TFLOP/s, cuBLAS TFLOP/s, ratio, tuning time,
the other shapes' verification, and the geomean ratio per suite and dtype.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..model.arch import Gpu
from ..model.errors import UserError
from ..model.problem import Problem
from ..model.atomic import atomic_write
from .results import gpu_dir, now, positive_number, problem_key, stored_record_path, write_json_atomic
from .serve_check import ShapeCheck, summary
from .suite_file import Shape


@dataclass(frozen=True)
class SuiteRow:
    name: str
    m: int
    n: int
    k: int
    dtype: str
    tflops: "float | None"  # gemmgen's best (median of the interleaved re-measurement)
    cublas_tflops: "float | None"
    ratio: "float | None"  # gemmgen / cuBLAS
    tuning_s: float
    kernel: str = ""
    predicted_tflops: "float | None" = None
    note: str = ""
    suite: str = ""
    worker: str = ""  # host/gpuN that tuned it (suite --gpus)
    other_shapes: "tuple[ShapeCheck, ...]" = ()  # the winner verified at other shapes it serves
    # --retime: the stored winner rebuilt by today's code and timed now at its own shape, beside cuBLAS now.
    now_tflops: "float | None" = None
    now_ratio: "float | None" = None


def row_for(shape: Shape, dtype: str, **fields) -> SuiteRow:
    """A row of `shape` in `dtype`; `fields` are SuiteRow's measured fields. A view's leading dimensions lead
    its note (the table's M, N, K alone would not say it)."""
    lds = ", ".join(f"{key} {value}" for key, value in (("lda", shape.lda), ("ldb", shape.ldb), ("ldc", shape.ldc))
                    if value)
    if lds:
        fields["note"] = "; ".join(filter(None, (f"view: {lds}", fields.get("note", ""))))
    return SuiteRow(shape.name, shape.m, shape.n, shape.k, dtype, suite=shape.suite, **fields)


def geomean(values) -> "float | None":
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


@dataclass(frozen=True)
class SuiteReport:
    gpu: Gpu
    source: str  # the suite files, comma-separated
    date: str
    rows: "tuple[SuiteRow, ...]"
    dry_run: bool
    device: str = ""
    from_results: bool = False  # built from stored records (--from-results): each row measured in its own tune
    # A row's figures were replayed, not measured (a --replay tune's record, which --from-results shows where no
    # GPU record is): such a table is written beside the measured one (suite-replay.md), never over it.
    simulated: bool = False

    def suites(self) -> "list[str]":
        return list(dict.fromkeys(r.suite for r in self.rows))

    def geomeans(self, suite: "str | None" = None) -> dict:
        """Geomean ratio to cuBLAS per dtype and over all rows: of one suite, or of every row."""
        rows = [r for r in self.rows if suite is None or r.suite == suite]
        out = {dt: geomean(r.ratio for r in rows if r.dtype == dt) for dt in dict.fromkeys(r.dtype for r in rows)}
        out["all"] = geomean(r.ratio for r in rows)
        return out

    def geomean_lines(self) -> "list[str]":
        """'Geomean ratio to cuBLAS: bf16 1.010x, all 1.010x', one line per suite when there are several."""
        def line(geo: dict) -> str:
            return ", ".join(f"{k} {_f(v, '{:.3f}x')}" for k, v in geo.items())

        suites = self.suites()
        if len(suites) == 1:
            return [f"Geomean ratio to cuBLAS: {line(self.geomeans())}"]
        return [f"Geomean ratio to cuBLAS, suite {name}: {line(self.geomeans(name))}" for name in suites] + \
               [f"Geomean ratio to cuBLAS, every suite: {line(self.geomeans())}"]

    def columns(self) -> "list[tuple[str, object]]":
        """(header, cell function) of the table; the suite, worker and other-shape columns where they say something."""
        many = len(self.suites()) > 1
        cols = [("suite", lambda r: r.suite)] if many else []
        cols += [("shape", lambda r: r.name), ("M", lambda r: str(r.m)), ("N", lambda r: str(r.n)),
                 ("K", lambda r: str(r.k)), ("dtype", lambda r: r.dtype),
                 ("model TFLOP/s" if self.dry_run else "gemmgen TFLOP/s",
                  lambda r: _f(r.predicted_tflops if self.dry_run else r.tflops)),
                 ("cuBLAS TFLOP/s", lambda r: _f(r.cublas_tflops)), ("ratio", lambda r: _f(r.ratio, "{:.2f}x")),
                 ("tuning time (s)", lambda r: f"{r.tuning_s:.1f}")]
        if any(r.other_shapes for r in self.rows):
            cols.append(("other shapes verified", lambda r: summary(r.other_shapes)))
        if any(r.now_ratio is not None for r in self.rows):
            cols += [("TFLOP/s now", lambda r: _f(r.now_tflops)), ("ratio now", lambda r: _f(r.now_ratio, "{:.2f}x")),
                     ("since stored", lambda r: retime_change(r))]
        if any(r.worker for r in self.rows):
            cols.append(("worker", lambda r: r.worker))
        return cols + [("note", lambda r: r.note)]

    def markdown(self) -> str:
        measured = ("Built from the stored records: each row's figures, cuBLAS's among them, come from that shape's own "
                    "tune (cuBLAS timed in the same run as it), at the date in its record; the other-shape "
                    "verification and the columns marked now (the winner rebuilt by this code and timed beside "
                    "cuBLAS), where shown, ran on the date above." if self.from_results else
                    "cuBLAS measured in the same run, same process and context.")
        head = (f"# gemmgen suite on {self.device or self.gpu.name} ({self.gpu.key}), {self.date}\n\n"
                f"Shapes from `{self.source}`. {measured}\n")
        if self.dry_run:
            head += "\nDry run: nothing measured; the TFLOP/s column is the roofline model's prediction.\n"
        cols = self.columns()
        numeric = {"M", "N", "K", "gemmgen TFLOP/s", "model TFLOP/s", "cuBLAS TFLOP/s", "ratio", "tuning time (s)",
                   "TFLOP/s now", "ratio now"}
        lines = ["| " + " | ".join(h for h, _ in cols) + " |",
                 "|" + "|".join("---:" if h in numeric else "---" for h, _ in cols) + "|"]
        lines += ["| " + " | ".join(cell(r) for _, cell in cols) + " |" for r in self.rows]
        return head + "\n" + "\n".join(lines + [""] + self.geomean_lines()) + "\n"

    def to_dict(self) -> dict:
        return {"format": "gemmgen-suite/1", "gpu": self.gpu.key, "device": self.device, "source": self.source,
                "date": self.date, "dry_run": self.dry_run, "rows": [asdict(r) for r in self.rows],
                "geomean_ratio": self.geomeans(),
                "geomean_ratio_by_suite": {name: self.geomeans(name) for name in self.suites()}}

    def write(self, variants: "tuple[str, ...]" = ()) -> "tuple[Path, Path]":
        """results/<gpu>/suite.{md,json} (suite-dry-run.* for a dry run): the latest report per GPU of the suite
        stored there, replaced atomically; the date is inside. Another suite's goes to suite-<name>.{md,json},
        several suites in one table to suite-<name>+<name>.{md,json}, so the one suite's report is kept.
        `variants` name a run that is not the whole suite as usual (`partial`: only some shapes; `sustained`: timed
        at the power limit), appended the same way: re-tuning one shape leaves the whole suite's table in place."""
        stem = "suite-dry-run" if self.dry_run else "suite"
        suites = self.suites()
        tagged = stem + "-" + "+".join("".join(c if c.isalnum() or c in "-_." else "_" for c in s) for s in suites)
        name = tagged if len(suites) > 1 else stem
        # One suite's table never replaces another suite's: a user's own suite (or the hard one), run where
        # results/<gpu>/suite.md holds the public suite's table, is written under its own name beside it; the
        # public suite, run again, still replaces its own table at the shipped path.
        if name == stem and self._other_suites(gpu_dir(self.gpu) / "".join((stem, *(f"-{v}" for v in variants),
                                                                              ".json"))):
            name = tagged
        for variant in variants:
            name += "-" + variant
        base = gpu_dir(self.gpu) / name
        md, js = base.with_suffix(".md"), base.with_suffix(".json")
        atomic_write(md, self.markdown().encode(), durable=True)
        write_json_atomic(js, self.to_dict())
        return md, js


    def _other_suites(self, path: Path) -> bool:
        """Whether the table stored at `path` holds other suites than this report's (an unreadable one counts as
        other: it is kept, not replaced)."""
        import json

        if not path.exists():
            return False
        try:
            rows = json.loads(path.read_text()).get("rows") or []
            stored = {row.get("suite") for row in rows}
        except (OSError, ValueError, AttributeError):
            return True
        return bool(stored) and stored != set(self.suites())  # an empty table has nothing to lose


# --retime flags a stored winner whose ratio to cuBLAS now is below this fraction of the stored one: more than run-
# to-run noise (about +-2% on large shapes, docs/perf-notes.md), as the PDL prefetch's 0.81x at 1024^3 was.
RETIME_DROP = 0.95
RETIME_ROUNDS = 5


def _fell(row: SuiteRow) -> bool:
    """Retimed, and its ratio to cuBLAS now below RETIME_DROP of the stored one."""
    return row.now_ratio is not None and bool(row.ratio) and row.now_ratio < RETIME_DROP * row.ratio


def retime_change(row: SuiteRow) -> str:
    """The retimed ratio against the stored one, flagged where it fell by more than RETIME_DROP allows."""
    if row.now_ratio is None or not row.ratio:
        return "-"
    return f"{row.now_ratio / row.ratio - 1.0:+.1%}" + (" SLOWER" if _fell(row) else "")


def retimed_slower(report: SuiteReport) -> "list[SuiteRow]":
    return [r for r in report.rows if _fell(r)]


def _f(value, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def suite_jobs(shapes: "list[Shape]", dtypes: "list[str]") -> "list[tuple[Shape, str, str | None]]":
    """(shape, dtype, key of an earlier job with the same product or None), in table order. The same product under
    another name (llm_o is sq4096) is tuned once: its record and measurement stand for both, so the table never
    shows one kernel at two speeds from two re-measurements."""
    seen: "dict[str, bool]" = {}
    out = []
    for shape in shapes:
        for dtype in dtypes:
            key = problem_key(shape.problem(dtype))
            out.append((shape, dtype, key if key in seen else None))
            seen[key] = True
    return out


def same_as(first: SuiteRow, shape: Shape) -> SuiteRow:
    """The row of a shape whose product `first` tuned."""
    from dataclasses import replace

    where = first.name if first.suite == shape.suite else f"{first.suite}/{first.name}"
    return replace(first, name=shape.name, suite=shape.suite, tuning_s=0.0,
                   note=(f"same problem as {where}; " + first.note).rstrip("; "))


def tune_row(shape: Shape, dtype: str, gpu: Gpu, measurer, options, *, engines, on_event=None,
             device: "dict | None" = None, out: "str | None" = None, check_shapes: int = 2) -> SuiteRow:
    """Tune one shape in one dtype, then verify its winner at `check_shapes` other shapes it serves. A failing tune
    is a row saying why; a UserError (storage, input) is raised: it concerns every shape."""
    from dataclasses import replace

    from .search import tune

    problem = shape.problem(dtype)
    t0 = time.monotonic()
    try:
        result = tune(problem, gpu, measurer, replace(options, out=out), engines=engines, on_event=on_event,
                      device=device)
    except UserError:
        raise
    except Exception as exc:  # one shape's failure must not lose the others' results
        return row_for(shape, dtype, tflops=None, cublas_tflops=None, ratio=None, tuning_s=time.monotonic() - t0,
                       note=f"failed: {type(exc).__name__}: {exc}"[:120], worker=options.worker)
    w = result.winner
    cublas = problem.flops / result.cublas_time_s / 1e12 if result.cublas_time_s else None
    tflops = w.tflops if w else None
    checks = _check_winner(result, engines, measurer, check_shapes) if w is not None and check_shapes else ()
    note = (f"{options.timing} timing" if options.timing != "burst" else "") if w else "no configuration ran correctly"
    if options.replay:  # as --from-results marks a replayed record: these figures were never measured
        note = "; ".join(filter(None, ("simulated (replayed timings)", note)))
    return row_for(shape, dtype, tflops=tflops, cublas_tflops=cublas, ratio=tflops / cublas if tflops and cublas
                   else None, tuning_s=result.elapsed_s, kernel=w.kernel if w else "",
                   predicted_tflops=problem.flops / w.predicted_time_s / 1e12 if w and w.predicted_time_s else None,
                   note=note, worker=options.worker, other_shapes=checks)


def _check_winner(result, engines, measurer, count: int) -> "tuple[ShapeCheck, ...]":
    """The winner verified at other shapes it serves: the exported bundle's manifest and cubin when there is one
    (what a user loads), else the winner built here (a compile-cache hit) with the same manifest."""
    import json

    from .serve_check import verify_other_shapes
    from ..model.tiles import Kernel

    if getattr(measurer, "verify", None) is None:
        return ()  # an in-process fake without verification: nothing to say
    try:
        if result.bundle is not None:
            manifest = json.loads(Path(result.bundle.manifest_path).read_text())
            cubin = Path(result.bundle.cubin_path).read_bytes()
        else:
            kernel = Kernel(result.gpu.arch, result.problem.operands, result.winner.config)
            compiled = engines.compiler.submit(kernel).result()
            if isinstance(compiled, Exception):
                raise compiled
            manifest, cubin = engines.manifest(kernel, result.problem, compiled), compiled.cubin
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return (ShapeCheck(0, 0, 0, False, reason=f"could not build the winner: {type(exc).__name__}: {exc}"[:160]),)
    return verify_other_shapes(manifest, bytes(cubin), measurer, count)


def run_suite(shapes: "list[Shape]", dtypes: "list[str]", gpu: Gpu, measurer, options, *, source: str,
              engines=None, on_event=None, device: "dict | None" = None, out: "str | None" = None,
              on_row=None, check_shapes: int = 2) -> SuiteReport:
    """Tune every shape in every dtype with one worker and one compile pool; a failing shape is a row, not an abort."""
    from .search import default_engines

    own = engines is None
    engines = engines or default_engines(options.jobs)
    rows = []
    done: "dict[str, SuiteRow]" = {}   # problem key -> the row of the first shape that tuned it
    try:
        for shape, dtype, same in suite_jobs(shapes, dtypes):
            key = problem_key(shape.problem(dtype))
            if same is not None:
                row = same_as(done[same], shape)
            else:
                row = tune_row(shape, dtype, gpu, measurer, options, engines=engines, on_event=on_event,
                               device=device, out=str(Path(out) / key) if out else None, check_shapes=check_shapes)
                done[key] = row
            rows.append(row)
            if on_row:
                on_row(row)
    finally:
        if own:
            engines.close()
    return SuiteReport(gpu, source, now(), tuple(rows), False, (device or {}).get("name", ""))


def dry_run_suite(shapes: "list[Shape]", dtypes: "list[str]", gpu: Gpu, *, source: str, top_k: int = 3,
                  jobs: int = 4, engines=None, on_row=None, out: "str | None" = None) -> SuiteReport:
    """Every shape ranked by the model and its top-k compiled; nothing measured. With `out`, each pick is
    exported unmeasured to out/<problem>/, where a tuned suite exports its winners."""
    from .search import default_engines, dry_run

    own = engines is None
    engines = engines or default_engines(jobs)
    rows = []
    try:
        for shape in shapes:
            for dtype in dtypes:
                t0 = time.monotonic()
                problem = shape.problem(dtype)
                result = dry_run(problem, gpu, top_k=top_k, engines=engines,
                                 out=str(Path(out) / problem_key(problem)) if out else None)
                pick = result.pick
                row = row_for(shape, dtype, tflops=None, cublas_tflops=None, ratio=None,
                              tuning_s=time.monotonic() - t0, kernel=pick.kernel.name if pick else "",
                              predicted_tflops=pick.ranked.tflops if pick else None,
                              note=("model's pick, compiled" + (", exported" if out else "")) if pick
                              else "no candidate compiled")
                rows.append(row)
                if on_row:
                    on_row(row)
    finally:
        if own:
            engines.close()
    return SuiteReport(gpu, source, now(), tuple(rows), True)


def report_from_results(shapes: "list[Shape]", dtypes: "list[str]", gpu: Gpu, *, source: str) -> SuiteReport:
    """The suite table from the records already in results/<gpu>/ (tunes run earlier, e.g. in parts)."""
    import json

    rows, device, simulated = [], "", False
    first_name: "dict[str, str]" = {}
    for shape in shapes:
        for dtype in dtypes:
            # The user's records, then those shipped with gemmgen (as lookup reads them); with no GPU measurement, a
            # replayed tune, if any, marked as simulated.
            path = stored_record_path(gpu, shape.problem(dtype))
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                record = None
            fault = _unreadable(record) if isinstance(record, dict) else ""
            w = None if fault else (record or {}).get("winner")
            if not w:
                note = "not tuned yet" if record is None else (
                    f"damaged record ({fault})" if fault else "no winner in its record")
                rows.append(row_for(shape, dtype, tflops=None, cublas_tflops=None, ratio=None, tuning_s=0.0,
                                    note=note))
                continue
            device = device or record.get("environment", {}).get("gpu_name", "")
            cublas = (record.get("cublas") or {}).get("tflops")
            pred = w.get("predicted_time_s")
            notes = ["simulated (replayed timings)"] if record.get("simulated") else []
            simulated = simulated or bool(record.get("simulated"))
            timing = (record.get("search") or {}).get("finalist_timing")
            if timing in ("sustained", "stream"):
                notes.append(f"{timing} timing")
            note = "; ".join(notes)
            key = problem_key(shape.problem(dtype))
            if key in first_name:   # one record serves every name of the same product (llm_o is sq4096)
                note = f"same problem as {first_name[key]}" + (f"; {note}" if note else "")
            first_name.setdefault(key, shape.name if len({s.suite for s in shapes}) == 1
                                  else f"{shape.suite}/{shape.name}")
            rows.append(row_for(shape, dtype, tflops=w["tflops"], cublas_tflops=cublas,
                                ratio=w["tflops"] / cublas if cublas else None,
                                tuning_s=float(record.get("elapsed_s", 0.0)), kernel=w["kernel"],
                                predicted_tflops=shape.problem(dtype).flops / pred / 1e12 if pred else None,
                                note=note))
    return SuiteReport(gpu, source, now(), tuple(rows), False, device, from_results=True, simulated=simulated)


def _unreadable(record: dict) -> str:
    """'' when the table can read a stored record's winner, cuBLAS, timing and tuning time, else the first field
    that is wrong: a record edited or cut short ended suite --from-results in a KeyError or TypeError."""
    w = record.get("winner")
    if w and not (isinstance(w, dict) and isinstance(w.get("kernel"), str) and positive_number(w.get("tflops"), True)
                  and positive_number(w.get("predicted_time_s"), False)):
        return "winner must give its kernel and a positive tflops"
    cublas = record.get("cublas")
    if cublas is not None and not (isinstance(cublas, dict) and positive_number(cublas.get("tflops"), False)):
        return "cublas.tflops must be a positive number"
    if not all(isinstance(record.get(key, {}), dict) for key in ("environment", "search")):
        return "environment and search must be mappings"
    if not (positive_number(record.get("elapsed_s"), False) or record.get("elapsed_s") == 0):
        return "elapsed_s must be a non-negative number"
    return ""


def verify_stored_winners(report: SuiteReport, shapes: "list[Shape]", dtypes: "list[str]", measurer, engines,
                          count: int = 2, *, verify: bool = True, retime: bool = False,
                          on_row=None) -> SuiteReport:
    """`report` (from the stored records) with each winner built from its record's configuration by today's code
    and, on the measurer's GPU, verified at `count` other shapes it serves (`verify`) and timed at its own shape
    beside cuBLAS in RETIME_ROUNDS interleaved rounds (`retime`: a stored tune that today's code, driver or card
    runs slower shows). Every winner is submitted to the compile pool first, so NVRTC builds them side by side
    while the GPU works on the first ones. `on_row(row)` is called with each row as it is done (progress)."""
    import json
    from dataclasses import replace

    from ..model.tiles import Kernel, TileConfig
    from .serve_check import verify_other_shapes

    gpu = report.gpu
    builds: "dict[str, tuple]" = {}  # problem key -> (problem, kernel, future) or (None, None, error text)
    for row, (shape, dtype, _) in zip(report.rows, suite_jobs(shapes, dtypes)):
        problem = shape.problem(dtype)
        key = problem_key(problem)
        if not row.kernel or key in builds:
            continue
        path = stored_record_path(gpu, problem)
        try:
            kernel = Kernel(gpu.arch, problem.operands,
                            TileConfig.from_dict(json.loads(path.read_text())["winner"]["config"]))
            builds[key] = (problem, kernel, engines.compiler.submit(kernel))
        except Exception as exc:  # noqa: BLE001 - a winner that cannot be rebuilt is a row's finding
            builds[key] = (None, None, f"{type(exc).__name__}: {exc}")
    checked: "dict[str, dict]" = {}
    rows = []
    for row, (shape, dtype, _) in zip(report.rows, suite_jobs(shapes, dtypes)):
        key = problem_key(shape.problem(dtype))
        if key not in builds:
            rows.append(row)
            continue
        if key not in checked:
            problem, kernel, build = builds[key]
            found: dict = {}
            try:
                if problem is None:
                    raise RuntimeError(build)
                compiled = build.result()
                if isinstance(compiled, Exception):
                    raise compiled
                manifest = engines.manifest(kernel, problem, compiled)
                if verify:
                    found["other_shapes"] = verify_other_shapes(manifest, compiled.cubin, measurer, count)
                if retime:
                    found.update(_retime(manifest, compiled.cubin, problem, measurer))
            except Exception as exc:  # noqa: BLE001 - as above
                found["other_shapes"] = (ShapeCheck(0, 0, 0, False, reason=f"could not build: {type(exc).__name__}: "
                                                    f"{exc}"[:160]),)
            checked[key] = found
        fields = dict(checked[key])
        if "note" in fields:   # a failed retime adds to the row's own note (a view's, a duplicate's)
            fields["note"] = "; ".join(filter(None, (row.note, fields["note"])))
        rows.append(replace(row, **fields))
        if on_row:
            on_row(rows[-1])
    return replace(report, rows=tuple(rows))


def _retime(manifest: dict, cubin: bytes, problem: Problem, measurer) -> dict:
    """The kernel and cuBLAS at the problem, in turns: {"now_tflops", "now_ratio"} from the medians (a failed
    measurement leaves the fields out and says why in a note)."""
    ours, cublas = [], []
    for _ in range(RETIME_ROUNDS):
        m = measurer.measure(manifest, cubin, problem)
        if not m.ok:
            return {"note": f"retime failed: {m.reason}"[:160]}
        ours.append(m.time_s)
        t = measurer.cublas_time(problem, fresh=True)
        if t:
            cublas.append(t)
    ours_s = statistics.median(ours)
    return {"now_tflops": problem.flops / ours_s / 1e12,
            "now_ratio": statistics.median(cublas) / ours_s if cublas else None}
