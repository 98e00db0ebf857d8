"""Shape sets and their buckets: which M ranges a dispatch table tunes, and which it merges afterwards.

A bucket is an M range at one N x K, tuned at its upper bound: the kernel tuned there must serve every M of the
bucket, and a family's problem-dependent limits only tighten as M grows (the swapped kernel's tile must hold all
of M), so the largest M is the one shape whose winner is known to serve them all. runtime/dispatch.py checks it
again on load.

  ranges     --m LO..HI at fixed N and K: power-of-two upper bounds, LO..1, 2, 3..4, 5..8, ..., ..HI.
  shape file a YAML/JSON list of [M, N, K] (or {M:, N:, K:}): each N x K gets buckets whose upper bounds are its
             listed M values, the first from M = 1.
  auto       before tuning, a bucket is split at its middle M where the model predicts that the kernel it ranks
             first at the bucket's top costs more than SPLIT_GAIN over its first choice at the middle (a swapped
             tile as wide as 64 rows of M is the wrong kernel for 40; refine_buckets, up to SPLIT_DEPTH halvings);
             after tuning, walking up in M, a bucket takes the kernel of the bucket below it when its own study
             measured that kernel within MERGE_TOLERANCE of its own winner, and neighbours with one kernel merge:
             fewer cubins, at a measured cost each merged bucket records.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..model.errors import GemmgenError, InvalidInput
from ..model.problem import parse_dim

BUCKETINGS = ("pow2", "auto")
MERGE_TOLERANCE = 0.01  # a lower bucket's kernel within 1% of a bucket's own winner serves that bucket too
MAX_M = 1 << 24
# auto splits a bucket where the model predicts its top's kernel at least 3% slower at its middle than the best
# there: the model's error between neighbouring tiles of one family is about that size, and a split costs a tune.
SPLIT_GAIN = 0.03
SPLIT_DEPTH = 2  # halvings per bucket: 33..64 can become 33..40, 41..48, 49..56, 57..64, at most 4x the tunes


@dataclass(frozen=True)
class Bucket:
    """M in m_min..m_max at one N x K; tuned at m_max."""

    n: int
    k: int
    m_min: int
    m_max: int

    @property
    def label(self) -> str:
        return f"M {self.m_min}..{self.m_max}" if self.m_min != self.m_max else f"M {self.m_max}"


def parse_range(text: str, what: str = "--m") -> "tuple[int, int]":
    """'LO..HI' (or one value) -> (LO, HI), both positive, LO <= HI."""
    low, sep, high = str(text).partition("..")
    try:
        lo, hi = (parse_dim(what, low), parse_dim(what, high)) if sep else (parse_dim(what, low),) * 2
    except InvalidInput:
        raise InvalidInput(f"{what} must be LO..HI with positive integers (e.g. 1..8192)", text) from None
    if lo > hi:
        raise InvalidInput(f"{what} must have LO <= HI", text)
    if hi > MAX_M:
        raise InvalidInput(f"{what} must stay at most {MAX_M}", text)
    return lo, hi


def pow2_buckets(lo: int, hi: int, n: int, k: int) -> "list[Bucket]":
    """Upper bounds at every power of two in lo..hi, and hi itself."""
    bounds, p = [], 1
    while p < hi:
        if p >= lo:
            bounds.append(p)
        p *= 2
    bounds.append(hi)
    out, low = [], lo
    for bound in bounds:
        out.append(Bucket(n, k, low, bound))
        low = bound + 1
    return out


def _dims(entry, where: str) -> "tuple[int, int, int]":
    if isinstance(entry, dict):
        keys = {str(key).upper(): value for key, value in entry.items()}
        if set(keys) != {"M", "N", "K"}:
            raise InvalidInput(f"{where} must be [M, N, K] or {{M:, N:, K:}}", entry)
        values = (keys["M"], keys["N"], keys["K"])
    elif isinstance(entry, (list, tuple)) and len(entry) == 3:
        values = tuple(entry)
    else:
        raise InvalidInput(f"{where} must be [M, N, K] or {{M:, N:, K:}}", entry)
    if any(isinstance(v, bool) or not isinstance(v, (int, str)) for v in values):
        raise InvalidInput(f"{where} must hold positive integers", entry)
    return tuple(parse_dim(axis, v) for axis, v in zip("MNK", values))


def read_shape_file(path: "str | Path") -> "list[tuple[int, int, int]]":
    """The (M, N, K) list of a shape file: JSON (.json) or YAML, a list, or a mapping with a 'shapes' list."""
    from ..model.files import load_json, load_yaml, read_text

    path = Path(path)
    text = read_text("--shapes", path)
    load = load_json if path.suffix.lower() == ".json" else load_yaml
    data = load("--shapes (a JSON or YAML list of [M, N, K])", text, str(path))
    if isinstance(data, dict) and "shapes" in data:
        data = data["shapes"]
    if not isinstance(data, list) or not data:
        raise InvalidInput("--shapes must be a JSON or YAML list of [M, N, K]", str(path))
    return sorted({_dims(entry, f"--shapes entry {i}") for i, entry in enumerate(data)})


def point_buckets(shapes: "list[tuple[int, int, int]]") -> "list[Bucket]":
    """Per N x K, buckets whose upper bounds are the listed M values, the first from M = 1."""
    by_nk: "dict[tuple[int, int], list[int]]" = {}
    for m, n, k in shapes:
        by_nk.setdefault((n, k), []).append(m)
    out = []
    for (n, k), ms in sorted(by_nk.items()):
        low = 1
        for m in sorted(set(ms)):
            out.append(Bucket(n, k, low, m))
            low = m + 1
    return out


def refine_buckets(buckets: "list[Bucket]", ranked_at, gain: float = SPLIT_GAIN,
                   depth: int = SPLIT_DEPTH) -> "list[Bucket]":
    """Split buckets where one kernel would not serve their lower part well, by the model (no measurement).

    `ranked_at(m, n, k)` gives the model's predicted seconds per configuration tag at that shape, best first.
    A bucket of at least two M values is halved when the first choice at its top is predicted more than `gain`
    slower at its middle M than the first choice there (or cannot run there); each half is checked the same way,
    `depth` times at most."""
    if gain < 0 or depth < 0:
        raise InvalidInput("refine_buckets needs gain >= 0 and depth >= 0", (gain, depth))
    out: "list[Bucket]" = []

    def visit(b: Bucket, left: int) -> None:
        if left == 0 or b.m_max == b.m_min:
            out.append(b)
            return
        mid = (b.m_min - 1 + b.m_max) // 2  # the lower half's top: where its own tune would run
        top, there = ranked_at(b.m_max, b.n, b.k), ranked_at(mid, b.n, b.k)
        if not top or not there:
            out.append(b)
            return
        first_top = next(iter(top))
        best_there = next(iter(there.values()))
        served = there.get(first_top)
        if served is not None and served <= best_there * (1 + gain):
            out.append(b)
            return
        visit(Bucket(b.n, b.k, b.m_min, mid), left - 1)
        visit(Bucket(b.n, b.k, mid + 1, b.m_max), left - 1)

    for bucket in sorted(buckets, key=lambda b: (b.n, b.k, b.m_min)):
        visit(bucket, depth)
    return out


class BucketWithoutWinner(GemmgenError):
    """A bucket was tuned and no configuration ran correctly there: work that failed (exit status 1, as a tune with
    no winner), not bad input. It was an InvalidInput, so the CLI called it an error in the user's input (exit 2)."""

    def __init__(self, label: str, n: int, k: int):
        self.label, self.n, self.k = label, n, k
        super().__init__(label, n, k)

    def __str__(self) -> str:
        return (f"no configuration ran correctly in bucket {self.label} at N x K {self.n}x{self.k}: a dispatch "
                "folder needs a kernel for every bucket (the other buckets' trials are stored; re-running resumes)")


@dataclass(frozen=True)
class BucketOutcome:
    """What tuning one bucket gave: its winner and every kernel its study measured (kernel name -> seconds,
    the finalists' medians where they were re-measured, else the best single measurement)."""

    bucket: Bucket
    winner: "str | None"
    winner_tag: "str | None"
    times_s: "dict[str, float]"
    finalist_tags: "tuple[str, ...]" = ()


def table_entries(outcomes: "list[BucketOutcome]", bucketing: str,
                  tolerance: float = MERGE_TOLERANCE) -> "list[dict]":
    """The buckets of one N x K as dispatch.json lists them, ascending; merged under `auto` (see above).

    Each entry: m_min, m_max, kernel, tuned_at (the M values tuned inside it) and, where a bucket serves a kernel
    other than its own study's winner, that winner and the measured slowdown accepted for it."""
    if bucketing not in BUCKETINGS:
        raise InvalidInput(f"--buckets must be one of {', '.join(BUCKETINGS)}", bucketing)
    entries: "list[dict]" = []
    for outcome in sorted(outcomes, key=lambda o: o.bucket.m_min):
        b = outcome.bucket
        if outcome.winner is None:
            raise BucketWithoutWinner(b.label, b.n, b.k)
        own = outcome.times_s.get(outcome.winner)
        entry = {"m_min": b.m_min, "m_max": b.m_max, "kernel": outcome.winner, "tuned_at": [b.m_max],
                 "time_s": own}
        previous = entries[-1] if entries else None
        if bucketing == "auto" and previous is not None:
            below = previous["kernel"]
            theirs = outcome.times_s.get(below)
            if below == outcome.winner or (theirs is not None and own and theirs <= own * (1 + tolerance)):
                previous["m_max"] = b.m_max
                previous["tuned_at"].append(b.m_max)
                if below != outcome.winner:
                    previous.setdefault("merged", []).append(
                        {"tuned_at": b.m_max, "own_winner": outcome.winner, "own_time_s": own,
                         "served_time_s": theirs, "slowdown": theirs / own})
                continue
        entries.append(entry)
    return entries


__all__ = ["BUCKETINGS", "Bucket", "BucketOutcome", "BucketWithoutWinner", "MERGE_TOLERANCE", "SPLIT_DEPTH", "SPLIT_GAIN", "parse_range",
           "point_buckets", "pow2_buckets", "read_shape_file", "refine_buckets", "table_entries"]
