"""A small training run: the same MLP with gemmgen.nn.Linear and with torch.nn.Linear, from one seed, 200 steps.

    PYTHONPATH=$PWD python3 benchmarks/linear_train.py [--steps 200] [--kernels dry|store] [--out out/linear]

A synthetic regression: a fixed random teacher (two tanh layers) maps x in R^IN to R^OUT; the student MLP
IN -> HIDDEN (GELU) -> HIDDEN (SiLU) -> OUT, with biases, learns it with AdamW on fresh batches of TOKENS rows
(one generator seed, so every run sees the same data). Three runs: torch.nn.Linear in fp32 (the reference), torch.nn.Linear
in bf16, gemmgen.nn.Linear in bf16. bf16 noise is how far torch's own bf16 curve is from fp32; the gemmgen curve
should be as close to torch's bf16 curve as that. On a GPU the layers' products run on the model's picks
(--kernels dry, compiled for this GPU into a temporary store) or on what `gemmgen tune-linear` stored (--kernels
store); on the CPU everything runs the torch fallback (the curves then agree exactly). Writes linear_train.json
with the three curves, and linear_train.png when matplotlib is installed (pip install 'gemmgen[plot]').
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from harness import run_main, write_report

IN, HIDDEN, OUT, TOKENS = 256, 1024, 64, 2048


def make_mlp(linear, dtype, device):
    import torch

    layers = [linear(IN, HIDDEN, activation="gelu"), linear(HIDDEN, HIDDEN, activation="silu"), linear(HIDDEN, OUT)]
    return torch.nn.Sequential(*layers).to(device=device, dtype=dtype)


def torch_linear(in_f, out_f, activation="none"):
    import torch

    act = {"none": torch.nn.Identity(), "gelu": torch.nn.GELU(approximate="tanh"), "silu": torch.nn.SiLU()}
    return torch.nn.Sequential(torch.nn.Linear(in_f, out_f), act[activation])


def train(model, dtype, device, steps: int, lr: float) -> "list[float]":
    import torch

    data = torch.Generator(device="cpu").manual_seed(1234)
    teacher = [torch.randn(IN, HIDDEN, generator=data) / IN ** 0.5, torch.randn(HIDDEN, OUT, generator=data) / HIDDEN ** 0.5]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        x = torch.randn(TOKENS, IN, generator=data)
        y = torch.tanh(torch.tanh(x @ teacher[0]) @ teacher[1])
        pred = model(x.to(device=device, dtype=dtype))
        loss = torch.nn.functional.mse_loss(pred.float(), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def prepare_kernels(mode: str, device) -> None:
    """Point gemmgen at kernels for the MLP's three layers (see the module docstring)."""
    if device.type != "cuda" or mode == "store":
        return
    import gemmgen
    from gemmgen.model.linear import LinearLayer
    from gemmgen.torch.registry import REGISTRY, gpu_key
    from gemmgen.tune.linear import tune_linear

    key = gpu_key(device.index or 0)
    if key is None:
        print("note: this GPU is not in gemmgen's catalogue: every product runs on torch", file=sys.stderr)
        return
    root = Path(tempfile.mkdtemp(prefix="gemmgen-train-")) / "kernels"
    for in_f, out_f, activation in ((IN, HIDDEN, "gelu"), (HIDDEN, HIDDEN, "silu"), (HIDDEN, OUT, "none")):
        layer = LinearLayer.create(in_f, out_f, "bf16", True, activation, TOKENS)
        # In training GELU and SiLU layers run the bias-only kernel (the pre-activation is saved for backward).
        plain = LinearLayer.create(in_f, out_f, "bf16", True, "none", TOKENS)
        tune_linear(plain if activation != "none" else layer, gemmgen.lookup_gpu(key), dry_run=True, top_k=2,
                    jobs=max(1, (os.cpu_count() or 2) - 1), root=root)
    REGISTRY.use_store(root)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--kernels", default="dry", choices=("dry", "store"))
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--out", default="out/linear", help="folder for linear_train.json/.png")
    args = parser.parse_args(argv)
    import torch

    import gemmgen

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    prepare_kernels(args.kernels, device)
    curves = {}
    for name, linear, dtype in (("torch fp32", torch_linear, torch.float32), ("torch bf16", torch_linear, torch.bfloat16),
                                ("gemmgen bf16", gemmgen.nn.Linear, torch.bfloat16)):
        torch.manual_seed(0)  # one initialisation for all three runs: torch's, copied, then cast
        model = reference = make_mlp(torch_linear, torch.float32, "cpu")
        if linear is not torch_linear:
            model = make_mlp(linear, torch.float32, "cpu")
            for ours, theirs in zip(model, reference):
                ours.load_state_dict(theirs[0].state_dict())
        model = model.to(device=device, dtype=dtype)
        gemmgen.reset_stats()
        curves[name] = train(model, dtype, device, args.steps, args.lr)
        if name.startswith("gemmgen"):
            counts = gemmgen.stats()
            print(f"gemmgen: {counts['kernel_calls']} kernel calls, {counts['fallbacks']} fallbacks "
                  f"{counts['fallbacks_by_reason']}")
    tail = max(1, args.steps // 4)

    def gap(a, b):  # mean relative difference of two curves over the last quarter
        return sum(abs(x - y) / y for x, y in zip(curves[a][-tail:], curves[b][-tail:])) / tail

    noise, ours = gap("torch bf16", "torch fp32"), gap("gemmgen bf16", "torch bf16")
    for name, curve in curves.items():
        print(f"{name:13s} loss: start {curve[0]:.4f}, step {args.steps // 2} {curve[args.steps // 2]:.4f}, "
              f"end {curve[-1]:.4f}")
    print(f"bf16 noise (torch bf16 vs fp32, last {tail} steps): {noise:.2%}; gemmgen vs torch bf16: {ours:.2%} "
          f"-> {'within' if ours <= max(noise, 1e-6) * 1.5 else 'OUTSIDE'} bf16 noise")
    report = {"device": str(device), "steps": args.steps, "curves": curves, "bf16_noise": noise,
              "gemmgen_vs_torch_bf16": ours, "stats": gemmgen.stats()}
    path = write_report(args.out, "linear_train.json", report)
    print(f"record: {path}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install 'gemmgen[plot]')")
        return 0
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, curve in curves.items():
        ax.plot(curve, label=name, lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("MSE loss")
    ax.set_title(f"MLP {IN}-{HIDDEN}-{HIDDEN}-{OUT}, {TOKENS} tokens/step, on {device}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(Path(args.out) / "linear_train.png", dpi=120)
    print(f"plot: {Path(args.out) / 'linear_train.png'}")
    return 0


if __name__ == "__main__":
    run_main(main, __file__)
