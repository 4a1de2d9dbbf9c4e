"""Float vs qtool int8 vs onnxruntime int8 on timm's image models, as both of torch's exporters write them.

    python benchmarks/timm_deploy.py MODELS_DIR [--models fastvit_t8.ts,levit_128s.dy] [--rounds 30]
        [--keep DIR] [--json FILE] [--baseline REV]

``MODELS_DIR`` is what ``benchmarks/timm_exports.py`` writes (``<model>.<ts|dy>.onnx`` with its
``.calib.npz``, ``.eval.npz`` and ``.json``). Each is measured by ``dynamo_deploy.bench`` (imported): qtool's
``rewrite_eval`` and onnxruntime's ``quant_pre_process`` + ``quantize_static`` (QDQ, per-channel) over the
same calibration images; the one-thread batch-1 latency of the three variants interleaved (median
``time.thread_time``); the Conv/MatMul/Gemm left in float in onnxruntime's optimized graph; and, on the 32
held-out images, each int8 model's top-1 agreement with the float model and the SQNR of its logits (dB).
The weights are random (batch-norm statistics from procedural images), so there is no task metric.
``--baseline REV``: the qtool of git revision REV quantizes each model too, measured in the same run (a line
under the table per model: before/after figures).
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import deploy  # noqa: E402
import dynamo_deploy  # noqa: E402


def fmt_table(rows: list[dict]) -> str:
    lines = ["| model | exporter | float ms | qtool (x float) | ort (x float) | qtool / ort | top-1 agree % qtool / ort "
             "| SQNR dB qtool / ort | float layers left: float / qtool / ort |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        v = row["variants"]
        get = functools.partial(dynamo_deploy.cell, v)

        q, o = v.get("qtool", {}), v.get("ort", {})
        vs = f"{q['latency_ms'] / o['latency_ms']:.2f}x" if "latency_ms" in q and "latency_ms" in o else "-"
        model, _, tag = row["model"].rpartition(".")
        lines.append(f"| {model} | {dict(ts='TorchScript 17', dy='dynamo').get(tag, tag)} "
                     f"| {get('float', 'latency_ms', '{:.2f}')} | {get('qtool', 'ratio', '{:.2f}x')} "
                     f"| {get('ort', 'ratio', '{:.2f}x')} | {vs} "
                     f"| {get('qtool', 'agree_top1', '{:.0f}')} / {get('ort', 'agree_top1', '{:.0f}')} "
                     f"| {get('qtool', 'sqnr_db', '{:.1f}')} / {get('ort', 'sqnr_db', '{:.1f}')} | "
                     + " / ".join(get(n, "float_layers", "{}") for n in deploy.VARIANTS) + " |")
    notes = dynamo_deploy.table_notes(rows)
    notes += [f"- {row['model']} qtool float layers: {', '.join(row['variants']['qtool']['float_layer_nodes'][:8])}"
              for row in rows if row["variants"].get("qtool", {}).get("float_layers")]
    return "\n".join(lines + ([""] + notes if notes else []))


def main(argv=None) -> int:
    ap = dynamo_deploy.arguments(__doc__, "comma-separated <model>.<ts|dy> subset (default: every one in MODELS_DIR)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.models_dir):
        print(f"no such folder: {args.models_dir}", file=sys.stderr)
        return 2
    have = sorted(f[:-5] for f in os.listdir(args.models_dir)
                  if f.endswith(".json") and os.path.exists(os.path.join(args.models_dir, f[:-5] + ".eval.npz")))
    return dynamo_deploy.run_models(
        args, have, "timm_deploy_", fmt_table,
        lambda name: dict(np.load(os.path.join(args.models_dir, name + ".eval.npz"))))


if __name__ == "__main__":
    sys.exit(main())
