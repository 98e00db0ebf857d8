"""Operands of more than 2^31 elements on sm90_wgmma, whose element offsets are 64-bit (KernelFamily.offset_bits):
an LM head's logits at many tokens (D, and C with beta), a weight of more than 2^31 elements read by the swapped
few-rows tile (B), and an operand with unaligned rows that the pack pass copies (A). On the CPU: the rules accept
them for sm90_wgmma and refuse them, naming the rule, for the 32-bit families. On the GPU: each is run with D
poisoned (NaN) and checked, in float64, on the rows or columns past the 2^31st element and a few others; each case
needs 5-10 GB of device memory and is skipped where less is free."""
from __future__ import annotations

import pytest

from gemmgen.families.rules import check
from gemmgen.model.arch import Arch, lookup_gpu
from gemmgen.model.problem import Problem
from gemmgen.model.tiles import Kernel
from gemmgen.rank.space import default_config
from sm90_helpers import H100

LIMIT = 2**31 - 1
# (M, N, K, A layout, B layout, bias, beta): the operand past 2^31 elements in the comment.
CASES = {
    "logits": (65600, 32768, 64, "row", "row", False, 0.0),        # D: 2.15e9 elements
    "logits_bias_beta": (65600, 32768, 64, "row", "col", True, 1.0),  # D and C, with a bias
    "huge_weight": (8, 1048577, 2048, "row", "col", False, 0.0),  # B: 2.15e9 elements, 8 rows of D (swapped)
    "packed_rows": (1048577, 64, 2049, "row", "row", False, 0.0),  # A: 2.15e9 elements, 4098-byte rows (pack)
}


def problem_of(case: str) -> Problem:
    m, n, k, a, b, bias, beta = CASES[case]
    return Problem.create(m, n, k, "bf16", a, b, bias=bias, beta=beta)


@pytest.mark.parametrize("case", sorted(CASES))
def test_sm90_takes_operands_past_2_31_elements_and_the_32_bit_families_refuse_them(case):
    problem = problem_of(case)
    assert max(problem.m * problem.k, problem.k * problem.n, problem.m * problem.n) > LIMIT
    config = default_config(problem, H100)
    assert config.family == "sm90_wgmma" and check(config, H100, Arch.SM90A, problem) == []
    sm80 = default_config(Problem.create(64, 64, 64), lookup_gpu("a100"))
    assert any("32-bit indexing" in v.rule for v in check(sm80, lookup_gpu("a100"), Arch.SM80, problem))


def _checked_rows(torch, problem, case: str) -> "list[int]":
    """Rows of D to check: the first and last, a few at random, and (for a large D or A) every row whose elements
    lie past the 2^31st."""
    m, n, k = problem.m, problem.n, problem.k
    rows = {0, 1, m // 2, m - 1}
    rows |= set(torch.randint(0, m, (8,)).tolist())
    if case.startswith("logits"):
        rows |= set(range(LIMIT // n, m))          # D's (and C's) rows past 2^31
    elif case == "packed_rows":
        rows |= set(range(LIMIT // k, m))          # A's rows past 2^31 (lda = K)
    return sorted(rows)


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_operands_past_2_31_elements_compute_the_product_on_the_gpu(case):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from gemmgen.codegen.nvrtc import compile_kernel
    from gemmgen.runtime.loader import LoadedKernel
    from gemmgen.runtime.manifest import make_manifest

    problem = problem_of(case)
    m, n, k, a_layout, b_layout, bias, beta = CASES[case]
    elements = m * k + k * n + m * n * (2 if beta else 1) + (m * k if case == "packed_rows" else 0)
    free, _ = torch.cuda.mem_get_info()
    if free < 2 * elements * 1.2:
        pytest.skip(f"needs {2 * elements / 2**30:.1f} GiB of device memory, {free / 2**30:.1f} free")
    kernel = Kernel(Arch.SM90A, problem.operands, default_config(problem, H100))
    gemm = LoadedKernel(make_manifest(kernel, problem), compile_kernel(kernel).cubin)
    torch.manual_seed(7)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    A = torch.randn(m, k, **bf16) if a_layout == "row" else torch.randn(k, m, **bf16).t()
    B = torch.randn(k, n, **bf16) if b_layout == "row" else torch.randn(n, k, **bf16).t()
    C = torch.randn(m, n, **bf16) if beta else None
    b = torch.randn(n, **bf16) if bias else None
    D = torch.full((m, n), float("nan"), **bf16)
    try:
        gemm(A, B, D, C=C, bias=b)
        torch.cuda.synchronize()
        assert not torch.isnan(D).any()
        if case == "huge_weight":   # D has 8 rows: check column blocks, the last past B's 2^31st element
            blocks = [range(0, 512), range(n // 2, n // 2 + 512), range(n - 512, n)]
            for cols in blocks:
                idx = torch.tensor(list(cols), device="cuda")
                ref = A.double() @ B[:, idx].double()
                got = D[:, idx].double()
                assert ((got - ref).norm() / ref.norm()).item() < 1e-2, cols
        else:
            rows = torch.tensor(_checked_rows(torch, problem, case), device="cuda")
            ref = A[rows].double() @ B.double()
            if beta:
                ref += beta * C[rows].double()
            if bias:
                ref += b.double()
            got = D[rows].double()
            assert ((got - ref).norm() / ref.norm()).item() < 1e-2
    finally:
        gemm.close()
