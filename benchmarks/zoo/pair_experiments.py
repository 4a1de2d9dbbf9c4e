"""Which Q/DQ pairs of a quantized whole model pay for themselves: remove one kind, time it.

    python benchmarks/zoo/pair_experiments.py FLOAT.onnx INT8.onnx --zoo-json NAME.json
        --drop silu_sigmoid,se_gate[,...] [--rounds 60]

INT8.onnx is a QDQ model (qtool's ``rewrite-eval`` output). Each ``--drop`` item names a kind
of activation pair (``QuantizeLinear -> DequantizeLinear`` on one tensor) that is removed from a
copy of it, every consumer reading the float tensor instead; kinds may be combined with ``+``
(``silu_sigmoid+se_gate``). Float, the int8 model and each variant are then timed like
``deploy.py`` (one thread, batch 1, interleaved, median ``time.thread_time``), with the largest
absolute difference of each output from the float model's on the first 16 eval samples.

Kinds (by the producer of the quantized tensor and its consumers):
- ``silu_sigmoid``: a Sigmoid output read by a Mul that also reads the Sigmoid's input (SiLU
  ``x * Sigmoid(x)``): without it onnxruntime fuses the SiLU into a float QuickGelu;
- ``se_gate``: any other Sigmoid/HardSigmoid output read by a Mul (squeeze-excite gate);
- ``se_mul``: the output of a Mul whose second input is a gate ([N, C, 1, 1]);
- ``gelu_in``: a MatMul/Add output read by GELU's Div/Mul/Pow (a GELU input);
- ``ln_in``: an input of a LayerNormalization; ``ln_out``: a LayerNormalization output;
- ``residual``: an Add output whose inputs are both activations, not read by a LayerNormalization;
- ``hardswish_in``: a HardSwish input; ``hardswish_out``: a HardSwish output;
- ``re:REGEX``: a tensor whose producer's node name matches REGEX.
"""

from __future__ import annotations

import argparse
import re
import json
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import zoo_metrics  # noqa: E402
from deploy import graph_ops, layer_counts, median_seconds, session_options  # noqa: E402


def _index(graph):
    producer = {o: n for n in graph.node for o in n.output}
    consumers = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    return producer, consumers


def _kind(tensor: str, producer: dict, consumers: dict) -> set[str]:
    """The kinds (module docstring) of the float tensor ``tensor`` that a Q reads."""
    p = producer.get(tensor)
    kinds = {f"name:{p.name}"} if p is not None else set()
    readers = []  # the float consumers behind the DQs
    for q in consumers.get(tensor, []):
        if q.op_type == "QuantizeLinear":
            for dq in consumers.get(q.output[0], []):
                if dq.op_type == "DequantizeLinear":
                    readers += consumers.get(dq.output[0], [])
    op = p.op_type if p is not None else ""
    if op == "Sigmoid" and any(r.op_type == "Mul" for r in readers):
        x = p.input[0]
        # the Sigmoid's input is a DQ output; SiLU when a Mul reads the same float tensor too
        xs = {x}
        src = producer.get(x)
        if src is not None and src.op_type == "DequantizeLinear":
            q = producer.get(src.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                xs.add(q.input[0])
        silu = any(r.op_type == "Mul" and any(i in xs or (producer.get(i) is not None and producer[i].op_type ==
                                                          "DequantizeLinear" and producer.get(producer[i].input[0]) is
                                                          not None and producer[producer[i].input[0]].input[0] in xs)
                                              for i in r.input if i != tensor) for r in readers)
        kinds.add("silu_sigmoid" if silu else "se_gate")
    elif op == "HardSigmoid":
        kinds.add("se_gate")
    if op == "Mul" and len(p.input) == 2:
        kinds.add("se_mul")
    if any(r.op_type in ("Div", "Pow") or (r.op_type == "Mul" and op in ("Add", "MatMul")) for r in readers) and op in (
            "Add", "MatMul"):
        kinds.add("gelu_in")
    if any(r.op_type == "LayerNormalization" for r in readers):
        kinds.add("ln_in")
    if op == "LayerNormalization":
        kinds.add("ln_out")
    if op == "Add" and not any(r.op_type == "LayerNormalization" for r in readers):
        kinds.add("residual")
    if any(r.op_type == "HardSwish" for r in readers):
        kinds.add("hardswish_in")
    if op == "HardSwish":
        kinds.add("hardswish_out")
    return kinds


def drop_pairs(model: onnx.ModelProto, kinds: set[str], keep: bool = False) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` without the activation pairs of ``kinds`` (``keep``: without all the others)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    producer, consumers = _index(g)
    outputs = {o.name for o in g.output}
    remove, rename = [], {}
    for q in list(g.node):
        if q.op_type != "QuantizeLinear" or q.input[0] in (i.name for i in g.initializer):
            continue
        x = q.input[0]
        found = _kind(x, producer, consumers)
        names = [k[3:] for k in kinds if k.startswith("re:")]
        chosen = bool(found & kinds) or any(re.search(r, f[5:]) for r in names for f in found if f.startswith("name:"))
        if chosen == keep:
            continue
        dqs = [d for d in consumers.get(q.output[0], []) if d.op_type == "DequantizeLinear"]
        if len(dqs) != len(consumers.get(q.output[0], [])) or any(d.output[0] in outputs for d in dqs):
            continue
        remove.append(q)
        remove += dqs
        for d in dqs:
            rename[d.output[0]] = x
    for n in remove:
        g.node.remove(n)
    def resolve(name):
        while name in rename:
            name = rename[name]
        return name

    for n in g.node:
        for i, name in enumerate(n.input):
            n.input[i] = resolve(name)
    return m, len(remove) // 2 if remove else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("float_model")
    ap.add_argument("int8_model")
    ap.add_argument("--zoo-json", required=True)
    ap.add_argument("--drop", required=True, help="comma-separated variants, each kinds joined by +")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)
    meta = json.load(open(args.zoo_json))
    npz = np.load(args.zoo_json[:-5] + ".eval.npz")
    feeds = {k: v[:16] for k, v in zoo_metrics.load_inputs(npz, meta).items()}
    one = {k: v[:1] for k, v in feeds.items()}
    base = onnx.load(args.int8_model)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"float": args.float_model, "int8": args.int8_model}
        removed = {}
        for k, variant in enumerate(args.drop.split(",")):
            model, n = drop_pairs(base, set(variant.split("+")))
            paths[f"-{variant}"] = os.path.join(tmp, f"variant{k}.onnx")
            onnx.save(model, paths[f"-{variant}"])
            removed[f"-{variant}"] = n
        sessions, info = {}, {}
        for k, (name, path) in enumerate(paths.items()):
            opt = os.path.join(tmp, f"{k}.opt.onnx")
            ort.InferenceSession(path, session_options(opt), providers=["CPUExecutionProvider"])
            info[name] = layer_counts(graph_ops(opt))
            sessions[name] = ort.InferenceSession(path, session_options(), providers=["CPUExecutionProvider"])
        ref = sessions["float"].run(None, feeds)
        times = median_seconds(sessions, one, args.rounds, args.warmup)
        f_ms = 1000 * times["float"]
        print(f"{os.path.basename(args.int8_model)}: {args.rounds} rounds")
        print("| variant | pairs removed | ms | x float | float layers | int layers | Q+DQ in optimized graph | max abs diff vs float |")
        print("|---|---|---|---|---|---|---|---|")
        for name, sess in sessions.items():
            ms = 1000 * times[name]
            diff = max(float(np.max(np.abs(a - b))) for a, b in zip(sess.run(None, feeds), ref))
            c = info[name]
            print(f"| {name} | {removed.get(name, '-')} | {ms:.2f} | {ms / f_ms:.2f}x | {c['float_layers']} | "
                  f"{c['int_layers']} | {c['qdq']} | {diff:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
