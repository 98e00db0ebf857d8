"""Command-line entry point: argument parsing and dispatch only.

Each subcommand lives in gemmgen/commands/<name>.py with `register(subparsers)` and `run(args)`.
User errors print as one line on stderr and exit with status 2; never a traceback. main() returns the status
(usage errors and --help included) instead of exiting, so it can be called in-process.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys

from ..model.errors import GemmgenError, UserError

# Order here is the order in `gemmgen --help`.
COMMANDS = ("tune", "tune_linear", "suite", "lookup", "bench", "compile", "render", "space", "intensity", "roofline",
            "calibrate", "gpus", "plot")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line with exit status 2."""

    def __init__(self, *args, **kwargs):
        # No prefixes of flags: with them 'render ... --out X' read as --out-dtype X and was refused as a bad dtype,
        # not as the unknown flag it is.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # argparse (before 3.14) takes '-1e-3', '-1..8' and '-inf' for flags ('--beta -1e-3: expected one
        # argument'); no gemmgen flag starts like a number, so whatever does is a value, for the parsers to judge
        # (3.14's own rule, plus -inf and -nan).
        self._negative_number_matcher = re.compile(r"-\.?[0-9]|-(inf|infinity|nan)\Z", re.IGNORECASE)

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(text: str, limit: int = 600) -> str:
    """`text` as one printable line: argparse quotes the user's words raw, newlines and control bytes included."""
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(text))
    return text if len(text) <= limit else text[: limit - 40] + f"... ({len(text)} characters)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gemmgen", description="GEMM autotuner and CUDA code generator.")
    parser.add_argument("--version", action="version", version="gemmgen 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"gemmgen.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"gemmgen.cli.{name}":
                continue  # command not built yet in this checkout
            raise
        module.register(sub)
    return parser


# gemmgen's own dependencies (pyproject.toml), by the module a missing one leaves unimportable: a Python where gemmgen
# was not installed (PYTHONPATH to a checkout) lacks them, and that is an environment problem, not a bug.
DEPENDENCIES = {"jinja2": "jinja2>=3.1", "numpy": "numpy>=1.24", "optuna": "optuna>=3.6", "yaml": "pyyaml>=6",
                "cuda": "cuda-bindings[all]>=12.8"}


def missing_dependency(exc: ModuleNotFoundError) -> "str | None":
    """The one-line message for a dependency of gemmgen this Python lacks, or None for any other missing module."""
    top = (exc.name or "").partition(".")[0]
    if top not in DEPENDENCIES:
        return None
    return (f"{top} is not installed in this Python ({sys.executable}), and gemmgen depends on it: "
            f"pip install '{DEPENDENCIES[top]}' (installing gemmgen, pip install -e ., brings all of its dependencies)")


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


def _emptied_flag(parser: argparse.ArgumentParser, args) -> "str | None":
    """The flag of one value that argparse (3.11-3.12) left as an empty list, given as `--flag=--`: it strips the
    `--` and never calls the flag's type, so no check of ours saw it."""
    for action in parser._actions:
        if isinstance(action, argparse._StoreAction) and action.nargs is None and action.option_strings \
                and getattr(args, action.dest, None) == []:
            return action.option_strings[-1]
    return None


def main(argv: "list[str] | None" = None) -> int:
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:  # argparse says so as `gemmgen`, pointing at the wrong --help; the command's parser says it
            command = getattr(args, "command", None)
            (_subparser(parser, command) if command else parser).error(
                f"unrecognized arguments: {' '.join(extras)}")
    except SystemExit as exc:  # a usage error (one line, status 2), --help or --version (0): a status, as below
        return exc.code if isinstance(exc.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        print("gemmgen: error: a command is required (see gemmgen --help)", file=sys.stderr)
        return 2
    args._parser = _subparser(parser, args.command)  # for _common.given: which flags were changed
    emptied = _emptied_flag(args._parser, args)
    if emptied:
        print(f"gemmgen {args.command}: error: {emptied} needs one value, but got '--'", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"gemmgen {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        missing = missing_dependency(exc)
        if missing is None:
            raise
        print(f"gemmgen {args.command}: error: {one_line(missing)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gemmgen {args.command}: interrupted; results already stored are kept", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if exc.filename is None:
            raise
        # A path the user chose (a flag, or GEMMGEN_RESULTS / GEMMGEN_DATA / XDG_DATA_HOME / GEMMGEN_CACHE) that
        # cannot be used.
        print(f"gemmgen {args.command}: error: cannot use {one_line(exc.filename, 200)} "
              f"({exc.strerror or type(exc).__name__}); "
              "check the paths given and GEMMGEN_RESULTS, GEMMGEN_DATA, XDG_DATA_HOME, GEMMGEN_CACHE", file=sys.stderr)
        return 2
    except GemmgenError as exc:
        print(f"gemmgen {args.command}: failed: {one_line(exc, 2000)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
