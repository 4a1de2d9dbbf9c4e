"""Micro-models of the OCR recognizer's int8 nodes that are slower than their float counterparts.

    python benchmarks/zoo/ocr_micro.py [--rounds 400]

Each case is a few-node model at the zoo recognizer's shapes, float against QDQ (8-bit, what
qtool writes), timed like ``deploy.py`` (one thread, batch 1, interleaved, median thread time) with
onnxruntime's optimized op list printed, so the number is the kernel's and not the placement's
(``benchmarks/zoo/FINDINGS.md`` section 9):

- ``first conv``: 1 -> 16 channels, 3x3 stride 2 on 1 x 32 x 128 (onnxruntime's NHWC QLinearConv
  with one input channel), with per-tensor weights, input zero point 128 and int8 activations;
- ``AveragePool``: kernel [2, 1] on 128 x 2 x 32 (QLinearAveragePool);
- ``HardSwish ops``: the elementwise kernels a HardSwish costs in int8 on 64 x 8 x 32 (the float
  model fuses HardSwish into its convolution): a Q/DQ pair alone, then with QLinearAdd (scalar),
  QLinearMul, and the lookup-table kernels QLinearLeakyRelu and QLinearSigmoid for comparison;
- qtool's exact forms of the first two (section 11): the conv on the input's SpaceToDepth (a 2x2
  stride-1 conv with 4 input channels) and the pool as a depthwise conv with weights 1/2.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from deploy import median_seconds, session_options  # noqa: E402

from qtool.onnx_rewrite.kernel_forms import space_to_depth_conv  # noqa: E402


def scalar(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.array(value, dtype), name)


def qdq(x, scale, zero, tag):
    """``Q -> DQ`` of ``x``; returns the nodes and the dequantized name."""
    return [helper.make_node("QuantizeLinear", [x, scale, zero], [f"{tag}_q"]),
            helper.make_node("DequantizeLinear", [f"{tag}_q", scale, zero], [f"{tag}_d"])], f"{tag}_d"


def model(nodes, inits, shape, out):
    nodes = nodes + [helper.make_node("Identity", [out], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def first_conv(quant, per_channel=True, x_zero=0, act=np.uint8, space_to_depth=False):
    rng = np.random.default_rng(0)
    w = (rng.normal(size=(16, 1, 3, 3)) * 0.3).astype(np.float32)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    if not quant:
        return model([helper.make_node("Conv", ["x", "w"], ["c"], **attrs), helper.make_node("HardSwish", ["c"], ["h"])],
                     [numpy_helper.from_array(w, "w")], [1, 1, 32, 128], "h")
    ws = np.abs(w).reshape(16, -1).max(1) / 127 if per_channel else np.full(16, np.abs(w).max() / 127)
    wq = np.clip(np.round(w / ws[:, None, None, None]), -127, 127).astype(np.int8)
    inits = [numpy_helper.from_array(wq, "wq"),
             numpy_helper.from_array(ws.astype(np.float32) if per_channel else np.array(ws[0], np.float32), "ws"),
             numpy_helper.from_array(np.zeros(16 if per_channel else (), np.int8), "wz"),
             scalar("xs", 1 / 255), scalar("xz", x_zero, act), scalar("cs", 0.05), scalar("cz", 60 if act == np.uint8 else -68, act)]
    nodes, x = qdq("x", "xs", "xz", "in")
    if space_to_depth:  # qtool's form (kernel_forms.space_to_depth_conv): SpaceToDepth codes, 2x2 stride 1
        wq, pads = space_to_depth_conv(wq, attrs["pads"], (32, 128))
        inits[0] = numpy_helper.from_array(wq, "wq")
        attrs = dict(kernel_shape=list(wq.shape[2:]), strides=[1, 1], pads=pads)
        nodes = [nodes[0], helper.make_node("SpaceToDepth", ["in_q"], ["in_s2d"], blocksize=2),
                 helper.make_node("DequantizeLinear", ["in_s2d", "xs", "xz"], ["in_s2d_d"])]
        x = "in_s2d_d"
    nodes += [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
              helper.make_node("Conv", [x, "wd"], ["c"], **attrs)]
    more, out = qdq("c", "cs", "cz", "out")
    return model(nodes + more, inits, [1, 1, 32, 128], out)


def average_pool(kind):
    attrs = dict(kernel_shape=[2, 1], strides=[2, 1])
    if kind == "float":
        return model([helper.make_node("AveragePool", ["x"], ["p"], **attrs)], [], [1, 128, 2, 32], "p")
    inits = [scalar("s", 0.03), scalar("z", 13, np.uint8), scalar("ps", 0.027), scalar("pz", 14, np.uint8)]
    nodes, x = qdq("x", "s", "z", "in")
    if kind == "qdq":
        return model(nodes, inits, [1, 128, 2, 32], x)
    more, out = qdq("p", "ps", "pz", "out")
    if kind == "depthwise":  # qtool's form (kernel_forms.pools_as_depthwise): weights 1/2 (code 1, scale 0.5)
        inits += [numpy_helper.from_array(np.ones((128, 1, 2, 1), np.int8), "wq"), scalar("ws", 0.5),
                  scalar("wz", 0, np.int8)]
        pool = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]),
                helper.make_node("Conv", [x, "wd"], ["p"], group=128, **attrs)]
    else:
        pool = [helper.make_node("AveragePool", [x], ["p"], **attrs)]
    return model(nodes + pool + more, inits, [1, 128, 2, 32], out)


def hardswish_op(kind):
    inits = [scalar("s", 0.03), scalar("z", 100, np.uint8), scalar("gs", 6 / 255), scalar("gz", 0, np.uint8),
             scalar("ps", 1 / 255), scalar("three", 3.0), scalar("one", 1, np.uint8), scalar("os", 0.02),
             scalar("oz", 10, np.uint8)]
    nodes, x = qdq("x", "s", "z", "in")
    if kind == "float HardSwish":
        return model([helper.make_node("HardSwish", ["x"], ["h"])], [], [1, 64, 8, 32], "h")
    if kind == "Q/DQ only":
        return model(nodes, inits, [1, 64, 8, 32], x)
    op, scale = {"+ QLinearAdd (scalar)": (helper.make_node("Add", [x, "c3"], ["t"]), "gs"),
                 "+ QLinearMul": (helper.make_node("Mul", [x, x], ["t"]), "os"),
                 "+ QLinearLeakyRelu": (helper.make_node("LeakyRelu", [x], ["t"], alpha=0.5), "gs"),
                 "+ QLinearSigmoid": (helper.make_node("Sigmoid", [x], ["t"]), "ps")}[kind]
    if op.op_type == "Add":  # the constant 3 through its own DequantizeLinear, as qtool writes it
        nodes.append(helper.make_node("DequantizeLinear", ["one", "three", "gz"], ["c3"]))
    nodes.append(op)
    more, out = qdq("t", scale, "gz" if scale != "os" else "oz", "out")
    return model(nodes + more, inits, [1, 64, 8, 32], out)


CASES = {
    "first conv": ({"float Conv + HardSwish": first_conv(False), "int8": first_conv(True),
                    "int8, per-tensor weights": first_conv(True, per_channel=False),
                    "int8, input zero point 128": first_conv(True, x_zero=128),
                    "int8 activations (s8s8)": first_conv(True, act=np.int8),
                    "int8 on SpaceToDepth (2x2, 4 ch)": first_conv(True, space_to_depth=True)}, [1, 1, 32, 128]),
    "AveragePool [2, 1]": ({"float": average_pool("float"), "Q/DQ only": average_pool("qdq"),
                            "int8 (Q, QLinearAveragePool, DQ)": average_pool("int8"),
                            "int8 depthwise Conv, weights 1/2": average_pool("depthwise")}, [1, 128, 2, 32]),
    "HardSwish ops (64 x 8 x 32)": ({k: hardswish_op(k) for k in (
        "float HardSwish", "Q/DQ only", "+ QLinearAdd (scalar)", "+ QLinearMul", "+ QLinearLeakyRelu",
        "+ QLinearSigmoid")}, [1, 64, 8, 32]),
}


def optimized_ops(proto: bytes) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "opt.onnx")
        ort.InferenceSession(proto, session_options(path), providers=["CPUExecutionProvider"])
        return [n.op_type for n in onnx.load(path).graph.node]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=400)
    args = ap.parse_args(argv)
    for case, (models, shape) in CASES.items():
        x = {"x": np.random.default_rng(1).normal(size=shape).astype(np.float32)}
        sessions = {k: ort.InferenceSession(m, session_options(), providers=["CPUExecutionProvider"]) for k, m in models.items()}
        times = median_seconds(sessions, x, args.rounds, 20)
        print(f"{case}:")
        for name, seconds in times.items():
            print(f"  {1e6 * seconds:7.1f} us  {name:34s} {' '.join(optimized_ops(models[name]))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
