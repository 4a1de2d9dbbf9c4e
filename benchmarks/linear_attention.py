"""ReLU linear attention in int8: the ways to quantize ``kv = k^T [v, 1]``, measured (``placement/normalisers.py``).

    python benchmarks/linear_attention.py MODELS_DIR [--models efficientvit_b0.ts,efficientvit_b0.dy] [--rounds 60]

``MODELS_DIR`` is what ``benchmarks/timm_exports.py`` writes (``--models efficientvit_b0,efficientvit_b1``). timm's
``LiteMLA`` computes ``out = q kv`` and ``out[..., :-1] / (out[..., -1:] + eps)``, so ``kv`` holds numerators and,
in its last column, the denominators. Per model, four int8 variants of the same calibration (32 images, minmax):

- ``per tensor``: ``kv`` one uint8 tensor (qtool before ``placement.normalisers``: the rule switched off);
- ``split``: ``kv[..., :-1]`` and ``kv[..., -1:]`` each behind its own QuantizeLinear/DequantizeLinear (min/max of
  that part in the float model over the calibration images), two MatMuls (``q kv_num``, ``q kv_den``);
- ``per column``: ``kv`` behind one per-column (``axis=-1``) QuantizeLinear/DequantizeLinear;
- ``float``: ``q kv`` in float, what qtool writes now.

(``split`` and ``per column`` are written from the ``float`` model by hand.) For each: SQNR of the logits against
float and top-1 agreement over the held-out images, the MatMul kernels of onnxruntime's optimized graph, and the
one-thread batch-1 latency, the variants and the float model interleaved (median ``time.thread_time``,
``deploy.median_seconds``). A variant onnxruntime cannot run is reported with its error.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's qtool
sys.path.insert(0, HERE)
import deploy  # noqa: E402
import dynamo_deploy  # noqa: E402

import qtool  # noqa: E402
import qtool.onnx_rewrite.placement as placement  # noqa: E402

MATMULS = ("MatMul", "MatMulIntegerToFloat", "QLinearMatMul")


def _qparams(lo, hi):
    lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
    scale = ((hi - lo) / 255).astype(np.float32)
    return scale, np.round(-lo / scale).astype(np.uint8)


def _qdq(graph, x: str, scale, zero_point, name: str, axis: int | None = None) -> list:
    kw = {} if axis is None else {"axis": axis}
    graph.initializer.extend([numpy_helper.from_array(np.asarray(scale), name + "/scale"),
                              numpy_helper.from_array(np.asarray(zero_point), name + "/zero_point")])
    ins = [name + "/scale", name + "/zero_point"]
    return [helper.make_node("QuantizeLinear", [x] + ins, [name + "/q"], name=name + "/Q", **kw),
            helper.make_node("DequantizeLinear", [name + "/q"] + ins, [name + "/dq"], name=name + "/DQ", **kw)]


def _kv_matmuls(graph) -> list:
    """``q kv``: the MatMuls whose second input another MatMul writes."""
    producers = {o: n for n in graph.node for o in n.output}
    return [n for n in graph.node if n.op_type == "MatMul" and getattr(producers.get(n.input[1]), "op_type", "") ==
            "MatMul"]


def _kv_values(float_model: str, kvs: list[str], calib: np.ndarray) -> list[np.ndarray]:
    m = onnx.load(float_model)
    for k in kvs:
        m.graph.output.append(helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, None))
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(kvs, {s.get_inputs()[0].name: calib})


def _per_column(base: onnx.ModelProto, values: list[np.ndarray]) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(base)
    for mm, v in zip(_kv_matmuls(m.graph), values):
        cols = v.reshape(-1, v.shape[-1])
        nodes = _qdq(m.graph, mm.input[1], *_qparams(cols.min(0), cols.max(0)), mm.name + "/kv_per_column", axis=-1)
        at = list(m.graph.node).index(mm)
        for j, n in enumerate(nodes):
            m.graph.node.insert(at + j, n)
        mm.input[1] = nodes[1].output[0]
    return m


def _split(base: onnx.ModelProto, values: list[np.ndarray]) -> onnx.ModelProto:
    """Each Slice of ``out`` becomes ``q @ QDQ(Slice(kv))`` with the same slice parameters."""
    m = onnx.ModelProto()
    m.CopyFrom(base)
    g = m.graph
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in g.node if n.op_type == "Constant"})
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    for mm, v in zip(_kv_matmuls(g), values):
        slices = [c for c in consumers[mm.output[0]] if c.op_type == "Slice"]
        if len(slices) != 2 or len(consumers[mm.output[0]]) != 2:
            raise ValueError(f"{mm.name}: out is not read by two Slices")
        for s in slices:
            part = v[..., -1:] if int(consts[s.input[1]].ravel()[0]) < 0 else v[..., :-1]
            name = s.name + "/kv_part"
            nodes = [helper.make_node("Slice", [mm.input[1]] + list(s.input[1:]), [name], name=name + "/Slice")]
            nodes += _qdq(g, name, *_qparams(part.min(), part.max()), name + "_quant")
            nodes.append(helper.make_node("MatMul", [mm.input[0], nodes[-1].output[0]], [s.output[0]],
                                          name=name + "/MatMul"))
            at = list(g.node).index(s)
            g.node.remove(s)
            for j, n in enumerate(nodes):
                g.node.insert(at + j, n)
        g.node.remove(mm)
    return m


def bench(models_dir: str, name: str, rounds: int, warmup: int, tmp: str) -> dict:
    model = os.path.join(models_dir, name + ".onnx")
    calib_path = os.path.join(models_dir, name + ".calib.npz")
    evals = dict(np.load(os.path.join(models_dir, name + ".eval.npz")))
    now = qtool.rewrite_eval(model, os.path.join(tmp, "float_kv.onnx"), calibration_data=calib_path)
    saved = placement.shared_normaliser_layers
    placement.shared_normaliser_layers = lambda graph: []
    try:
        qtool.rewrite_eval(model, os.path.join(tmp, "per_tensor.onnx"), calibration_data=calib_path)
    finally:
        placement.shared_normaliser_layers = saved
    base = onnx.load(os.path.join(tmp, "float_kv.onnx"))
    kvs = [n.input[1] for n in _kv_matmuls(base.graph)]
    values = _kv_values(model, kvs, np.load(calib_path)["pixel_values"])
    onnx.save(_split(base, values), os.path.join(tmp, "split.onnx"))
    onnx.save(_per_column(base, values), os.path.join(tmp, "per_column.onnx"))
    paths = {"float": model, **{v: os.path.join(tmp, v + ".onnx")
                                for v in ("per_tensor", "split", "per_column", "float_kv")}}
    row = {"model": name, "float_kv_left": [e["node"] for e in now.summary["left_in_float"]], "variants": {}}
    sessions, outs = {}, {}
    for variant, path in paths.items():
        info = row["variants"].setdefault(variant, {})
        try:
            opt = os.path.join(tmp, variant + ".optimized.onnx")
            ort.InferenceSession(path, deploy.session_options(opt), providers=["CPUExecutionProvider"])
            ops = deploy.graph_ops(opt)
            info["matmuls"] = {op: ops[op] for op in MATMULS if ops[op]}
            sess = ort.InferenceSession(path, deploy.session_options(), providers=["CPUExecutionProvider"])
            outs[variant] = deploy.run_all(sess, evals, chunk=4)
            sessions[variant] = sess
        except Exception as e:  # a variant onnxruntime cannot run is a result
            info["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][-220:]}"
    for variant, out in outs.items():
        if variant != "float":
            row["variants"][variant]["sqnr_db"] = dynamo_deploy.sqnr_db(outs["float"], out)
            row["variants"][variant]["agree_top1"] = 100 * float(np.mean(outs["float"].argmax(1) == out.argmax(1)))
    deploy.time_variants(row, sessions, {k: v[:1] for k, v in evals.items()}, rounds, warmup)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| model | kv | SQNR dB | top-1 agree % | ms (x float) | MatMul kernels in onnxruntime |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        for variant, x in row["variants"].items():
            if variant == "float":
                continue
            get = functools.partial(dynamo_deploy.cell, row["variants"], variant)
            ms = f"{x['latency_ms']:.2f} ({x['ratio']:.3f}x)" if "latency_ms" in x else get("latency_ms", "{}")
            kernels = ", ".join(f"{op} {n}" for op, n in x.get("matmuls", {}).items())
            lines.append(f"| {row['model']} | {variant.replace('_', ' ')} | {get('sqnr_db', '{:.2f}')} "
                         f"| {get('agree_top1', '{:.0f}')} | {ms} | {kernels} |")
    notes = [f"- {row['model']} {v}: {x['error']}" for row in rows for v, x in row["variants"].items() if "error" in x]
    return "\n".join(lines + ([""] + notes if notes else []))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models_dir")
    ap.add_argument("--models", default="efficientvit_b0.ts,efficientvit_b0.dy")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)
    names = args.models.split(",")
    missing = [n for n in names if not os.path.exists(os.path.join(args.models_dir, n + ".onnx"))]
    if missing:
        print(f"not in {args.models_dir}: {', '.join(missing)} (benchmarks/timm_exports.py writes them)",
              file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="linear_attention_") as scratch:
        for name in names:
            tmp = os.path.join(scratch, name)
            os.makedirs(tmp)
            rows.append(bench(args.models_dir, name, args.rounds, args.warmup, tmp))
            print(f"[{name}] done", file=sys.stderr, flush=True)
    print(table(rows))
    print(dynamo_deploy.timing_footer(args.rounds, args.warmup))
    return 0


if __name__ == "__main__":
    sys.exit(main())
