"""Where the time goes: onnxruntime's per-node profile of models, summed per op type.

    python benchmarks/zoo/profile_ops.py MODEL.onnx [MODEL2.onnx ...] --zoo-json benchmarks/zoo/models/vit.json
        [--eval benchmarks/zoo/models/vit.eval.npz] [--runs 50] [--nodes 20]

Each model runs at batch 1 on one thread (``ORT_ENABLE_ALL``, as ``deploy.py``) with
``SessionOptions.enable_profiling``; the node events of the timed runs (after 10 warm-up runs),
the median per node over the runs, are summed per op type of onnxruntime's optimized graph
(``QLinearConv``, ``QuantizeLinear``, ``HardSwish``, ...) and printed as microseconds per run,
largest first, side by side per model.
``--nodes N`` also lists each model's N slowest nodes (microseconds per run, op type, node name of
the optimized graph): where a single kernel takes far longer than its shape should (the real
PP-OCRv4 recognizer's two depthwise convolutions at 10 ms instead of 0.2 ms) shows up there.
The profiler adds about 1 us per node: compare models node by node, not with ``deploy.py``'s totals.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import deploy  # noqa: E402
import zoo_metrics  # noqa: E402
from qtool.model.profile import node_times, profiling  # noqa: E402
from qtool.model.session import file_session  # noqa: E402


def profile(path: str, feeds: dict, runs: int, warmup: int = 10) -> dict:
    """Median microseconds per run of each ``(op type, node name)``, and ``"(total of runs)"``."""
    so = deploy.session_options()  # the benchmark's one-thread options, plus profiling
    with profiling(so) as folder:
        sess = file_session(path, options=so)
        per_node, whole = node_times(sess, feeds, runs, warmup)
        del sess, folder
    return {**per_node, "(total of runs)": whole}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--zoo-json", required=True, help="the zoo model's JSON (input names, scales)")
    ap.add_argument("--eval", help="eval npz (default: next to the JSON)")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--nodes", type=int, default=0, help="also list each model's N slowest nodes")
    args = ap.parse_args(argv)
    meta = json.load(open(args.zoo_json))
    npz = np.load(args.eval or args.zoo_json[:-5] + ".eval.npz")
    feeds = {k: v[:1] for k, v in zoo_metrics.load_inputs(npz, meta).items()}
    per_node = [profile(m, feeds, args.runs) for m in args.models]
    results = []
    for nodes in per_node:
        per_op = defaultdict(float)
        for key, us in nodes.items():
            per_op[key if isinstance(key, str) else key[0]] += us
        results.append(per_op)
    ops = sorted(set().union(*results), key=lambda o: -max(r.get(o, 0) for r in results))
    print("| op | " + " | ".join(os.path.basename(m) for m in args.models) + " |")
    print("|---|" + "---|" * len(args.models))
    for op in ops:
        print(f"| {op} | " + " | ".join(f"{r.get(op, 0):.0f}" for r in results) + " |")
    for m, nodes in zip(args.models, per_node) if args.nodes else ():
        print(f"\n{os.path.basename(m)}: the {args.nodes} slowest nodes (us per run)")
        ranked = sorted(((k, us) for k, us in nodes.items() if not isinstance(k, str)), key=lambda kv: -kv[1])
        for (op, name), us in ranked[:args.nodes]:
            print(f"  {us:8.1f}  {op:24s} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
