"""The per-call path on the CPU: a bound launch re-pointed at a moving output (runtime), and the torch ops' eager
fast path and per-call plans (a fake bundle registered for CPU tensors), with a stale binding never reused."""
from __future__ import annotations

import struct
import warnings
from types import SimpleNamespace

import pytest

from gemmgen.model.errors import InvalidInput
from gemmgen.runtime.launch import LaunchSequence, PreparedLaunch, pack_params
from gemmgen.runtime.arrays import ArrayInfo
from gemmgen.runtime.loader import BoundLaunch

PARAMS = [{"name": "A", "kind": "tensor"}, {"name": "B", "kind": "tensor"}, {"name": "D", "kind": "tensor"},
          {"name": "M", "kind": "scalar", "ctype": "int", "value": 64}]
TMA_D = [{"name": "A", "kind": "tensor"}, {"name": "tmD", "kind": "tensormap", "tensor": "D"}]


def sequence(params, pointers, runs):
    """A launch sequence over `params` bound to `pointers` whose run() is recorded, not enqueued."""
    packed = pack_params(params, pointers, encode_tensormap=lambda spec, ptr: ptr.to_bytes(128, "little"))
    seq = LaunchSequence([PreparedLaunch(SimpleNamespace(name="k", handle=0), (1, 1, 1), (1, 1, 1), (1, 1, 1), 0,
                                         packed)], None, "k")
    seq.run = lambda stream: runs.append((stream, pointed(seq)))
    return seq


def pointed(seq) -> int:
    """The address the launch's D parameter holds (a plain pointer, or the first 8 bytes of the fake tensor map)."""
    params = seq.launches[0].params
    return struct.unpack("<Q", params.raw(params.tensors.index("D"))[:8])[0]


class StubKernel:
    """What BoundLaunch uses of a LoadedKernel: _prepare (counted), generation, the device's context setter."""

    def __init__(self, params):
        self.params, self.generation, self.prepared, self.runs = params, 0, [], []
        self._device = SimpleNamespace(current_setter=lambda: (lambda: None))

    def _prepare(self, infos):
        if infos["D"].ptr % 16:
            raise InvalidInput("D must start on a 16-byte boundary", hex(infos["D"].ptr))
        self.prepared.append(infos["D"].ptr)
        return sequence(self.params, {n: i.ptr for n, i in infos.items()}, self.runs)


def infos(d_ptr=0x3000):
    return {name: ArrayInfo(ptr, (64, 64), (64, 1), "bfloat16", 0, 0)
            for name, ptr in (("A", 0x1000), ("B", 0x2000), ("D", d_ptr))}


def test_pointer_setter_rewrites_the_packed_pointer_and_refuses_a_tensor_map_over_the_operand():
    seq = sequence(PARAMS, {"A": 0x1000, "B": 0x2000, "D": 0x3000}, [])
    seq.pointer_setter("D")(0x9000)
    raw = [seq.launches[0].params.raw(i) for i in range(3)]
    assert [struct.unpack("<Q", r)[0] for r in raw] == [0x1000, 0x2000, 0x9000]  # A and B untouched
    assert sequence(TMA_D, {"A": 0x1000, "D": 0x3000}, []).pointer_setter("D") is None  # the map holds D
    assert seq.pointer_setter("C") is None  # no parameter reads it


def test_a_bound_launch_repoints_d_in_place_and_binds_again_when_the_workspace_moves():
    kernel = StubKernel(PARAMS)
    bound = BoundLaunch(kernel, infos())
    for d_ptr in (0x3000, 0x4000, 0x5000, 0x3000):
        bound.launch(d_ptr, 7)
    assert kernel.prepared == [0x3000]  # bound once: every later output only re-pointed
    assert kernel.runs == [(7, 0x3000), (7, 0x4000), (7, 0x5000), (7, 0x3000)]
    kernel.generation += 1  # a larger workspace: sequences bound to the old one are dead
    bound.launch(0x3000, 7)
    assert kernel.prepared == [0x3000, 0x3000] and kernel.runs[-1] == (7, 0x3000)
    with pytest.raises(InvalidInput, match="16-byte"):
        bound.launch(0x4008, 7)
    bound.launch(0x6000, 7)
    assert kernel.runs[-1] == (7, 0x6000)


def test_a_bound_launch_whose_d_is_in_a_tensor_map_binds_each_new_address_once():
    kernel = StubKernel(TMA_D)
    bound = BoundLaunch(kernel, infos())
    for d_ptr in (0x3000, 0x4000, 0x3000, 0x4000, 0x5000):
        bound.launch(d_ptr, 0)
    assert kernel.prepared == [0x3000, 0x4000, 0x5000]  # recycled addresses reuse their binding
    assert [ptr for _, ptr in kernel.runs] == [0x3000, 0x4000, 0x3000, 0x4000, 0x5000]
    kernel.generation += 1
    bound.launch(0x4000, 0)
    assert kernel.prepared[-1] == 0x4000 and len(kernel.prepared) == 4


class Tensor:
    """What a bundle's call reads of a torch tensor (named Tensor, as the loader tells torch arrays by name)."""

    def __init__(self, ptr, shape, dtype="bfloat16"):
        self.ptr, self.shape, self.dtype = ptr, shape, dtype

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return (self.shape[1], 1) if len(self.shape) == 2 else (1,)

    def get_device(self):
        return 0


def test_a_bundle_call_with_arrays_seen_before_is_one_lookup_and_other_arrays_are_checked_again(monkeypatch):
    from gemmgen import Arch, Kernel, Problem
    from gemmgen.model.arch import lookup_gpu
    from gemmgen.rank.space import default_config
    from gemmgen.runtime import loader
    from gemmgen.runtime.loader import LoadedKernel
    from gemmgen.runtime.manifest import make_manifest

    problem = Problem.create(64, 256, 128, "bf16")
    manifest = make_manifest(Kernel(Arch.SM90A, problem.operands, default_config(problem, lookup_gpu("h100"))),
                             problem)
    kernel = LoadedKernel(manifest, b"", "<test>")
    prepared, runs, current = [], [], []
    monkeypatch.setattr(loader, "_torch_stream", lambda ordinal: 7)
    monkeypatch.setattr(loader, "describe_array", lambda x, name, stream: x)

    def prepare(arrays):
        prepared.append({name: x.ptr for name, x in arrays.items()})
        return SimpleNamespace(run=runs.append)

    kernel._prepare = prepare
    kernel._set_current = lambda: current.append(1)
    A, B, D = Tensor(0x1000, (64, 128)), Tensor(0x2000, (128, 256)), Tensor(0x3000, (64, 256))
    for _ in range(3):
        assert kernel(A, B, D) is D
    kernel(A, B, D, stream=9)
    assert prepared == [{"A": 0x1000, "B": 0x2000, "D": 0x3000}]   # checked and bound once
    assert runs == [7, 7, 7, 9] and len(current) == 3                 # the context made current on every hit
    kernel(A, B, Tensor(0x4000, (64, 256)))                          # another D: bound again
    assert len(prepared) == 2
    # A bias the kernel was not built with is refused, though the other arrays were bound before.
    with pytest.raises(InvalidInput, match="bias must be None"):
        kernel(A, B, D, bias=Tensor(0x5000, (256,)))
    kernel._bound.clear()                                            # as a grown workspace or close() does
    kernel(A, B, D)
    assert len(prepared) == 3

# --- the torch op layer ---------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
from gemmgen.model.arch import DType  # noqa: E402
from gemmgen.model.linear import KernelClass  # noqa: E402
from gemmgen.model.problem import Activation, Layout  # noqa: E402
from gemmgen.torch import ops, stats  # noqa: E402
from gemmgen.torch.registry import CPU, REGISTRY, register  # noqa: E402


class FakeBundle:
    """A bundle-shaped kernel for CPU tensors: bind_launch records what it bound, launch computes into the D at
    the address it is given (found among the outputs it was shown), so a stale binding shows as a wrong result."""

    def __init__(self):
        self.binds, self.launches = [], []

    def __call__(self, A, B, D, C=None, bias=None):
        raise AssertionError("the plan should launch the bound launch, not call the kernel")

    def bind_launch(self, A, B, D, C=None, bias=None):
        self.binds.append((A.data_ptr(), B.data_ptr(), tuple(A.shape), A.stride(), B.stride()))
        return _FakeBound(self, A, B, bias)


class _FakeBound:
    def __init__(self, bundle, A, B, bias):
        # The product of the arrays as they were when bound: a later call with other inputs must not land here.
        self.bundle, self.result = bundle, (A.float() @ B.float() + (0 if bias is None else bias.float()))
        self.outputs = {}

    def launch(self, d_ptr, stream):
        self.bundle.launches.append(d_ptr)
        D = self.bundle.outputs[d_ptr]
        D.view(-1, D.shape[-1]).copy_(self.result)


@pytest.fixture
def bundle(monkeypatch):
    """A FakeBundle registered for the CPU products below; torch.empty's outputs are made visible to it."""
    fake = FakeBundle()
    fake.outputs = {}
    real_empty = torch.empty

    def empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        fake.outputs[out.data_ptr()] = out
        return out

    monkeypatch.setattr(torch, "empty", empty)
    for a, b, bias in ((Layout.ROW, Layout.ROW, False), (Layout.COL, Layout.ROW, False),
                       (Layout.ROW, Layout.COL, True)):
        register(KernelClass(DType.BF16, a, b, bias, Activation.NONE, None, 32, 48), fake, gpu=CPU)
    stats.reset_stats(warnings_too=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", stats.FallbackWarning)  # every call here must take the kernel
        yield fake
    REGISTRY.clear()


def bf16(*shape):
    return torch.randn(*shape).bfloat16()


def test_a_repeated_call_reuses_its_plan_and_a_new_pointer_shape_or_stride_binds_again(bundle):
    A, B = bf16(16, 48), bf16(48, 32)
    outs = [gemmgen.mm(A, B) for _ in range(3)]
    assert len(bundle.binds) == 1 and len(bundle.launches) == 3
    for D in outs:
        torch.testing.assert_close(D.float(), A.float() @ B.float(), rtol=2e-2, atol=2e-2)
    cases = {"A's pointer": (bf16(16, 48), B), "B's pointer": (A, bf16(48, 32)), "M": (bf16(24, 48), B),
             "A's strides": (bf16(48, 16).t(), B)}
    for what, (A2, B2) in cases.items():
        before = len(bundle.binds)
        D = gemmgen.mm(A2, B2)
        assert len(bundle.binds) == before + 1, what
        torch.testing.assert_close(D.float(), A2.float() @ B2.float(), rtol=2e-2, atol=2e-2, msg=what)
    assert bundle.binds[-1][3] == (1, 16)  # the column-major view was bound with its own strides
    assert gemmgen.stats()["kernel_calls"] == 7


def test_same_address_with_another_dtype_view_or_bias_is_not_a_plan_hit(bundle):
    X, W, b = bf16(5, 48), bf16(32, 48), bf16(32)
    y1 = ops.linear(X, W, b)
    y2 = ops.linear(X, W, b.clone())  # another bias address
    assert len(bundle.binds) == 2
    torch.testing.assert_close(y1, y2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.FallbackWarning)
        as_f16 = ops.linear(X.view(torch.float16), W.view(torch.float16), b.view(torch.float16))
    assert len(bundle.binds) == 2 and as_f16.dtype == torch.float16  # f16 has no kernel here: torch ran it
    assert gemmgen.stats()["fallbacks"] == 1


def test_registering_a_kernel_drops_every_plan(bundle):
    A, B = bf16(8, 48), bf16(48, 32)
    gemmgen.mm(A, B)
    other = FakeBundle()
    other.outputs = bundle.outputs
    register(KernelClass(DType.BF16, Layout.ROW, Layout.ROW, False, Activation.NONE, None, 32, 48), other, gpu=CPU)
    gemmgen.mm(A, B)
    assert len(bundle.binds) == 1 and len(other.binds) == 1  # the newest registration serves the next call


def test_linear_fast_path_and_custom_op_share_the_plan(bundle):
    layer = gemmgen.nn.Linear(48, 32, dtype=torch.bfloat16)
    x = bf16(3, 4, 48)
    with torch.no_grad():
        eager = layer(x)
        through_op = torch.ops.gemmgen.linear(x, layer.weight, layer.bias, "none")
    assert len(bundle.binds) == 1 and len(bundle.launches) == 2  # one implementation, one plan
    torch.testing.assert_close(eager, through_op)
    assert gemmgen.stats()["kernel_calls_by_op"] == {"linear": 2}


def test_grad_takes_an_autograd_function_and_no_grad_the_bare_implementation():
    A = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    B = torch.randn(5, 4, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.FallbackWarning)
        assert type(gemmgen.mm(A, B).grad_fn).__name__ == "_MmBackward"
        with torch.no_grad():
            assert gemmgen.mm(A, B).grad_fn is None
        assert torch.autograd.gradcheck(lambda a: gemmgen.mm(a, B), (A,))


def test_eager_fast_path_steps_aside_for_modes_fake_and_meta_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    A = torch.randn(3, 3)
    assert ops._eager(A, torch.nn.Parameter(A))
    # None for an operand goes to the custom op, whose check names it (linear passes its bias only when it has one).
    assert not ops._eager(A, torch.nn.Parameter(A), None)
    assert not ops._eager(A.to("meta"), A)

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Seen():
        assert not ops._eager(A, A)
    class Passing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        assert not ops._eager(A, A)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(A)
        assert not ops._eager(fake, fake)
        assert gemmgen.mm(fake, fake).shape == (3, 3)  # the custom op's fake impl answered


@pytest.mark.gpu
def test_gpu_plans_never_reuse_a_stale_binding(tmp_path):
    # A real bundle behind the op layer: outputs move every call (re-pointed, or bound per address under a TMA
    # store), inputs change address, shape and layout; every result is checked against torch in fp64.
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    from gemmgen import Kernel, Problem
    from gemmgen.codegen.nvrtc import compile_kernel
    from gemmgen.rank.space import default_config
    from gemmgen.runtime.detect import detect_gpu
    from gemmgen.tune.export import export_bundle

    gpu = detect_gpu().gpu
    n = 256
    problem = Problem.create(n, n, n, "bf16")
    kernel = Kernel(gpu.arch, problem.operands, default_config(problem, gpu))
    export_bundle(tmp_path, kernel, problem, compile_kernel(kernel), measured=None, verification=None, environment={})
    register(KernelClass(DType.BF16, Layout.ROW, Layout.ROW, False, Activation.NONE, None, n, n),
             gemmgen.load(tmp_path))
    stats.reset_stats(warnings_too=True)
    try:
        B = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        inputs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for m in (256, 256, 128, 256)]
        with torch.no_grad():
            for step in range(12):
                A = inputs[step % 4]
                B2 = B if step < 6 else B.clone()
                keep = [gemmgen.mm(A, B2) for _ in range(3)]  # live outputs: three addresses in turn
                torch.cuda.synchronize()
                ref = A.double() @ B2.double()
                for D in keep:
                    assert float((D.double() - ref).norm() / ref.norm()) < 1e-2, step
        assert gemmgen.stats()["fallbacks"] == 0
    finally:
        REGISTRY.clear()
