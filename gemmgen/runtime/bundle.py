"""Checks of an exported bundle before anything is launched: the manifest's schema, the cubin's identity and
architecture, and the launch parameters recomputed from the kernel's configuration.

A manifest is data a launcher trusts with the GPU: a grid, shared-memory size or workspace that disagrees with
the kernel could fault it. So every field a launch uses is checked, and each refusal names the field.
"""
from __future__ import annotations

import hashlib
import struct

from .. import families
from ..model.arch import Arch, lookup_gpu
from ..model.errors import InvalidInput
from ..model.problem import Problem
from ..model.tiles import Kernel, TileConfig
from .manifest import operands_dict

EM_CUDA = 190  # ELF e_machine of CUDA cubins
PARAM_KINDS = {"tensor", "tensormap", "scalar", "workspace"}
TENSORS = {"A", "B", "C", "D", "bias", "scale_a", "scale_b", "row_sums"}


def cubin_sm(cubin: bytes) -> int:
    """The SM version a cubin's SASS is for (90 for sm_90/sm_90a), from its ELF header's e_flags."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF":
        raise InvalidInput("cubin must be an ELF file (a SASS cubin, not PTX)", cubin[:8])
    wide = cubin[4] == 2
    (machine,) = struct.unpack_from("<H", cubin, 18)
    if machine != EM_CUDA:
        raise InvalidInput("cubin must be a CUDA ELF (e_machine 190)", machine)
    (flags,) = struct.unpack_from("<I", cubin, 48 if wide else 36)
    return (flags >> 8) & 0xFF


def arch_sm(arch: str) -> int:
    """sm_90a -> 90."""
    digits = "".join(ch for ch in str(arch)[3:] if ch.isdigit())
    if not str(arch).startswith("sm_") or not digits:
        raise InvalidInput("manifest field arch must be sm_<NN>[a]", arch)
    return int(digits)


def runs_on(arch: str, cc: "tuple[int, int]") -> bool:
    """SASS for sm_XY runs on devices of the same major with minor >= Y; arch-specific sm_XYa only on X.Y."""
    sm = arch_sm(arch)
    major, minor = divmod(sm, 10)
    if str(arch).endswith("a"):
        return cc == (major, minor)
    return cc[0] == major and cc[1] >= minor


def _field(manifest: dict, path: str, kind, check=None):
    value = manifest
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise InvalidInput(f"manifest field {path} is required", "missing")
        value = value[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise InvalidInput(f"manifest field {path} must be {getattr(kind, '__name__', kind)}", value)
    if check is not None and not check(value):
        raise InvalidInput(f"manifest field {path} is out of range", value)
    return value


def _dims3(value, what: str, limit: int) -> "list[int]":
    if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) and not isinstance(v, bool)
                                                              and 1 <= v <= limit for v in value)):
        raise InvalidInput(f"manifest field {what} must be three integers in 1..{limit}", value)
    return value


def check_schema(manifest: dict) -> None:
    """Every field a launcher uses is present and of the right type and range."""
    _field(manifest, "name", str, str.isidentifier)
    _field(manifest, "arch", str, lambda a: arch_sm(a) > 0)
    _field(manifest, "cubin", str)
    _field(manifest, "cubin_sha256", str, lambda h: len(h) == 64)
    _field(manifest, "problem", dict)
    _field(manifest, "config", dict)
    _field(manifest, "workspace_bytes", int, lambda n: 0 <= n < 1 << 40)
    zero = manifest.get("workspace_zero", {"bytes": manifest["workspace_bytes"], "when": "run"})
    if not (isinstance(zero, dict) and isinstance(zero.get("bytes"), int) and 0 <= zero["bytes"] <= manifest["workspace_bytes"]
            and zero.get("when") in ("run", "bind")):
        raise InvalidInput("manifest field workspace_zero must be {bytes: 0..workspace_bytes, when: run|bind}", zero)
    launches = _field(manifest, "launches", list, lambda v: 1 <= len(v) <= 4)
    for i, launch in enumerate(launches):
        where = f"launches[{i}]"
        if not isinstance(launch, dict):
            raise InvalidInput(f"manifest field {where} must be a mapping", launch)
        if not isinstance(launch.get("entry"), str) or not launch["entry"].isidentifier():
            raise InvalidInput(f"manifest field {where}.entry must be a C identifier", launch.get("entry"))
        _dims3(launch.get("grid"), f"{where}.grid", 2**31 - 1)
        block = _dims3(launch.get("block"), f"{where}.block", 1024)
        if block[0] * block[1] * block[2] > 1024:
            raise InvalidInput(f"manifest field {where}.block must hold at most 1024 threads", block)
        _dims3(launch.get("cluster", [1, 1, 1]), f"{where}.cluster", 16)
        if not isinstance(launch.get("programmatic", False), bool):
            raise InvalidInput(f"manifest field {where}.programmatic must be true or false", launch.get("programmatic"))
        smem = launch.get("dynamic_smem", 0)
        if not isinstance(smem, int) or not 0 <= smem <= 256 * 1024:
            raise InvalidInput(f"manifest field {where}.dynamic_smem must be 0..262144 bytes", smem)
        params = launch.get("params")
        if not isinstance(params, list):
            raise InvalidInput(f"manifest field {where}.params must be a list", params)
        for j, p in enumerate(params):
            if isinstance(p, dict):   # a list or mapping in these fields was a bare TypeError (unhashable) below
                for key in ("name", "kind", "tensor"):
                    if key in p and not isinstance(p[key], str):
                        raise InvalidInput(f"manifest field {where}.params[{j}].{key} must be text", p[key])
            if not isinstance(p, dict) or p.get("kind") not in PARAM_KINDS:
                raise InvalidInput(f"manifest field {where}.params[{j}].kind must be one of {sorted(PARAM_KINDS)}",
                                   p.get("kind") if isinstance(p, dict) else p)
            allowed = TENSORS | {"workspace"} if p["kind"] == "tensormap" else TENSORS
            if p["kind"] in ("tensor", "tensormap") and p.get("tensor", p.get("name")) not in allowed:
                raise InvalidInput(f"manifest field {where}.params[{j}].tensor must be one of {sorted(allowed)}",
                                   p.get("tensor"))
            offset = p.get("offset_bytes", 0)
            if p["kind"] in ("workspace", "tensormap") and not (
                    isinstance(offset, int) and not isinstance(offset, bool)
                    and 0 <= offset and (offset == 0 or offset < manifest["workspace_bytes"])):
                raise InvalidInput(f"manifest field {where}.params[{j}].offset_bytes must lie inside the workspace",
                                   offset, f"workspace_bytes {manifest['workspace_bytes']}")


def check_cubin(manifest: dict, cubin: bytes) -> None:
    """The cubin is the one the manifest was written for (sha256) and its SASS is for the manifest's arch."""
    digest = hashlib.sha256(cubin).hexdigest()
    if digest != manifest["cubin_sha256"]:
        raise InvalidInput("manifest field cubin_sha256 must match the cubin's sha256", digest[:16] + "…",
                           f"manifest says {manifest['cubin_sha256'][:16]}…")
    sm = cubin_sm(cubin)
    if sm != arch_sm(manifest["arch"]):
        raise InvalidInput("manifest field arch must match the cubin's ELF architecture", manifest["arch"],
                           f"the cubin holds SASS for sm_{sm}")


# .nv.info attribute records (the CUDA ELF's per-kernel notes, as `cuobjdump -elf` decodes them): a 4-byte header
# (format, attribute, a 16-bit value or payload size), then for the SVAL format that many payload bytes.
NV_INFO_SVAL = 0x04
EIATTR_KPARAM_INFO = 0x17   # payload: u32 index, u16 ordinal, u16 offset, u32 flags with the size in bits 18-31
PARAM_BYTES = {"tensor": 8, "workspace": 8, "tensormap": 128}   # a device pointer; a CUtensorMap by value
# Parameters kernels gained after bundles had been exported with cubins that take none: sm90's edge maps
# (2026-11-27; docs/architecture.md, "Kernel ABI"). A manifest without them still verifies.
ADDED_PARAMS = frozenset({"tmAe", "tmBe"})


def cubin_params(cubin: bytes) -> "dict[str, list[int]]":
    """Each kernel entry's parameter sizes in bytes, by ordinal, from the cubin's .nv.info.<entry> sections ({} for
    a cubin without section headers)."""
    if len(cubin) < 64 or cubin[4] != 2:   # cubins are ELF64
        return {}
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    if not shoff or shentsize < 64 or shstrndx >= shnum or shoff + shnum * shentsize > len(cubin):
        return {}
    sections = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx][4]
    found = {}
    for name, _type, _flags, _addr, offset, size in sections:
        start = names + name
        label = cubin[start:cubin.find(b"\0", start)].decode("ascii", "replace")
        if not label.startswith(".nv.info.") or offset + size > len(cubin):
            continue
        data, pos, params = cubin[offset:offset + size], 0, {}
        while pos + 4 <= len(data):
            form, attribute, value = struct.unpack_from("<BBH", data, pos)
            pos += 4
            if form != NV_INFO_SVAL:
                continue
            # (a record cut short by its section's end is skipped: a hostile cubin raised struct.error here)
            if attribute == EIATTR_KPARAM_INFO and value >= 12 and pos + 12 <= len(data):
                _index, ordinal, _offset, flags = struct.unpack_from("<IHHI", data, pos)
                params[ordinal] = (flags >> 18) & 0x3FFF
            pos += value
        found[label[len(".nv.info."):]] = [params[k] for k in sorted(params)]
    return found


def param_bytes(param: dict) -> "int | None":
    """The bytes a manifest parameter takes in the kernel's parameter list (None: a ctype gemmgen does not pack)."""
    if param.get("kind") == "scalar":
        from .launch import _SCALAR_CTYPES   # the launcher's own table of C scalar types
        import ctypes

        ctype = _SCALAR_CTYPES.get(" ".join(str(param.get("ctype", "")).replace("const", "").split()))
        return ctypes.sizeof(ctype) if ctype is not None else None
    return PARAM_BYTES.get(param.get("kind"))


def check_cubin_params(manifest: dict, cubin: bytes) -> None:
    """Each launch's entry is a kernel of the cubin and its parameters are the ones that kernel takes, in count and
    size: parameters are passed by position, so a list one short (a bundle exported before a parameter existed,
    edited, or beside another cubin) shifted every later argument. A cubin without .nv.info notes is not checked."""
    entries = cubin_params(cubin)
    if not entries:
        return
    for i, launch in enumerate(manifest["launches"]):
        sizes = entries.get(launch["entry"])
        if sizes is None:
            raise InvalidInput(f"manifest field launches[{i}].entry must be a kernel of the cubin", launch["entry"],
                               f"the cubin holds {', '.join(sorted(entries))}")
        if not sizes:   # notes without parameter records (a toolchain that writes another format): not known
            continue
        listed = [param_bytes(p) for p in launch["params"]]
        if listed != sizes:
            raise InvalidInput(f"manifest field launches[{i}].params must be the parameters the cubin's kernel takes",
                               [p.get("name") for p in launch["params"]],
                               f"{len(listed)} listed of {listed} bytes; the kernel takes {len(sizes)} of {sizes}")


def check_launches(manifest: dict) -> None:
    """The launches agree with what the kernel's family computes from the manifest's configuration and problem:
    block, cluster, shared memory, parameters and workspace exactly; the grid exactly unless the kernel is
    persistent (its grid follows the device it was exported on), and never larger than the work."""
    if manifest["config"].get("family") not in families.names():
        return  # a kernel no registered family built (hand-written, a test's naive kernel): schema and cubin only
    config = TileConfig.from_dict(manifest["config"])
    problem = Problem.from_dict(manifest["problem"])
    kernel = Kernel(Arch.parse(manifest["arch"]), problem.operands, config)
    if kernel.name != manifest["name"]:
        raise InvalidInput("manifest field name must be the kernel its config and problem name", manifest["name"],
                           f"expected {kernel.name}")
    # The operands' dtypes, layouts and alignment as a launcher in another language reads them (an edited align_a
    # of 1 beside a kernel built for 8 let it pass leading dimensions the kernel's vector loads fault on).
    if "operands" in manifest:
        expected, given = operands_dict(kernel.operands), manifest["operands"]
        if not isinstance(given, dict):
            raise InvalidInput("manifest field operands must be a mapping", given)
        for key in sorted(set(expected) | set(given)):
            if given.get(key) != expected.get(key):
                raise InvalidInput(f"manifest field operands.{key} must be what the kernel was built for",
                                   given.get(key), f"expected {expected.get(key)}")
    persistent = bool(getattr(config, "persistent", False))
    refusal = None
    for sm_count in _export_sm_counts(manifest) if persistent else [None]:
        try:
            return _check_against(manifest, families.of(config).launches(kernel, problem, sm_count), persistent)
        except InvalidInput as exc:
            refusal = refusal or exc
    raise refusal


def _export_sm_counts(manifest: dict) -> "list[int | None]":
    """The SM counts a persistent kernel's launches may have been computed for (its grid, and Stream-K's workspace
    and what is placed after it, follow the GPU): the one its environment names (gemmgen compile exports for
    --gpu), then the families' default, an H100 SXM's (None), which every other export uses."""
    environment = manifest.get("environment")
    key = environment.get("gpu_key") if isinstance(environment, dict) else None
    try:
        named = lookup_gpu(key).sm_count if isinstance(key, str) else None
    except InvalidInput:   # a GPU this catalogue does not hold
        named = None
    return [named, None] if named is not None else [None]


def _check_against(manifest: dict, expected, persistent: bool) -> None:
    """InvalidInput naming the first field of the manifest's workspace and launches that `expected` (the family's
    Launches for the manifest's problem) does not match."""
    if manifest["workspace_bytes"] < expected.workspace_bytes:
        raise InvalidInput("manifest field workspace_bytes must cover the kernel's workspace",
                           manifest["workspace_bytes"], f"needs {expected.workspace_bytes}")
    if len(manifest["launches"]) != len(expected.launches):
        raise InvalidInput("manifest field launches must list the kernel's launches", len(manifest["launches"]),
                           f"expected {len(expected.launches)}")
    for i, (got, want) in enumerate(zip(manifest["launches"], expected.launches)):
        defaults = {"cluster": [1, 1, 1], "programmatic": False}
        for key in ("entry", "block", "cluster", "dynamic_smem", "programmatic"):
            if got.get(key, defaults.get(key)) != want.get(key, defaults.get(key)):
                raise InvalidInput(f"manifest field launches[{i}].{key} must be what the kernel was built for",
                                   got.get(key), f"expected {want[key]}")
        # A bundle exported before a parameter existed lists the parameters its cubin takes (check_cubin_params
        # holds the list to the cubin's) and is launched with them at every shape (serve.keep_exported_params).
        listed = {p.get("name") for p in got["params"]}
        wanted = [q for q in want["params"] if q["name"] in listed or q["name"] not in ADDED_PARAMS]
        if [(p.get("name"), p.get("kind")) for p in got["params"]] != [(q["name"], q["kind"]) for q in wanted]:
            raise InvalidInput(f"manifest field launches[{i}].params must be the kernel's parameters in order",
                               [p.get("name") for p in got["params"]])
        for j, (p, q) in enumerate(zip(got["params"], wanted)):
            if p.get("offset_bytes", 0) != q.get("offset_bytes", 0) or p.get("tensor") != q.get("tensor"):
                raise InvalidInput(f"manifest field launches[{i}].params[{j}] must point where the kernel's "
                                   "launches put it", (p.get("tensor"), p.get("offset_bytes", 0)),
                                   f"expected {(q.get('tensor'), q.get('offset_bytes', 0))}")
            if p.get("shape") != q.get("shape"):   # the scale vectors' lengths (per tensor, or per row/column)
                raise InvalidInput(f"manifest field launches[{i}].params[{j}].shape must be the kernel's",
                                   p.get("shape"), f"expected {q.get('shape')}")
            # Every other value a launch passes or a tensor map encodes (the scalars M, N, K, the leading
            # dimensions, alpha and beta; a map's dims, strides, box and swizzle): the loader launches the
            # bundle's own problem with these as written, and so does a launcher in another language. A manifest
            # whose problem was edited beside its old launches ran the kernel over other bounds than the arrays'.
            # A map written before "l2_promotion" existed is encoded with 256B (tma.LEGACY_L2_PROMOTION).
            for key in sorted(set(p) | set(q)):
                if p.get(key) != q.get(key) and not (key == "l2_promotion" and key not in p):
                    raise InvalidInput(f"manifest field launches[{i}].params[{j}].{key} must be what the kernel's "
                                       f"launches compute for the manifest's problem", p.get(key),
                                       f"{p.get('name')}: expected {q.get(key)}")
        if persistent and want["entry"] == manifest["name"]:
            if got["grid"][1:] != [1, 1] or got["grid"][0] % want["cluster"][0]:
                raise InvalidInput(f"manifest field launches[{i}].grid must be whole clusters in x", got["grid"])
        elif got["grid"] != want["grid"]:
            raise InvalidInput(f"manifest field launches[{i}].grid must be what the kernel was built for",
                               got["grid"], f"expected {want['grid']}")


def verify(manifest: dict, cubin: bytes) -> None:
    """All of the above: schema, cubin identity and architecture, launches. Raises InvalidInput naming the field."""
    check_schema(manifest)
    check_cubin(manifest, cubin)
    check_cubin_params(manifest, cubin)
    check_launches(manifest)


__all__ = ["arch_sm", "check_cubin", "check_launches", "check_schema", "cubin_sm", "runs_on", "verify"]
