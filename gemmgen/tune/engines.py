"""What a tune plugs in: enumeration, prediction, compilation (process pool) and manifests; injectable for tests."""
from __future__ import annotations

from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable

from ..model.arch import Arch, Gpu
from ..model.errors import CompileError
from ..model.problem import Problem
from ..model.tiles import Kernel, TileConfig

def _compile_one(kernel: Kernel):
    """Pool task: the compiled kernel, or the CompileError as a value (it pickles)."""
    from ..codegen.nvrtc import compile_kernel

    try:
        return compile_kernel(kernel)
    except CompileError as exc:
        return exc


def _compile_worker_init(parent_pid: int, poll_s: float = 1.0) -> None:
    """Pool initializer. Ctrl-C is the tune's: it reaches the whole process group, and each compile process
    printed a KeyboardInterrupt traceback under the tune's 'interrupted' line; the tune shuts the pool down.
    And the process ends once `parent_pid` (the tune) is gone: a pool worker waits on a queue whose write end
    it holds itself, so it never sees EOF, and after a kill -9 of the tune every compile process (and
    multiprocessing's resource tracker) was left running for good, one per --jobs."""
    import os
    import signal
    import threading
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=watch, name="gemmgen-exit-with-parent", daemon=True).start()


class PoolCompiler:
    """NVRTC in a process pool: submit() returns at once, so compiles run while the GPU measures."""

    def __init__(self, jobs: int, task: "Callable[[Kernel], object]" = _compile_one):
        import multiprocessing as mp
        import os

        self.jobs = max(1, int(jobs))
        self.task = task
        self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=mp.get_context("spawn"),
                                         initializer=_compile_worker_init, initargs=(os.getpid(),))

    def submit(self, kernel: Kernel) -> Future:
        from .worker import sigint_held

        with sigint_held():  # the pool starts its processes here, as they are needed
            return self._pool.submit(self.task, kernel)

    def close(self, wait: bool = False) -> None:
        """Stop the pool; without `wait`, its processes are ended here: what they compile is not wanted, and such
        a pool's process could miss its stop sentinel, so the interpreter's exit waited on it for ever (a --gpus
        worker stopped by Ctrl-C, or by its parent's death, hung there)."""
        processes = list((getattr(self._pool, "_processes", None) or {}).values())  # None after shutdown
        self._pool.shutdown(wait=wait, cancel_futures=True)
        if not wait:
            for process in processes:
                if process.is_alive():
                    process.terminate()


class InlineCompiler:
    """Compiles in the calling process when asked (tests, and jobs == 0)."""

    def __init__(self, task: "Callable[[Kernel], object]" = _compile_one):
        self.task = task
        self.jobs = 1

    def submit(self, kernel: Kernel) -> Future:
        future: Future = Future()
        try:
            future.set_result(self.task(kernel))
        except Exception as exc:  # reported as that trial's failure
            future.set_exception(exc)
        return future

    def close(self) -> None:
        pass


@dataclass
class Engines:
    """Everything the search calls besides Optuna and the measurer."""

    enumerate: "Callable[[Problem, Gpu, Arch], list[TileConfig]]"
    predict: "Callable[[Problem, TileConfig, Gpu], object]"
    compiler: object  # .submit(kernel) -> Future[Compiled | CompileError], .close()
    manifest: "Callable[[Kernel, Problem, object], dict]"
    nvrtc_version: "Callable[[], str | None]" = lambda: None
    tiebreak: "Callable[[Problem, TileConfig, Gpu], float] | None" = None
    # The kernel identity a configuration builds to now (codegen/identity.identity_of): stored trials of
    # another identity timed another cubin.
    identity: "Callable[[Kernel], str]" = lambda kernel: "unversioned"

    def ranked_space(self, problem: Problem, gpu: Gpu, arch: Arch):
        """The configurations the rules allow for `problem` (a SearchSpace) and the model's ranking of them, best
        first: what a tune, a dry run and the dispatch planner each start from."""
        from ..families.rules import check
        from ..rank.ranking import SearchSpace, rank_configs

        space = SearchSpace(self.enumerate(problem, gpu, arch), lambda c: check(c, gpu, arch, problem))
        return space, rank_configs(space.configs, problem, gpu, self.predict, self.tiebreak)

    def close(self, wait: bool = False) -> None:
        """Stop the compiler; `wait`: until its processes have exited (a process about to exit itself must wait:
        a pool that served several tunes was seen to miss its stop sentinel at interpreter exit, Python 3.11,
        and the exit then waited on that pool process for ever)."""
        if wait and isinstance(self.compiler, PoolCompiler):
            self.compiler.close(wait=True)
        else:
            self.compiler.close()


def _enumerate_families(problem: Problem, gpu: Gpu, arch: Arch) -> "list[TileConfig]":
    from ..rank.space import enumerate_space, families_for

    configs: "list[TileConfig]" = []
    for family in families_for(arch):
        configs.extend(enumerate_space(family, gpu, arch, problem=problem, operands=problem.operands))
    return configs


def _predict(problem, config, gpu):
    """The model with the GPU's calibration where one is stored (rank/calibration.py), else its defaults."""
    from ..rank.calibration import calibrated_predict

    return calibrated_predict(problem, config, gpu)


def _manifest(kernel, problem, compiled):
    from ..runtime.manifest import make_manifest

    return make_manifest(kernel, problem, compiled)


def _nvrtc_version():
    try:
        from ..codegen.nvrtc import nvrtc_version

        return str(nvrtc_version())
    except Exception:  # a fingerprint without the NVRTC version is still a fingerprint
        return None


def _tiebreak(problem, config, gpu):
    from ..rank.space import heuristic_time

    return heuristic_time(problem, config, gpu)


def _identity(kernel):
    from ..codegen.identity import identity_of

    return identity_of(kernel)


def default_engines(jobs: int) -> Engines:
    """The real engines: NVRTC is checked here, once, so a Python without it is refused before any ranking (not
    every candidate reported, or quarantined, as a compile error)."""
    from ..codegen.nvrtc import require_nvrtc

    require_nvrtc()
    return Engines(_enumerate_families, _predict, PoolCompiler(jobs) if jobs > 0 else InlineCompiler(),
                   _manifest, _nvrtc_version, _tiebreak, _identity)


# --- storage ----------------------------------------------------------------------------------
