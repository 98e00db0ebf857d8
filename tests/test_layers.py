"""The package's layers: imports point down, family names stay in their packages, the runtime stands alone.

Layers, lowest first: model -> calc -> families -> (codegen | runtime | rank) -> (tune | torch) -> cli. A module
may import its own layer and the ones below; the three middle layers are siblings that never import each other
(the runtime launches bundles without the code generator; ranking needs neither), and so are tune and torch
(the torch ops read the kernels tune-linear stores through the runtime, never the tuner).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gemmgen import families

PACKAGE = Path(__file__).resolve().parent.parent / "gemmgen"
LEVEL = {"model": 0, "calc": 1, "families": 2, "codegen": 3, "runtime": 3, "rank": 3, "tune": 4, "torch": 4, "cli": 5}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        yield path, parts


def _imports(path: Path, parts: tuple) -> "list[tuple[int, str]]":
    """(line, gemmgen-relative dotted target) of every gemmgen import in the module, nested ones included."""
    package = list(parts[:-1]) if parts[-1] != "__init__" else list(parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                target = base + (node.module.split(".") if node.module else [])
                names = [target + [a.name] for a in node.names] if not node.module else [target]
                out += [(node.lineno, ".".join(n)) for n in names]
            elif node.module and node.module.split(".")[0] == "gemmgen":
                out.append((node.lineno, node.module.partition(".")[2]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name.partition(".")[2]) for a in node.names if a.name.split(".")[0] == "gemmgen"]
    return out


def test_every_module_lives_in_a_layer():
    stray = [str(path) for path, parts in _modules() if len(parts) > 1 and parts[0] not in LEVEL]
    top = {parts[0] for _, parts in _modules() if len(parts) == 1}
    # The package's facades: __init__ (the public API), __main__ (the CLI), nn (the PyTorch modules, so that
    # `import gemmgen.nn` and `from gemmgen.nn import Linear` work as torch.nn's spelling leads users to write).
    assert not stray and top <= {"__init__", "__main__", "nn"}, (stray, top)


def test_no_module_imports_upward_or_sideways():
    bad = []
    for path, parts in _modules():
        if len(parts) == 1:
            continue  # the package's facades (gemmgen/__init__, __main__, nn) re-export the public API
        layer = parts[0]
        for line, target in _imports(path, parts):
            to = target.split(".")[0]
            if to in ("", "__init__") or to not in LEVEL:
                continue
            if to != layer and LEVEL[to] >= LEVEL[layer]:
                bad.append(f"{path.relative_to(PACKAGE)}:{line} imports {target} ({layer} -> {to})")
    assert not bad, "\n".join(bad)


def _code_strings_and_names(tree) -> "list[tuple[int, str]]":
    """String constants that are not docstrings, and identifiers, of a module."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
    return out


def test_family_names_appear_only_in_their_own_packages_and_the_registry_list():
    names = [f.name for f in families.all_families()]
    bad = []
    for path, parts in _modules():
        own = parts[:2] if parts[0] == "families" and len(parts) > 2 else None
        for line, text in _code_strings_and_names(ast.parse(path.read_text())):
            for name in names:
                if name in text and not (own and own[1] == name):
                    bad.append(f"{path.relative_to(PACKAGE)}:{line}: {text[:60]!r}")
    registry = PACKAGE / "families" / "__init__.py"
    allowed = [b for b in bad if b.startswith("families/__init__.py") and "BUILTIN" in registry.read_text()]
    assert len(allowed) == len(names)  # each built-in named once, in BUILTIN
    assert [b for b in bad if b not in allowed] == []


BLOCKER = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("jinja2", "optuna", "yaml"):
                raise ImportError(f"{name} is blocked: the runtime must not need it")
    sys.meta_path.insert(0, Block())
""")


def test_the_runtime_loads_and_checks_a_bundle_with_jinja2_optuna_and_yaml_blocked(tmp_path):
    from gemmgen import Arch, Kernel, Problem
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.rank.space import default_config
    from gemmgen.tune.export import export_bundle

    try:
        from gemmgen.codegen.nvrtc import compile_kernel
    except Exception as exc:  # noqa: BLE001 - no NVRTC on this machine
        pytest.skip(f"NVRTC unavailable: {exc}")
    problem = Problem.create(300, 200, 100)
    kernel = Kernel(Arch.SM90A, problem.operands, default_config(problem, lookup_gpu("h100")))
    export_bundle(tmp_path, kernel, problem, compile_kernel(kernel), measured=None, verification=None,
                  environment={})
    code = BLOCKER + textwrap.dedent(f"""
        import sys
        import numpy as np
        import gemmgen
        from gemmgen.model.errors import GemmgenError
        from gemmgen.runtime import detect, device, manifest, tma
        from gemmgen.runtime.loader import load
        kernel = load({str(tmp_path)!r})
        print(kernel.name)
        try:  # host arrays are refused with a one-line error, before any GPU work
            kernel(np.zeros((300, 100)), np.zeros((100, 200)), np.zeros((300, 200)))
        except GemmgenError as exc:
            print("refused:", exc)
        print(sorted(k for k in sys.modules if k.split(".")[0] in ("jinja2", "optuna", "yaml")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == kernel.name and lines[1].startswith("refused:") and lines[-1] == "[]"
