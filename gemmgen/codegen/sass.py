"""SASS of a cubin on the CPU: cuobjdump from PyPI's nvidia-cuda-cuobjdump (with nvdisasm beside it).

Used to pin what the compiler made of a template: HMMA.16816 / LDSM / LDGSTS present, LDL / STL
(local memory: register spills or dynamically indexed arrays) absent.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from ..model.errors import GemmgenError, MissingTool

INSTALL_HINT = "pip install 'gemmgen[test]' (nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm)"


class ToolMissing(MissingTool):
    """A CUDA binary utility is not installed."""

    def __init__(self, tool: str, hint: str = INSTALL_HINT):
        self.tool = tool
        super().__init__(tool, hint)


class SassError(GemmgenError):
    """cuobjdump ran but could not disassemble the cubin."""

    def __init__(self, command: str, returncode: int, stderr: str):
        self.command, self.returncode, self.stderr = command, returncode, stderr
        super().__init__(command, returncode, stderr)

    def __str__(self) -> str:
        return f"{self.command} exited with {self.returncode}: {self.stderr.strip()[:300]}"


def _package_bins() -> "list[Path]":
    """bin/ folders of the installed nvidia-* wheels (nvidia is a namespace package)."""
    try:
        import nvidia  # type: ignore[import-not-found]
    except ImportError:
        return []
    found = []
    for root in getattr(nvidia, "__path__", []):
        for candidate in sorted(Path(root).glob("*/bin")) + [Path(root) / "bin"]:
            if candidate.is_dir():
                found.append(candidate)
    return found


def find_tool(name: str) -> Path:
    """A CUDA utility from the nvidia-* wheels, else from PATH; ToolMissing if neither has it."""
    for folder in _package_bins():
        path = folder / name
        if path.is_file() and os.access(path, os.X_OK):
            return path
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    raise ToolMissing(name)


def dump_sass(cubin: bytes) -> str:
    """The disassembly (`cuobjdump --dump-sass`) of a cubin."""
    cuobjdump = find_tool("cuobjdump")
    nvdisasm = find_tool("nvdisasm")  # cuobjdump shells out to nvdisasm for SASS
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(nvdisasm.parent), env.get("PATH", "")])
    with tempfile.TemporaryDirectory(prefix="gemmgen-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        command = [str(cuobjdump), "--dump-sass", str(path)]
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SassError("cuobjdump --dump-sass", proc.returncode, proc.stderr)
    return proc.stdout


# `/*0080*/   @!P0 LDGSTS.E.BYPASS.LTC128B.128 [R3], desc[UR8][R4.64] ;   /* 0x... */`
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")


def instruction_counts(sass: str) -> Counter:
    """Opcodes with their modifiers (e.g. HMMA.16816.F32.BF16, LDSM.16.M88.4) and how often each occurs."""
    counts: Counter = Counter()
    for line in sass.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            counts[match.group(1)] += 1
    return counts


def count_prefix(counts: Counter, prefix: str) -> int:
    """Instructions whose opcode is `prefix` or starts with `prefix.` (LDL matches LDL.64, not LDLK)."""
    return sum(n for op, n in counts.items() if op == prefix or op.startswith(prefix + "."))


__all__ = ["SassError", "ToolMissing", "count_prefix", "dump_sass", "find_tool", "instruction_counts"]
