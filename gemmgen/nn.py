"""gemmgen.nn: the PyTorch modules, as `import gemmgen.nn` and `from gemmgen.nn import Linear` expect to find them
(torch.nn's spelling). A facade like the package's __init__: the modules live in gemmgen/torch/nn.py, and importing
this one imports torch, which nothing else of gemmgen's core does."""
from .torch.nn import Linear

__all__ = ["Linear"]
