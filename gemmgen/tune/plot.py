"""Roofline chart: the GPU's roofs, the problem at minimum traffic and configurations as points.

matplotlib is optional (the `plot` extra) and imported only when a chart is drawn.
"""
from __future__ import annotations

from pathlib import Path

from ..model.errors import InvalidInput, UserError
from ..calc.intensity import Roofline
from ..rank.predict import Prediction


class MissingDependency(UserError):
    """An optional package a command needs is not installed."""

    def __init__(self, package: str, extra: str):
        self.package, self.extra = package, extra
        super().__init__(package, extra)

    def __str__(self) -> str:
        return f"{self.package} is not installed; pip install 'gemmgen[{self.extra}]'"


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MissingDependency("matplotlib", "plot") from None
    matplotlib.use("Agg")  # files only: no display is assumed
    import matplotlib.pyplot as plt

    return plt


def roofline_chart(roof: Roofline, path: "str | Path", points: "list[tuple[str, Prediction]]" = ()) -> Path:
    """Draw `roof` with the problem and each (label, prediction) as points; write a PNG/SVG/PDF to `path`."""
    out = Path(path)
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise InvalidInput("--plot file must end in .png, .svg or .pdf", str(path))
    plt = _pyplot()
    peak_t = roof.peak_flops / 1e12
    ridge = roof.ridge
    xs = [p.intensity for _, p in points] + [roof.min_intensity, ridge]
    lo, hi = min(xs) / 4, max(xs) * 4
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot([lo, ridge, hi], [lo * roof.bandwidth / 1e12, peak_t, peak_t], color="black", lw=1.5,
            label=f"{roof.gpu.key}: {peak_t:.0f} TFLOP/s, {roof.bandwidth / 1e12:.2f} TB/s")
    ax.scatter([roof.min_intensity], [roof.attainable_flops / 1e12], marker="*", s=160, color="tab:red", zorder=3,
               label=f"problem at minimum traffic ({roof.bound}-bound)")
    for label, pred in points:
        ax.scatter([pred.intensity], [pred.tflops], s=40, zorder=3, label=f"{label}: {pred.tflops:.0f} TFLOP/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
    ax.set_ylabel("TFLOP/s")
    p = roof.problem
    ax.set_title(f"{p.m}x{p.n}x{p.k} {p.dtype_label} on {roof.gpu.name}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    try:
        fig.savefig(out)
    except OSError as exc:
        raise InvalidInput("--plot file must be writable", str(path), exc.strerror or str(exc)) from None
    finally:
        plt.close(fig)
    return out
