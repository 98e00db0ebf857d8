"""CUDA source from a validated Kernel: jinja2 with StrictUndefined, values from the model only.

The template is the kernel's family's (`KernelFamily.template` under its `template_root`). The context is
built in one place, the family's `context(kernel)`, from the Kernel's fields: no free-form string reaches the
source, and a misspelt or missing value in a template fails rendering instead of rendering as nothing.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from .. import families
from ..families import rules
from ..model.arch import Gpu, loosest_gpu
from ..model.tiles import Kernel


@lru_cache(maxsize=None)
def environment(root: "str | Path | None" = None) -> jinja2.Environment:
    """The template environment of one template folder: strict, and whitespace-tidy so generated CUDA stays
    readable. Built-in families share templates/; a family may bring its own folder."""
    from ..model import paths

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root or paths.TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def template_context(kernel: Kernel) -> dict:
    """Every value the family's templates may use, derived from the Kernel alone."""
    return families.of(kernel.config).context(kernel)


def render(kernel: Kernel, gpu: "Gpu | None" = None) -> str:
    """The CUDA source of `kernel`, after checking its configuration (on `gpu`, else the loosest GPU
    that runs the arch). Raises InvalidConfig listing every broken rule."""
    rules.validate(kernel.config, gpu or loosest_gpu(kernel.arch), kernel.arch, operands=kernel.operands)
    return render_unchecked(kernel)


def render_unchecked(kernel: Kernel, context: "dict | None" = None) -> str:
    """Render without the feasibility check (tests use it to probe the template itself)."""
    family = families.of(kernel.config)
    template = environment(str(family.template_root)).get_template(family.template)
    return template.render(**(template_context(kernel) if context is None else context))


__all__ = ["environment", "render", "render_unchecked", "template_context"]
