"""Small ONNX models built with onnx.helper, the way exporters write them.

``Builder`` collects nodes and weights; weights go in as initializers or as
``Constant`` nodes (``constants=True``, as the sample model and many
exporters do), nodes may be left unnamed, and inputs have a dynamic batch.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(0)
"""The tests' one generator. tests/conftest.py reseeds it (in place: modules that imported it see the new
state) before each test's body and each fixture's set-up, from that test's or fixture's own key, so the data a
test draws is a function of the test alone, not of which tests ran before it."""


def seed_of(key: str) -> int:
    """A stable seed for ``key`` (Python's ``hash`` of a str is salted per process)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:16], "little")


def reseed(key: str) -> None:
    RNG.bit_generator.state = np.random.default_rng(seed_of(key)).bit_generator.state


class Builder:
    def __init__(self, opset: int = 13, constants: bool = False, named: bool = True, ir_version: int = 8):
        self.opset = opset
        self.constants = constants
        self.named = named
        self.ir_version = ir_version
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._k = 0

    def name(self, base: str) -> str:
        self._k += 1
        return f"{base}{self._k}"

    def input(self, name: str, shape, dtype=TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, shape))
        return name

    def output(self, name: str, dtype=TensorProto.FLOAT, shape=None) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, dtype, shape))

    def const(self, array: np.ndarray, name: str | None = None) -> str:
        name = name or self.name("w")
        if self.constants:
            self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name)))
        else:
            self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op: str, inputs, name: str | None = None, outputs=None, **attrs) -> str:
        out_name = outputs or [self.name(f"{op.lower()}_out")]
        node_name = (name or self.name(op)) if self.named else ""
        self.nodes.append(helper.make_node(op, list(inputs), list(out_name), name=node_name, **attrs))
        return out_name[0]

    # --- layers -----------------------------------------------------------------------------
    def conv(self, x, cin, cout, k=3, group=1, bias=True, name=None, pads=None, **attrs) -> str:
        w = self.const((RNG.standard_normal((cout, cin // group, k, k)) * 0.3).astype(np.float32))
        ins = [x, w]
        if bias:
            ins.append(self.const((RNG.standard_normal(cout) * 0.1).astype(np.float32)))
        pads = pads if pads is not None else [k // 2] * 4
        return self.node("Conv", ins, name=name, group=group, kernel_shape=[k, k], pads=pads, **attrs)

    def conv_transpose(self, x, cin, cout, k=3, group=1, bias=True, name=None) -> str:
        w = self.const((RNG.standard_normal((cin, cout // group, k, k)) * 0.3).astype(np.float32))
        ins = [x, w]
        if bias:
            ins.append(self.const((RNG.standard_normal(cout) * 0.1).astype(np.float32)))
        return self.node("ConvTranspose", ins, name=name, group=group, kernel_shape=[k, k], strides=[2, 2])

    def gemm(self, x, k, n, trans_b=1, bias=True, name=None, **attrs) -> str:
        shape = (n, k) if trans_b else (k, n)
        w = self.const((RNG.standard_normal(shape) * 0.3).astype(np.float32))
        ins = [x, w]
        if bias:
            ins.append(self.const((RNG.standard_normal(n) * 0.1).astype(np.float32)))
        return self.node("Gemm", ins, name=name, transB=trans_b, **attrs)

    def matmul(self, x, k, n, bias=False, name=None) -> str:
        w = self.const((RNG.standard_normal((k, n)) * 0.3).astype(np.float32))
        out = self.node("MatMul", [x, w], name=name)
        if bias:
            out = self.node("Add", [out, self.const((RNG.standard_normal(n) * 0.1).astype(np.float32))])
        return out

    def bn(self, x, c, name=None, eps=1e-5) -> str:
        gamma = (RNG.uniform(0.5, 1.5, c)).astype(np.float32)
        beta = (RNG.standard_normal(c) * 0.1).astype(np.float32)
        mean = (RNG.standard_normal(c) * 0.1).astype(np.float32)
        var = (RNG.uniform(0.5, 2.0, c)).astype(np.float32)
        ins = [x] + [self.const(a) for a in (gamma, beta, mean, var)]
        return self.node("BatchNormalization", ins, name=name, epsilon=eps)

    def proto(self, outputs=None) -> onnx.ModelProto:
        outs = self.outputs or [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        graph = helper.make_graph(self.nodes, "g", self.inputs, outs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = self.ir_version
        # outputs declared without a shape: let shape inference fill them in, as exporters do
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
            for out, inf in zip(model.graph.output, inferred.graph.output):
                if not out.type.tensor_type.HasField("shape") and inf.type.tensor_type.HasField("shape"):
                    out.type.CopyFrom(inf.type)
        except Exception:  # noqa: BLE001 - some test models are deliberately odd
            pass
        return model

    def ir(self, outputs=None) -> ir.Model:
        return ir.serde.deserialize_model(self.proto(outputs))


def run(model, feeds: dict, optimize: bool = True) -> list[np.ndarray]:
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def x_data(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# --- HardSwish and HardSigmoid on the ties of their integer gates -----------------------------------------------
def gate_model() -> onnx.ModelProto:
    """x [N, 1, 4, 4] -> Conv 1x1 (w = 1) -> y; HardSwish(y) * HardSigmoid(y; 0.2, 0.5) (an older exporter's
    alpha) -> Conv 3x3 -> out. Constant-node weights, unnamed nodes, dynamic batch."""
    b = Builder(opset=17, constants=True, named=False)
    y = b.node("Conv", [b.input("x", ["N", 1, 4, 4]), b.const(np.ones((1, 1, 1, 1), np.float32))], kernel_shape=[1, 1])
    gated = b.node("Mul", [b.node("HardSwish", [y]), b.node("HardSigmoid", [y], alpha=0.2, beta=0.5)])
    return b.proto([b.conv(gated, 1, 2)])


def gate_calibration() -> dict:
    """x (and y = x) calibrated on [-3, 3] exactly."""
    x = np.concatenate([[-3, 3], np.random.default_rng(1).uniform(-3, 3, 62)])
    return {"x": x.astype(np.float32).reshape(4, 1, 4, 4)}


def gate_inputs() -> np.ndarray:
    """Every level of the [-3, 3] grid (x's and y's, :func:`gate_calibration`): its zero point is 128 (3 / scale
    = 127.5, rounded away from zero), so y + 3 = (k - 0.5) * scale and the HardSwish gate's quotient by its
    scale 6/255 is a tie or within a few ulps of one for every level."""
    from qtool.kernels import nudged_range

    _, _, scale, zp = nudged_range(np.float32(-3), np.float32(3), num_bits=8)
    assert zp == 128
    return ((np.arange(256) - zp).astype(np.float32) * np.float32(scale)).reshape(16, 1, 4, 4)


# --- a batch norm's dead channel: a folded bias that does not fit int32 at input_scale * weight_scale -----------
DEAD_CHANNEL = 1
DEAD_BIAS = 0.26


def dead_channel_model() -> tuple[onnx.ModelProto, dict]:
    """x [N, 3, 8, 8] -> Conv 3x3 (no bias) -> BatchNormalization -> Relu (graph output ``h``) -> Conv 1x1 -> ``y``,
    as PyTorch exports a Conv2d + BatchNorm2d stem (named initializers ``c1.weight``, ``bn1.running_var`` ...).
    Channel :data:`DEAD_CHANNEL` is one the training switched off, as in SINet's first Conv: weights ~1e-9 (weight
    decay), gamma -5e-5, running variance 3e-11, beta 0.26; its folded bias 0.26 needs a weight scale ~1e-13 at the
    input's scale, ~4e-12 of weights, so its int32 code at input_scale * weight_scale is ~2**38. Returns the model
    and 16 calibration inputs."""
    rng = np.random.default_rng(11)
    b = Builder(opset=13)
    x = b.input("x", ["N", 3, 8, 8])
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    w[DEAD_CHANNEL] *= 3e-9
    conv = b.node("Conv", [x, b.const(w, "c1.weight")], name="c1", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    stats = {"bn1.weight": [1.1, -5e-5, 0.9, 1.2], "bn1.bias": [0.05, DEAD_BIAS, -0.1, 0.2],
             "bn1.running_mean": [0.1, 2e-9, -0.2, 0.05], "bn1.running_var": [1.5, 3e-11, 0.8, 2.0]}
    bn = b.node("BatchNormalization", [conv] + [b.const(np.array(v, np.float32), k) for k, v in stats.items()],
                name="bn1", epsilon=1e-3)
    h = b.node("Relu", [bn], name="act1", outputs=["h"])
    w2 = (rng.standard_normal((2, 4, 1, 1)) * 0.5).astype(np.float32)
    y = b.node("Conv", [h, b.const(w2, "c2.weight"), b.const(np.array([0.1, -0.1], np.float32), "c2.bias")],
               name="c2", kernel_shape=[1, 1], outputs=["y"])
    return b.proto([h, y]), {"x": rng.standard_normal((16, 3, 8, 8)).astype(np.float32)}
