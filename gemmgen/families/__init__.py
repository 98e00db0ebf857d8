"""The kernel-family registry: the rest of gemmgen asks here and never names a family.

A family is a package (see families/base.py for what it implements) that calls `register(instance)` when
imported. BUILTIN is the one list of the families shipped with gemmgen; a family defined elsewhere (a test,
a user's package) registers itself the same way and is then searched, ranked, rendered and launched like
the built-in ones.
"""
from __future__ import annotations

import importlib

from ..model import parse
from ..model.arch import Arch
from ..model.errors import InvalidInput
from ..model.tiles import TileConfig
from .base import KernelFamily, Launches, ModelTraits

# The registry's list: the only place outside a family's own package and templates that names families.
BUILTIN = ("sm80_mma", "sm90_wgmma", "sm80_skinny", "sm80_gemv")

_REGISTRY: "dict[str, KernelFamily]" = {}


def register(family: KernelFamily) -> KernelFamily:
    """Add `family` to the registry (idempotent for the same instance type); returns it."""
    if not family.name or TileConfig._types.get(family.name) is not family.config_type:
        raise InvalidInput("a kernel family's config type must be declared with its name "
                           "(class MyConfig(TileConfig, family=NAME))", family.name or type(family).__name__)
    _REGISTRY[family.name] = family
    return family


def unregister(name: str) -> None:
    """Remove a family (tests that register a temporary one)."""
    _REGISTRY.pop(name, None)


def get(name: str) -> KernelFamily:
    """The registered family called `name`."""
    family = _REGISTRY.get(str(name))
    if family is None:
        raise InvalidInput(f"kernel family must be one of {sorted(_REGISTRY)}", name)
    return family


def of(config: TileConfig) -> KernelFamily:
    """The family a configuration belongs to."""
    if not isinstance(config, TileConfig):
        # Every API that takes a configuration (predict, check, render, ...) asks here first: a kernel's tag or a
        # dict would otherwise fail as "'str' object has no attribute 'family'".
        shown = parse.shown(config) if isinstance(config, str) else type(config).__name__
        raise InvalidInput("a configuration must be a TileConfig", shown,
                           "TileConfig.from_dict(fields) builds one from a dict, TileConfig.from_text(text) from "
                           "YAML or JSON; a kernel's name or tag is not parsed back")
    return get(config.family)


def all_families() -> "list[KernelFamily]":
    """Every registered family, built-in ones first in BUILTIN's order."""
    return list(_REGISTRY.values())


def names() -> "list[str]":
    return list(_REGISTRY)


def for_arch(arch: "Arch | str") -> "list[KernelFamily]":
    """Families that compile for `arch` and whose template and search space are present."""
    arch = Arch.parse(arch)
    return [f for f in _REGISTRY.values() if f.supports_arch(arch) and f.available()]


for _name in BUILTIN:
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["BUILTIN", "KernelFamily", "Launches", "ModelTraits", "all_families", "for_arch", "get", "names", "of",
           "register", "unregister"]
