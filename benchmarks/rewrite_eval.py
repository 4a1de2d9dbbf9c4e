"""Benchmark: ``qtool rewrite-eval`` against onnxruntime's static quantization.

Builds a ResNet-50-shaped model (bottleneck blocks [3, 4, 6, 3], every Conv
followed by an unfolded BatchNormalization, random weights, about 100 MB,
opset 13, dynamic batch) and 16 calibration samples in a temporary folder,
then times, as whole processes in the same run:

- qtool:        ``qtool rewrite-eval model.onnx -o q.onnx --data calib.npz``
- onnxruntime:  ``quant_pre_process`` then ``quantize_static`` (MinMax,
                per-channel, QDQ, uint8 activations / int8 weights), one batch of 16

Each tool runs ``--repeats`` times (alternating); the median wall time and
the peak resident memory (``ru_maxrss`` of the process) are reported with
the ratios qtool / onnxruntime, with the CPU time (user + sys), which other
work on a shared machine disturbs less than wall time. qtool runs once before timing so that numba's
on-disk cache is warm, as for any second use of the CLI.

    python benchmarks/rewrite_eval.py [--repeats 3] [--samples 16] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

# Runs one command and prints its peak RSS (KiB) and wall time as JSON: a fresh
# wrapper per measurement, so ru_maxrss covers exactly that one child process.
_WRAPPER = textwrap.dedent(
    """
    import json, resource, subprocess, sys, time
    t = time.perf_counter()
    proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"rc": proc.returncode, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
                      "rss_kib": usage.ru_maxrss, "stderr": proc.stderr[-2000:]}))
    """
)

_ORT_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model, pre, out, calib = sys.argv[1:5]
    quant_pre_process(model, pre)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"input": np.load(calib)["input"]}])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(pre, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)
    """
)


def build_resnet50(path: str, seed: int = 0) -> int:
    """A ResNet-50-shaped model with unfolded batch norms; returns its size in bytes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    counter = {"n": 0}

    def uid(base):
        counter["n"] += 1
        return f"{base}_{counter['n']}"

    def const(array, base):
        name = uid(base)
        inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv_bn(x, cin, cout, k, stride=1, relu=True, scope="conv"):
        std = np.sqrt(2.0 / (cin * k * k))
        w = const(rng.standard_normal((cout, cin, k, k)) * std, f"{scope}.weight")
        y = uid(f"{scope}/conv_out")
        nodes.append(helper.make_node("Conv", [x, w], [y], name=f"{scope}/Conv", kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4))
        gamma = const(rng.uniform(0.3, 0.6, cout), f"{scope}.bn.weight")
        beta = const(rng.standard_normal(cout) * 0.05, f"{scope}.bn.bias")
        mean = const(rng.standard_normal(cout) * 0.05, f"{scope}.bn.running_mean")
        var = const(rng.uniform(0.8, 1.2, cout), f"{scope}.bn.running_var")
        z = uid(f"{scope}/bn_out")
        nodes.append(helper.make_node("BatchNormalization", [y, gamma, beta, mean, var], [z], name=f"{scope}/bn",
                                      epsilon=1e-5))
        if not relu:
            return z
        r = uid(f"{scope}/relu_out")
        nodes.append(helper.make_node("Relu", [z], [r], name=f"{scope}/relu"))
        return r

    x = conv_bn("input", 3, 64, 7, stride=2, scope="stem")
    p = uid("pool_out")
    nodes.append(helper.make_node("MaxPool", [x], [p], name="stem/maxpool", kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1]))
    x, cin = p, 64
    for stage, (blocks, width) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512]), start=1):
        for b in range(blocks):
            scope = f"layer{stage}.{b}"
            stride = 2 if (b == 0 and stage > 1) else 1
            out_c = width * 4
            h = conv_bn(x, cin, width, 1, scope=f"{scope}/conv1")
            h = conv_bn(h, width, width, 3, stride=stride, scope=f"{scope}/conv2")
            h = conv_bn(h, width, out_c, 1, relu=False, scope=f"{scope}/conv3")
            short = x
            if b == 0:
                short = conv_bn(x, cin, out_c, 1, stride=stride, relu=False, scope=f"{scope}/downsample")
            s = uid(f"{scope}/add_out")
            nodes.append(helper.make_node("Add", [h, short], [s], name=f"{scope}/add"))
            r = uid(f"{scope}/relu_out")
            nodes.append(helper.make_node("Relu", [s], [r], name=f"{scope}/relu"))
            x, cin = r, out_c
    g = uid("gap_out")
    nodes.append(helper.make_node("GlobalAveragePool", [x], [g], name="gap"))
    f = uid("flat_out")
    nodes.append(helper.make_node("Flatten", [g], [f], name="flatten"))
    w = const(rng.standard_normal((1000, 2048)) * np.sqrt(1.0 / 2048), "fc.weight")
    bias = const(rng.standard_normal(1000) * 0.01, "fc.bias")
    nodes.append(helper.make_node("Gemm", [f, w, bias], ["logits"], name="fc/Gemm", transB=1))
    graph = helper.make_graph(
        nodes, "resnet50",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1000])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return os.path.getsize(path)


def measure(cmd: list[str], src: str | None = None) -> dict:
    """Run ``cmd``; ``src``: a qtool checkout to import qtool from (another version, same run)."""
    env = dict(os.environ, PYTHONPATH=src) if src else None
    out = subprocess.run([sys.executable, "-c", _WRAPPER, *cmd], capture_output=True, text=True, check=True,
                         env=env, cwd=src)
    result = json.loads(out.stdout)
    if result["rc"] != 0:
        raise SystemExit(f"command failed ({result['rc']}): {' '.join(cmd)}\n{result['stderr']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--keep", default=None, help="work in this folder and keep the files")
    parser.add_argument("--also", default=None, metavar="DIR",
                        help="also time the qtool of another checkout (e.g. the previous commit), interleaved")
    args = parser.parse_args()

    work = args.keep or tempfile.mkdtemp(prefix="qtool-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        model = os.path.join(work, "resnet50.onnx")
        calib = os.path.join(work, "calib.npz")
        t = time.perf_counter()
        size = build_resnet50(model)
        rng = np.random.default_rng(1)
        np.savez(calib, input=rng.standard_normal((args.samples, 3, 224, 224)).astype(np.float32))
        print(f"model: {size / 1e6:.1f} MB, {args.samples} calibration samples (built in {time.perf_counter() - t:.1f} s)")
        ort_script = os.path.join(work, "ort_quantize.py")
        with open(ort_script, "w") as f:
            f.write(_ORT_SCRIPT)

        qtool_cmd = [sys.executable, "-m", "qtool", "rewrite-eval", model, "-o", os.path.join(work, "q_qtool.onnx"),
                     "--data", calib]  # default batch size (16)
        ort_cmd = [sys.executable, ort_script, model, os.path.join(work, "pre.onnx"),
                   os.path.join(work, "q_ort.onnx"), calib]
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        measure(qtool_cmd, here)  # warm numba's cache
        runs = {"qtool": [], "onnxruntime": []}
        if args.also:
            also_cmd = [a if a != "--data" else "--calibration-data" for a in qtool_cmd]  # the 0.1 spelling
            measure(also_cmd, os.path.abspath(args.also))
            runs["qtool@also"] = []
        for _ in range(args.repeats):
            runs["qtool"].append(measure(qtool_cmd, here))
            runs["onnxruntime"].append(measure(ort_cmd))
            if args.also:
                runs["qtool@also"].append(measure(also_cmd, os.path.abspath(args.also)))

        def summary(name):
            walls = [r["wall"] for r in runs[name]]
            cpus = [r["cpu"] for r in runs[name]]
            rss = max(r["rss_kib"] for r in runs[name]) / 1024
            return statistics.median(walls), min(walls), statistics.median(cpus), rss

        q_wall, q_best, q_cpu, q_rss = summary("qtool")
        o_wall, o_best, o_cpu, o_rss = summary("onnxruntime")
        print(f"{'':14}{'median s':>10}{'best s':>10}{'cpu s':>10}{'peak MiB':>10}")
        print(f"{'qtool':14}{q_wall:10.2f}{q_best:10.2f}{q_cpu:10.2f}{q_rss:10.0f}")
        print(f"{'onnxruntime':14}{o_wall:10.2f}{o_best:10.2f}{o_cpu:10.2f}{o_rss:10.0f}")
        print(f"time ratio qtool/onnxruntime:   {q_wall / o_wall:.3f} median, {q_best / o_best:.3f} best, "
              f"{q_cpu / o_cpu:.3f} cpu  (goal <= 0.25)")
        print(f"memory ratio qtool/onnxruntime: {q_rss / o_rss:.3f}  (goal <= 1.0)")
        if args.also:
            a_wall, a_best, a_cpu, a_rss = summary("qtool@also")
            print(f"{'qtool@' + args.also:14}{a_wall:10.2f}{a_best:10.2f}{a_cpu:10.2f}{a_rss:10.0f}")
            print(f"the other checkout / onnxruntime: {a_wall / o_wall:.3f} median, {a_cpu / o_cpu:.3f} cpu, "
                  f"memory {a_rss / o_rss:.3f}")
        if os.getloadavg()[0] > (os.cpu_count() or 1):
            print(f"note: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: other work shares the machine")
        for name in ("q_qtool.onnx", "q_ort.onnx"):
            print(f"{name}: {os.path.getsize(os.path.join(work, name)) / 1e6:.1f} MB")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
