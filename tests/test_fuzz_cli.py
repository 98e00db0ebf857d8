"""Property-based fuzzing of the command line (issue 24): hypothesis over argv (every command, its flags with
valid, random and hostile values), over the contents of the files they name (random bytes, truncated YAML and
JSON, huge numbers, deep nesting) and over the environment (GEMMGEN_DATA, XDG_DATA_HOME, GEMMGEN_RESULTS,
GEMMGEN_CACHE pointing at odd places).

Every outcome must be exit 0 with valid output (JSON where --json asked for it), or exit 2 with exactly one
line on stderr; never a traceback, never over 10 s. Runs in-process (gemmgen.cli.main) for speed. The work a
valid invocation would start (NVRTC compiles, a tune, a suite) is replaced by a sentinel raised where it
begins: reaching it shows that every input was checked before any work, and keeps the test at CPU speed.
benchmarks/fuzz_cli_table.py runs a larger campaign with the same strategies and prints the outcome table.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gemmgen.cli import main  # noqa: E402

TIME_LIMIT_S = 10.0


class WorkStarted(BaseException):
    """Raised where a valid invocation would begin real work (a BaseException: nothing in gemmgen catches it)."""


# The entry points of real work, each replaced by one that raises WorkStarted.
WORK = ("gemmgen.codegen.nvrtc:compile_kernel", "gemmgen.codegen.nvrtc:compile_many",
        "gemmgen.tune.search:dry_run", "gemmgen.tune.search:tune", "gemmgen.tune.suite:dry_run_suite",
        "gemmgen.tune.suite:run_suite", "gemmgen.tune.suite_gpus:run_suite_on_gpus", "gemmgen.tune.linear:tune_linear", "gemmgen.tune.tuning_plots:plot_tune")


@contextlib.contextmanager
def work_replaced():
    import importlib

    saved = []
    for spec in WORK:
        module_name, attr = spec.split(":")
        module = importlib.import_module(module_name)
        saved.append((module, attr, getattr(module, attr)))

        def stop(*_a, _what=spec, **_k):
            raise WorkStarted(_what)

        setattr(module, attr, stop)
    try:
        yield
    finally:
        for module, attr, original in saved:
            setattr(module, attr, original)


# --- values ------------------------------------------------------------------------------------

HOSTILE_TEXT = ["", " ", "-1", "0", "1e30", "1" + "0" * 30, "9" * 5000, "nan", "inf", "-inf", "４０９６", "٤٠٩٦",
                "4_096", "0x10", "1.5", "\t", "--", "-", "=", "a\x00b", "\n", "\udcff", "ü", "x" * 5000, "../..",
                "/", "/dev/null", "/proc/self/mem", "sqlite://", "sqlite:///:memory:", "h100 ", "H100", "%s%n",
                "128 x 128 x 32", "128×128×32", "{}", "[]", "null", "~", "*"]
hostile = st.sampled_from(HOSTILE_TEXT) | st.text(max_size=12) | st.binary(max_size=8).map(
    lambda b: b.decode("utf-8", "surrogateescape"))


def valid(*values):
    return st.sampled_from([str(v) for v in values])


DIM = valid(1, 16, 64, 256, 1000, 4096, 4096, 3000, 2**31, 4096000000)
VALUE_OF = {
    "int": valid(0, 1, 2, 3, 10, 100),
    "seed": valid(0, 7, 2**32 - 1, 2**32),
    "float": valid(0, 0.5, 1, 2.5, 1e-3, 60, 1e9),
    "gpu": valid("h100", "a100", "rtx3090", "rtx4090", "l40s", "h200"),
    "arch": valid("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm90a"),
    "dtype": valid("bf16", "f16", "f32", "fp8", "e5m2"),
    "dtypes": valid("bf16", "f16", "bf16,f16", "f32", "bf16,,f16"),
    "layout": valid("row", "col", "r", "t"),
    "activation": valid("none", "relu", "gelu", "silu", "swish"),
    "scaling": valid("tensor", "rowcol", "rowwise"),
    "sampler": valid("tpe", "random", "grid", "cmaes"),
    "timing": valid("burst", "sustained"),
    "reference": valid("auto", "torch", "kernel"),
    "tile": valid("64x64x32", "16x8x16", "128x128x32", "64x256x16"),
    "storage": valid("sqlite:///STUDIES", "sqlite:///NOFOLDER/x.db", "nosuchdb://x", "notaurl"),
    "file": valid("FILE", "FILE", "FILE", "FILE", "MISSING", "DIR"),
    "out": valid("OUTDIR", "FILE/sub"),
    "names": valid("tiny", "tiny,huge"),
    "range": valid("1..8192", "16", "64..32", "1..2147483648"),
    "buckets": valid("pow2", "auto", "none"),
    "format": valid("png", "svg", "gif"),
    "gpus": valid("0", "0,1", "all", "0,0"),
}
PROBLEM_FLAGS = [("--dtype", "dtype"), ("--b-dtype", "dtype"), ("--scaling", "scaling"), ("--a", "layout"), ("--b", "layout"), ("--alpha", "float"), ("--beta", "float"),
                 ("--bias", None), ("--activation", "activation"), ("--gpu", "gpu")]
TUNE_FLAGS = [("--trials", "int"), ("--timeout", "float"), ("--patience", "int"), ("--storage", "storage"),
              ("--out", "out"), ("--sampler", "sampler"), ("--top-k", "int"), ("--jobs", "int"),
              ("--finalists", "int"), ("--rounds", "int"), ("--timing", "timing"), ("--watchdog", "float"),
              ("--seed", "seed"), ("--replay", "file"), ("--no-progress", None)]
COMMANDS = {
    "tune": (3, PROBLEM_FLAGS + TUNE_FLAGS + [("--dry-run", None), ("--m", "range"), ("--n", "int"), ("--k", "int"),
                                              ("--shapes", "file"), ("--buckets", "buckets"), ("--gpus", "gpus"),
                                              ("--heartbeat", "int"), ("--grace", "int")]),
    "suite": (0, [("--gpu", "gpu"), ("--dtypes", "dtypes"), ("--timeout-per-shape", "float"), ("--only", "names"),
                  ("--from-results", None), ("--dry-run", None), ("--gpus", "gpus"), ("--verify-winners", None)]
              + [f for f in TUNE_FLAGS if f[0] != "--timeout"]),
    "lookup": (3, PROBLEM_FLAGS + [("--json", None)]),
    "bench": (3, PROBLEM_FLAGS + [("--arch", "arch"), ("--config", "file"), ("--reference", "reference"),
                                  ("--no-cublas", None), ("--json", None)]),
    "compile": (3, PROBLEM_FLAGS + [("--arch", "arch"), ("--config", "file"), ("--out", "out"),
                                    ("--lineinfo", None)]),
    "render": (3, PROBLEM_FLAGS + [("--arch", "arch"), ("--config", "file")]),
    "space": (0, [("--arch", "arch"), ("--dtype", "dtype"), ("--b-dtype", "dtype"), ("--a", "layout"), ("--b", "layout"), ("--gpu", "gpu"),
                  ("--compile", None), ("--jobs", "int"), ("--json", None)]),
    "intensity": (0, [("--warp", "tile"), ("--mma", "tile"), ("--cta", "tile"), ("--dtype", "dtype"),
                      ("--gpu", "gpu"), ("--peak-per-sm", "float"), ("--json", None)]),
    "roofline": (3, PROBLEM_FLAGS + [("--config", "file"), ("--json", None)]),
    "calibrate": (0, [("--gpu", "gpu"), ("--json", None), ("--fit", None), ("--defaults", None),
                      ("--holdout", "names"), ("--prior", "float"), ("--out", "out")]),
    "gpus": (0, [("--json", None)]),
    "tune-linear": (2, [("--tokens", "range"), ("--buckets", "buckets"), ("--dtype", "dtype"), ("--bias", None),
                        ("--activation", "activation"), ("--gpu", "gpu"), ("--dry-run", None)]
                    + [f for f in TUNE_FLAGS if f[0] not in ("--out", "--replay")]),
    "plot": (0, [("--storage", "storage"), ("--out", "out"), ("--format", "format")]),
}


@st.composite
def argv_strategy(draw):
    """A command, its positionals (some missing or extra), and a few of its flags with valid or hostile values,
    written `--flag value` or `--flag=value`; now and then an unknown flag or a stray word."""
    command = draw(st.sampled_from(sorted(COMMANDS)))
    positionals, flags = COMMANDS[command]
    argv = [command]
    if command in ("suite", "plot"):
        argv.append(draw(VALUE_OF["file"]))
    count = positionals + draw(st.sampled_from([0, 0, 0, 0, -1, 1])) if positionals else draw(st.sampled_from([0, 0, 1]))
    values = [draw(DIM) for _ in range(max(0, count))]
    chosen = draw(st.lists(st.sampled_from(flags), max_size=5, unique=True))
    if ("--gpu", "gpu") in flags and ("--gpu", "gpu") not in chosen and draw(st.integers(0, 9)) < 8:
        chosen.append(("--gpu", "gpu"))  # most runs name a GPU: without one, this machine has none to find
    if command == "compile" and ("--out", "out") not in chosen and draw(st.integers(0, 9)) < 8:
        chosen.append(("--out", "out"))  # compile requires it
    file_flags = [f for f in flags if f[1] == "file" and f[0] != "--replay"]
    if file_flags and not set(file_flags) & set(chosen) and draw(st.booleans()):
        chosen.append(file_flags[0])  # half the runs read a file: its contents are the other half of the input
    values += [draw(VALUE_OF[kind]) for _, kind in chosen if kind is not None]
    # Half the invocations carry only plausible values; the others one to three hostile ones among them, as a
    # typo or a hostile script would: so both the refusals and the paths behind them are reached.
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3]))):
        if values:
            values[draw(st.integers(0, len(values) - 1))] = draw(hostile)
    argv += values[: max(0, count)]
    rest = iter(values[max(0, count):])
    for flag, kind in chosen:
        if kind is None:
            argv.append(flag)
        elif draw(st.booleans()):
            argv += [flag, next(rest)]
        else:
            argv.append(f"{flag}={next(rest)}")
    if draw(st.integers(0, 9)) == 0:
        argv.insert(draw(st.integers(1, len(argv))), draw(st.sampled_from(["--nope", "-x", "extra", "--help"])))
    return argv


VALID_CONFIG = ("family: sm80_mma\ncta: 128x128x32\nwarp: 64x64x32\nmma: 16x8x16\nstages: 3\n"
                "raster: {order: row, group: 8}\n")
VALID_SUITE = "shapes:\n  - {name: tiny, M: 256, N: 256, K: 256}\n  - {name: sq, M: 4096, N: 4096, K: 4096, b: col}\n"
VALID_REPLAY = json.dumps({"cublas_time_s": 1e-5, "timings": {"x": 1e-4}})


@st.composite
def file_strategy(draw):
    """Contents for FILE: valid, truncated, random bytes, huge numbers, deep nesting, wrong shapes of data."""
    valid_text = draw(st.sampled_from([VALID_CONFIG, VALID_SUITE, VALID_REPLAY]))
    kind = draw(st.sampled_from(["valid", "truncated", "bytes", "huge", "nested", "mangled", "empty", "scalar"]))
    if kind == "valid":
        return kind, valid_text.encode()
    if kind == "truncated":
        return kind, valid_text.encode()[: draw(st.integers(0, len(valid_text) - 1))]
    if kind == "bytes":  # random bytes, and an ELF or PNG header's: what a binary file given by mistake starts with
        return kind, draw(st.sampled_from([b"\x7fELF\x02\x01", b"\x89PNG\r\n", b"\xff\xfe", b""])) + draw(
            st.binary(min_size=1, max_size=300))
    if kind == "huge":
        number = draw(st.sampled_from(["9" * 5000, "1e999", "-1", "0", "2147483648", ".nan", "4096000000"]))
        return kind, valid_text.replace("256", number, 1).replace("128x128x32", f"{number}x128x32", 1).encode()
    if kind == "nested":
        depth = draw(st.sampled_from([50, 2000, 100000]))
        return kind, ("[" * depth + "]" * depth).encode()
    if kind == "mangled":
        text = valid_text
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(["\x00", ":", "- ", "{", "&a", "*a", "!!python/object:os.system",
                                                      "\t", "\ufeff", "'"])) + text[at:]
        return kind, text.encode("utf-8", "surrogateescape")
    if kind == "empty":
        return kind, b""
    return kind, draw(st.sampled_from([b"42", b"null", b"[1, 2]", b'"text"', b"shapes: 3", b"timings: []"]))


ENV_VARS = ("GEMMGEN_DATA", "XDG_DATA_HOME", "GEMMGEN_RESULTS", "GEMMGEN_CACHE")
env_strategy = st.dictionaries(st.sampled_from(ENV_VARS),
                               st.sampled_from(["FILE", "MISSING/deep/er", "", "/proc", "/dev/null", "DIR", "."]),
                               max_size=3)


@dataclass
class Outcome:
    argv: list
    env: dict
    file_kind: str
    code: "int | None"
    out: str
    err: str
    seconds: float
    crash: str = ""  # a traceback, when main raised
    work: str = ""  # the work entry point reached, when the invocation was accepted


def run_case(tmp: Path, argv: list, file_kind: str, file_bytes: bytes, env: dict) -> Outcome:
    """Run main(argv) in-process with FILE, DIR, OUTDIR... replaced by paths under `tmp` and `env` applied."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "FILE").write_bytes(file_bytes)
    (tmp / "DIR").mkdir(exist_ok=True)

    def place(text: str) -> str:
        if text.startswith("--") and "=" in text:
            flag, _, value = text.partition("=")
            return f"{flag}={place(value)}"
        for word in ("STUDIES", "NOFOLDER", "MISSING", "OUTDIR", "FILE", "DIR"):
            if text.startswith(word):
                return str(tmp / word) + text[len(word):] if word != "STUDIES" else str(tmp / "studies.db")
            text = text.replace(f"sqlite:///{word}", f"sqlite:///{tmp / word}")
        return text

    argv = [place(a) for a in argv]
    saved = {k: os.environ.get(k) for k in ENV_VARS}
    base = {"GEMMGEN_RESULTS": str(tmp / "results"), "GEMMGEN_CACHE": str(tmp / "cache"),
            "GEMMGEN_DATA": str(tmp / "data"), "XDG_DATA_HOME": str(tmp / "xdg")}
    applied = dict(base, **{k: place(v) if v not in ("", ".") else v for k, v in env.items()})
    out, err = io.StringIO(), io.StringIO()
    crash, work, code = "", "", None
    start = time.monotonic()
    try:
        os.environ.update(applied)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), work_replaced():
            code = main(argv)
    except WorkStarted as exc:
        work = str(exc)
    except BaseException:  # noqa: BLE001 - anything else escaping main is the bug this test looks for
        crash = traceback.format_exc()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return Outcome(argv, env, file_kind, code, out.getvalue(), err.getvalue(), time.monotonic() - start, crash, work)


def violation(o: Outcome) -> str:
    """'' when the outcome keeps the contract, else what it breaks."""
    if o.crash:
        return "traceback:\n" + o.crash
    if "Traceback" in o.err:
        return "traceback printed"
    if o.seconds > TIME_LIMIT_S:
        return f"took {o.seconds:.1f} s"
    if o.work:
        return ""  # every input was accepted and checked; real work would begin here
    if o.code == 0:
        if "--json" in o.argv and "--help" not in o.argv:
            try:
                json.loads(o.out)
            except ValueError:
                return "--json output is not JSON"
        return "" if (o.out.strip() or "--help" in o.argv) else "exit 0 with no output"
    if o.code == 2:
        lines = o.err.splitlines()
        return "" if len(lines) == 1 and lines[0].startswith("gemmgen") else f"exit 2 with stderr {o.err!r}"
    return f"exit {o.code}: {o.err[-300:]!r}"


@settings(max_examples=int(os.environ.get("GEMMGEN_FUZZ_EXAMPLES", "1000")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(argv=argv_strategy(), file=file_strategy(), env=env_strategy)
def test_every_invocation_exits_0_with_output_or_2_with_one_line(tmp_path_factory, argv, file, env):
    outcome = run_case(tmp_path_factory.mktemp("fuzz"), argv, file[0], file[1], env)
    problem = violation(outcome)
    assert not problem, f"{outcome.argv} env={outcome.env} file={outcome.file_kind}: {problem}"
