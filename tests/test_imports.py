"""The model, the calculator and rendering import neither cuda-python nor Optuna (docs/architecture.md)."""
import subprocess
import sys


def test_model_calculator_and_rendering_load_without_cuda_python_or_optuna():
    code = ("import sys, gemmgen, gemmgen.model.tiles, gemmgen.families.rules, gemmgen.calc.intensity, gemmgen.codegen.render, "
            "gemmgen.rank.space, gemmgen.runtime.manifest, gemmgen.families.sm90_wgmma.launch; "
            "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('cuda', 'optuna')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
