"""Suite files: the YAML files `gemmgen suite` reads (`[suite: NAME]`, `shapes: [{name, M, N, K, [a], [b],
[lda], [ldb], [ldc]}]`), each problem a SuiteFileError naming the file, the rule and the entry; and the --only and
--dtypes selections. Split from tune/suite.py, which tunes the shapes and writes the table."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..model.arch import DType
from ..model.errors import InvalidInput, UserError
from ..model.files import load_yaml, read_text
from ..model.problem import Layout, Problem, parse_dim


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
    suite: str = ""  # the suite file's name (its `suite:` key, else its stem)
    lda: int = 0  # leading dimensions of a view wider than its operand (0: packed)
    ldb: int = 0
    ldc: int = 0

    def problem(self, dtype: str) -> Problem:
        return Problem.create(self.m, self.n, self.k, dtype, self.a, self.b, lda=self.lda, ldb=self.ldb,
                              ldc=self.ldc).k_major_rows()


_KEYS = {"name", "M", "N", "K", "a", "b", "lda", "ldb", "ldc"}


def load_suites(paths: "list[str]") -> "list[Shape]":
    """The shapes of several suite files, in order; two files may not bear one suite name."""
    shapes, seen = [], {}
    for path in paths:
        found = load_shapes(path)
        suite = found[0].suite
        if suite in seen:
            raise SuiteFileError(str(path), f"suite names must be unique ({seen[suite]} is also '{suite}'); "
                                            "set `suite: NAME` in one of the files", suite)
        seen[suite] = str(path)
        shapes += found
    return shapes


def load_shapes(path: "str | Path") -> "list[Shape]":
    """Parse and validate a suite file; every problem is a SuiteFileError naming the rule."""
    where = str(path)
    try:
        data = load_yaml("the suite file", read_text("the suite file", path), where)
    except InvalidInput as exc:
        raise SuiteFileError(where, exc.rule, exc.hint) from None
    if not isinstance(data, dict) or not isinstance(data.get("shapes"), list) or not data["shapes"]:
        # Say what stands where the list should ('got dict' for `shapes: []` named the file's top level).
        held = type(data).__name__ if not isinstance(data, dict) else (
            "no 'shapes' key" if "shapes" not in data else f"shapes: {data['shapes']!r}"[:60])
        raise SuiteFileError(where, "the suite file must map 'shapes' to a non-empty list", held)
    suite = data.get("suite", Path(where).stem)
    if not isinstance(suite, str) or not suite or not suite.isprintable() or "|" in suite:
        raise SuiteFileError(where, "the suite's name (suite:) must be printable text without '|'", repr(suite))
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
            # A leading dimension is checked against the operand it belongs to (at least its packed one); one
            # equal to the packed value is packed.
            view = Problem.create(m, n, k, "bf16", a, b, **{key: entry.get(key, 0) for key in ("lda", "ldb", "ldc")})
        except InvalidInput as exc:
            raise SuiteFileError(where, f"{at}: {exc.rule}", repr(exc.value)) from None
        name = entry.get("name", f"{m}x{n}x{k}")
        if not isinstance(name, str) or not name or not name.isprintable() or "|" in name:
            # '|' would split the name across two cells of the markdown table.
            raise SuiteFileError(where, f"{at}: a shape name must be printable text without '|'", repr(name))
        if name in names:
            raise SuiteFileError(where, f"{at}: shape names must be unique", name)
        names.add(name)
        shapes.append(Shape(name, m, n, k, a, b, suite, view.a_ld, view.b_ld, view.c_ld))
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
