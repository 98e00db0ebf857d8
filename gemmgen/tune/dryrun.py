"""`gemmgen tune --dry-run`: rank by the model, compile the top candidates, export the pick unmeasured."""
from __future__ import annotations

from dataclasses import dataclass

from ..model.arch import Arch, Gpu
from ..model.errors import CompileError
from ..model.problem import Problem
from .results import fingerprint
from ..model.tiles import Kernel
from .engines import Engines, default_engines
from ..rank.ranking import Ranked, model_top

@dataclass(frozen=True)
class Candidate:
    ranked: Ranked
    kernel: Kernel
    compiled: object  # Compiled, or the CompileError

    @property
    def ok(self) -> bool:
        return not isinstance(self.compiled, Exception)


@dataclass(frozen=True)
class DryRunResult:
    problem: Problem
    gpu: Gpu
    space_size: int
    candidates: "tuple[Candidate, ...]"
    pick: "Candidate | None"
    bundle: object


def dry_run(problem: Problem, gpu: Gpu, top_k: int = 8, out: "str | None" = None, *,
            engines: "Engines | None" = None, jobs: int = 4, arch: "Arch | None" = None) -> DryRunResult:
    """Rank by the model, compile its top-k, export the best-ranked one that compiled, unmeasured."""
    own = engines is None
    engines = engines or default_engines(jobs)
    arch = arch or gpu.arch
    try:
        space, ranked = engines.ranked_space(problem, gpu, arch)
        ranking = model_top(ranked, max(1, top_k))
        kernels = [Kernel(arch, problem.operands, r.config) for r in ranking]
        futures = [engines.compiler.submit(k) for k in kernels]
        candidates = []
        for r, k, f in zip(ranking, kernels, futures):
            try:
                compiled = f.result()
            except Exception as exc:
                compiled = CompileError(k.name, (), f"{type(exc).__name__}: {exc}")
            candidates.append(Candidate(r, k, compiled))
        pick = next((c for c in candidates if c.ok), None)
        bundle = None
        if pick is not None and out:
            from .export import export_bundle

            env = fingerprint(gpu, None, engines.nvrtc_version())
            bundle = export_bundle(out, pick.kernel, problem, pick.compiled, measured=None, verification=None,
                                   environment=env, note="not measured (dry run)", manifest_fn=engines.manifest,
                                   extra={"predicted": {"time_s": pick.ranked.time_s, "tflops": pick.ranked.tflops,
                                                        "bound": pick.ranked.bound, "model_rank": 0}})
        return DryRunResult(problem, gpu, len(space), tuple(candidates), pick, bundle)
    finally:
        if own:
            engines.close()
