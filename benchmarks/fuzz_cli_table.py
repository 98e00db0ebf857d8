#!/usr/bin/env python3
"""A larger fuzz campaign over gemmgen's command line, printed as the table docs/robustness.md quotes.

    PYTHONPATH=$PWD python3 benchmarks/fuzz_cli_table.py [--examples 5000] [--seed 0] [--json FILE]

Uses the strategies of tests/test_fuzz_cli.py (argv of every command with valid, random and hostile values;
files of random bytes, truncated YAML/JSON, huge numbers, deep nesting; GEMMGEN_DATA, XDG_DATA_HOME,
GEMMGEN_RESULTS and GEMMGEN_CACHE pointing at odd places), runs each invocation in-process, and counts the
outcomes per category: exit 0 (valid output), exit 2 (one line on stderr), accepted (every input checked, then
the work a GPU-free run replaces by a sentinel: a compile, a tune, a suite), any other exit, tracebacks and runs
over 10 s. The contract is 0 in the last three columns; the script exits 1 otherwise and prints the cases.
No GPU needed.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"


def campaign(examples: int, seed: int) -> list:
    """The outcomes of `examples` generated invocations (hypothesis, generation only: nothing is shrunk)."""
    sys.path.insert(0, str(TESTS))
    from hypothesis import HealthCheck, Phase, given, seed as fix_seed, settings
    from test_fuzz_cli import argv_strategy, env_strategy, file_strategy, run_case

    root = Path(tempfile.mkdtemp(prefix="gemmgen-fuzz-"))
    outcomes = []

    @fix_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(argv=argv_strategy(), file=file_strategy(), env=env_strategy)
    def one(argv, file, env):
        case = root / str(len(outcomes))
        outcomes.append(run_case(case, argv, file[0], file[1], env))
        shutil.rmtree(case, ignore_errors=True)

    try:
        one()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return outcomes


def category_rows(outcomes: list) -> "list[tuple[str, Counter]]":
    """Per category (the command, the file contents, the environment), the count of each outcome."""
    from test_fuzz_cli import violation

    groups: "dict[str, Counter]" = defaultdict(Counter)
    for o in outcomes:
        bad = violation(o)
        kind = ("traceback" if o.crash or "Traceback" in o.err else "over 10 s" if o.seconds > 10 else
                "broken" if bad else "accepted" if o.work else f"exit {o.code}")
        env = "odd environment" if o.env else "default environment"
        command = o.argv[0] if o.argv else "-"
        for group in (f"argv: {command}", f"file: {o.file_kind}", f"env: {env}", "all"):
            groups[group][kind] += 1
            groups[group]["tried"] += 1
    order = sorted(groups, key=lambda g: (g == "all", g.split(":")[0], g))
    return [(g, groups[g]) for g in order]


def table(rows) -> str:
    head = ["category", "tried", "exit 0", "exit 2", "accepted, work not run", "other exit", "tracebacks",
            "over 10 s"]
    keys = ["tried", "exit 0", "exit 2", "accepted", "broken", "traceback", "over 10 s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, counts in rows:
        cells = [f"**{name}**" if name == "all" else name] + [str(counts.get(k, 0)) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def top_refusals(outcomes: list, n: int = 12) -> str:
    """The most frequent exit-2 rules (the line up to ', but got' or the first parenthesis: the value dropped)."""
    import re

    counts = Counter()
    for o in outcomes:
        if o.code == 2 and o.err:
            line = o.err.strip().split(": error: ", 1)[-1]
            line = re.split(r", but got|: /| \(see gemmgen|: got ", line)[0]
            counts[re.sub(r"argument (--[\w-]+|[A-Z. ]+): ", "", line)[:90]] += 1
    rows = ["| exit 2, the rule named | count |", "|---|---|"]
    rows += [f"| {rule} | {count} |" for rule, count in counts.most_common(n)]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=5000, help="invocations to generate (default 5000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write every broken case here")
    args = parser.parse_args()
    start = time.monotonic()
    outcomes = campaign(args.examples, args.seed)
    print(table(category_rows(outcomes)))
    print()
    print(top_refusals(outcomes))
    slowest = max(outcomes, key=lambda o: o.seconds)
    print(f"\n{len(outcomes)} invocations in {time.monotonic() - start:.0f} s; slowest {slowest.seconds:.2f} s "
          f"({' '.join(slowest.argv)[:80]})")
    from test_fuzz_cli import violation

    broken = [(o, violation(o)) for o in outcomes if violation(o)]
    for o, why in broken[:20]:
        print(f"BROKEN {o.argv!r} env={o.env} file={o.file_kind}: {why.splitlines()[-1] if why else ''}")
    if args.json:
        Path(args.json).write_text(json.dumps([{"argv": o.argv, "env": o.env, "file": o.file_kind, "why": why}
                                               for o, why in broken], indent=2))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
