"""CUDA source from a validated Kernel: one jinja2 Environment, StrictUndefined, values from the model only.

The template is the kernel's family (`config.family.template`). The context is built in one place,
`template_context`, from the Kernel's fields: no free-form string reaches the source, and a
misspelt or missing value in a template fails rendering instead of rendering as nothing.
"""
from __future__ import annotations

from functools import lru_cache

import jinja2

from . import constraints, paths
from .arch import Arch, Gpu, catalogue
from .errors import InvalidInput
from .problem import Layout
from .tiles import DecompKind, Family, Kernel, SmemLayout

REDUCE_THREADS = 256  # block size of the split-K reduction kernel (manifest.py launches it)
PAD_ELEMS = constraints.PAD_BYTES // 2  # 16-bit elements


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The one template environment: strict, and whitespace-tidy so generated CUDA stays readable."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def reference_gpu(arch: Arch) -> Gpu:
    """The most permissive catalogue GPU that runs `arch`: validation without a named GPU checks the
    rules of the model (tiles, dtypes, pipeline), and only the loosest device limits."""
    able = [g for g in catalogue().values() if g.arch.cc >= arch.cc and (g.arch.has_wgmma or not arch.has_wgmma)]
    if not able:
        raise InvalidInput("no catalogue GPU can run this arch", arch.value)
    return max(able, key=lambda g: (g.smem_per_block_optin, g.regs_per_sm))


def template_context(kernel: Kernel) -> dict:
    """Every value the family's template may use, derived from the Kernel alone."""
    family = kernel.config.family
    if family not in CONTEXTS and family is Family.SM90_WGMMA:
        from .families import sm90  # registers nothing itself: its template_params is the context

        CONTEXTS[family] = sm90.template_params
    builder = CONTEXTS.get(family)
    if builder is None:
        raise InvalidInput("no template context for this kernel family", family.value)
    return builder(kernel)


def sm80_context(kernel: Kernel) -> dict:
    """Template values of templates/sm80_mma/*.j2 (and the shared common/sm80_helpers.cuh.j2)."""
    cfg, ops = kernel.config, kernel.operands
    ctx = {
        "name": kernel.name,
        "arch": kernel.arch.value,
        "family": cfg.family.value,
        "config_yaml": cfg.to_yaml().rstrip("\n").splitlines(),
        # operands
        "dtype": ops.a_dtype.ptx,
        "elem_ctype": ops.a_dtype.cuda_type,
        "a_layout": ops.a_layout.value,
        "b_layout": ops.b_layout.value,
        "a_kmajor": ops.a_layout is Layout.ROW,  # A row-major: K contiguous
        "b_kmajor": ops.b_layout is Layout.COL,  # B col-major: K contiguous
        "align_a": ops.align_a,
        "align_b": ops.align_b,
        "align_c": ops.align_c,
        "bias": ops.bias,
        "activation": ops.activation.value,
        # tiles and pipeline
        "bm": cfg.cta.m, "bn": cfg.cta.n, "bk": cfg.cta.k,
        "wm": cfg.warp.m, "wn": cfg.warp.n,
        "mma_m": cfg.mma.m, "mma_n": cfg.mma.n, "mma_k": cfg.mma.k,
        "warps_m": cfg.warps_m, "warps_n": cfg.warps_n,
        "threads": cfg.threads,
        "stages": cfg.stages,
        "smem_layout": cfg.smem_layout.value,
        "swizzle": cfg.smem_layout is SmemLayout.SWIZZLE,
        "pad_elems": PAD_ELEMS,
        "smem_bytes": constraints.smem_bytes(cfg, ops),
        "raster_order": cfg.raster.order.value,
        "raster_group": cfg.raster.group,
        "splitk": cfg.decomposition.kind is DecompKind.SPLIT_K,
        "splits": cfg.decomposition.splits,
        "reduce_threads": REDUCE_THREADS,
        "cluster_m": cfg.cluster.m, "cluster_n": cfg.cluster.n,
        "warp_specialized": cfg.warp_specialized,
        "persistent": cfg.persistent,
    }
    return ctx


# Family -> context builder. The Hopper family's lives in gemmgen/families/sm90.py and is looked up
# on first use, so rendering sm80 kernels does not depend on it.
CONTEXTS = {Family.SM80_MMA: sm80_context}


def render(kernel: Kernel, gpu: "Gpu | None" = None) -> str:
    """The CUDA source of `kernel`, after checking its configuration (on `gpu`, else the loosest GPU
    that runs the arch). Raises InvalidConfig listing every broken rule."""
    constraints.validate(kernel.config, gpu or reference_gpu(kernel.arch), kernel.arch, operands=kernel.operands)
    return render_unchecked(kernel)


def render_unchecked(kernel: Kernel, context: "dict | None" = None) -> str:
    """Render without the feasibility check (tests use it to probe the template itself)."""
    template = environment().get_template(kernel.config.family.template)
    return template.render(**(template_context(kernel) if context is None else context))


__all__ = ["CONTEXTS", "environment", "sm80_context", "reference_gpu", "render", "render_unchecked", "template_context", "REDUCE_THREADS"]
