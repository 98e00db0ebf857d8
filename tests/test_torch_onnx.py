"""ONNX export of a model holding gemmgen.nn.Linear layers (and calls of gemmgen.mm): the graph holds the standard
ops torch.nn.Linear and its activation export as (Gemm or MatMul and Add, Relu, Gelu or its tanh formula, Sigmoid
and Mul), never a gemmgen op no ONNX runtime knows.

Regression: torch.onnx.export failed on such a model, "ONNX export failed on an operator with unrecognized namespace
gemmgen::linear" (TorchScript exporter); the dynamo exporter's torch.export capture recorded gemmgen::linear too.

torch 2.13's TorchScript exporter (dynamo=False) needs the `onnx` package only to insert onnxscript functions into
the finished model (none here): where `onnx` is absent that one step is skipped and the graph read from the
protobuf directly, so the exporter's conversion is tested on every machine. The dynamo exporter needs `onnxscript`
(and `onnx`): its end-to-end test skips without them, while what it captures (torch.export under the exporter's
flag) is tested everywhere."""
from __future__ import annotations

import importlib
import io
import warnings

import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
from gemmgen.torch.nn import Linear  # noqa: E402
from torch_helpers import quiet_fallbacks  # noqa: E402,F401

ACTS = ["none", "relu", "gelu", "silu"]


class TwoLayers(torch.nn.Module):
    """Two Linear layers of `linear` (gemmgen's or torch's with the activation after it) and a gemmgen.mm (or
    torch.mm) of the result with a fixed matrix."""

    def __init__(self, activation: str, ours: bool):
        super().__init__()
        torch.manual_seed(0)
        self.activation, self.ours = activation, ours
        if ours:
            self.first, self.second = Linear(8, 16, activation=activation), Linear(16, 4)
        else:
            self.first, self.second = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.register_buffer("proj", torch.randn(4, 3))

    def forward(self, x):
        y = self.first(x)
        if not self.ours:
            y = {"none": lambda t: t, "relu": torch.relu, "silu": torch.nn.functional.silu,
                 "gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[self.activation](y)
        y = self.second(y)
        return gemmgen.mm(y, self.proj) if self.ours else torch.mm(y, self.proj)


def _protobuf_fields(buf: bytes):
    """(field number, wire type, value) of one protobuf message: bytes for length-delimited fields, int for varints."""
    i = 0

    def varint():
        nonlocal i
        shift = value = 0
        while True:
            byte = buf[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while i < len(buf):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, wire, varint()
        elif wire == 2:
            n = varint()
            yield number, wire, buf[i:i + n]
            i += n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not one an ONNX model uses")


def onnx_nodes(model: bytes) -> "list[tuple[str, str]]":
    """(domain, op_type) of every node of an ONNX ModelProto's graph (ModelProto.graph = 7, GraphProto.node = 1,
    NodeProto.op_type = 4, NodeProto.domain = 7), read without the onnx package."""
    graph = next(v for n, w, v in _protobuf_fields(model) if n == 7 and w == 2)
    nodes = []
    for n, w, node in _protobuf_fields(graph):
        if n == 1 and w == 2:
            fields = {k: v for k, wt, v in _protobuf_fields(node) if wt == 2 and k in (4, 7)}
            nodes.append((fields.get(7, b"").decode(), fields.get(4, b"").decode()))
    return nodes


def torchscript_export(model, x, monkeypatch) -> bytes:
    """torch.onnx.export(dynamo=False) of `model` at `x`, the model's bytes. Without the onnx package the one step
    that needs it (inserting onnxscript functions, which a model of standard ops has none of) is skipped."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        utils = None
        for name in ("torch.onnx._internal.torchscript_exporter.onnx_proto_utils", "torch.onnx._internal.onnx_proto_utils"):
            try:
                utils = importlib.import_module(name)
                break
            except ImportError:
                continue
        if utils is None or not hasattr(utils, "_add_onnxscript_fn"):
            pytest.skip("the onnx package is absent, and this torch's TorchScript exporter needs it otherwise")
        monkeypatch.setattr(utils, "_add_onnxscript_fn", lambda proto, custom_opsets: proto)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # torch 2.13: the TorchScript exporter is deprecated
        torch.onnx.export(model.eval(), (x,), f, dynamo=False, opset_version=17)
    return f.getvalue()


@pytest.mark.parametrize("activation", ACTS)
def test_torchscript_onnx_export_writes_the_ops_torch_nn_linear_exports_as(activation, monkeypatch):
    """Regression: torch.onnx.export(dynamo=False) of a model of gemmgen.nn.Linear refused gemmgen::linear
    ('unrecognized namespace'). It now writes the nodes the same model of torch.nn.Linear (and the activation after
    it, and torch.mm for gemmgen.mm) writes, all in the standard domain."""
    x = torch.randn(2, 8)
    ours = onnx_nodes(torchscript_export(TwoLayers(activation, ours=True), x, monkeypatch))
    reference = onnx_nodes(torchscript_export(TwoLayers(activation, ours=False), x, monkeypatch))
    assert ours == reference, (ours, reference)
    assert all(domain == "" for domain, _ in ours), ours   # "": the standard ONNX operator set
    ops = [op for _, op in ours]
    assert {"Gemm", "MatMul"} & set(ops), ops
    if activation == "relu":
        assert "Relu" in ops
    elif activation == "silu":
        assert "Sigmoid" in ops and "Mul" in ops
    elif activation == "gelu":
        assert "Tanh" in ops or "Gelu" in ops


def test_what_the_dynamo_exporter_captures_holds_no_gemmgen_op():
    """Regression: the dynamo exporter's capture (torch.export, non-strict first) of a gemmgen.nn.Linear recorded
    gemmgen::linear, which it has no ONNX translation for. Under the exporter's flag it records aten's linear, the
    activation and mm."""
    flags = pytest.importorskip("torch.onnx._internal.exporter._flags")
    model = TwoLayers("gelu", ours=True).eval()
    x = torch.randn(2, 8)
    program = flags.set_onnx_exporting_flag(torch.export.export)(model, (x,), strict=False)
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert not any("gemmgen" in t for t in targets), targets
    assert any("linear" in t or "addmm" in t for t in targets) and any("gelu" in t for t in targets), targets
    torch.testing.assert_close(program.module()(x), model(x))


def test_dynamo_onnx_export_writes_standard_ops():
    """The dynamo exporter end to end (it needs onnxscript and onnx, absent on a bare install)."""
    pytest.importorskip("onnxscript")
    onnx = pytest.importorskip("onnx")
    model = TwoLayers("silu", ours=True).eval()
    program = torch.onnx.export(model, (torch.randn(2, 8),), dynamo=True)
    nodes = [(n.domain, n.op_type) for n in onnx.load_from_string(program.model_proto.SerializeToString()).graph.node]
    assert all(domain in ("", "ai.onnx") for domain, _ in nodes), nodes
    ops = [op for _, op in nodes]
    assert {"Gemm", "MatMul"} & set(ops) and "Sigmoid" in ops, ops
