"""gemmgen: a GEMM autotuner and CUDA code generator.

The model (tiles, constraints), the calculator (intensity) and rendering import neither
cuda-python nor Optuna, so they work on any machine.
"""
from .model.arch import Arch, DType, Gpu, catalogue, lookup_gpu
from .model.errors import (CompileError, CudaError, GemmgenError, InvalidConfig, InvalidInput, NoGpu, UserError,
                     VerificationError, Violation)
from .model.problem import Activation, Epilogue, Layout, Operands, Problem
from .model.tiles import Cluster, Decomposition, DecompKind, Family, Kernel, Raster, RasterOrder, Shape3, SmemLayout, TileConfig

__version__ = "0.1.0"

__all__ = [
    "Activation", "Arch", "Cluster", "CompileError", "CudaError", "DType", "DecompKind", "Decomposition", "Epilogue",
    "Family", "GemmgenError", "Gpu", "InvalidConfig", "InvalidInput", "Kernel", "Layout", "NoGpu", "Operands",
    "Problem", "Raster", "RasterOrder", "Shape3", "SmemLayout", "TileConfig", "UserError", "VerificationError",
    "Violation", "catalogue", "lookup_gpu", "load",
]


def load(path):
    """Load an exported kernel bundle (manifest .json or its folder) as a callable for torch/cupy arrays."""
    from .runtime.loader import load as _load  # imports cuda-python only when asked

    return _load(path)
