"""The GPU half of the benchmark: verification and timing of compiled kernels on the GPU, behind an injectable interface.

The tuner calls `GpuBenchmark().measure(manifest, cubin, problem)` in a worker process that owns the
CUDA context; a fake with the same two methods (measure, cublas_time) replays recorded timings in CI.

Verification: fresh random inputs in [-1, 1) for every check, D poisoned with NaN first, then the relative
Frobenius error against an fp32 reference (gemmgen.tune.reference); any NaN/Inf fails.
Timing: CUDA events around each run, after ~25 ms of warm-up; the median of >= 20 runs (~100 ms), queued in
batches behind a kernel that holds the stream, so the events see the GPU's time and not the host's launch
overhead. Inputs
and outputs rotate over enough buffer sets that together they exceed 2x the L2 cache, so L2 never serves
a run's operands from the previous run (no L2 flush, so nothing is subtracted). cuBLAS (torch.matmul, or
addmm with C/bias) is timed the same way, on the same rotated buffers.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ...model.arch import DType
from ...model.errors import CudaError
from ...model.problem import Fp8Accum, Fp32Math, Problem, Scaling
from .policy import HOLD_BASE_S, HOLD_BATCH, HOLD_MAX_S, HOLD_PER_RUN_S, HOST_BOUND_S, Measurement, TimingPolicy, describe, failed, manifest_mismatch, median, plan_runs, rotation_count, threshold, timing_policy, verdict
from .. import utility
from ..reference import GemmPointers, operand_bytes, operand_dtypes, storage_shapes, view_widths



@dataclass
class _OperandSet:
    buffers: dict
    pointers: GemmPointers


def _on_device(manifest: dict, problem: Problem, dev, module) -> dict:
    """`manifest` with a persistent kernel's launches for this device, as gemmgen.load launches it
    (runtime.serve.device_manifest): the tuner builds manifests on the host for the catalogue's H100 SXM, so on an
    H100 PCIe a persistent grid of 132 CTAs had 18 waiting for a second wave in every measurement."""
    from ...runtime.serve import device_manifest, kernel_of

    kernel = kernel_of(manifest)
    if kernel is None or not getattr(kernel.config, "persistent", False):
        return manifest
    return device_manifest(manifest, kernel, problem, dev.props.sm_count, module)


class GpuBenchmark:
    """Verifies and times kernels on one GPU. Constructing it touches no GPU: the context opens on first use,
    so it can be built in a parent and used in a worker (it pickles as its settings)."""

    # The device-side helpers (random fill, stream hold): tune/utility.py; tests put fakes here.
    helpers = utility

    def __init__(self, ordinal: int = 0, reference: str = "auto", policy: TimingPolicy = TimingPolicy(),
                 seed: "int | None" = None, verify: bool = True):
        self.ordinal, self.reference, self.policy, self.verify_first = ordinal, reference, policy, verify
        self._own_policy = policy
        self._seed = seed
        self._rng = random.Random(seed)
        self._device = None
        self._sets: "list[_OperandSet]" = []
        self._sets_key = None
        self._workspace = None
        self._events: list = []
        self._cublas: dict = {}
        self.healthy = True  # False after a sticky CUDA error: the owner must replace this process

    def __getstate__(self):
        return {"ordinal": self.ordinal, "reference": self.reference, "policy": self._own_policy, "verify": self.verify_first,
                "seed": self._seed}

    def __setstate__(self, state):
        self.__init__(state["ordinal"], state["reference"], state["policy"], state["seed"], state["verify"])

    # public interface ----------------------------------------------------------------------------
    @property
    def device(self):
        if self._device is None:
            from ...runtime.device import Device

            self._device = Device(self.ordinal).open()
        return self._device

    def measure(self, manifest, cubin, problem: Problem) -> Measurement:
        """Verify, then time. Every failure (wrong result, CUDA error, bad manifest) becomes ok=False with its
        reason; nothing raises out of here. Also accepts the architecture doc's order (compiled, manifest, problem)."""
        if not isinstance(manifest, dict) and isinstance(cubin, dict):
            manifest, cubin = cubin, manifest  # (compiled, manifest, problem)
        cubin = getattr(cubin, "cubin", cubin)
        return self._guarded(problem, lambda: self._measure(manifest, bytes(cubin), problem, timing=True))

    def verify(self, manifest: dict, cubin: bytes, problem: Problem) -> Measurement:
        """Verification only (no timing)."""
        cubin = getattr(cubin, "cubin", cubin)
        return self._guarded(problem, lambda: self._measure(manifest, bytes(cubin), problem, timing=False))

    def set_timing(self, name: "str | None") -> None:
        """Time from now on with the named policy of TIMINGS, or with the one given at construction (None).
        The tuner switches for its finalist rounds."""
        self.policy = self._own_policy if name is None else timing_policy(name)

    def cublas_time(self, problem: Problem, fresh: bool = False) -> "float | None":
        """Median seconds of cuBLAS on this problem (torch.matmul, or addmm with C/bias; the activation is
        not included), or None where neither torch nor cupy (f16 only) is importable. Remembered per problem;
        `fresh` measures again (the tuner's finalist rounds time cuBLAS beside each round of its kernels, since
        the card's clocks drift with its power draw from one minute to the next)."""
        key = _storage_key(problem)
        if key in self._cublas and not fresh:
            return self._cublas[key]
        try:
            result = self._time_cublas(problem)
        except ImportError:
            result = None
        except CudaError as exc:
            self._note(exc)
            raise
        self._cublas[key] = result
        return result

    def close(self) -> None:
        if self._device is not None:
            try:
                self._release_sets()
            finally:
                self._device.close()
                self._device = None

    # internals -----------------------------------------------------------------------------------
    def _guarded(self, problem: Problem, body) -> Measurement:
        if not self.healthy:
            return failed("the CUDA context was lost to an earlier sticky error; replace this worker", problem)
        try:
            return body()
        except Exception as exc:  # noqa: BLE001 - CudaError, a bad manifest, torch's RuntimeError: one failed trial
            self._note(exc)
            return failed(describe(exc), problem)

    def _note(self, exc: BaseException) -> None:
        from ...runtime.device import is_sticky

        if is_sticky(exc) or "illegal memory access" in str(exc) or "unspecified launch failure" in str(exc):
            self.healthy = False

    def _measure(self, manifest: dict, cubin: bytes, problem: Problem, timing: bool) -> Measurement:
        mismatch = manifest_mismatch(manifest, problem)
        if mismatch:
            return failed(mismatch, problem)
        dev = self.device
        dev.make_current()
        module = dev.load(cubin)
        try:
            manifest = _on_device(manifest, problem, dev, module)
            workspace = self._workspace_for(int(manifest.get("workspace_bytes", 0) or 0))
            # A mixed fp8 pair is held to the looser of its two inputs' floors.
            limit = max(threshold(problem.c_dtype, problem.k, dt) for dt in (problem.a_dtype, problem.b_dtype))
            if problem.fp32_math is Fp32Math.X3:   # asked for fp32-class accuracy: no tf32 input floor
                limit = threshold(problem.c_dtype, problem.k)
            rel, backend = None, ""
            if self.verify_first:
                first = self._sets_for(problem, 1)[0]
                self._refill(first, problem)  # fresh inputs for every check
                dev.poison(first.buffers["D"], problem.c_dtype)
                if "row_sums" in first.buffers:
                    dev.poison(first.buffers["row_sums"], problem.c_dtype)
                if workspace is not None:
                    # Partials a kernel reads before writing would pass on a previous run's values; NaN
                    # shows them. Binding re-zeroes whatever prefix the manifest's workspace_zero names.
                    dev.poison(workspace, "f32")
                dev.launch(manifest, module, first.pointers.as_dict(), workspace)
                dev.synchronize(f"after {manifest.get('name', 'the kernel')}")
                from ..reference import compare

                result = compare(dev, problem, first.pointers, self.reference, seed=self._rng.getrandbits(32))
                rel, backend = result.rel_error, result.backend
                reason = verdict(result.rel_error, result.nonfinite, limit, problem, result.sample_rel_error)
                if reason:
                    extra = f"; {result.detail}" if result.detail else ""
                    return failed(reason + extra, problem, rel_error=rel, threshold=limit, backend=backend)
            if not timing:
                return Measurement(True, None, (), rel, "", problem.flops, limit, backend)
            times = self._time_kernel(manifest, module, problem, workspace)
            return Measurement(True, median(times), tuple(times), rel, "", problem.flops, limit, backend)
        finally:
            try:
                dev.unload(module)
            except CudaError:
                pass  # after a sticky error unloading fails too; the error that caused it is the one to report

    def _time_kernel(self, manifest: dict, module, problem: Problem, workspace) -> "list[float]":
        dev = self.device
        sets = self._sets_for(problem, self._rotation(problem))
        sequences = [dev.prepare(manifest, module, s.pointers.as_dict(), workspace) for s in sets]
        name = manifest.get("name", "the kernel")
        return self._timed(lambda i: sequences[i % len(sequences)].run(0), 0, f"timing {name}")

    def _timed(self, run_one, stream: int, what: str) -> "list[float]":
        """Estimate from one run, warm up, then time each run between its own pair of events."""
        dev = self.device
        start, end = self._event_pair(0)
        for _ in range(2):  # the first run may include one-time costs (cuBLAS heuristics, module load)
            # Behind a hold, so the events bracket the run and not the host's enqueueing of it: on an idle
            # stream torch's dispatch (~20-40 us) would land inside the estimate, and a 9 us cuBLAS run would
            # pass for a long one and be timed back to back from Python in sustained mode (host-bound: sq1024's
            # cuBLAS read 94 TFLOP/s instead of 230 that way on 2026-11-24, docs/perf-notes.md).
            self.helpers.hold_stream(dev, HOLD_BASE_S, stream)
            start.record(stream)
            run_one(0)
            end.record(stream)
            dev.synchronize(what)
        estimate = end.elapsed_s(start)
        warmup, reps = plan_runs(estimate, self.policy)
        for i in range(warmup):
            run_one(i)
        if self.policy.sustained and estimate >= HOST_BOUND_S:
            pairs = [self._event_pair(i) for i in range(reps)]
            # The warm-up left the queue deep: the GPU never waits for the host, and no hold lets it idle.
            for i, (s, e) in enumerate(pairs):
                s.record(stream)
                run_one(i)
                e.record(stream)
            dev.synchronize(what)
            return [e.elapsed_s(s) for s, e in pairs]
        # Runs go in batches queued behind a hold kernel: a short kernel (sq1024 takes ~7 us) launched
        # straight from Python would otherwise be timed with the host's launch overhead, which differs
        # between our cuLaunchKernel and torch's dispatch and so skews the ratio to cuBLAS.
        # A hold covers the enqueueing of at most HOLD_MAX_S / HOLD_PER_RUN_S runs: a sustained policy's huge batch
        # would leave all but the first few hundred runs host-bound (sq1024's cuBLAS read 92 TFLOP/s that way).
        batch = min(self.policy.batch, HOLD_BATCH)
        # `group` runs back to back between one pair of events, a sample per group (1: each run timed alone; more:
        # stream timing).
        group = max(1, self.policy.group)
        groups = [self._event_pair(i) for i in range(-(-reps // group))]
        per_hold = max(1, batch // group)
        for first in range(0, len(groups), per_hold):
            chunk = groups[first:first + per_hold]
            self.helpers.hold_stream(dev, min(HOLD_MAX_S, HOLD_BASE_S + HOLD_PER_RUN_S * group * len(chunk)), stream)
            for g, (s, e) in enumerate(chunk, start=first):
                s.record(stream)
                for j in range(group):
                    run_one(g * group + j)
                e.record(stream)
            dev.synchronize(what)
        return [e.elapsed_s(s) / group for s, e in groups]

    def _event_pair(self, index: int):
        while len(self._events) <= index:
            self._events.append((self.device.event(), self.device.event()))
        return self._events[index]

    def _rotation(self, problem: Problem) -> int:
        set_bytes = sum(operand_bytes(problem).values())
        return rotation_count(set_bytes, self.device.props.l2_bytes, self.policy.l2_factor)

    def _workspace_for(self, nbytes: int):
        if nbytes <= 0:
            return None
        if self._workspace is None or self._workspace.nbytes < nbytes:
            self.device.free(self._workspace)
            self._workspace = self.device.alloc(nbytes)
        return self._workspace

    def _sets_for(self, problem: Problem, count: int) -> "list[_OperandSet]":
        """`count` operand sets for this problem's storage, reusing those already filled."""
        key = _storage_key(problem)
        if key != self._sets_key:
            self._release_sets()
            self._sets_key = key
        while len(self._sets) < count:
            buffers = {name: self.device.alloc(nbytes) for name, nbytes in operand_bytes(problem).items()}
            ptr = {name: buf.ptr for name, buf in buffers.items()}
            entry = _OperandSet(buffers, GemmPointers(ptr["A"], ptr["B"], ptr["D"], ptr.get("C", 0), ptr.get("bias", 0),
                                                      ptr.get("scale_a", 0), ptr.get("scale_b", 0),
                                                      ptr.get("row_sums", 0)))
            self._refill(entry, problem)
            self._sets.append(entry)
        return self._sets[:count]

    def _refill(self, entry: _OperandSet, problem: Problem) -> None:
        """New random inputs (never zeros: they hide unwritten outputs and run faster than real data)."""
        dtypes = operand_dtypes(problem)
        shapes = storage_shapes(problem)
        for name, buf in entry.buffers.items():
            if name in ("D", "row_sums"):
                continue  # outputs: poisoned before each check; their content does not matter for timing
            count = math.prod(shapes[name])
            # Scales away from 1 (and apart per row and column), so a kernel that drops or swaps one fails.
            lo, hi = (0.25, 4.0) if name in ("scale_a", "scale_b") else (-1.0, 1.0)
            self.helpers.fill_uniform(self.device, buf, dtypes[name], count, self._rng.getrandbits(63), lo, hi)
        # A view's gaps hold NaN, as a user's uninitialized memory may: a kernel must neither write them (the
        # check reads D's back) nor let them into its result.
        for name, width in view_widths(problem).items():
            if name != "D":
                rows, pitch = shapes[name]
                self.device.poison_2d(entry.buffers[name].ptr + width * dtypes[name].bytes, dtypes[name], pitch,
                                      pitch - width, rows)

    def _release_sets(self) -> None:
        if self._device is not None:
            for entry in self._sets:
                for buf in entry.buffers.values():
                    self._device.free(buf)
        self._sets, self._sets_key = [], None

    def _time_cublas(self, problem: Problem) -> "float | None":
        sets = self._sets_for(problem, self._rotation(problem))
        try:
            import torch
        except ImportError:
            return self._time_cublas_cupy(problem, sets)
        from ..reference import torch_operands

        ops = [torch_operands(problem, s.pointers) for s in sets]
        ep = problem.epilogue
        if problem.a_dtype.bytes == 1:
            # fp8: cuBLAS through torch._scaled_mm (per-tensor scales on the GPU, bias fused, 16-bit out); it takes
            # A row-major and B column-major only, the layouts the fp8 kernels run.
            one = torch.ones((), device="cuda", dtype=torch.float32)
            out_dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[problem.c_dtype.value]
            rowwise = problem.scaling is not Scaling.TENSOR
            # Block scaling: cuBLAS's rowwise scaling stands in (torch._scaled_mm's Hopper block scaling is not in
            # every torch), the nearest fp8 product it runs, with unit scales of the rowwise shapes.
            ones = (torch.ones(problem.m, 1, device="cuda"), torch.ones(1, problem.n, device="cuda"))
            # Like for like: cuBLAS's fast accumulation against a fast problem, its fp32 accumulation (torch's
            # default) against an --accumulate fp32 one. Per-tensor scaling only: the rowwise call keeps torch's
            # default, as measured on the H100 before the option existed (its fast mode there is not measured, and
            # a RuntimeError from it would drop the baseline below).
            fast = problem.fp8_accum is Fp8Accum.FAST and not rowwise

            def run_one(i: int) -> None:
                o = ops[i % len(ops)]
                # rowcol: cuBLAS's rowwise scaling, scale_a (M, 1) and scale_b (1, N).
                sa, sb = (one, one) if not rowwise else ones if problem.scaling is Scaling.BLOCK else (
                    o["scale_a"][:, None], o["scale_b"][None, :])
                torch._scaled_mm(o["A"], o["B"], sa, sb, bias=o["bias"] if ep.bias else None, out_dtype=out_dtype,
                                 out=o["D"], use_fast_accum=fast)

            if rowwise:
                try:
                    run_one(0)
                except RuntimeError:
                    return None   # this torch/cuBLAS has no rowwise scaling for these dtypes: no baseline

        elif problem.a_dtype is DType.F32:
            # fp32 inputs run as tf32 here, so cuBLAS is timed with TF32 allowed too; a 3xTF32 problem asked for
            # fp32 accuracy, so against cuBLAS's fp32 (TF32 off).
            tf32 = problem.fp32_math is not Fp32Math.X3

            def run_one(i: int) -> None:
                previous = torch.backends.cuda.matmul.allow_tf32
                torch.backends.cuda.matmul.allow_tf32 = tf32
                try:
                    run_dense(i)
                finally:
                    torch.backends.cuda.matmul.allow_tf32 = previous
        elif problem.c_dtype is not problem.a_dtype:
            # 16-bit inputs, fp32 D: cuBLAS writes fp32 itself (torch.mm's out_dtype); C and bias are added after.
            def run_one(i: int) -> None:
                o = ops[i % len(ops)]
                d = torch.mm(o["A"], o["B"], out_dtype=torch.float32)
                if ep.alpha != 1.0:
                    d.mul_(ep.alpha)
                if ep.beta != 0:
                    d.add_(o["C"], alpha=ep.beta)
                if ep.bias:
                    d.add_(o["bias"])
        else:
            run_one = None

        def run_dense(i: int) -> None:
            o = ops[i % len(ops)]
            if ep.beta != 0:
                torch.addmm(o["C"], o["A"], o["B"], beta=ep.beta, alpha=ep.alpha, out=o["D"])
                if ep.bias:
                    o["D"].add_(o["bias"])
            elif ep.bias:
                torch.addmm(o["bias"], o["A"], o["B"], alpha=ep.alpha, out=o["D"])
            elif ep.alpha != 1.0:
                torch.mm(o["A"], o["B"], out=o["D"]).mul_(ep.alpha)
            else:
                torch.mm(o["A"], o["B"], out=o["D"])

        run = run_one or run_dense
        if ep.row_sums:
            # The row sums of A beside D: what a framework without the fused kernel runs, cuBLAS then torch's
            # reduction (a Linear layer's bias gradient, dZ.sum(0), is the row sums of the weight gradient's A).
            product = run

            def run(i: int) -> None:
                product(i)
                o = ops[i % len(ops)]
                torch.sum(o["A"], dim=1, out=o["row_sums"])

        if not problem.packed:
            try:
                run(0)
            except RuntimeError:
                return None  # torch refuses this view for cuBLAS (its fp8 product wants packed rows): no baseline
        stream = torch.cuda.current_stream().cuda_stream
        return median(self._timed(run, stream, "timing cuBLAS"))

    def _time_cublas_cupy(self, problem: Problem, sets) -> "float | None":
        import cupy as cp  # noqa: F401 - ImportError means no cuBLAS here

        if problem.a_dtype is not DType.F16 or problem.epilogue.beta or problem.epilogue.bias or problem.epilogue.row_sums:
            return None  # cupy has no bf16, and its matmul has no epilogue
        if not problem.packed:
            return None  # cupy's matmul writes a contiguous out only: no baseline for a D with gaps
        from ..reference import _CudaArray

        shapes = storage_shapes(problem)

        def arrays(s):
            a = cp.asarray(_CudaArray(s.pointers.a, shapes["A"], "<f2"))
            b = cp.asarray(_CudaArray(s.pointers.b, shapes["B"], "<f2"))
            d = cp.asarray(_CudaArray(s.pointers.d, shapes["D"], "<f2"))
            return (a.T if problem.a_layout.value == "col" else a, b.T if problem.b_layout.value == "col" else b, d)

        ops = [arrays(s) for s in sets]
        stream = cp.cuda.get_current_stream().ptr
        return median(self._timed(lambda i: cp.matmul(*ops[i % len(ops)][:2], out=ops[i % len(ops)][2]), stream,
                                  "timing cuBLAS (cupy)"))


def _storage_key(problem: Problem) -> tuple:
    """What decides the buffers' sizes and fill (not alpha, beta's value or the activation): B's dtype too, as
    e4m3 and e5m2 operands are the same size but not the same values."""
    return (problem.m, problem.n, problem.k, problem.a_dtype, problem.b_dtype, problem.c_dtype, problem.a_layout,
            problem.b_layout, problem.epilogue.beta != 0, problem.epilogue.bias, problem.scaling,
            problem.epilogue.row_sums, problem.lda, problem.ldb, problem.ldc)
