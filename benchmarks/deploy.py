"""Deployment benchmark: accuracy and one-thread latency of float, qtool int8 and onnxruntime int8.

For each model of the zoo (``benchmarks/zoo/models``, built by ``benchmarks/zoo/make_zoo.py``),
in one run:

- **float**: the exported model as is;
- **qtool**: ``qtool.rewrite_eval(model, out, calibration_data=<name>.calib.npz)`` (defaults:
  8-bit, per-channel weights);
- **ort**: onnxruntime's ``quant_pre_process`` then ``quantize_static`` (QDQ, per-channel,
  QUInt8 activations / QInt8 weights, MinMax) over the same calibration samples.

Reported per variant: the task metric on ``<name>.eval.npz``; the median one-thread latency
of ``session.run`` at batch 1 (``time.thread_time`` of the calling thread, sessions with
intra/inter-op threads 1, ORT_ENABLE_ALL, sequential execution; the three variants
interleaved round-robin, ``--rounds`` rounds after ``--warmup``), with the ratio to float;
and, from onnxruntime's optimized graph (``SessionOptions.optimized_model_filepath``), the
Conv/ConvTranspose/MatMul/Gemm layer ops left in float, those run by integer kernels and
the QuantizeLinear/DequantizeLinear nodes left.

    python benchmarks/deploy.py [--models vit,bert] [--rounds 200] [--markdown FILE] [--json FILE]

Needs no torch: the zoo is committed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ZOO = os.path.join(HERE, "zoo", "models")
sys.path.insert(0, os.path.join(HERE, "zoo"))
sys.path.insert(0, ROOT)  # this checkout's qtool
import zoo_metrics  # noqa: E402
# op types in onnxruntime's optimized graph (qtool's own check of what it writes uses the same sets)
from qtool.model.runtime_graph import FLOAT_LAYER_OPS  # noqa: E402
from qtool.model.runtime_graph import INTEGER_LAYER_OPS as INT_LAYER_OPS  # noqa: E402

VARIANTS = ("float", "qtool", "ort")

RNN_OPS = {"LSTM", "GRU", "RNN"}


def session_options(optimized_path: str | None = None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    return so


def median_seconds(sessions: dict, feeds: dict, rounds: int, warmup: int) -> dict[str, float]:
    """Median thread CPU seconds of one ``run`` of each session on ``feeds``, the sessions interleaved
    round-robin (``warmup`` untimed rounds first): the timing every zoo benchmark uses, and
    ``qtool simulate --latency``'s (``qtool.simulate.latency.interleaved_medians``)."""
    from qtool.simulate.latency import interleaved_medians

    return interleaved_medians({name: functools.partial(sess.run, None, feeds) for name, sess in sessions.items()},
                               rounds, warmup)


def graph_ops(path: str, float_layers: list | None = None) -> Counter:
    """Op types of a model (subgraphs included); names of float layer nodes go to ``float_layers``."""
    ops = Counter()

    def walk(graph):
        for node in graph.node:
            ops[node.op_type] += 1
            if float_layers is not None and node.op_type in FLOAT_LAYER_OPS:
                float_layers.append(node.name)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(onnx.load(path, load_external_data=False).graph)
    return ops


def layer_counts(ops: Counter) -> dict:
    return {
        "float_layers": sum(n for op, n in ops.items() if op in FLOAT_LAYER_OPS),
        "int_layers": sum(n for op, n in ops.items() if op in INT_LAYER_OPS),
        "float_rnn": sum(n for op, n in ops.items() if op in RNN_OPS),
        "weight_only": ops.get("MatMulNBits", 0),
        "qdq": ops.get("QuantizeLinear", 0) + ops.get("DequantizeLinear", 0),
    }


class _Reader:
    """CalibrationDataReader over the calib npz, batches of 16."""

    def __init__(self, calib: dict[str, np.ndarray], batch: int = 16):
        n = len(next(iter(calib.values())))
        self._batches = iter([{k: v[i:i + batch] for k, v in calib.items()} for i in range(0, n, batch)])

    def get_next(self):
        return next(self._batches, None)


def quantize_ort(model: str, out: str, calib, tmp: str) -> str:
    """onnxruntime's static QDQ quantization over ``calib`` (a dict of samples-first arrays, cut into batches
    of 16, or any ``CalibrationDataReader``); returns how the model was pre-processed."""
    import logging

    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    logging.getLogger().setLevel(logging.ERROR)  # quantize_static warns per LayerNorm weight (axis out of range)
    pre = os.path.join(tmp, "ort_pre.onnx")
    # quant_pre_process's symbolic shape inference fails on some exports (TorchScript's Resize with
    # scales in the U-Net and the YOLO neck): then without it, then on the model as exported, as a user would
    # (a failing symbolic shape inference leaves a <uuid>.data file in the current folder: run in tmp)
    how = "quant_pre_process"
    model = os.path.abspath(model)
    with contextlib.chdir(tmp):
        try:
            quant_pre_process(model, pre)
        except Exception:
            try:
                quant_pre_process(model, pre, skip_symbolic_shape=True)
                how = "quant_pre_process(skip_symbolic_shape=True)"
            except Exception:
                pre, how = model, "no pre-processing (quant_pre_process failed)"
    reader = calib if hasattr(calib, "get_next") else _Reader(calib)
    quantize_static(pre, out, reader, quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)
    return how


def quantize_qtool(model: str, out: str, calib_path: str) -> str:
    """qtool's deployable int8 model; returns its summary text."""
    import qtool

    return qtool.rewrite_eval(model, out, calibration_data=calib_path).format_text()


def run_all(sess: ort.InferenceSession, feeds: dict[str, np.ndarray], chunk: int = 64) -> np.ndarray:
    n = len(next(iter(feeds.values())))
    outs = [sess.run(None, {k: v[i:i + chunk] for k, v in feeds.items()})[0] for i in range(0, n, chunk)]
    return np.concatenate(outs)


def bench_model(name: str, rounds: int, warmup: int, tmp: str) -> dict:
    meta = json.load(open(os.path.join(ZOO, f"{name}.json")))
    model = os.path.join(ZOO, f"{name}.onnx")
    calib_path = os.path.join(ZOO, f"{name}.calib.npz")
    evals = np.load(os.path.join(ZOO, f"{name}.eval.npz"))
    calib = dict(np.load(calib_path))
    feeds = zoo_metrics.load_inputs(evals, meta)
    one = {k: v[:1] for k, v in feeds.items()}
    os.makedirs(tmp, exist_ok=True)
    paths = {"float": model, "qtool": os.path.join(tmp, f"{name}.qtool.onnx"), "ort": os.path.join(tmp, f"{name}.ort.onnx")}
    row = {"model": name, "task": meta["task"], "metric": meta["metric"], "variants": {}}

    for variant, quantize in (("qtool", lambda: quantize_qtool(model, paths["qtool"], calib_path)),
                              ("ort", lambda: quantize_ort(model, paths["ort"], calib, tmp))):
        t = time.perf_counter()
        try:
            note = quantize()
            row["variants"][variant] = {"quantize_s": round(time.perf_counter() - t, 2)}
            row["variants"][variant]["preprocess" if variant == "ort" else "summary"] = note
        except Exception as e:  # a failing tool is a result, not the end of the benchmark
            row["variants"][variant] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            paths.pop(variant)
    row["variants"]["float"] = {}

    sessions = {}
    for variant, path in paths.items():
        info = row["variants"][variant]
        opt = os.path.join(tmp, f"{name}.{variant}.optimized.onnx")
        try:
            ort.InferenceSession(path, session_options(opt), providers=["CPUExecutionProvider"])
            names = []
            ops = graph_ops(opt, names)
            info.update(layer_counts(ops))
            info["float_layer_nodes"] = names
            info["optimized_ops"] = dict(sorted(ops.items()))
            sess = ort.InferenceSession(path, session_options(), providers=["CPUExecutionProvider"])
            info["metrics"] = zoo_metrics.evaluate(meta, run_all(sess, feeds), evals)
            sessions[variant] = sess
        except Exception as e:
            info["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"

    time_variants(row, sessions, one, rounds, warmup)
    return row


def time_variants(row: dict, sessions: dict, feeds: dict, rounds: int, warmup: int) -> None:
    """Each session's one-thread latency (``median_seconds``) into ``row["variants"][name]``: ``latency_ms``, and
    ``ratio`` against the ``float`` variant's."""
    times = median_seconds(sessions, feeds, rounds, warmup)
    for variant, seconds in times.items():
        row["variants"][variant]["latency_ms"] = 1000 * seconds
    base = row["variants"]["float"].get("latency_ms")
    for variant in times:
        if base:
            row["variants"][variant]["ratio"] = row["variants"][variant]["latency_ms"] / base


def fmt_table(rows: list[dict]) -> str:
    head = ("| model | metric | float | qtool | ort | float ms | qtool ms (x float) | ort ms (x float) "
            "| float layers left: float / qtool / ort | int layers: qtool / ort | Q+DQ left: qtool / ort |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        v = row["variants"]
        met = row["metric"]

        def acc(name):
            x = v.get(name, {})
            return "error" if "error" in x and "metrics" not in x else f"{x['metrics'][met]:.1f}"

        def lat(name):
            x = v.get(name, {})
            if "latency_ms" not in x:
                return "error"
            return f"{x['latency_ms']:.2f}" + (f" ({x['ratio']:.2f}x)" if name != "float" else "")

        def cnt(name, key):
            x = v.get(name, {})
            if key not in x:
                return "-"
            if key == "float_layers" and x.get("weight_only"):
                return f"{x[key]} ({x['weight_only']} MatMulNBits)"
            return str(x[key])

        fl = " / ".join(cnt(n, "float_layers") for n in VARIANTS)
        rnn = v["float"].get("float_rnn", 0)
        if rnn:
            fl += f" (+{rnn} RNN float in all: " + " / ".join(cnt(n, "float_rnn") for n in VARIANTS) + ")"
        lines.append(f"| {row['model']} | {met} | {acc('float')} | {acc('qtool')} | {acc('ort')} | {lat('float')} "
                     f"| {lat('qtool')} | {lat('ort')} | {fl} | {cnt('qtool', 'int_layers')} / {cnt('ort', 'int_layers')} "
                     f"| {cnt('qtool', 'qdq')} / {cnt('ort', 'qdq')} |")
    errors = [f"- {row['model']} {n}: {x['error']}" for row in rows for n, x in row["variants"].items() if "error" in x]
    errors += [f"- {row['model']} ort: {row['variants']['ort']['preprocess']}" for row in rows
               if row["variants"].get("ort", {}).get("preprocess", "quant_pre_process") != "quant_pre_process"]
    notes = ["", "Float layers: Conv/ConvTranspose/MatMul/Gemm (and their fused forms) left in float in onnxruntime's "
             "optimized graph; MatMulNBits (int8 weights, float activations: what onnxruntime makes of a MatMul whose "
             "weight has a DequantizeLinear but whose input has none) counts as float. RNN: LSTM/GRU nodes, float in "
             "every variant under QDQ."]
    return "\n".join(lines + notes + ([""] + errors if errors else []))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--zoo", default=ZOO)
    zoo = pre.parse_known_args(argv)[0].zoo
    globals()["ZOO"] = zoo
    files = set(os.listdir(zoo)) if os.path.isdir(zoo) else set()
    names = sorted(f[:-5] for f in files if f.endswith(".json")  # a model: its JSON, ONNX file and data (not --json's)
                   and {f[:-5] + ext for ext in (".onnx", ".calib.npz", ".eval.npz")} <= files)
    ap.add_argument("--zoo", default=ZOO, help="folder of <name>.onnx/.json/.calib.npz/.eval.npz (default: the committed zoo)")
    ap.add_argument("--models", default=",".join(names), help="comma-separated subset (default: all)")
    ap.add_argument("--rounds", type=int, default=200, help="timed rounds per variant (default 200)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed rounds first (default 20)")
    ap.add_argument("--markdown", help="also write the table (and the environment) to this markdown file")
    ap.add_argument("--json", help="also write all results (op counts included) to this JSON file")
    ap.add_argument("--keep", help="keep the quantized and optimized models in this folder")
    args = ap.parse_args(argv)
    chosen = [m for m in args.models.split(",") if m]
    unknown = [m for m in chosen if m not in names]
    if unknown:
        print(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(names)}", file=sys.stderr)
        return 2
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deploy_") as scratch:
        for name in chosen:
            t = time.perf_counter()
            rows.append(bench_model(name, args.rounds, args.warmup, os.path.join(args.keep or scratch, name)))
            print(f"[{name}] done in {time.perf_counter() - t:.0f}s", file=sys.stderr, flush=True)
    table = fmt_table(rows)
    print(table)
    import platform

    import qtool

    env = (f"onnxruntime {ort.__version__}, onnx {onnx.__version__}, numpy {np.__version__}, "
           f"python {platform.python_version()}, {platform.machine()}; qtool from {os.path.dirname(qtool.__file__)}; "
           f"{args.rounds} rounds after {args.warmup} warm-up, batch 1, one thread, median of time.thread_time; "
           f"total {time.perf_counter() - t0:.0f}s")
    print(env)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"{table}\n\n{env}\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
