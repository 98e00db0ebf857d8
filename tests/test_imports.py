"""The model, the calculator and rendering import neither cuda-python nor Optuna (docs/architecture.md); torch loads
only when its API is first used."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_model_calculator_and_rendering_load_without_cuda_python_or_optuna():
    code = ("import sys, gemmgen, gemmgen.model.tiles, gemmgen.families.rules, gemmgen.calc.intensity, gemmgen.codegen.render, "
            "gemmgen.rank.space, gemmgen.runtime.manifest, gemmgen.families.sm90_wgmma.launch; "
            "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('cuda', 'optuna')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"



def test_torch_api_loads_on_first_use_and_then_costs_no_module_lookup():
    """`import gemmgen` (and `from gemmgen import *`) needs no torch; gemmgen.mm, .linear and .nn import it on first
    use and are then bound in the module, so a call does not go through the module's __getattr__ again."""
    pytest.importorskip("torch")
    code = ("import sys, gemmgen; from gemmgen import *; before = 'torch' in sys.modules; "
            "mm = gemmgen.mm; print(before, 'mm' in vars(gemmgen), gemmgen.mm is mm, gemmgen.nn.Linear.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.stdout.split() == ["False", "True", "True", "Linear"], out.stderr[-2000:]


def test_the_pytorch_modules_import_as_torch_nn_spelling_leads_users_to_write_them():
    """`import gemmgen.nn` and `from gemmgen.nn import Linear` (not only the attribute gemmgen.nn.Linear) find the
    layer, and every spelling gives the same module and class; `import gemmgen` alone still imports no torch."""
    pytest.importorskip("torch")
    code = ("import sys, gemmgen; before = 'torch' in sys.modules; import gemmgen.nn as a; "
            "from gemmgen.nn import Linear; from gemmgen import nn as b; "
            "print(before, a is b is gemmgen.nn, Linear is gemmgen.nn.Linear, Linear.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.stdout.split() == ["False", "True", "True", "gemmgen.torch.nn"], out.stderr[-2000:]
