"""The placement of FINDINGS.md applied by hand to the zoo models: what the rules achieve.

Not qtool: a ~200-line reference that folds BatchNormalization into Conv, picks the tensors
to quantize with the recommended rules, measures their min/max ranges on the calibration
samples and writes Q/DQ pairs with ``placement_experiments.quantize`` (uint8 activations,
int8 per-channel weights, int32 biases). Then, per model, in one run: task metric and
one-thread latency of float vs this reference (interleaved, median), and the layer ops left in
float in onnxruntime's optimized graph. It shows the latency the placement rules reach on real
exported graphs, as a target for qtool (it does no range tuning: plain min/max).

Rules (FINDINGS.md section 2):
1. every activation input of Conv/ConvTranspose/Gemm/MatMul; the output of every Conv/Gemm,
   taken after a bias Add and after a Relu/Clip that follow it; a MatMul keeps a float output
   (MatMulIntegerToFloat, which takes the bias Add in);
2. Sigmoid, LeakyRelu, GlobalAveragePool: input and output (own range);
3. Add/Mul with two activation inputs that are both quantized: output (after a following Relu);
4. Concat: inputs and output share one range (union), when every input is quantized;
5. Softmax: output with the fixed range [0, 1]; its input (scores + mask) stays float;
6. LayerNormalization: input and output;
7. Resize, MaxPool, Split, Gather, Flatten, Reshape, Transpose, Squeeze, Unsqueeze, Slice: when the
   input is quantized, the output too, with the input's parameters.

    python benchmarks/zoo/reference_placement.py [--models unet,yolo] [--rounds 100]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import placement_experiments as pe  # noqa: E402
import zoo_metrics  # noqa: E402

MODELS = os.path.join(HERE, "models")
LAYERS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
UNARY_INT = {"Sigmoid", "LeakyRelu", "GlobalAveragePool"}
MOVE = {"Resize", "MaxPool", "Split", "Gather", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice"}
ACTS = {"Relu", "Clip"}


def fold_batch_norms(model: onnx.ModelProto) -> onnx.ModelProto:
    g = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    consumers = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    drop, new_inits = set(), {}
    for n in g.node:
        if n.op_type != "Conv" or n.input[1] not in inits or len(consumers.get(n.output[0], [])) != 1:
            continue
        bn = consumers[n.output[0]][0]
        if bn.op_type != "BatchNormalization" or not all(i in inits for i in bn.input[1:5]):
            continue
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        gamma, beta, mean, var = (inits[i] for i in bn.input[1:5])
        w = inits[n.input[1]]
        b = inits[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros(w.shape[0], np.float32)
        k = gamma / np.sqrt(var + eps)
        wname, bname = n.input[1] + "_folded", n.output[0] + "_bias_folded"
        new_inits[wname] = (w * k.reshape(-1, 1, 1, 1)).astype(np.float32)
        new_inits[bname] = ((b - mean) * k + beta).astype(np.float32)
        n.input[1] = wname
        if len(n.input) > 2:
            n.input[2] = bname
        else:
            n.input.append(bname)
        n.output[0] = bn.output[0]
        drop.add(id(bn))
    nodes = [n for n in g.node if id(n) not in drop]
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in new_inits.items())
    used = {i for n in g.node for i in n.input}
    keep = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return model


def choose(model: onnx.ModelProto):
    """(tensors to quantize, share groups, fixed params) by the rules of the module docstring."""
    g = model.graph
    consts = {i.name for i in g.initializer}
    for n in g.node:
        if n.op_type in ("Constant", "ConstantOfShape", "Shape"):
            consts.update(n.output)
    mi = onnx.shape_inference.infer_shapes(model)
    float_t = {v.name for v in list(mi.graph.value_info) + list(mi.graph.input) + list(mi.graph.output)
               if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    consumers, producer = {}, {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
        for o in n.output:
            producer[o] = n
    act = lambda t: t and t not in consts and t in float_t  # noqa: E731
    T, fixed, groups = set(), {}, []
    same = {}  # tensor -> tensor whose parameters it takes

    def after_chain(t):
        """The tensor at the end of [bias Add] -> [Relu|Clip] after a layer output."""
        cs = consumers.get(t, [])
        if len(cs) == 1 and cs[0].op_type == "Add" and any(i in consts for i in cs[0].input):
            t, cs = cs[0].output[0], consumers.get(cs[0].output[0], [])
        if len(cs) == 1 and cs[0].op_type in ACTS:
            t = cs[0].output[0]
        return t

    for _ in range(3):  # to a fixed point
        for n in g.node:
            ins = [i for i in n.input if act(i)]
            if n.op_type in LAYERS:
                T.update(ins)
                weighted = any(i in consts for i in n.input[1:2])
                # a MatMul (exported with a symbolic batch axis) runs best as MatMulIntegerToFloat with the
                # bias fused: no pair on its output (FINDINGS.md, "MatMul + bias" with a symbolic batch)
                if weighted and n.op_type != "MatMul":
                    T.add(after_chain(n.output[0]))
            elif n.op_type in UNARY_INT and ins:
                T.add(ins[0])
                T.add(after_chain(n.output[0]))
            elif n.op_type in ("Add", "Mul") and len(ins) == 2 and all(i in T for i in ins):
                T.add(after_chain(n.output[0]))
            elif n.op_type == "Concat" and ins and all(i in T for i in ins):
                T.add(n.output[0])
                groups.append(ins + [n.output[0]])
            elif n.op_type == "Softmax":
                fixed[n.output[0]] = (np.float32(1 / 255), np.uint8(0))
                T.add(n.output[0])
            elif n.op_type == "LayerNormalization" and ins:
                T.add(ins[0])
                T.add(n.output[0])
            elif n.op_type in MOVE and ins and ins[0] in T:
                for o in n.output:
                    if act(o):
                        T.add(o)
                        same[o] = ins[0]
    # merge "same parameters" chains and Concat groups into share groups
    parent = {}

    def find(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for o, i in same.items():
        parent[find(o)] = find(i)
    for grp in groups:
        for t in grp[1:]:
            parent[find(t)] = find(grp[0])
    clusters = {}
    for t in T:
        clusters.setdefault(find(t), []).append(t)
    share = [c for c in clusters.values() if len(c) > 1]
    return T, share, fixed


def build(name: str, tmp: str):
    meta = zoo_metrics_meta(name)
    model = fold_batch_norms(onnx.load(os.path.join(MODELS, f"{name}.onnx")))
    calib = dict(np.load(os.path.join(MODELS, f"{name}.calib.npz")))
    T, share, fixed = choose(model)
    ranges = pe.measure_ranges(model, calib)
    T = {t for t in T if t in ranges}
    q = pe.quantize(model, ranges, T, fixed=fixed, share=[[t for t in s if t in T] for s in share])
    path = os.path.join(tmp, f"{name}.ref.onnx")
    onnx.save(q, path)
    return meta, path, len(T)


def zoo_metrics_meta(name):
    import json

    return json.load(open(os.path.join(MODELS, f"{name}.json")))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", default=MODELS, help="model folder (default: the committed zoo)")
    ap.add_argument("--models", help="comma-separated subset (default: all)")
    ap.add_argument("--rounds", type=int, default=100)
    args = ap.parse_args()
    globals()["MODELS"] = args.zoo
    names = sorted(f[:-5] for f in os.listdir(args.zoo) if f.endswith(".json"))
    args.models = args.models or ",".join(names)
    from deploy import graph_ops, layer_counts, median_seconds, run_all, session_options

    print("| model | metric | float | reference | float ms | reference ms (x float) | float layers left | int layers | Q inserted |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            meta, path, nq = build(name, tmp)
            fpath = os.path.join(MODELS, f"{name}.onnx")
            evals = np.load(os.path.join(MODELS, f"{name}.eval.npz"))
            feeds = zoo_metrics.load_inputs(evals, meta)
            one = {k: v[:1] for k, v in feeds.items()}
            res = {}
            for v, p in (("float", fpath), ("ref", path)):
                opt = os.path.join(tmp, f"{name}.{v}.opt.onnx")
                ort.InferenceSession(p, session_options(opt), providers=["CPUExecutionProvider"])
                s = ort.InferenceSession(p, session_options(), providers=["CPUExecutionProvider"])
                res[v] = {"sess": s, "counts": layer_counts(graph_ops(opt)),
                          "metric": zoo_metrics.evaluate(meta, run_all(s, feeds), evals)[meta["metric"]]}
            seconds = median_seconds({v: res[v]["sess"] for v in res}, one, args.rounds, 10)
            ms = {v: 1000 * s for v, s in seconds.items()}
            c = res["ref"]["counts"]
            print(f"| {name} | {meta['metric']} | {res['float']['metric']:.1f} | {res['ref']['metric']:.1f} | {ms['float']:.2f} "
                  f"| {ms['ref']:.2f} ({ms['ref'] / ms['float']:.2f}x) | {c['float_layers']} | {c['int_layers']} | {nq} |",
                  flush=True)


if __name__ == "__main__":
    main()
