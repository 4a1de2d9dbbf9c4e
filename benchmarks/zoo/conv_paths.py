"""Which convolutions onnxruntime runs in its fast integer kernels, and what each costs.

    python benchmarks/zoo/conv_paths.py efficientnet [--int8 INT8.onnx] [--runs 30]
    python benchmarks/zoo/conv_paths.py --depthwise [--runs 40]

**Per model** (a zoo name): the float model and qtool's int8 model (``rewrite_eval`` with the
defaults, or ``--int8``) are run under onnxruntime's profiler (one thread, batch 1, the first eval
sample); each Conv is listed with its weight shape and group, its median kernel time in both models
and whether onnxruntime 1.32's fast "symmetric" integer kernel takes it (MLAS
``MlasConvSymPackWSize`` on x86-64: int8 weights of zero point 0, and a depthwise Conv with a
multiple of 16 channels, a group-1 Conv with input channels a multiple of 4 and at least 16 output
channels, a multiple of 8). Then the share of each op type in the int8 run.

**--depthwise**: one QDQ depthwise Conv (Q -> DQ -> Conv -> Q -> DQ, int8 symmetric per-channel
weights) per channel count, the QLinearConv's median kernel time: 72 / 88 / 120 channels against
80 / 96 / 128 (``benchmarks/zoo/FINDINGS.md`` section 10).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # this checkout's qtool
import zoo_metrics  # noqa: E402

ZOO = os.path.join(HERE, "models")


def profile(path: str, feeds: dict, runs: int) -> tuple[dict, list, dict]:
    """Median kernel microseconds per node, the nodes in run order, and (op type, input shapes) per node."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "profile")
    so.log_severity_level = 3
    session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        session.run(None, feeds)
    times, info = collections.defaultdict(list), {}
    for event in json.load(open(session.end_profiling())):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            times[event["name"]].append(event["dur"])
            info.setdefault(event["name"], (event["args"]["op_name"],
                                            [list(s.values())[0] for s in event["args"].get("input_type_shape", [])]))
    return {k: float(np.median(v)) for k, v in times.items()}, list(info), info


def fast_path(weight_shape, group: int) -> bool:
    if group > 1:
        return weight_shape[0] % 16 == 0
    return weight_shape[1] % 4 == 0 and weight_shape[0] >= 16 and weight_shape[0] % 8 == 0


def int8_convs(path: str) -> list[tuple[str, list, int]]:
    """(name, stored weight shape, group) of each Conv of a QDQ model, in graph order."""
    g = onnx.load(path).graph
    inits = {i.name: i for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    out = []
    for n in g.node:
        if n.op_type == "Conv":
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            out.append((n.name, list(inits[producer[n.input[1]].input[0]].dims), group))
    return out


def per_model(name: str, int8: str | None, runs: int) -> None:
    meta = json.load(open(os.path.join(ZOO, f"{name}.json")))
    feeds = {k: v[:1] for k, v in zoo_metrics.load_inputs(np.load(os.path.join(ZOO, f"{name}.eval.npz")), meta).items()}
    model = os.path.join(ZOO, f"{name}.onnx")
    if int8 is None:
        import qtool

        int8 = os.path.join(tempfile.mkdtemp(), f"{name}.int8.onnx")
        qtool.rewrite_eval(model, int8, calibration_data=os.path.join(ZOO, f"{name}.calib.npz"))
    f_time, f_order, f_info = profile(model, feeds, runs)
    q_time, q_order, q_info = profile(int8, feeds, runs)
    f_convs = [k for k in f_order if f_info[k][0] in ("Conv", "FusedConv")]
    q_convs = [k for k in q_order if q_info[k][0] == "QLinearConv"]
    print(f"{name}: {len(f_convs)} float convs, {len(q_convs)} QLinearConv (matched in run order)")
    print("| conv | weight (stored) | group | fast int8 kernel | float us | int8 us | int8 / float |")
    print("|---|---|---|---|---|---|---|")
    for (conv, shape, group), f, q in zip(int8_convs(int8), f_convs, q_convs):
        print(f"| {conv} | {shape} | {group} | {'yes' if fast_path(shape, group) else 'NO'} | {f_time[f]:.0f} | "
              f"{q_time[q]:.0f} | {q_time[q] / f_time[f]:.2f} |")
    by_op = collections.Counter()
    for k, t in q_time.items():
        by_op[q_info[k][0]] += t
    total = sum(by_op.values())
    print(f"int8 run: {total / 1000:.2f} ms (float {sum(f_time.values()) / 1000:.2f} ms) of kernel time")
    for op, t in by_op.most_common():
        print(f"  {op:28s} {t / 1000:6.3f} ms {100 * t / total:5.1f} %")


def depthwise_model(channels: int, size: int, k: int, stride: int) -> str:
    rng = np.random.default_rng(0)
    c = channels
    inits = [numpy_helper.from_array(rng.integers(-127, 128, size=(c, 1, k, k)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.full(c, 0.01, np.float32), "ws"),
             numpy_helper.from_array(np.zeros(c, np.int8), "wz"),
             numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
             numpy_helper.from_array(np.array(128, np.uint8), "xz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             helper.make_node("Conv", ["xd", "w"], ["c"], group=c, kernel_shape=[k, k], strides=[stride, stride],
                              pads=[k // 2] * 4),
             helper.make_node("QuantizeLinear", ["c", "xs", "xz"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "xs", "xz"], ["y"])]
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = os.path.join(tempfile.mkdtemp(), "dw.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def depthwise_table(runs: int) -> None:
    print("| channels | input | kernel, stride | QLinearConv us | fast int8 kernel |")
    print("|---|---|---|---|---|")
    for c, size, k, stride in [(72, 56, 3, 1), (80, 56, 3, 1), (88, 28, 3, 1), (96, 28, 3, 1), (120, 28, 5, 1),
                               (128, 28, 5, 1)]:
        x = np.random.default_rng(1).normal(size=(1, c, size, size)).astype(np.float32)
        times, _, info = profile(depthwise_model(c, size, k, stride), {"x": x}, runs)
        t = sum(v for n, v in times.items() if info[n][0] == "QLinearConv")
        print(f"| {c} | {size}x{size} | {k}x{k}, {stride} | {t:.0f} | {'yes' if c % 16 == 0 else 'NO'} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="zoo model name")
    ap.add_argument("--int8", help="the int8 QDQ model (default: qtool rewrite_eval with the defaults)")
    ap.add_argument("--depthwise", action="store_true", help="the isolated depthwise channel-count table")
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args(argv)
    if args.depthwise:
        depthwise_table(args.runs)
    if args.model:
        per_model(args.model, args.int8, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
