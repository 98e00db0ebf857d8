"""The benchmark suite: tune every shape of a YAML file in each dtype, side by side with cuBLAS.

The file (e.g. ../shared/shapes.yaml) holds `shapes: [{name, M, N, K, [a: row|col], [b: row|col]}]`.
One measuring worker and one compile pool serve every tune, so cuBLAS and gemmgen's kernels are
timed in the same process on the same context. The table goes to results/<gpu>/suite.md
and .json: shape, dtype, best TFLOP/s, cuBLAS TFLOP/s, ratio, tuning time, and the geomean ratio.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from ..model.arch import DType, Gpu
from ..model.errors import InvalidInput, UserError
from ..model.problem import Layout, Problem, parse_dim
from ..model.atomic import atomic_write
from ..model.files import load_yaml, read_text
from .results import gpu_dir, now, problem_key, record_path, write_json_atomic


class SuiteFileError(UserError):
    """The suite file breaks a rule: names the file, the rule and the offending entry."""

    def __init__(self, path: str, rule: str, detail: str = ""):
        self.path, self.rule, self.detail = path, rule, detail
        super().__init__(path, rule, detail)

    def __str__(self) -> str:
        return f"{self.path}: {self.rule}" + (f" (got {self.detail})" if self.detail else "")


@dataclass(frozen=True)
class Shape:
    name: str
    m: int
    n: int
    k: int
    a: str = "row"
    b: str = "row"

    def problem(self, dtype: str) -> Problem:
        return Problem.create(self.m, self.n, self.k, dtype, self.a, self.b)


_KEYS = {"name", "M", "N", "K", "a", "b"}


def load_shapes(path: "str | Path") -> "list[Shape]":
    """Parse and validate a suite file; every problem is a SuiteFileError naming the rule."""
    where = str(path)
    try:
        data = load_yaml("the suite file", read_text("the suite file", path), where)
    except InvalidInput as exc:
        raise SuiteFileError(where, exc.rule, exc.hint) from None
    if not isinstance(data, dict) or not isinstance(data.get("shapes"), list) or not data["shapes"]:
        raise SuiteFileError(where, "the suite file must map 'shapes' to a non-empty list", type(data).__name__)
    shapes, names = [], set()
    for i, entry in enumerate(data["shapes"]):
        at = f"shapes[{i}]"
        if not isinstance(entry, dict):
            raise SuiteFileError(where, f"{at} must be a mapping with M, N and K", repr(entry))
        unknown = sorted(set(map(str, entry)) - _KEYS)
        if unknown:
            raise SuiteFileError(where, f"{at} keys must be among {sorted(_KEYS)}", unknown[0])
        try:
            m, n, k = (parse_dim(axis, entry.get(axis)) for axis in ("M", "N", "K"))
            a, b = Layout.parse(entry.get("a", "row")).value, Layout.parse(entry.get("b", "row")).value
        except InvalidInput as exc:
            raise SuiteFileError(where, f"{at}: {exc.rule}", repr(exc.value)) from None
        name = entry.get("name", f"{m}x{n}x{k}")
        if not isinstance(name, str) or not name or not name.isprintable():
            raise SuiteFileError(where, f"{at}: a shape name must be printable text", repr(name))
        if name in names:
            raise SuiteFileError(where, f"{at}: shape names must be unique", name)
        names.add(name)
        shapes.append(Shape(name, m, n, k, a, b))
    return shapes


def select(shapes: "list[Shape]", only: "str | None", path: str) -> "list[Shape]":
    """The shapes named in `only` (comma-separated), in file order; all of them when None."""
    if not only:
        return shapes
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    known = {s.name for s in shapes}
    unknown = [w for w in wanted if w not in known]
    if unknown or not wanted:
        raise SuiteFileError(path, f"--only must name shapes of the file ({', '.join(sorted(known))})",
                             ", ".join(unknown) or only)
    return [s for s in shapes if s.name in wanted]


def parse_dtypes(text: str) -> "list[str]":
    """The comma-separated dtypes, each one some registered kernel family takes (the registry says which)."""
    from .. import families

    taken = sorted({d.value for f in families.all_families() for d in f.dtypes})
    rule = f"--dtypes must list dtypes the kernel families take ({', '.join(taken)}), separated by commas"
    out = []
    for part in str(text).split(","):
        try:
            dt = DType.parse(part)
        except InvalidInput:
            raise InvalidInput(rule, part) from None
        if dt.value not in taken:
            raise InvalidInput(rule, part)
        out.append(dt.value)
    return list(dict.fromkeys(out))


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


def geomean(values) -> "float | None":
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


@dataclass(frozen=True)
class SuiteReport:
    gpu: Gpu
    source: str
    date: str
    rows: "tuple[SuiteRow, ...]"
    dry_run: bool
    device: str = ""

    def geomeans(self) -> dict:
        out = {dt: geomean(r.ratio for r in self.rows if r.dtype == dt) for dt in dict.fromkeys(r.dtype for r in self.rows)}
        out["all"] = geomean(r.ratio for r in self.rows)
        return out

    def markdown(self) -> str:
        head = (f"# gemmgen suite on {self.device or self.gpu.name} ({self.gpu.key}), {self.date}\n\n"
                f"Shapes from `{self.source}`. cuBLAS measured in the same run, same process and context.\n")
        if self.dry_run:
            head += "\nDry run: nothing measured; the TFLOP/s column is the roofline model's prediction.\n"
        lines = ["| shape | M | N | K | dtype | gemmgen TFLOP/s | cuBLAS TFLOP/s | ratio | tuning time (s) | note |",
                 "|---|---:|---:|---:|---|---:|---:|---:|---:|---|"]
        for r in self.rows:
            tf = r.tflops if not self.dry_run else r.predicted_tflops
            lines.append(f"| {r.name} | {r.m} | {r.n} | {r.k} | {r.dtype} | {_f(tf)} | {_f(r.cublas_tflops)} | "
                         f"{_f(r.ratio, '{:.2f}x')} | {r.tuning_s:.1f} | {r.note} |")
        geo = self.geomeans()
        foot = ["", "Geomean ratio to cuBLAS: " + ", ".join(f"{k} {_f(v, '{:.3f}x')}" for k, v in geo.items())]
        return head + "\n" + "\n".join(lines + foot) + "\n"

    def to_dict(self) -> dict:
        return {"format": "gemmgen-suite/1", "gpu": self.gpu.key, "device": self.device, "source": self.source,
                "date": self.date, "dry_run": self.dry_run, "rows": [asdict(r) for r in self.rows],
                "geomean_ratio": self.geomeans()}

    def write(self) -> "tuple[Path, Path]":
        """results/<gpu>/suite.{md,json} (suite-dry-run.* for a dry run): the latest report per GPU, replaced
        atomically; the date is inside."""
        base = gpu_dir(self.gpu) / ("suite-dry-run" if self.dry_run else "suite")
        md, js = base.with_suffix(".md"), base.with_suffix(".json")
        atomic_write(md, self.markdown().encode(), durable=True)
        write_json_atomic(js, self.to_dict())
        return md, js


def _f(value, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def run_suite(shapes: "list[Shape]", dtypes: "list[str]", gpu: Gpu, measurer, options, *, source: str,
              engines=None, on_event=None, device: "dict | None" = None, out: "str | None" = None,
              on_row=None) -> SuiteReport:
    """Tune every shape in every dtype with one worker and one compile pool; a failing shape is a row, not an abort."""
    from dataclasses import replace

    from .search import default_engines, tune

    own = engines is None
    engines = engines or default_engines(options.jobs)
    rows = []
    done: "dict[str, SuiteRow]" = {}   # problem key -> the row of the first shape that tuned it
    try:
        for shape in shapes:
            for dtype in dtypes:
                problem = shape.problem(dtype)
                key = problem_key(problem)
                if key in done:
                    # The same product under another name (llm_o is sq4096): its one record and one measurement
                    # stand for both, so the table never shows one kernel at two speeds from two re-measurements.
                    first = done[key]
                    row = replace(first, name=shape.name, tuning_s=0.0,
                                  note=(f"same problem as {first.name}; " + first.note).rstrip("; "))
                    rows.append(row)
                    if on_row:
                        on_row(row)
                    continue
                shape_out = str(Path(out) / key) if out else None
                t0 = time.monotonic()
                try:
                    result = tune(problem, gpu, measurer, replace(options, out=shape_out), engines=engines,
                                  on_event=on_event, device=device)
                except UserError:
                    raise  # storage or input problems concern every shape: stop with the one-line error
                except Exception as exc:  # one shape's failure must not lose the others' results
                    row = SuiteRow(shape.name, shape.m, shape.n, shape.k, dtype, None, None, None,
                                   time.monotonic() - t0, note=f"failed: {type(exc).__name__}: {exc}"[:120])
                else:
                    w = result.winner
                    cublas = problem.flops / result.cublas_time_s / 1e12 if result.cublas_time_s else None
                    tflops = w.tflops if w else None
                    row = SuiteRow(shape.name, shape.m, shape.n, shape.k, dtype, tflops, cublas,
                                   tflops / cublas if tflops and cublas else None, result.elapsed_s,
                                   w.kernel if w else "", w.predicted_time_s and problem.flops / w.predicted_time_s / 1e12
                                   if w else None, ("sustained timing" if options.timing == "sustained" else "")
                                   if w else "no configuration ran correctly")
                rows.append(row)
                done[key] = row
                if on_row:
                    on_row(row)
    finally:
        if own:
            engines.close()
    return SuiteReport(gpu, source, now(), tuple(rows), False, (device or {}).get("name", ""))


def dry_run_suite(shapes: "list[Shape]", dtypes: "list[str]", gpu: Gpu, *, source: str, top_k: int = 3,
                  jobs: int = 4, engines=None, on_row=None) -> SuiteReport:
    """Every shape ranked by the model and its top-k compiled; nothing measured."""
    from .search import default_engines, dry_run

    own = engines is None
    engines = engines or default_engines(jobs)
    rows = []
    try:
        for shape in shapes:
            for dtype in dtypes:
                t0 = time.monotonic()
                result = dry_run(shape.problem(dtype), gpu, top_k=top_k, engines=engines)
                pick = result.pick
                row = SuiteRow(shape.name, shape.m, shape.n, shape.k, dtype, None, None, None, time.monotonic() - t0,
                               pick.kernel.name if pick else "", pick.ranked.tflops if pick else None,
                               "model's pick, compiled" if pick else "no candidate compiled")
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

    rows, device = [], ""
    first_name: "dict[str, str]" = {}
    for shape in shapes:
        for dtype in dtypes:
            path = record_path(gpu, shape.problem(dtype))
            if not path.is_file():  # no GPU measurement: a replayed tune, if any, marked as simulated
                path = record_path(gpu, shape.problem(dtype), simulated=True)
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                record = None
            w = (record or {}).get("winner")
            if not w:
                rows.append(SuiteRow(shape.name, shape.m, shape.n, shape.k, dtype, None, None, None, 0.0,
                                     note="not tuned yet" if record is None else "no winner in its record"))
                continue
            device = device or record.get("environment", {}).get("gpu_name", "")
            cublas = (record.get("cublas") or {}).get("tflops")
            pred = w.get("predicted_time_s")
            notes = ["simulated (replayed timings)"] if record.get("simulated") else []
            if (record.get("search") or {}).get("finalist_timing") == "sustained":
                notes.append("sustained timing")
            note = "; ".join(notes)
            key = problem_key(shape.problem(dtype))
            if key in first_name:   # one record serves every name of the same product (llm_o is sq4096)
                note = f"same problem as {first_name[key]}" + (f"; {note}" if note else "")
            first_name.setdefault(key, shape.name)
            rows.append(SuiteRow(shape.name, shape.m, shape.n, shape.k, dtype, w["tflops"], cublas,
                                 w["tflops"] / cublas if cublas else None, float(record.get("elapsed_s", 0.0)),
                                 w["kernel"], shape.problem(dtype).flops / pred / 1e12 if pred else None, note))
    return SuiteReport(gpu, source, now(), tuple(rows), False, device)
