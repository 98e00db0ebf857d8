"""gemmgen: a GEMM autotuner and CUDA code generator.

Layers, each importing only those below it: cli -> tune -> rank -> codegen / runtime -> families -> calc ->
model. The model, the calculator, the families and the runtime import neither jinja2, PyYAML nor Optuna at
import time; only the runtime's launches need cuda-bindings (and numpy), and only the code generator jinja2.
"""
from .model.arch import Arch, DType, Gpu, catalogue, lookup_gpu
from .model.errors import (CompileError, CudaError, GemmgenError, InvalidConfig, InvalidInput, NoGpu, UserError,
                     VerificationError, Violation)
from .model.problem import Activation, Epilogue, Layout, Operands, Problem, Scaling
from . import families  # registers the built-in kernel families, so any configuration parses
from .model.tiles import Cluster, Decomposition, DecompKind, Kernel, Raster, RasterOrder, Shape3, SmemLayout, TileConfig

__version__ = "0.1.0"

__all__ = [
    "Activation", "Arch", "Cluster", "CompileError", "CudaError", "DType", "DecompKind", "Decomposition", "Epilogue",
    "GemmgenError", "Gpu", "InvalidConfig", "InvalidInput", "Kernel", "Layout", "NoGpu", "Operands",
    "Problem", "Raster", "RasterOrder", "Scaling", "Shape3", "SmemLayout", "TileConfig", "UserError", "VerificationError",
    "Violation", "catalogue", "lookup_gpu", "load", "reset_stats", "stats",
]


def load(path, name=None):
    """Load an exported kernel bundle (manifest .json or its folder; `name` picks one of several), or a dispatch
    folder (dispatch.json: the kernel is picked per call by the shape's bucket), as a callable for torch/cupy
    arrays. Everything is verified first: schema, cubin sha256 and architecture, launches, the table."""
    from .runtime.loader import load as _load  # imports cuda-python only when asked

    return _load(path, name)


def _build_for_jit(problem, kernel_class, gpu, root):
    """gemmgen.torch's opt-in JIT builds with the tuner's dry run (tune/linear.store_pick); the facade joins the two
    layers, which never import each other."""
    from .tune.linear import store_pick

    return store_pick(problem, kernel_class, gpu, role="jit", root=root)


from .torch import jit as _jit  # noqa: E402 (no torch: jit.py imports the model only)

_jit.set_builder(_build_for_jit)


def stats() -> dict:
    """Counters of the torch ops since start (or reset_stats()): kernel calls per op, fallbacks to torch per
    reason. Needs no torch: zero until an op ran."""
    from .torch.stats import stats as _stats

    return _stats()


def reset_stats() -> None:
    from .torch.stats import reset_stats as _reset

    _reset()


def __getattr__(name):
    # torch is imported only when its API is first used: the core never needs it. (nn, mm and linear stay out of
    # __all__, so `from gemmgen import *` needs no torch.) The first use binds the name in the module, so later
    # calls of gemmgen.mm skip this function (2 us a call, a third of the eager op's own host time).
    if name == "nn":
        # The facade gemmgen/nn.py, the module `import gemmgen.nn` binds too (import_module: `from . import nn`
        # would ask this function for the attribute again).
        import importlib

        value = importlib.import_module(".nn", __name__)
    elif name in ("mm", "linear"):
        from .torch import ops as _ops

        value = getattr(_ops, name)
    else:
        raise AttributeError(f"module 'gemmgen' has no attribute {name!r}")
    globals()[name] = value
    return value
