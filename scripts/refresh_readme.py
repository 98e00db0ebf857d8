#!/usr/bin/env python3
"""Re-run the CPU-only commands shown in README.md and paste their current output under each.

    python3 scripts/refresh_readme.py [--check]

Only commands that need no GPU are re-run (intensity, roofline, gpus, render, space, compile, lookup,
calibrate and tune --dry-run); outputs of GPU runs stay as they were recorded, with their dates. `| head -N` is honoured.
--check exits 1 if the README would change.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPU_COMMANDS = ("intensity", "roofline", "gpus", "render", "space", "compile", "lookup", "calibrate")


def is_cpu_only(argv: "list[str]") -> bool:
    if len(argv) < 2 or argv[0] != "gemmgen":
        return False
    return argv[1] in CPU_COMMANDS or (argv[1] == "tune" and "--dry-run" in argv)


def run(command: str) -> str:
    head = None
    tail = None
    match = re.search(r"\|\s*(head|tail)\s+-(\d+)\s*$", command)
    if match:
        head, tail = (int(match.group(2)), None) if match.group(1) == "head" else (None, int(match.group(2)))
        command = command[:match.start()].strip()
    argv = shlex.split(command)
    proc = subprocess.run([sys.executable, "-m", "gemmgen", *argv[1:]], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    lines = proc.stdout.rstrip("\n").split("\n")
    if tail:
        lines = lines[-tail:]
    return "\n".join(lines[:head] if head else lines)


def refresh(text: str) -> str:
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not line.startswith("$ gemmgen"):
            continue
        command = line[2:]
        if not is_cpu_only(shlex.split(command.split("|")[0])):
            continue
        end = i  # the recorded output runs to the next prompt or the end of the block
        while end < len(lines) and not lines[end].startswith("$ ") and not lines[end].startswith("```"):
            end += 1
        out.extend(run(command).split("\n"))
        i = end
    return "\n".join(out)


def main() -> int:
    readme = ROOT / "README.md"
    old = readme.read_text()
    new = refresh(old)
    if "--check" in sys.argv:
        return int(new != old)
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
