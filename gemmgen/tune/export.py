"""The export bundle: what a user needs to launch the winning kernel without gemmgen's tuner.

<name>.cubin   SASS for the exact target (cubins, not PTX: newer PTX does not load on older drivers)
<name>.cu      the generated source, for reading and debugging
<name>.json    the launch manifest (docs/architecture.md) plus the problem, the configuration,
               the measured time, the verification record and the environment fingerprint
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..model.errors import InvalidInput
from ..model.problem import Problem
from ..model.atomic import atomic_write_files
from .results import now
from ..model.tiles import Kernel


@dataclass(frozen=True)
class Bundle:
    manifest_path: Path
    cubin_path: Path
    source_path: Path
    manifest: dict


def _make_manifest(kernel: Kernel, problem: Problem, compiled) -> dict:
    from ..runtime.manifest import make_manifest

    return make_manifest(kernel, problem, compiled)


def export_bundle(out_dir: "str | Path", kernel: Kernel, problem: Problem, compiled, *,
                  measured: "dict | None", verification: "dict | None", environment: dict,
                  note: "str | None" = None, extra: "dict | None" = None, manifest_fn=None) -> Bundle:
    """Write <name>.cubin, <name>.cu and <name>.json into `out_dir` and return their paths.

    `measured` is {"time_s", "tflops", "median_time_s", "min_time_s", "max_time_s", ...} or None
    for a kernel that was never timed (dry run); `verification` is {"ok", "rel_error", ...} or None.
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput("--out must be a directory gemmgen can create and write", str(out), exc.strerror) from None
    manifest = dict((manifest_fn or _make_manifest)(kernel, problem, compiled))
    name = manifest.get("name") or kernel.name
    manifest.setdefault("name", name)
    manifest.setdefault("problem", problem.to_dict())
    manifest.setdefault("config", kernel.config.to_dict())
    manifest["cubin"] = f"{name}.cubin"
    manifest["cubin_sha256"] = hashlib.sha256(bytes(compiled.cubin)).hexdigest()  # checked on load
    manifest["source"] = f"{name}.cu"
    manifest["measured"] = measured
    manifest["verification"] = verification
    manifest["environment"] = environment
    manifest["exported"] = now()
    if note:
        manifest["note"] = note
    if extra:
        manifest.update(extra)
    try:
        cubin_path, source_path, manifest_path = write_bundle_files(out, name, compiled.cubin, compiled.source,
                                                                    manifest)
    except OSError as exc:
        raise InvalidInput("--out must be a directory gemmgen can create and write", str(out), exc.strerror) from None
    return Bundle(manifest_path, cubin_path, source_path, manifest)


def write_bundle_files(out: Path, name: str, cubin: bytes, source: str, manifest: dict) -> "list[Path]":
    """<name>.cubin, .cu and .json written as one: staged and fsynced, then renamed into place manifest last,
    so a disk that fills (or a Ctrl-C) mid-export leaves the bundle that was there intact."""
    text = json.dumps(manifest, indent=2, default=str) + "\n"
    return atomic_write_files(out, {f"{name}.cubin": bytes(cubin), f"{name}.cu": source.encode(),
                                    f"{name}.json": text.encode()}, last=f"{name}.json")
