"""The zoo's LSTM tagger in one run: float, qtool (LSTM -> DynamicQuantizeLSTM), qtool --float-rnn,
onnxruntime ``quantize_static`` (QDQ) and onnxruntime ``quantize_dynamic`` (its DynamicQuantizeLSTM).

Same method as ``benchmarks/deploy.py`` (whose functions it reuses): frame accuracy on
``lstm.eval.npz``, one-thread latency at batch 1 (median of ``time.thread_time`` over ``--rounds``
rounds, the variants interleaved round-robin), op counts of onnxruntime's optimized graph.

    python benchmarks/zoo/lstm_dynamic.py [--rounds 300] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/: deploy.py
import deploy  # noqa: E402

import qtool  # noqa: E402  (this checkout's: deploy.py put it first on sys.path)
from qtool.config import QuantConfig  # noqa: E402


def quantize_dynamic_ort(model: str, out: str) -> None:
    """onnxruntime's dynamic quantization with its defaults (int8 weights; LSTM -> DynamicQuantizeLSTM,
    MatMul -> DynamicQuantizeMatMul)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(model, out, weight_type=QuantType.QInt8)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    name = "lstm"
    meta = json.load(open(os.path.join(deploy.ZOO, f"{name}.json")))
    model = os.path.join(deploy.ZOO, f"{name}.onnx")
    calib_path = os.path.join(deploy.ZOO, f"{name}.calib.npz")
    evals = np.load(os.path.join(deploy.ZOO, f"{name}.eval.npz"))
    feeds = deploy.zoo_metrics.load_inputs(evals, meta)
    one = {k: v[:1] for k, v in feeds.items()}
    rows = {}
    with tempfile.TemporaryDirectory(prefix="lstm_dynamic_") as tmp:
        paths = {"float": model}
        makers = {
            "qtool": lambda p: qtool.rewrite_eval(model, p, calibration_data=calib_path),
            "qtool --float-rnn": lambda p: qtool.rewrite_eval(model, p, calibration_data=calib_path,
                                                              quant=QuantConfig(float_rnn=True)),
            "ort static": lambda p: deploy.quantize_ort(model, p, dict(np.load(calib_path)), tmp),
            "ort dynamic": lambda p: quantize_dynamic_ort(model, p),
        }
        for i, (variant, make) in enumerate(makers.items()):
            paths[variant] = os.path.join(tmp, f"{variant.replace(' ', '_')}.onnx")
            make(paths[variant])
        sessions = {}
        for i, (variant, path) in enumerate(paths.items()):
            opt = os.path.join(tmp, f"{i}.optimized.onnx")
            ort.InferenceSession(path, deploy.session_options(opt), providers=["CPUExecutionProvider"])
            ops = deploy.graph_ops(opt)
            sess = ort.InferenceSession(path, deploy.session_options(), providers=["CPUExecutionProvider"])
            metric = deploy.zoo_metrics.evaluate(meta, deploy.run_all(sess, feeds), evals)[meta["metric"]]
            rows[variant] = {"metric": metric, "ops": {k: ops[k] for k in sorted(ops) if k in deploy.RNN_OPS
                                                       or k in deploy.INT_LAYER_OPS or k in deploy.FLOAT_LAYER_OPS
                                                       or k in ("QuantizeLinear", "DequantizeLinear")}}
            sessions[variant] = sess
        times = deploy.median_seconds(sessions, one, args.rounds, args.warmup)
    base = times["float"]
    print(f"| variant | {meta['metric']} | ms | x float | optimized graph |")
    print("|---|---|---|---|---|")
    for variant, row in rows.items():
        row["latency_ms"] = 1000 * times[variant]
        row["ratio"] = times[variant] / base
        ops = ", ".join(f"{k} x{n}" for k, n in row["ops"].items())
        print(f"| {variant} | {row['metric']:.2f} | {row['latency_ms']:.3f} | {row['ratio']:.2f}x | {ops} |")
    print(f"onnxruntime {ort.__version__}; {args.rounds} rounds after {args.warmup}, batch 1, one thread, "
          "median of time.thread_time, variants interleaved")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
