"""Which activation quantizers of a quantized zoo model cost its accuracy: switch them off by kind.

    python benchmarks/zoo/quantizer_blame.py NAME INT8.onnx --variants re:Softmax,re:Expand|Concat_2 [--only]

INT8.onnx is a QDQ model of the zoo model NAME (qtool's ``rewrite-eval`` output). Each variant
(kinds of ``pair_experiments.py``, joined by ``+``; ``re:REGEX`` matches the node that produces
the quantized tensor) removes those activation pairs from a copy, or with ``--only`` removes every
other activation pair (weights stay int8; a pair on a graph output stays). Reported on the whole
eval set against the float model: the task metric, the top-1 agreement with float (last axis),
and the SQNR of the first output. Rows "int8" and "weights only" (every activation pair removed)
bracket the variants. No timing: ``pair_experiments.py`` times the same variants.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import zoo_metrics  # noqa: E402
from deploy import run_all  # noqa: E402
from pair_experiments import drop_pairs  # noqa: E402

ZOO = os.path.join(HERE, "models")


def outputs(model, feeds) -> np.ndarray:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return run_all(ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]), feeds)


def row(name: str, removed, out: np.ndarray, ref: np.ndarray, meta: dict, npz) -> str:
    metric = zoo_metrics.evaluate(meta, out, npz)[meta["metric"]]
    agree = 100 * float(np.mean(out.argmax(axis=-1) == ref.argmax(axis=-1)))
    sqnr = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(np.sum((out - ref).astype(np.float64) ** 2), 1e-30))
    return f"| {name} | {removed} | {metric:.1f} | {agree:.1f} | {sqnr:.1f} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", help="zoo model (benchmarks/zoo/models/NAME.onnx, .json, .eval.npz)")
    ap.add_argument("int8_model")
    ap.add_argument("--variants", required=True, help="comma-separated variants, each kinds joined by +")
    ap.add_argument("--only", action="store_true", help="keep only the variant's pairs instead of removing them")
    args = ap.parse_args(argv)
    meta = json.load(open(os.path.join(ZOO, f"{args.name}.json")))
    npz = np.load(os.path.join(ZOO, f"{args.name}.eval.npz"))
    feeds = zoo_metrics.load_inputs(npz, meta)
    ref = outputs(os.path.join(ZOO, f"{args.name}.onnx"), feeds)
    base = onnx.load(args.int8_model)
    print(f"{args.name}: float {meta['metric']} {zoo_metrics.evaluate(meta, ref, npz)[meta['metric']]:.1f}, "
          f"{len(ref)} eval samples")
    print(f"| variant | pairs removed | {meta['metric']} | agreement with float | SQNR dB |")
    print("|---|---|---|---|---|")
    print(row("int8", 0, outputs(base, feeds), ref, meta, npz))
    for variant in args.variants.split(","):
        model, removed = drop_pairs(base, set(variant.split("+")), keep=args.only)
        name = ("only " if args.only else "-") + variant
        print(row(name, removed, outputs(model, feeds), ref, meta, npz), flush=True)
    model, removed = drop_pairs(base, set(), keep=True)
    print(row("weights only", removed, outputs(model, feeds), ref, meta, npz))
    return 0


if __name__ == "__main__":
    sys.exit(main())
