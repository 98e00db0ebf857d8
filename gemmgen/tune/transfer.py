"""Transfer from stored records: the winners and finalists of the nearest tuned shapes, measured first.

A fresh shape's best configuration is usually the best, or a finalist, of a shape near it (same dtypes,
layouts and epilogue on the same GPU; nearness in log space of M, N, K, as `gemmgen lookup` measures it). The
search measures these beside the calibrated model's picks (search/queue.py interleaves the two), so a short
tune (--timeout) starts from both what the model predicts and what was measured nearby.

The problem's own record is never a source (a re-run resumes its study instead), nor is a simulated (replayed)
record for a tune on a GPU: its times were never measured on one.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..model.arch import Gpu
from ..model.errors import InvalidInput
from ..model.problem import Problem
from .results import _operands_key, load_records, log_distance


@dataclass(frozen=True)
class TransferSeed:
    """One configuration to measure early: its tag and where it came from (the trial's `source`)."""

    tag: str
    source: str


def nearest_records(problem: Problem, gpu: "Gpu | str", count: int, simulated: bool = False,
                    records=None) -> "list[tuple[float, Problem, dict]]":
    """(log distance, problem, record) of the `count` nearest stored records of other shapes with the problem's
    operands, nearest first. `records` defaults to every record held for the GPU (tune/results.load_records)."""
    if count <= 0:
        return []
    # Configurations carry over between alignments (the rules still filter them for this problem), so neighbours
    # are matched on dtypes, layouts and epilogue; a record of the same shape is a source when it is another
    # problem (a view's leading dimensions), never the problem itself.
    want = _operands_key(problem, alignment=False)
    found = []
    for _, record in (load_records(gpu) if records is None else records):
        if record.get("simulated") and not simulated:
            continue
        try:
            held = Problem.from_dict(record["problem"])
        except (InvalidInput, KeyError, TypeError, ValueError):
            continue
        distance = log_distance(problem, held)
        if held.label == problem.label or _operands_key(held, alignment=False) != want:
            continue
        found.append((distance, held, record))
    found.sort(key=lambda f: (f[0], f[1].m, f[1].n, f[1].k))
    return found[:count]


def _ranked_tags(record: dict) -> "list[str]":
    """A record's winner, then its finalists by re-measured median (failed ones left out)."""
    tags = []
    winner = record.get("winner") or {}
    if winner.get("config_tag"):
        tags.append(winner["config_tag"])
    finalists = [f for f in record.get("finalists") or () if f.get("config_tag") and f.get("median_time_s")
                 and not f.get("failed")]
    tags += [f["config_tag"] for f in sorted(finalists, key=lambda f: f["median_time_s"])]
    return list(dict.fromkeys(tags))


def transfer_seeds(problem: Problem, gpu: "Gpu | str", count: int, simulated: bool = False,
                   records=None) -> "tuple[TransferSeed, ...]":
    """The winners and finalists of the `count` nearest stored shapes, deduplicated: every record's winner
    first (nearest first), then every record's second finalist, and so on."""
    near = nearest_records(problem, gpu, count, simulated, records)
    per_record = [(held, _ranked_tags(record)) for _, held, record in near]
    seeds: "dict[str, TransferSeed]" = {}
    for place in range(max((len(tags) for _, tags in per_record), default=0)):
        for held, tags in per_record:
            if place < len(tags) and tags[place] not in seeds:
                role = "winner" if place == 0 else f"finalist {place + 1}"
                seeds[tags[place]] = TransferSeed(tags[place], f"transfer: the {role} of {held.m}x{held.n}x{held.k}")
    return tuple(seeds.values())


__all__ = ["TransferSeed", "nearest_records", "transfer_seeds"]
