"""The calibration file: the performance model's free parameters refitted for one GPU (`gemmgen calibrate --fit`).

    {"format": "gemmgen-calibration/1", "gpu": "h100-sxm", "fitted": "<date>",
     "params": {"tma_latency_clocks": 1600.0, ..., "efficiency_scale": {"<family>": 1.02},
                "terms": {"tile:128x256": -0.031, "knob:store_warp=True": -0.012, ...}},
     "fit": {...what it was fitted on and how well it ranks held-out shapes...}}

`params` holds any subset of ModelParams' fields (rank/predict.py); the others keep their defaults. `terms` are
the learned corrections' weights in log time (rank/terms.py says what each feature is). Tuning and
the dry run rank with the first file found, in this order: <per-user data dir>/calibration/<gpu>.json (where
`--fit` writes), then results/<gpu>/calibration.json in each results folder (a checkout's, or one shipped).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, fields
from pathlib import Path

from ..model import paths
from ..model.arch import Gpu
from ..model.errors import InvalidInput
from .predict import DEFAULT_PARAMS, ModelParams

CALIBRATION_FORMAT = "gemmgen-calibration/1"
# The power ceiling's figures (rank/predict.py): fitted from sustained timings (benchmarks/power_model_fit.py
# --write-calibration), not from the tuner's burst records, so `calibrate --fit` carries them over unchanged.
POWER_FIELDS = ("static_power_w", "energy_pj_per_flop", "energy_pj_per_dram_byte", "energy_pj_per_l2_byte")


def user_calibration_path(gpu: "Gpu | str") -> Path:
    key = gpu.key if isinstance(gpu, Gpu) else str(gpu)
    return paths.user_data_dir() / "calibration" / f"{key}.json"


def calibration_paths(gpu: "Gpu | str") -> "list[Path]":
    """Where a calibration of `gpu` is looked for, first match wins: its own, then (for a catalogue entry) those of
    GPUs of the same chip, the same architecture and SM count at the same board power. An H200 is an H100 SXM's
    GH100 with faster memory: the fitted compute rates, efficiencies and energies carry over, and the memory terms
    scale with the H200's own bandwidth, so the H100's fit ranks better there than the defaults do."""
    key = gpu.key if isinstance(gpu, Gpu) else str(gpu)
    keys = [key]
    if isinstance(gpu, Gpu):
        from ..model.arch import catalogue

        keys += [g.key for g in catalogue().values() if g.key != key and g.arch == gpu.arch
                 and g.sm_count == gpu.sm_count and g.power_limit_w == gpu.power_limit_w]
    return [path for k in keys
            for path in [user_calibration_path(k)] + [root / k / "calibration.json" for root in paths.results_dirs()]]


def params_to_dict(params: ModelParams) -> dict:
    out = asdict(params)
    out["efficiency_scale"] = dict(params.efficiency_scale)
    out["terms"] = dict(params.terms)
    return out


def params_from_dict(data: dict, where: str = "params") -> ModelParams:
    """ModelParams from a mapping of some of its fields; InvalidInput naming an unknown or non-numeric one."""
    if not isinstance(data, dict):
        raise InvalidInput(f"calibration field {where} must be a mapping", data)
    known = {f.name for f in fields(ModelParams)}
    values = {}
    for name, value in data.items():
        if name not in known:
            raise InvalidInput(f"calibration field {where}.{name} must be a model parameter", name, sorted(known))
        if name == "efficiency_scale":
            if not isinstance(value, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in value.values()):
                raise InvalidInput(f"calibration field {where}.efficiency_scale must map families to positive "
                                   "factors", value)
            values[name] = tuple(sorted((str(k), float(v)) for k, v in value.items()))
        elif name == "terms":
            # weights in log time: any finite sign (a feature may speed up or slow down)
            if not isinstance(value, dict) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    for v in value.values()):
                raise InvalidInput(f"calibration field {where}.terms must map feature names to finite weights", value)
            values[name] = tuple(sorted((str(k), float(v)) for k, v in value.items()))
        elif value is None and name == "l2_bytes_per_clock_per_sm":
            values[name] = None
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise InvalidInput(f"calibration field {where}.{name} must be a non-negative number", value)
        else:
            values[name] = float(value)
    return ModelParams(**values)


def read_calibration(path: "str | Path") -> "tuple[ModelParams, dict]":
    """(params, the whole payload) of a calibration file, checked."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInput("a calibration file must be readable JSON", str(path), str(exc).splitlines()[0]) from None
    if not isinstance(payload, dict) or payload.get("format") != CALIBRATION_FORMAT:
        raise InvalidInput(f"a calibration file must have format {CALIBRATION_FORMAT}", str(path))
    return params_from_dict(payload.get("params", {})), payload


_CACHE: "dict[tuple, ModelParams]" = {}


def params_for(gpu: Gpu) -> "tuple[ModelParams, Path | None]":
    """The model parameters tuning uses on `gpu`: the first calibration file found, else the defaults."""
    for path in calibration_paths(gpu):
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            continue
        key = (str(path), stamp)
        if key not in _CACHE:
            _CACHE[key] = read_calibration(path)[0]
        return _CACHE[key], path
    return DEFAULT_PARAMS, None


def calibrated_predict(problem, config, gpu: Gpu):
    """The model's prediction with `gpu`'s calibration where one is stored, else its defaults: what a tune, a dry
    run and `gemmgen compile` without --config rank by."""
    from .predict import predict

    return predict(problem, config, gpu, params_for(gpu)[0])


__all__ = ["CALIBRATION_FORMAT", "POWER_FIELDS", "calibrated_predict", "calibration_paths", "params_for",
           "params_from_dict", "params_to_dict", "read_calibration", "user_calibration_path"]
