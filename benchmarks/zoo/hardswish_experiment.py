"""HardSwish / HardSigmoid in onnxruntime's integer kernels: rewrite a QDQ model's float sandwiches, time it.

    python benchmarks/zoo/hardswish_experiment.py [--models mobilenetv3,ocr] [--rounds 200]

onnxruntime 1.32 has no integer HardSwish or HardSigmoid: in a QDQ model each runs as
``DQ -> HardSigmoid (-> Mul) -> Q`` in float. Both are a clipped affine map, and a uint8
quantizer clips for free, so they can be written with the integer Add and Mul kernels:

- HardSigmoid(x) = clip(alpha*x + beta, 0, 1) = alpha * clip(x + beta/alpha, 0, 1/alpha):
  ``g_q = Q(DQ(x_q) + DQ(c), scale (1/alpha)/255, zp 0)`` with ``c = beta/alpha`` (3 for torch's
  hardsigmoid) -- the uint8 saturation of that Q *is* the clip to [0, 1/alpha] -- read through
  ``DQ(g_q, scale 1/255, zp 0)``, which means ``alpha * (x + c)`` in [0, 1];
- HardSwish(x) = x * HardSigmoid(x) (alpha 1/6, beta 1/2): the gate above, then
  ``Mul(DQ(x_q), gate) -> Q(out)`` with the HardSwish output's own quantizer.

onnxruntime fuses the Add into QLinearAdd and the Mul into QLinearMul. The gate's Q and DQ
disagree on the scale on purpose (6/255 written, 1/255 read): nothing in the float graph
corresponds to the uint8 tensor ``g_q`` but it holds exactly round((x + 3) * 255/6) clipped.

For each model of the zoo, in one run: qtool's ``rewrite_eval`` output, the same with every
HardSwish/HardSigmoid sandwich rewritten (``qtool+intHS``), onnxruntime's ``quantize_static``
(as ``deploy.py`` builds it) and the same rewritten where its graph allows it (``ort+intHS``);
per variant the task metric on the eval set, the SQNR of the output against float over the eval
set, the op types left in onnxruntime's optimized graph (HardSwish/HardSigmoid and the QLinear
ops), and the one-thread batch-1 latency (``deploy.median_seconds``: interleaved, median of
``time.thread_time``).

qtool's ``rewrite_eval`` now writes this form itself (``qtool/onnx_rewrite/hard_activations.py``), so on
today's qtool the ``qtool`` and ``qtool+intHS`` variants coincide (nothing left to rewrite); the numbers
in ``FINDINGS.md`` section 8 were taken on qtool before that change (commit 79bc033).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import deploy  # noqa: E402
import zoo_metrics  # noqa: E402

ZOO = os.path.join(HERE, "models")
SHOWN_OPS = ("HardSwish", "HardSigmoid", "QLinearAdd", "QLinearMul", "QuantizeLinear", "DequantizeLinear")


class _Graph:
    """A QDQ graph with producer/consumer lookups and fresh names for what the rewrite adds."""

    def __init__(self, model: onnx.ModelProto):
        self.g = model.graph
        self.producer = {o: n for n in self.g.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in self.g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.inits = {i.name: i for i in self.g.initializer}
        self._n = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}__ihs{self._n}"

    def const(self, base: str, value) -> str:
        name = self.name(base)
        self.g.initializer.append(numpy_helper.from_array(value, name))
        return name

    def only_q_after(self, tensor: str):
        """The QuantizeLinear that is the only consumer of ``tensor`` (else None)."""
        readers = self.consumers.get(tensor, [])
        if len(readers) == 1 and readers[0].op_type == "QuantizeLinear":
            return readers[0]
        return None


def _attr(node, name: str, default: float) -> float:
    return next((a.f for a in node.attribute if a.name == name), default)


def _scalar(gr: _Graph, name: str):
    return numpy_helper.to_array(gr.inits[name]).item() if name in gr.inits else None


def _shifted(gr: _Graph, node, alpha: float, beta: float, out: str) -> list:
    """``Add(x, beta/alpha)`` (the constant through a DQ) writing ``out``: what a gate's Q reads."""
    base = node.name or node.output[0]
    c_dq = gr.name(base + "_c_dq")
    return [helper.make_node("DequantizeLinear", [gr.const(base + "_cq", np.array(1, np.uint8)),
                                                  gr.const(base + "_c", np.array(beta / alpha, np.float32)),
                                                  gr.const(base + "_zp", np.array(0, np.uint8))], [c_dq], name=c_dq),
            helper.make_node("Add", [node.input[0], c_dq], [out], name=base + "_add")]


def _set_qparams(gr: _Graph, qdq, scale: float, base: str) -> None:
    qdq.input[1] = gr.const(base + "_s", np.array(scale, np.float32))
    qdq.input[2:] = [gr.const(base + "_zp", np.array(0, np.uint8))]


def _hardswish(gr: _Graph, node) -> list:
    """x * HardSigmoid(x): the gate as Q(x + 3, 6/255, 0) read at 1/255, then an integer Mul."""
    base = node.name or node.output[0]
    g, g_q, gate = gr.name(base + "_sum"), gr.name(base + "_q"), gr.name(base + "_gate")
    q = helper.make_node("QuantizeLinear", [g, "", ""], [g_q], name=g_q)
    dq = helper.make_node("DequantizeLinear", [g_q, "", ""], [gate], name=gate)
    _set_qparams(gr, q, 6 / 255, base + "_q")
    _set_qparams(gr, dq, 1 / 255, base + "_dq")
    return _shifted(gr, node, 1 / 6, 0.5, g) + [q, dq, helper.make_node("Mul", [node.input[0], gate], [node.output[0]],
                                                                      name=base + "_mul")]


def _hardsigmoid(gr: _Graph, node, q_out, keep_scale: bool) -> list:
    """clip(alpha x + beta, 0, 1) = alpha * clip(x + beta/alpha, 0, 1/alpha): the Add takes the
    HardSigmoid's place and its Q the scale divided by alpha. With ``keep_scale`` and a calibrated
    range [0, <= 1] (zero point 0) the DQs after it are unchanged; otherwise the range becomes
    [0, 1] (Q at (1/alpha)/255, every DQ at 1/255)."""
    alpha, beta = _attr(node, "alpha", 0.2), _attr(node, "beta", 0.5)
    base = node.name or node.output[0]
    scale, zp = _scalar(gr, q_out.input[1]), _scalar(gr, q_out.input[2]) if len(q_out.input) > 2 else 0
    if not (keep_scale and zp == 0 and scale is not None and 255 * scale <= 1 + 1e-6):
        scale = 1 / 255
        for dq in gr.consumers.get(q_out.output[0], []):
            if dq.op_type != "DequantizeLinear":
                raise ValueError(f"{q_out.name} feeds {dq.op_type}")
            _set_qparams(gr, dq, scale, base + "_dq")
    _set_qparams(gr, q_out, scale / alpha, base + "_q")
    return _shifted(gr, node, alpha, beta, node.output[0])


def rewrite(model: onnx.ModelProto, keep_gate_scale: bool = True) -> tuple[onnx.ModelProto, dict]:
    """Every HardSwish/HardSigmoid between a DequantizeLinear and a QuantizeLinear, as integer Add/Mul."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    gr = _Graph(model)
    done = {"HardSwish": 0, "HardSigmoid": 0, "skipped": 0}
    new_nodes = []
    for node in gr.g.node:
        src = gr.producer.get(node.input[0]) if node.input else None
        q_out = gr.only_q_after(node.output[0])
        if node.op_type not in done or src is None or src.op_type != "DequantizeLinear" or q_out is None:
            done["skipped"] += node.op_type in done
            new_nodes.append(node)
            continue
        if node.op_type == "HardSwish":
            new_nodes += _hardswish(gr, node)
        else:
            new_nodes += _hardsigmoid(gr, node, q_out, keep_gate_scale)
        done[node.op_type] += 1
    del gr.g.node[:]
    gr.g.node.extend(new_nodes)
    return model, done


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    err = np.sum((ref.astype(np.float64) - out) ** 2)
    return float("inf") if err == 0 else float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / err))


def bench(name: str, rounds: int, warmup: int, tmp: str) -> dict:
    import qtool

    meta = json.load(open(os.path.join(ZOO, f"{name}.json")))
    model = os.path.join(ZOO, f"{name}.onnx")
    calib_path = os.path.join(ZOO, f"{name}.calib.npz")
    evals = np.load(os.path.join(ZOO, f"{name}.eval.npz"))
    feeds = zoo_metrics.load_inputs(evals, meta)
    paths = {"float": model, "qtool": os.path.join(tmp, f"{name}.qtool.onnx"),
             "ort": os.path.join(tmp, f"{name}.ort.onnx")}
    qtool.rewrite_eval(model, paths["qtool"], calibration_data=calib_path)
    deploy.quantize_ort(model, paths["ort"], dict(np.load(calib_path)), tmp)
    rewritten = {}
    for base in ("qtool", "ort"):
        new, rewritten[base + "+intHS"] = rewrite(onnx.load(paths[base]))
        paths[base + "+intHS"] = os.path.join(tmp, f"{name}.{base}.inths.onnx")
        onnx.save(new, paths[base + "+intHS"])
    rows, sessions, outputs = {}, {}, {}
    for variant, path in paths.items():
        opt = os.path.join(tmp, f"{name}.{variant}.opt.onnx")
        ort.InferenceSession(path, deploy.session_options(opt), providers=["CPUExecutionProvider"])
        ops = deploy.graph_ops(opt)
        sess = ort.InferenceSession(path, deploy.session_options(), providers=["CPUExecutionProvider"])
        outputs[variant] = deploy.run_all(sess, feeds)
        rows[variant] = {"metrics": zoo_metrics.evaluate(meta, outputs[variant], evals),
                         "ops": {k: ops.get(k, 0) for k in SHOWN_OPS},
                         "float_layers": deploy.layer_counts(ops)["float_layers"],
                         "rewritten": rewritten.get(variant)}
        sessions[variant] = sess
    for variant in rows:
        rows[variant]["sqnr_db"] = sqnr_db(outputs["float"], outputs[variant])
    one = {k: v[:1] for k, v in feeds.items()}
    for variant, seconds in deploy.median_seconds(sessions, one, rounds, warmup).items():
        rows[variant]["latency_ms"] = 1000 * seconds
    for variant in rows:
        rows[variant]["ratio"] = rows[variant]["latency_ms"] / rows["float"]["latency_ms"]
    return {"model": name, "metric": meta["metric"], "variants": rows}


def fmt(result: dict) -> str:
    met = result["metric"]
    lines = [f"### {result['model']}", "",
             f"| variant | {met} | SQNR vs float (dB) | ms | x float | " + " | ".join(SHOWN_OPS)
             + " | float layers | rewritten |",
             "|---|---|---|---|---|" + "---|" * (len(SHOWN_OPS) + 2)]
    for variant, r in result["variants"].items():
        sq = "-" if variant == "float" else f"{r['sqnr_db']:.1f}"
        rw = "-" if r["rewritten"] is None else ", ".join(f"{k} {v}" for k, v in r["rewritten"].items())
        lines.append(f"| {variant} | {r['metrics'][met]:.2f} | {sq} | {r['latency_ms']:.3f} | {r['ratio']:.3f} | "
                     + " | ".join(str(r["ops"][k]) for k in SHOWN_OPS) + f" | {r['float_layers']} | {rw} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mobilenetv3,ocr")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="hswish_") as tmp:
        for name in args.models.split(","):
            results.append(bench(name, args.rounds, args.warmup, tmp))
            print(fmt(results[-1]) + "\n", flush=True)
    print(f"onnxruntime {ort.__version__}; {args.rounds} rounds after {args.warmup} warm-up, batch 1, one thread, "
          "median of time.thread_time, variants interleaved")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
