"""The public arithmetic-intensity and roofline calculator: pure Python, no CUDA.

    from gemmgen.calc import roofline, cta_level
    from gemmgen import Problem, lookup_gpu
    roofline(Problem.create(4096, 4096, 4096, "e4m3", "row", "col"), lookup_gpu("h100"))
"""
from .intensity import (Level, Roofline, cta_level, mma_level, peak_per_sm, roofline, seed_table, smem_level,
                        warp_level)

__all__ = ["Level", "Roofline", "cta_level", "mma_level", "peak_per_sm", "roofline", "seed_table", "smem_level",
           "warp_level"]
