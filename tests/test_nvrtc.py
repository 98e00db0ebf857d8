"""NVRTC: cubins, resource reports, the cache, errors carrying the log, and the whole sm80 space compiling."""
from __future__ import annotations

import os
import time

import pytest

from gemmgen.codegen import nvrtc
from gemmgen.model.arch import Arch, lookup_gpu
from gemmgen.model.errors import CompileError
from gemmgen.codegen.nvrtc import Compiled, compile_kernel, compile_many, compile_source, parse_ptxas_log
from gemmgen.model.problem import Operands, Problem
from gemmgen.rank.space import enumerate_space
from gemmgen.families.sm80_mma.config import Sm80Config
from gemmgen.model.tiles import Kernel, Shape3
from space_helpers import compile_cache  # noqa: F401 (an autouse fixture: this module's compiles get their own cache)


SMALL = Sm80Config(Shape3(64, 64, 32), Shape3(32, 32, 32), Shape3(16, 8, 16), 3)

LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm' for 'sm_80'
ptxas info    : Function properties for gemm
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 512 bytes smem, 384 bytes cmem[0]
ptxas info    : Compiling entry function 'gemm_reduce' for 'sm_80'
ptxas info    : Function properties for gemm_reduce
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 20 registers, used 0 barriers, 384 bytes cmem[0]
"""


def test_parse_ptxas_log_per_entry():
    entries = parse_ptxas_log(LOG)
    assert entries["gemm"] == nvrtc.Resources(168, 4, 12, 8, 512)
    assert entries["gemm_reduce"].registers == 20 and entries["gemm_reduce"].spill_bytes == 0


def test_parse_ptxas_log_flags_serialized_wgmma_per_entry():
    # The advisory as ptxas 13 wrote it for a lab kernel whose epilogue overlapped its last MMAs (2026-11-23).
    log = LOG + ("ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized "
                 "due to insufficient register resources for the wgmma pipeline in the function 'gemm' in line 483\n")
    entries = parse_ptxas_log(log)
    assert entries["gemm"].wgmma_serialized and not entries["gemm_reduce"].wgmma_serialized
    assert not parse_ptxas_log(LOG)["gemm"].wgmma_serialized


def test_nvrtc_version_is_major_minor():
    major, minor = nvrtc.nvrtc_version().split(".")
    assert int(major) >= 12 and int(minor) >= 0


def test_compile_error_carries_log_options_and_a_real_source_path():
    with pytest.raises(CompileError) as info:
        compile_source("broken", 'extern "C" __global__ void broken() { undeclared_thing = 1; }',
                       ("--gpu-architecture=sm_80",))
    err = info.value
    assert "undeclared_thing" in err.log
    assert err.options == ("--gpu-architecture=sm_80",)
    assert os.path.isfile(err.source_path) and "undeclared_thing" in open(err.source_path).read()
    assert "broken" in str(err) and "\n" not in str(err)


def test_compile_kernel_produces_a_sass_cubin_and_resources():
    kernel = Kernel(Arch.SM80, Operands(), SMALL)
    compiled = compile_kernel(kernel)
    assert compiled.cubin[:4] == b"\x7fELF"  # a cubin (ELF), never PTX text
    assert "--gpu-architecture=sm_80" in compiled.options and "--ptxas-options=-v" in compiled.options
    assert 0 < compiled.resources.registers <= 255
    assert compiled.entries[0][0] == kernel.name


def test_cache_serves_the_second_compile_and_survives_a_torn_entry(monkeypatch):
    kernel = Kernel(Arch.SM86, Operands(), SMALL)
    first = compile_kernel(kernel)
    calls = []
    real = nvrtc.compile_source
    monkeypatch.setattr(nvrtc, "compile_source", lambda *a: calls.append(a) or real(*a))
    second = compile_kernel(kernel)
    assert second.cached and not calls and second.cubin == first.cubin
    key = nvrtc.cache_key(first.source, first.options)
    cubin_path, _ = nvrtc._cache_paths(key)
    cubin_path.write_bytes(b"torn")
    third = compile_kernel(kernel)
    assert not third.cached and calls and third.cubin == first.cubin


def test_cache_key_changes_with_source_and_options():
    assert nvrtc.cache_key("a", ("x",)) != nvrtc.cache_key("b", ("x",))
    assert nvrtc.cache_key("a", ("x",)) != nvrtc.cache_key("a", ("y",))


def test_sm90a_target_keeps_the_a():
    kernel = Kernel(Arch.SM90A, Operands(), SMALL)
    assert "--gpu-architecture=sm_90a" in nvrtc.options_for(kernel)


@pytest.mark.parametrize("arch,gpu", [(Arch.SM80, "a100"), (Arch.SM90A, "h100")])
def test_every_config_of_the_space_compiles_or_is_rejected_by_check(arch, gpu):
    """The rule of the family: NVRTC never rejects a configuration the feasibility check accepts."""
    configs = enumerate_space("sm80_mma", lookup_gpu(gpu), arch)
    assert len(configs) > 40
    kernels = [Kernel(arch, Operands(), c) for c in configs]
    start = time.monotonic()
    results = compile_many(kernels, jobs=os.cpu_count())
    failures = [r for r in results if isinstance(r, CompileError)]
    assert not failures, failures[0].log[:2000]
    assert all(isinstance(r, Compiled) and r.name == k.name for r, k in zip(results, kernels))
    assert time.monotonic() - start < 240


def test_the_kernel_identity_is_the_compiled_kernels_and_follows_source_options_and_toolkit(monkeypatch):
    """One identity: what a build's Compiled.identity says is what identity_of(kernel) predicts without
    compiling, and it moves with the rendered source, the options and the NVRTC version."""
    from gemmgen.codegen import identity

    kernel = Kernel(Arch.SM80, Problem.create(256, 256, 256).operands, SMALL)
    compiled = nvrtc.compile_kernel(kernel)
    assert compiled.identity == identity.identity_of(kernel)
    base = identity.kernel_identity(compiled.source, compiled.options, compiled.nvrtc_version)
    assert identity.kernel_identity(compiled.source + "\n// changed", compiled.options, compiled.nvrtc_version) != base
    assert identity.kernel_identity(compiled.source, compiled.options + ("-lineinfo",), compiled.nvrtc_version) != base
    assert identity.kernel_identity(compiled.source, compiled.options, "99.9") != base
    monkeypatch.setattr(identity, "render", lambda k: compiled.source.replace("__syncthreads", "__syncthreads "))
    assert identity.identity_of(kernel) != compiled.identity


def test_narrow_copies_of_both_operands_keep_64x64_warp_tiles_out_and_the_model_pick_spills_nothing():
    """Both operands' rows copied in pieces under 8 bytes (4095^3, 4094^3 bf16): 64x64 warp tiles spilled 32-160 B
    on sm_80, so the rule refuses them there and keeps them where either operand allows 8-byte pieces; the dry
    run's pick for 4095^3 on an A100 compiles without local memory."""
    from gemmgen.families import rules as constraints
    from gemmgen.tune.dryrun import dry_run

    a100 = lookup_gpu("a100")
    big = Sm80Config(Shape3(128, 128, 32), Shape3(64, 64, 32), Shape3(16, 8, 16), 4)
    for shape, refused in (((4095, 4095, 4095), True), ((4094, 4094, 4094), True), ((4096, 4096, 4095), False),
                           ((4092, 4092, 4092), False)):
        broken = [v.rule for v in constraints.check(big, a100, Arch.SM80, Problem.create(*shape))]
        assert any("pieces under 8 bytes" in r for r in broken) == refused, (shape, broken)
    pick = dry_run(Problem.create(4095, 4095, 4095), a100, top_k=1, jobs=1).pick
    assert pick is not None and pick.ok and pick.kernel.config.warp.m * pick.kernel.config.warp.n < 64 * 64
    assert pick.compiled.spill_bytes == 0 and pick.compiled.resources.stack_bytes == 0
