"""Helpers shared by tests: a private compile cache per test module (imported by the few-row families' tests and the
NVRTC, SASS and row-sums tests), the rules a configuration breaks, compile checks over a family's whole space."""
from __future__ import annotations

import pytest

from gemmgen.families import rules as constraints
from gemmgen.model.arch import Arch, lookup_gpu
from gemmgen.model.tiles import Kernel

H100 = lookup_gpu("h100")


@pytest.fixture(scope="module", autouse=True)
def compile_cache(tmp_path_factory):
    """A module's compiles go to a cache of their own (imported into a test module, it applies to all of it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMMGEN_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def broken(config, problem):
    """The rules `config` breaks for `problem` on the H100 (sm_90a)."""
    return [v.rule for v in constraints.check(config, H100, Arch.SM90A, problem)]


def heaviest_compile_without_spills(family, gpu, problem, key, at_least: int) -> None:
    """The register-heaviest configuration of `family`'s space for `problem` per value of key(config) (where a
    spill would show) compiles, with no spilled bytes and no stack; the space holds more than `at_least`."""
    from gemmgen.codegen.nvrtc import compile_many
    from gemmgen.rank.space import enumerate_space

    configs = list(enumerate_space(family, gpu, problem=problem))
    assert len(configs) > at_least
    heaviest = {}
    for c in sorted(configs, key=family.regs_estimate):
        heaviest[key(c)] = c
    kernels = [Kernel(Arch.SM90A, problem.operands, c) for c in heaviest.values()]
    for kernel, result in zip(kernels, compile_many(kernels)):
        assert not isinstance(result, Exception), (kernel.name, result)
        assert result.spill_bytes == 0 and result.resources.stack_bytes == 0, kernel.name
