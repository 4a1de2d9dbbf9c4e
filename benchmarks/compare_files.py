"""Latency and accuracy of model files already written (float, two qtool builds, onnxruntime's tool), in one run.

    python benchmarks/compare_files.py --inputs zoo:bert float=F main=A branch=B ort=C [--rounds 200] [--repeat 3]
    python benchmarks/compare_files.py --inputs calib:DIR/bert.calib.npz float=F main=A branch=B

For comparing two qtool builds (a change against main) where ``deploy.py`` / ``dynamo_deploy.py`` quantize with
one. ``--inputs zoo:NAME``: the zoo's eval samples and task metric (``benchmarks/zoo/models``); ``calib:PATH``:
held-out inputs drawn like those calibration samples (``dynamo_deploy.eval_inputs``), no task metric. Per
variant: the metric, SQNR and top-1 agreement of its output against the ``float`` variant's, the ops of
onnxruntime's optimized graph that differ between variants, and the one-thread batch-1 latency (median
``time.thread_time``, the variants interleaved round-robin, ``deploy.median_seconds``), ``--repeat`` times.
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
sys.path.insert(0, HERE)
import deploy  # noqa: E402
import dynamo_deploy  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", required=True, help="zoo:NAME or calib:PATH.npz")
    ap.add_argument("variants", nargs="+", help="NAME=PATH; the first is the reference (float)")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    paths = dict(v.split("=", 1) for v in args.variants)
    kind, _, where = args.inputs.partition(":")
    meta = evals = None
    if kind == "zoo":
        meta = json.load(open(os.path.join(deploy.ZOO, f"{where}.json")))
        evals = np.load(os.path.join(deploy.ZOO, f"{where}.eval.npz"))
        feeds = deploy.zoo_metrics.load_inputs(evals, meta)
    else:
        feeds = dynamo_deploy.eval_inputs(dict(np.load(where)))
    ref = next(iter(paths))
    sessions, outs, ops, result = {}, {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in paths.items():
            opt = os.path.join(tmp, f"{name}.optimized.onnx")
            ort.InferenceSession(path, deploy.session_options(opt), providers=["CPUExecutionProvider"])
            ops[name] = deploy.graph_ops(opt)
            sessions[name] = ort.InferenceSession(path, deploy.session_options(), providers=["CPUExecutionProvider"])
            outs[name] = deploy.run_all(sessions[name], feeds, chunk=16)
    for name in paths:
        row = result[name] = {}
        if meta is not None:
            row["metric"] = deploy.zoo_metrics.evaluate(meta, outs[name], evals)[meta["metric"]]
        if name != ref:
            row["sqnr_db"] = dynamo_deploy.sqnr_db(outs[ref], outs[name])
            if outs[ref].ndim == 2:
                row["agree_top1"] = 100 * float(np.mean(outs[ref].argmax(1) == outs[name].argmax(1)))
    kinds = sorted(set().union(*ops.values()))
    differ = [k for k in kinds if len({ops[n].get(k, 0) for n in paths}) > 1]
    for name in paths:
        result[name]["ops"] = {k: ops[name].get(k, 0) for k in differ}
    one = {k: v[:1] for k, v in feeds.items()}
    for r in range(args.repeat):
        times = deploy.median_seconds(sessions, one, args.rounds, args.warmup)
        for name, s in times.items():
            result[name].setdefault("ms", []).append(1000 * s)
            result[name].setdefault("x_ref", []).append(s / times[ref])
        print(f"repeat {r + 1}: " + ", ".join(f"{n} {1000 * s:.2f} ms ({s / times[ref]:.3f}x)"
                                               for n, s in times.items()), flush=True)
    for name, row in result.items():
        print(name, json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                                if k not in ("ms", "x_ref")}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"inputs": args.inputs, "paths": paths, "rounds": args.rounds, "result": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
