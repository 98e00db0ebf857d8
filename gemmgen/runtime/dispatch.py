"""A dispatch folder: several kernel bundles and a table (dispatch.json) saying which one serves which shapes.

    gemm = gemmgen.load("out/")          # a folder holding dispatch.json
    gemm(A, B, D)                        # the kernel of the bucket holding A's M, for A's N x K

dispatch.json (format gemmgen-dispatch/1):

    {"format": "gemmgen-dispatch/1", "arch": "sm_90a", "gpu": "h100-sxm",
     "problem": {...Problem.to_dict() of the operand description; M, N, K are those of the first bucket...},
     "tables": [{"n": 4096, "k": 4096,
                 "buckets": [{"m_min": 1, "m_max": 1, "kernel": "<name>", "tuned_at": 1, ...}, ...]}]}

Each table covers one N x K; its buckets cover M from the first m_min to the last m_max without gaps or overlap,
in ascending order, each served by one kernel of the folder (<kernel>.json + .cubin, verified as gemmgen.load
verifies any bundle). Keys beyond these (measured times, the kernel a merged bucket would have had) are for
people and are not read here. The table is checked whole on load; a shape outside it is refused naming the rule.

Per call, the arrays' identity (address, shape, strides, dtype of each operand) is the key of a cached bound
launch: a call seen before costs a tuple, one dict lookup, the current stream and the launch. Only a new key
looks up the bucket (bisect on M) and binds the kernel (checks, parameters, tensor maps).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from pathlib import Path

from ..model import parse
from ..model.errors import InvalidInput
from ..model.files import load_json, read_text
from ..model.problem import Problem
from .arrays import _torch_key, _torch_stream, describe_array, stream_handle
from .loader import LoadedKernel, read_bundle
from .serve import check_serves, kernel_of

DISPATCH_FORMAT = "gemmgen-dispatch/1"
DISPATCH_FILE = "dispatch.json"
BOUND_KEYS = 64  # array sets kept bound (a decode loop sees a few shapes, each with rotating activations)


@dataclass(frozen=True)
class Table:
    """The buckets of one N x K: ascending upper bounds of M and the kernel of each."""

    n: int
    k: int
    m_min: "tuple[int, ...]"
    m_max: "tuple[int, ...]"
    kernels: "tuple[str, ...]"

    def kernel_for(self, m: int) -> str:
        """The kernel of the bucket holding `m`; InvalidInput naming the table's range when none does."""
        i = bisect.bisect_left(self.m_max, m)
        if i == len(self.m_max) or m < self.m_min[0]:
            raise InvalidInput(f"M must be within the dispatch table's range {self.m_min[0]}..{self.m_max[-1]} "
                               f"for N x K = {self.n}x{self.k}", m)
        return self.kernels[i]


def _int(value, what: str, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidInput(f"dispatch.json field {what} must be an integer >= {low}", value)
    return value


def parse_tables(table: dict) -> "dict[tuple[int, int], Table]":
    """(N, K) -> Table from a dispatch.json payload, checking its schema; InvalidInput names the field."""
    if not isinstance(table, dict) or table.get("format") != DISPATCH_FORMAT:
        raise InvalidInput(f"dispatch.json field format must be {DISPATCH_FORMAT}",
                           table.get("format") if isinstance(table, dict) else type(table).__name__)
    if not isinstance(table.get("problem"), dict):
        raise InvalidInput("dispatch.json field problem must be a mapping (the operand description)",
                           table.get("problem"))
    tables = table.get("tables")
    if not isinstance(tables, list) or not tables:
        raise InvalidInput("dispatch.json field tables must be a non-empty list", tables)
    out: "dict[tuple[int, int], Table]" = {}
    for i, entry in enumerate(tables):
        where = f"tables[{i}]"
        if not isinstance(entry, dict):
            raise InvalidInput(f"dispatch.json field {where} must be a mapping", entry)
        n, k = _int(entry.get("n"), f"{where}.n"), _int(entry.get("k"), f"{where}.k")
        if (n, k) in out:
            raise InvalidInput(f"dispatch.json field {where} must cover an N x K no other table covers", f"{n}x{k}")
        buckets = entry.get("buckets")
        if not isinstance(buckets, list) or not buckets:
            raise InvalidInput(f"dispatch.json field {where}.buckets must be a non-empty list", buckets)
        lows, highs, names = [], [], []
        for j, bucket in enumerate(buckets):
            at = f"{where}.buckets[{j}]"
            if not isinstance(bucket, dict):
                raise InvalidInput(f"dispatch.json field {at} must be a mapping", bucket)
            low, high = _int(bucket.get("m_min"), f"{at}.m_min"), _int(bucket.get("m_max"), f"{at}.m_max")
            if high < low:
                raise InvalidInput(f"dispatch.json field {at} must have m_min <= m_max", (low, high))
            if highs and low != highs[-1] + 1:
                raise InvalidInput(f"dispatch.json field {at}.m_min must follow the previous bucket's m_max "
                                   "(ascending, no gap, no overlap)", low, f"previous m_max {highs[-1]}")
            name = bucket.get("kernel")
            if not isinstance(name, str) or not name.isidentifier():
                raise InvalidInput(f"dispatch.json field {at}.kernel must be a kernel name", name)
            lows.append(low), highs.append(high), names.append(name)
        out[(n, k)] = Table(n, k, tuple(lows), tuple(highs), tuple(names))
    return out


def _same_operands(a: dict, b: dict) -> bool:
    """Two problems' compile-time description (dtypes, layouts, epilogue), shapes aside."""
    skip = {"M", "N", "K"}
    return {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


def _check_bucket_served(manifest: dict, base: Problem, table: Table, i: int) -> None:
    """The bucket's kernel serves its largest M and the smallest M of the kernel's M alignment (the family's
    rules: the swapped tile's M limit, split-K's K, 32-bit indexing)."""
    kernel = kernel_of(manifest)
    if kernel is None:
        raise InvalidInput("a dispatch table's kernels must be of a registered kernel family (a foreign kernel "
                           "serves its own problem only)", manifest.get("name"))
    step = int((manifest.get("serves") or {}).get("multiple_of", {}).get("M", 1) or 1)
    lowest = -(-table.m_min[i] // step) * step
    for m in sorted({table.m_max[i], lowest}):
        if m <= table.m_max[i]:
            try:
                check_serves(kernel, replace(base, m=m, n=table.n, k=table.k))
            except InvalidInput as exc:
                raise InvalidInput(f"dispatch.json bucket M {table.m_min[i]}..{table.m_max[i]} of N x K "
                                   f"{table.n}x{table.k} must be served by its kernel", m, str(exc)) from None


def read_dispatch(folder: "str | Path") -> "tuple[dict, dict[tuple[int, int], Table], dict[str, tuple]]":
    """(dispatch.json payload, tables, kernel name -> (manifest, cubin, path)), every part checked."""
    folder = Path(folder)
    path = folder / DISPATCH_FILE
    try:   # through the files reader, as manifests are: a size limit, and nesting thousands deep is named
        payload = load_json("dispatch.json", read_text("dispatch.json", path), str(path))
    except InvalidInput as exc:
        raise InvalidInput("dispatch.json must be readable JSON", str(path), exc.rule) from None
    tables = parse_tables(payload)
    try:
        base = Problem.from_dict(payload["problem"])
    except (KeyError, TypeError, ValueError, InvalidInput) as exc:
        raise InvalidInput("dispatch.json field problem must be a problem description", str(exc)) from None
    bundles: "dict[str, tuple]" = {}
    for table in tables.values():
        for i, name in enumerate(table.kernels):
            if name not in bundles:
                # Each kernel's manifest is <name>.json beside dispatch.json: read it directly (finding it by name
                # parsed every JSON file of the folder once per kernel), and name the bucket that points nowhere.
                manifest_file = folder / f"{name}.json"
                if not manifest_file.is_file():
                    raise InvalidInput("every kernel a dispatch.json bucket names must have its manifest "
                                       "<kernel>.json in the folder", name, f"no {manifest_file.name}")
                manifest, cubin, manifest_path = read_bundle(manifest_file)
                if not _same_operands(manifest["problem"], payload["problem"]):
                    raise InvalidInput("every kernel of a dispatch folder must have dispatch.json's dtypes, "
                                       "layouts and epilogue", name)
                bundles[name] = (manifest, cubin, manifest_path)
            _check_bucket_served(bundles[name][0], base, table, i)
    return payload, tables, bundles


class DispatchKernel:
    """The kernels of a dispatch folder behind one callable: the bucket of the actual shape picks the kernel."""

    def __init__(self, payload: dict, tables: "dict[tuple[int, int], Table]", bundles: "dict[str, tuple]",
                 source: str = "<memory>"):
        self.payload, self.tables, self.source = payload, tables, source
        self.kernels = {name: LoadedKernel(m, c, str(p)) for name, (m, c, p) in bundles.items()}
        # Array identities -> (run, device ordinal, make the context current, kernel, its generation).
        self._bound: "dict[tuple, tuple]" = {}

    def __repr__(self) -> str:
        covered = ", ".join(f"M {t.m_min[0]}..{t.m_max[-1]} x {n}x{k}" for (n, k), t in self.tables.items())
        return f"<gemmgen dispatch of {len(self.kernels)} kernels for {covered} from {self.source}>"

    def kernel_for(self, m: int, n: int, k: int) -> LoadedKernel:
        """The loaded kernel the table gives for an M x N x K product; InvalidInput naming the rule otherwise."""
        # (Text or None compared with the table's bounds was a bare TypeError, and M = 3.5 found a bucket.)
        m, n, k = (parse.integer(axis, value, None, None) for axis, value in (("M", m), ("N", n), ("K", k)))
        table = self.tables.get((n, k))
        if table is None:
            covered = sorted(f"{tn}x{tk}" for tn, tk in self.tables)
            raise InvalidInput(f"N x K must be one the dispatch table covers ({', '.join(covered)}): only M is "
                               "bucketed", f"{n}x{k}")
        return self.kernels[table.kernel_for(m)]

    def __call__(self, A, B, D, C=None, bias=None, stream: "int | None" = None, row_sums=None, scale_a=None,
                 scale_b=None):
        """D = epilogue(A @ B) with the kernel of A's shape, on the stream current for D (or `stream`); kernels
        built with the row sums of A also write them into `row_sums`, and fp8 kernels take `scale_a` and `scale_b`
        (see LoadedKernel)."""
        if row_sums is not None or scale_a is not None or scale_b is not None:
            # (the bucket's kernel keys and checks the arrays itself)
            return self.kernel_for(*_product_shape(A, B))(A, B, D, C=C, bias=bias, stream=stream, scale_a=scale_a,
                                                          scale_b=scale_b, row_sums=row_sums)
        try:  # torch: the arrays' identity from its fast accessors (nothing else has data_ptr and stride())
            key = _torch_key(A, B, D, C, bias, None, None, None)
        except (AttributeError, TypeError):
            return self._call_any(A, B, D, C, bias, stream)
        # Device addresses are unique across the process (unified addressing), so no device is in the key.
        hit = self._bound.get(key)
        if hit is None:
            hit = self._bind(key, A, B, D, C, bias)
        run, ordinal, set_current = hit[0], hit[1], hit[2]
        set_current()  # the caller may have made another device's context current
        run(_torch_stream(ordinal) if stream is None else stream if type(stream) is int else stream_handle(stream))
        return D

    def bind(self, A, B, D, C=None, bias=None, scale_a=None, scale_b=None, row_sums=None):
        """The launch sequence of the kernel for these arrays' shape, bound to them (see LoadedKernel.bind)."""
        return self.kernel_for(*_product_shape(A, B)).bind(A, B, D, C=C, bias=bias, scale_a=scale_a, scale_b=scale_b,
                                                           row_sums=row_sums)

    def bind_launch(self, A, B, D, C=None, bias=None, row_sums=None, scale_a=None, scale_b=None):
        """A BoundLaunch of the kernel for these arrays' shape (see LoadedKernel.bind_launch): D may move."""
        return self.kernel_for(*_product_shape(A, B)).bind_launch(A, B, D, C=C, bias=bias, scale_a=scale_a,
                                                                  scale_b=scale_b, row_sums=row_sums)

    def _bind(self, key: tuple, A, B, D, C, bias) -> tuple:
        """A new array set: the bucket's kernel, bound to the arrays (checked there), kept under `key`."""
        if len(A.shape) != 2 or len(B.shape) != 2:
            raise InvalidInput("A and B must be 2-D (A: M x K, B: K x N)", (tuple(A.shape), tuple(B.shape)))
        (m, k), n = tuple(A.shape), tuple(B.shape)[1]
        kernel = self.kernel_for(m, n, k)
        generation = kernel.generation
        sequence = kernel.bind(A, B, D, C=C, bias=bias)
        if kernel.generation != generation:  # its workspace grew: sequences bound to the old one are gone
            self._bound = {key_: v for key_, v in self._bound.items() if v[3] is not kernel}
        if len(self._bound) >= BOUND_KEYS:
            self._bound.pop(next(iter(self._bound)))  # the oldest binding
        ordinal = D.get_device()
        entry = (sequence.run, ordinal, kernel._device.current_setter(), kernel)
        self._bound[key] = entry
        return entry

    def _call_any(self, A, B, D, C, bias, stream):
        """Arrays of another library (cupy, numba): the bucket's kernel, which keys and checks them itself."""
        return self.kernel_for(*_product_shape(A, B))(A, B, D, C=C, bias=bias, stream=stream)

    def close(self) -> None:
        for kernel in self.kernels.values():
            kernel.close()
        self._bound.clear()


def _product_shape(A, B) -> "tuple[int, int, int]":
    """(M, N, K) of A (M x K) and B (K x N), their shapes as the loader reads them (an object with only
    __cuda_array_interface__ has no .shape); InvalidInput naming an operand that is no array, or not 2-D."""
    shape_a, shape_b = (tuple(describe_array(x, name, stream=False).shape) for x, name in ((A, "A"), (B, "B")))
    if len(shape_a) != 2 or len(shape_b) != 2:
        raise InvalidInput("A and B must be 2-D arrays on the GPU (A: M x K, B: K x N)", (shape_a, shape_b))
    return shape_a[0], shape_b[1], shape_a[1]


def is_dispatch_folder(path: "str | Path") -> bool:
    return Path(path).is_dir() and (Path(path) / DISPATCH_FILE).is_file()


def load_dispatch(folder: "str | Path") -> DispatchKernel:
    """A dispatch folder as one callable, after every kernel and the table are checked."""
    payload, tables, bundles = read_dispatch(folder)
    return DispatchKernel(payload, tables, bundles, str(Path(folder) / DISPATCH_FILE))


__all__ = ["DISPATCH_FILE", "DISPATCH_FORMAT", "DispatchKernel", "Table", "is_dispatch_folder", "load_dispatch",
           "parse_tables", "read_dispatch"]
