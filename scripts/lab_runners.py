"""What the back-to-back device scripts (power_probe.py, kernel_trace.py) share: the stored winners (plus any
--config) built and verified, and one launcher each for them and for cuBLAS on the same bf16 buffers."""
from __future__ import annotations

from pathlib import Path

from ab_lab import build, stored_winner
from gemmgen.model.arch import Arch
from gemmgen.runtime.manifest import make_manifest
from gemmgen.model.tiles import Kernel, TileConfig


def verified_builds(shapes: str, config_files: "list[str]", override: "dict | None" = None) -> dict:
    """shape -> (problem, [(tag, manifest, cubin)]): each suite shape's stored winner and the --config files,
    rendered with `override`, compiled, and kept only if verified (gemmgen.tune.bench: fresh inputs, NaN-poisoned D)."""
    from gemmgen.tune.bench import GpuBenchmark

    variants = {}
    bench = GpuBenchmark(verify=True)
    for shape in shapes.split(","):
        problem, winner = stored_winner(shape)
        built = []
        for cfg in [winner] + [TileConfig.from_text(Path(f).read_text(), f) for f in config_files]:
            kernel = Kernel(Arch.SM90A, problem.operands, cfg)
            _, (cubin, _, _) = build(kernel, override or {})
            manifest = make_manifest(kernel, problem)
            verdict = bench.verify(manifest, cubin, problem)
            print(f"{shape} {cfg.tag}: {'verified' if verdict.ok else 'NOT verified: ' + verdict.reason}", flush=True)
            if verdict.ok:
                built.append((cfg.tag, manifest, cubin))
        variants[shape] = (problem, built)
    bench.close()
    return variants


def runners(dev, problem, built) -> dict:
    """name -> a function enqueuing one run: cuBLAS (torch.matmul) first, then each built kernel, all on one set of
    random bf16 buffers (A and B row-major) of `problem`."""
    import torch

    m, n, k = problem.m, problem.n, problem.k
    A = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    D = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    out = {"cuBLAS": lambda: torch.matmul(A, B, out=D)}
    for tag, manifest, cubin in built:
        dev.make_current()
        module = dev.load(cubin)
        ws = dev.alloc(max(256, manifest["workspace_bytes"]))
        out[tag] = dev.prepare(manifest, module, {"A": A.data_ptr(), "B": B.data_ptr(), "D": D.data_ptr()}, ws).run
    return out
