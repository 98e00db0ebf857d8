"""`gemmgen plot STUDY-OR-RECORD`: what a tune did, as charts (matplotlib, the `plot` extra).

Three files: <stem>-roofline (every measured configuration at its DRAM intensity, under the GPU's roofs),
<stem>-progress (best TFLOP/s so far against trial number and against wall time, one line per worker) and
<stem>-calibration (the model's predicted time against the measured one, per configuration).
"""
from __future__ import annotations

from pathlib import Path

from ..model.errors import InvalidInput
from ..model.problem import Problem
from .plot import _pyplot


def load_tune(source: str, storage: "str | None" = None) -> dict:
    """A tuning record (JSON file), or the record's fields read from a study (name + --storage URL)."""
    path = Path(source)
    if path.suffix == ".json" or path.is_file():
        if storage:
            # The record holds its trials: a storage given with it was silently never opened.
            raise InvalidInput("a tuning record file and --storage cannot be used together (--storage is read for "
                               "a study name instead of a record)", source)
        from ..model.files import load_json, read_text

        record = load_json("a tuning record", read_text("a tuning record", path), source)
        if not isinstance(record, dict) or record.get("format") != "gemmgen-tune/1":
            raise InvalidInput("a tuning record has format gemmgen-tune/1", source,
                               str(record.get("format") if isinstance(record, dict) else type(record).__name__))
        return record
    if not storage:
        raise InvalidInput("STUDY-OR-RECORD is a record file, or a study name with --storage URL", source)
    import optuna

    from .storage import check_url, open_storage, storage_errors

    check_url(storage)  # the user's URL: no folders made, no in-memory database
    st = open_storage(storage)
    with storage_errors(storage):
        try:
            study = optuna.load_study(study_name=source, storage=st)
        except KeyError:
            raise InvalidInput("the study must exist in the storage", source, storage) from None
        trials = []
        for t in study.get_trials(deepcopy=False):
            a = t.user_attrs
            trials.append({"number": t.number, "state": t.state.name, "config_tag": a.get("config_tag"),
                           "config": a.get("config"), "time_s": a.get("time_s"),
                           "tflops": t.value if t.state.name == "COMPLETE" else None,
                           "predicted_time_s": a.get("predicted_time_s"), "measured": bool(a.get("measured")),
                           "worker": a.get("worker") or a.get("owner"),
                           "started": t.datetime_start.timestamp() if t.datetime_start else None,
                           "finished": t.datetime_complete.timestamp() if t.datetime_complete else None})
        return {"problem": study.user_attrs.get("problem"), "gpu": study.user_attrs.get("gpu"), "trials": trials,
                "study": {"name": source}}


def plot_tune(record: dict, out_dir: "str | Path", fmt: str = "png") -> "list[Path]":
    """Write the three charts of `record` into out_dir; return their paths."""
    from ..calc.intensity import roofline
    from ..model.arch import lookup_gpu
    from ..model.tiles import TileConfig
    from ..rank.predict import predict

    if fmt not in ("png", "svg"):
        raise InvalidInput("--format must be png or svg", fmt)
    if not record.get("problem") or not record.get("gpu"):
        raise InvalidInput("the record must name its problem and GPU", str(record.get("study")))
    plt = _pyplot()
    problem, gpu = Problem.from_dict(record["problem"]), lookup_gpu(record["gpu"])
    done = [t for t in record["trials"] if t.get("measured") and t.get("tflops") and t.get("config")]
    if not done:
        raise InvalidInput("the record must hold measured trials to plot", str(record.get("study")))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{problem.m}x{problem.n}x{problem.k}_{problem.dtype_label}"
    roof = roofline(problem, gpu)
    written = []

    # 1. Roofline: every measured configuration at the DRAM intensity the model gives its tiling.
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    xs = [predict(problem, TileConfig.from_dict(t["config"]), gpu).intensity for t in done]
    ys = [t["tflops"] for t in done]
    peak = roof.peak_flops / 1e12
    lo, hi = min(xs + [roof.min_intensity]) / 4, max(xs + [roof.ridge]) * 4
    ax.plot([lo, roof.ridge, hi], [lo * roof.bandwidth / 1e12, peak, peak], color="black", lw=1.5,
            label=f"{gpu.key}: {peak:.0f} TFLOP/s, {roof.bandwidth / 1e12:.2f} TB/s")
    ax.scatter(xs, ys, s=12, alpha=0.6, label=f"{len(done)} measured configurations")
    best = max(range(len(done)), key=lambda i: ys[i])
    ax.scatter([xs[best]], [ys[best]], marker="*", s=160, color="tab:red", zorder=3,
               label=f"best: {ys[best]:.0f} TFLOP/s")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per DRAM byte, model)",
           ylabel="TFLOP/s", title=f"{stem} on {gpu.name}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    written.append(_save(plt, fig, out / f"{stem}-roofline.{fmt}"))

    # 2. Best so far, per worker, against trial number and wall time.
    fig, (by_trial, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    t0 = min(t["finished"] for t in done if t.get("finished")) if any(t.get("finished") for t in done) else None
    workers = sorted({str(t.get("worker") or "this process") for t in done})
    for label in workers:
        mine = sorted((t for t in done if str(t.get("worker") or "this process") == label), key=lambda t: t["number"])
        bests, running = [], 0.0
        for t in mine:
            running = max(running, t["tflops"])
            bests.append(running)
        by_trial.step([t["number"] for t in mine], bests, where="post", label=label)
        if t0 is not None:
            by_time.step([(t.get("finished") or t0) - t0 for t in mine], bests, where="post", label=label)
    overall, running = [], 0.0
    for t in sorted(done, key=lambda t: t["number"]):
        running = max(running, t["tflops"])
        overall.append(running)
    by_trial.step([t["number"] for t in sorted(done, key=lambda t: t["number"])], overall, where="post",
                  color="black", lw=2, label="study")
    by_trial.set(xlabel="trial number (study)", ylabel="best TFLOP/s so far")
    by_time.set(xlabel="wall time (s)", ylabel="best TFLOP/s so far")
    for ax in (by_trial, by_time):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{stem} on {gpu.name}: best so far per worker", fontsize=10)
    written.append(_save(plt, fig, out / f"{stem}-progress.{fmt}"))

    # 3. Calibration: predicted against measured time.
    pairs = [(t["predicted_time_s"] * 1e3, t["time_s"] * 1e3) for t in done
             if t.get("predicted_time_s") and t.get("time_s")]
    fig, ax = plt.subplots(figsize=(5.5, 5), dpi=120)
    if pairs:
        px, mx = zip(*pairs)
        ax.scatter(px, mx, s=12, alpha=0.6)
        lo, hi = min(px + mx) * 0.8, max(px + mx) * 1.25
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="measured = predicted")
        ax.set(xscale="log", yscale="log")
        ax.legend(fontsize=7)
    ax.set(xlabel="model's predicted time (ms)", ylabel="measured time (ms)", title=f"model calibration: {stem}")
    ax.grid(True, which="both", alpha=0.3)
    written.append(_save(plt, fig, out / f"{stem}-calibration.{fmt}"))
    return written


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise InvalidInput("the plot folder must be writable", str(path), exc.strerror or str(exc)) from None
    finally:
        plt.close(fig)
    return path
