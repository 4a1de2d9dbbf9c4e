"""Which Q/DQ arrangement lets onnxruntime run Conv/MatMul/Gemm in integer kernels, fastest?

Small float graphs (onnx.helper) of each pattern are quantized here by hand with one
arrangement of QuantizeLinear/DequantizeLinear pairs per variant (weights: int8 per
output channel through a DequantizeLinear; Conv/Gemm bias int32 with scale x_scale *
w_scale; activations: uint8 asymmetric min/max ranges measured on random inputs). For
each variant this prints onnxruntime's optimized graph (ORT_ENABLE_ALL, one thread,
``optimized_model_filepath``): the layer ops left in float, those run by integer kernels,
the Q/DQ nodes left, the other ops; the one-thread batch-1 latency (median
``time.thread_time`` of ``session.run``, variants of a pattern interleaved round-robin);
and the max abs error against the float graph.

    python benchmarks/zoo/placement_experiments.py [--only silu,attention] [--rounds 300]

Results are in FINDINGS.md next to this file.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort

from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import deploy  # noqa: E402  (benchmarks/deploy.py: the one-thread session options)

FLOAT_LAYER = {"Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedMatMul", "FusedGemm", "NhwcFusedConv",
               "MatMulNBits"}  # MatMulNBits: int8 weights, float activations
INT_LAYER = {"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "MatMulIntegerToFloat", "QGemm",
             "DynamicQuantizeMatMul", "NhwcQLinearConv", "DynamicQuantizeLSTM"}
rng = np.random.default_rng(0)
DYNAMIC_BATCH = False  # --dynamic-batch


# ----------------------------------------------------------------------------------------------
# float graph builder
# ----------------------------------------------------------------------------------------------
class Builder:
    def __init__(self, opset: int = 17):
        self.nodes, self.inits, self.opset, self.n = [], {}, opset, 0
        self.roles: dict[str, str] = {}  # tensor -> role (what a variant may quantize)
        self.weights: dict[str, tuple[str, int]] = {}  # weight initializer -> (layer op, channel axis)

    def name(self, base):
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, arr, base="c"):
        name = self.name(base)
        self.inits[name] = np.asarray(arr)
        return name

    def op(self, op_type, inputs, role=None, domain="", n_out=1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(op_type), domain=domain, **attrs))
        if role:
            for o in outs:
                self.roles[o] = role
        return outs[0] if n_out == 1 else outs

    def conv(self, x, cin, cout, k=3, stride=1, groups=1, role="conv_out"):
        w = self.const((rng.normal(0, 1, (cout, cin // groups, k, k)) / np.sqrt(cin // groups * k * k)).astype(np.float32), "w")
        b = self.const(rng.normal(0, 0.1, cout).astype(np.float32), "b")
        self.weights[w] = ("Conv", 0)
        return self.op("Conv", [x, w, b], role, kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride] * 2,
                       group=groups)

    def matmul(self, x, k, n, role="mm_out", bias=True, axis=1, bias_role="bias_out"):
        w = self.const((rng.normal(0, 1, (k, n)) / np.sqrt(k)).astype(np.float32), "w")
        self.weights[w] = ("MatMul", axis)
        y = self.op("MatMul", [x, w], role)
        if bias:
            y = self.op("Add", [y, self.const(rng.normal(0, 0.1, n).astype(np.float32), "b")], bias_role)
        return y

    def act(self, kind, x):
        """Activation ``kind`` on x; internal tensors get role act_mid, the result act_out."""
        c = lambda v: self.const(np.array(v, np.float32))  # noqa: E731
        if kind == "none":
            return x
        if kind in ("Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Elu"):
            return self.op(kind, [x], "act_out")
        if kind == "LeakyRelu":
            return self.op("LeakyRelu", [x], "act_out", alpha=0.1)
        if kind == "Relu6":
            return self.op("Clip", [x, c(0.0), c(6.0)], "act_out")
        if kind == "PRelu":
            return self.op("PRelu", [x, self.const(np.full((64, 1, 1), 0.2, np.float32))], "act_out")
        if kind == "SiLU":
            return self.op("Mul", [x, self.op("Sigmoid", [x], "act_mid")], "act_out")
        if kind == "GeluErf":  # torch's exporter: x * 0.5 * (1 + erf(x / sqrt 2)) as Div, Erf, Add, Mul, Mul
            e = self.op("Erf", [self.op("Div", [x, c(1.4142135)], "act_mid")], "act_mid")
            return self.op("Mul", [self.op("Mul", [x, self.op("Add", [e, c(1.0)], "act_mid")], "act_mid"), c(0.5)],
                           "act_out")
        if kind == "GeluTanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            x3 = self.op("Pow", [x, c(3.0)], "act_mid")
            inner = self.op("Mul", [self.op("Add", [x, self.op("Mul", [x3, c(0.044715)], "act_mid")], "act_mid"),
                                    c(0.7978846)], "act_mid")
            t = self.op("Add", [self.op("Tanh", [inner], "act_mid"), c(1.0)], "act_mid")
            return self.op("Mul", [self.op("Mul", [x, c(0.5)], "act_mid"), t], "act_out")
        if kind == "Gelu":  # opset 20 op
            return self.op("Gelu", [x], "act_out")
        raise ValueError(kind)

    def model(self, inputs: dict[str, tuple], output: str | list[str]) -> onnx.ModelProto:
        outs = [output] if isinstance(output, str) else output
        # exported models have a symbolic batch axis: onnxruntime then cannot rewrite a 3-D
        # MatMul + bias Add into a Gemm, which changes what the QDQ rules can fuse
        dims = lambda s: (["batch"] + list(s[1:])) if DYNAMIC_BATCH and s else s  # noqa: E731
        g = helper.make_graph(
            self.nodes, "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT if dt == np.float32 else TensorProto.INT64, dims(s))
             for n, (s, dt) in inputs.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 8 if self.opset < 19 else 9
        return m


# ----------------------------------------------------------------------------------------------
# hand quantization
# ----------------------------------------------------------------------------------------------
def measure_ranges(model: onnx.ModelProto, feeds) -> dict[str, tuple[float, float]]:
    m = onnx.shape_inference.infer_shapes(model)
    have = {o.name for o in m.graph.output}
    for vi in m.graph.value_info:
        if vi.name not in have and vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            m.graph.output.append(vi)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = dict(zip(names, sess.run(None, feeds)))
    values.update(feeds)
    return {n: (float(min(v.min(), 0)), float(max(v.max(), 0))) for n, v in values.items() if v.dtype == np.float32}


def qparams(lo, hi):
    scale = max(hi - lo, 1e-8) / 255.0
    return np.float32(scale), np.uint8(np.clip(round(-lo / scale), 0, 255))


def quantize(model: onnx.ModelProto, ranges, tensors: set[str], *, fixed=None, per_channel=True,
             share=None, weight_axis_override=None) -> onnx.ModelProto:
    """Insert Q/DQ on ``tensors``; quantize the weights (and bias) of every layer whose input is quantized.

    ``fixed``: tensor -> (scale, zero point) used instead of the measured range (Softmax [0, 1]).
    ``share``: groups of tensors that use one range (the union), e.g. Concat inputs.
    """
    g = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    params = {}
    for t in tensors:
        params[t] = qparams(*ranges[t])
    for group in share or ():
        lo = min(ranges[t][0] for t in group)
        hi = max(ranges[t][1] for t in group)
        for t in group:
            params[t] = qparams(lo, hi)
    params.update(fixed or {})
    new_inits = []
    rename = {}
    for t in sorted(tensors):
        s, zp = params[t]
        new_inits += [numpy_helper.from_array(np.array(s, np.float32), f"{t}_s"),
                      numpy_helper.from_array(np.array(zp, np.uint8), f"{t}_zp")]
        rename[t] = f"{t}_dq"
    consumers_done = set()
    out_nodes = []
    producer = {}
    for node in g.node:
        for o in node.output:
            producer[o] = node
    graph_inputs = {i.name for i in g.input}
    # Q/DQ of graph inputs first
    for t in sorted(tensors & graph_inputs):
        out_nodes += [helper.make_node("QuantizeLinear", [t, f"{t}_s", f"{t}_zp"], [f"{t}_q"], name=f"{t}_Q"),
                      helper.make_node("DequantizeLinear", [f"{t}_q", f"{t}_s", f"{t}_zp"], [f"{t}_dq"], name=f"{t}_DQ")]
    for node in g.node:
        n = onnx.NodeProto()
        n.CopyFrom(node)
        for i, name in enumerate(n.input):
            if name in rename:
                n.input[i] = rename[name]
        # weights of quantized layers
        if n.op_type in ("Conv", "MatMul", "Gemm") and n.input[0].endswith("_dq") and n.input[1] in inits:
            wname = n.input[1]
            w = inits[wname]
            axis = {"Conv": 0, "MatMul": 1, "Gemm": 0}[n.op_type]
            if weight_axis_override is not None:
                axis = weight_axis_override
            if per_channel:
                red = tuple(a for a in range(w.ndim) if a != axis)
                ws = (np.maximum(np.abs(w).max(axis=red), 1e-8) / 127.0).astype(np.float32)
                shape = [1] * w.ndim
                shape[axis] = -1
                wq = np.clip(np.rint(w / ws.reshape(shape)), -127, 127).astype(np.int8)
                wzp = np.zeros_like(ws, dtype=np.int8)
            else:
                ws = np.float32(max(np.abs(w).max(), 1e-8) / 127.0)
                wq = np.clip(np.rint(w / ws), -127, 127).astype(np.int8)
                wzp = np.int8(0)
            new_inits += [numpy_helper.from_array(wq, f"{wname}_q"), numpy_helper.from_array(np.asarray(ws), f"{wname}_s"),
                          numpy_helper.from_array(np.asarray(wzp), f"{wname}_zp")]
            attrs = [helper.make_attribute("axis", axis)] if per_channel else []
            dq = helper.make_node("DequantizeLinear", [f"{wname}_q", f"{wname}_s", f"{wname}_zp"], [f"{wname}_dq"],
                                  name=f"{wname}_DQ")
            dq.attribute.extend(attrs)
            out_nodes.append(dq)
            n.input[1] = f"{wname}_dq"
            if n.op_type in ("Conv", "Gemm") and len(n.input) > 2 and n.input[2] in inits:
                x_s = params[n.input[0][:-3]][0]
                bs = (x_s * np.asarray(ws)).astype(np.float32) * np.ones(len(inits[n.input[2]]), np.float32)
                bq = np.rint(inits[n.input[2]] / bs).astype(np.int32)
                bname = n.input[2]
                new_inits += [numpy_helper.from_array(bq, f"{bname}_q"), numpy_helper.from_array(bs, f"{bname}_s"),
                              numpy_helper.from_array(np.zeros_like(bq), f"{bname}_zp")]
                bdq = helper.make_node("DequantizeLinear", [f"{bname}_q", f"{bname}_s", f"{bname}_zp"], [f"{bname}_dq"],
                                       name=f"{bname}_DQ", axis=0)
                out_nodes.append(bdq)
                n.input[2] = f"{bname}_dq"
        out_nodes.append(n)
        for o in n.output:
            if o in tensors and o not in consumers_done:
                consumers_done.add(o)
                out_nodes += [helper.make_node("QuantizeLinear", [o, f"{o}_s", f"{o}_zp"], [f"{o}_q"], name=f"{o}_Q"),
                              helper.make_node("DequantizeLinear", [f"{o}_q", f"{o}_s", f"{o}_zp"], [f"{o}_dq"],
                                               name=f"{o}_DQ")]
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.node[:]
    m.graph.node.extend(out_nodes)
    m.graph.initializer.extend(new_inits)
    for o in m.graph.output:
        if o.name in rename:
            o.name = rename[o.name]

    return m


# ----------------------------------------------------------------------------------------------
# measurement
# ----------------------------------------------------------------------------------------------
def _so(opt=None):
    return deploy.session_options(opt)  # the benchmark's one-thread options


def optimized_ops(model: onnx.ModelProto, tmp: str) -> list[str]:
    p = os.path.join(tmp, "m.onnx")
    opt = os.path.join(tmp, "m.opt.onnx")
    onnx.save(model, p)
    ort.InferenceSession(p, _so(opt), providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(opt).graph.node]


def summarize(ops: list[str]) -> tuple[int, int, int, str]:
    c = Counter(ops)
    fl = sum(v for k, v in c.items() if k in FLOAT_LAYER)
    il = sum(v for k, v in c.items() if k in INT_LAYER)
    qdq = c["QuantizeLinear"] + c["DequantizeLinear"]
    other = ", ".join(f"{k}x{v}" if v > 1 else k for k, v in sorted(c.items()))
    return fl, il, qdq, other


def run_pattern(title: str, float_model: onnx.ModelProto, feeds, variants: dict, rounds: int, tmp: str):
    """variants: name -> ModelProto (already quantized) ; float model is added as 'float'."""
    models = {"float": float_model, **variants}
    sessions, rows = {}, {}
    ref = ort.InferenceSession(float_model.SerializeToString(), _so(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for name, m in models.items():
        ops = optimized_ops(m, tmp)
        sess = ort.InferenceSession(m.SerializeToString(), _so(), providers=["CPUExecutionProvider"])
        err = float(np.max(np.abs(sess.run(None, feeds)[0] - ref)))
        sessions[name] = sess
        rows[name] = (summarize(ops), err, sum(1 for n in m.graph.node if n.op_type == "QuantizeLinear"))
    times = deploy.median_seconds(sessions, feeds, rounds, 10)
    base = times["float"]
    print(f"\n### {title}\n")
    print("| variant | Q inserted | float layers | int layers | Q+DQ left | latency ms (x float) | max err | optimized graph ops |")
    print("|---|---|---|---|---|---|---|---|")
    for name, ((fl, il, qdq, other), err, nq) in rows.items():
        ms = times[name]
        print(f"| {name} | {nq} | {fl} | {il} | {qdq} | {1000 * ms:.3f} ({ms / base:.2f}x) | {err:.3g} | {other} |")
    sys.stdout.flush()


def q_variants(model, ranges, base_tensors, role_sets: dict[str, set[str]], roles, **kw):
    out = {}
    for name, rs in role_sets.items():
        tensors = set(base_tensors) | {t for t, r in roles.items() if r in rs}
        out[name] = quantize(model, ranges, tensors, **kw)
    return out


# ----------------------------------------------------------------------------------------------
# patterns
# ----------------------------------------------------------------------------------------------
def conv_chain(kind, blocks=4, c=64, hw=32, opset=17):
    b = Builder(opset)
    x = "x"
    first = b.conv(x, 16, c)
    y = b.act(kind, first)
    for _ in range(blocks - 1):
        y = b.act(kind, b.conv(y, c, c))
    out = b.conv(y, c, c, role="head")
    m = b.model({"x": ([1, 16, hw, hw], np.float32)}, out)
    return m, b, {"x": rng.normal(0, 1, (1, 16, hw, hw)).astype(np.float32)}


ACT_VARIANTS = {
    "A: after act only": {"act_out", "head"},
    "B: conv out + act out": {"conv_out", "act_out", "head"},
    "C: conv out + act out + act internals": {"conv_out", "act_mid", "act_out", "head"},
    "D: conv out only (qtool today after a non-Relu activation)": {"conv_out", "head"},
}


def exp_conv_acts(rounds, tmp, kinds):
    for kind in kinds:
        m, b, feeds = conv_chain(kind)
        ranges = measure_ranges(m, feeds)
        vs = {k: v for k, v in ACT_VARIANTS.items() if "internals" not in k or any(r == "act_mid" for r in b.roles.values())}
        run_pattern(f"Conv -> {kind} (4 blocks, 64 ch, 32x32)", m, feeds,
                    q_variants(m, ranges, {"x"}, vs, b.roles), rounds, tmp)


def mlp_chain(kind, blocks=4, d=256, t=64, opset=17):
    b = Builder(opset)
    y = "x"
    for i in range(blocks):
        y = b.act(kind, b.matmul(y, d, d))
    out = b.matmul(y, d, d, role="head", bias_role="head_bias")
    m = b.model({"x": ([1, t, d], np.float32)}, out)
    return m, b, {"x": rng.normal(0, 1, (1, t, d)).astype(np.float32)}


MLP_VARIANTS = {
    "A: act out only (MatMul inputs)": {"act_out"},
    "E: act out + MatMul out (before the bias Add)": {"mm_out", "act_out"},
    "B: act out + bias-add out": {"bias_out", "act_out"},
    "C: act out + MatMul out + bias-add out": {"mm_out", "bias_out", "act_out"},
    "D: everything (act internals too)": {"mm_out", "bias_out", "act_mid", "act_out"},
}


def exp_mlp_acts(rounds, tmp, kinds):
    for kind in kinds:
        m, b, feeds = mlp_chain(kind, opset=20 if kind == "Gelu" else 17)
        ranges = measure_ranges(m, feeds)
        vs = {k: v for k, v in MLP_VARIANTS.items() if "internals" not in k or any(r == "act_mid" for r in b.roles.values())}
        if kind == "none":
            vs = {"A: MatMul inputs only": {"bias_out"}, "C: + MatMul out": {"mm_out", "bias_out"}}
        run_pattern(f"MatMul + bias -> {kind} (4 blocks, [1,64,256] x [256,256])", m, feeds,
                    q_variants(m, ranges, {"x"}, vs, b.roles), rounds, tmp)


def exp_matmul_axis(rounds, tmp):
    m, b, feeds = mlp_chain("Relu")
    ranges = measure_ranges(m, feeds)
    roles = {"act_out", "bias_out"}
    base = {"x"} | {t for t, r in b.roles.items() if r in roles}
    run_pattern("MatMul weight [K, N]: per-channel axis", m, feeds, {
        "per column (axis=1)": quantize(m, ranges, base),
        "per row (axis=0, wrong)": quantize(m, ranges, base, weight_axis_override=0),
        "per tensor": quantize(m, ranges, base, per_channel=False),
    }, rounds, tmp)


def exp_gemm(rounds, tmp):
    b = Builder()
    y = "x"
    for i in range(3):
        w = b.const((rng.normal(0, 1, (512, 512)) / 22).astype(np.float32), "w")
        b.weights[w] = ("Gemm", 0)
        y = b.op("Gemm", [y, w, b.const(np.zeros(512, np.float32), "b")], "gemm_out", transB=1)
        y = b.op("Relu", [y], "act_out")
    m = b.model({"x": ([1, 512], np.float32)}, y)
    feeds = {"x": rng.normal(0, 1, (1, 512)).astype(np.float32)}
    ranges = measure_ranges(m, feeds)
    run_pattern("Gemm (transB=1, weight [N, K] per-channel axis 0) -> Relu", m, feeds,
                q_variants(m, ranges, {"x"}, {"act out only": {"act_out"}, "gemm out + act out": {"gemm_out", "act_out"}},
                           b.roles), rounds, tmp)


def exp_se(rounds, tmp, gate="Sigmoid", act="SiLU"):
    b = Builder()
    c = 96
    x = b.act(act, b.conv("x", 16, c))
    for _ in range(2):
        s = b.op("GlobalAveragePool", [x], "gap_out")
        s = b.op("Relu" if act == "Relu" else "Relu", [b.conv(s, c, 24, k=1, role="fc1_out")], "fc1_act")
        s = b.conv(s, 24, c, k=1, role="fc2_out")
        s = b.op(gate, [s], "gate")
        x = b.op("Mul", [x, s], "se_out")
        x = b.act(act, b.conv(x, c, c))
    out = b.conv(x, c, c, role="head")
    m = b.model({"x": ([1, 16, 32, 32], np.float32)}, out)
    feeds = {"x": rng.normal(0, 1, (1, 16, 32, 32)).astype(np.float32)}
    ranges = measure_ranges(m, feeds)
    common = {"conv_out", "act_out", "head"}
    run_pattern(f"Squeeze-excite: x * {gate}(FC(Relu(FC(GAP(x))))), x = {act}(Conv)", m, feeds, q_variants(m, ranges, {"x"}, {
        "A: only SE output + FC inputs (gap, relu)": common | {"gap_out", "fc1_act", "se_out"},
        "B: A + fc outs": common | {"gap_out", "fc1_out", "fc1_act", "fc2_out", "se_out"},
        "C: B + gate (QLinearSigmoid, QLinearMul)": common | {"gap_out", "fc1_out", "fc1_act", "fc2_out", "gate", "se_out", "act_mid"},
        "D: no gap_out (FC inputs float)": common | {"fc1_act", "se_out"},
    }, b.roles), rounds, tmp)


def attention_model(mask: str, t=65, d=128, heads=4):
    b = Builder()
    hd = d // heads
    inp = {"x": ([1, t, d], np.float32)}
    feeds = {"x": rng.normal(0, 1, (1, t, d)).astype(np.float32)}
    h = b.op("LayerNormalization", ["x", b.const(np.ones(d, np.float32)), b.const(np.zeros(d, np.float32))], "ln_out", axis=-1)
    shape = b.const(np.array([1, t, heads, hd], np.int64))

    def proj(role):
        y = b.matmul(h, d, d, role="mm_out", bias_role=role)
        return b.op("Transpose", [b.op("Reshape", [y, shape])], None, perm=[0, 2, 1, 3])

    q, k, v = proj("q"), proj("k"), proj("v")
    kt = b.op("Transpose", [k], None, perm=[0, 1, 3, 2])
    s = b.op("Div", [b.op("MatMul", [q, kt], "qk_out"), b.const(np.array(np.sqrt(hd), np.float32))], "scores")
    if mask != "none":
        inp["mask"] = ([1, t], np.int64)
        mk = np.ones((1, t), np.int64)
        mk[0, -10:] = 0
        feeds["mask"] = mk
        mf = b.op("Cast", [b.op("Unsqueeze", ["mask", b.const(np.array([1, 2], np.int64))])], to=TensorProto.FLOAT)
        big = -1e4 if mask == "-1e4" else float(np.finfo(np.float32).min)
        ext = b.op("Mul", [b.op("Sub", [b.const(np.array(1.0, np.float32)), mf]), b.const(np.array(big, np.float32))])
        s = b.op("Add", [s, ext], "masked")
    p = b.op("Softmax", [s], "probs", axis=-1)
    ctx = b.op("MatMul", [p, v], "pv_out")
    ctx = b.op("Reshape", [b.op("Transpose", [ctx], None, perm=[0, 2, 1, 3]), b.const(np.array([1, t, d], np.int64))], "ctx")
    out = b.matmul(ctx, d, d, role="o_mm", bias_role="head")
    return b.model(inp, out), b, feeds


def exp_attention(rounds, tmp, mask):
    m, b, feeds = attention_model(mask)
    ranges = measure_ranges(m, feeds)
    probs = [t for t, r in b.roles.items() if r == "probs"]
    fixed = {p: (np.float32(1 / 255), np.uint8(0)) for p in probs}
    base = {"x"}
    vs = {
        "A: weight-MatMul inputs only (ln_out, ctx)": {"ln_out", "ctx", "head"},
        "B: A + q/k/v (after bias) + probs [0,1]": {"ln_out", "ctx", "head", "q", "k", "v", "probs"},
        "C: B + MatMul outs (quantize_static-like)": {"ln_out", "ctx", "head", "q", "k", "v", "probs", "mm_out", "qk_out",
                                                      "pv_out", "o_mm"},
        "D: B + scores (Softmax input)": {"ln_out", "ctx", "head", "q", "k", "v", "probs", "masked" if mask != "none" else "scores"},
    }
    run_pattern(f"Attention block (t=65, d=128, 4 heads), mask: {mask}", m, feeds,
                q_variants(m, ranges, base, vs, b.roles, fixed=fixed), rounds, tmp)


def exp_layernorm(rounds, tmp):
    b = Builder()
    d, t = 256, 64
    y = "x"
    for _ in range(3):
        z = b.matmul(y, d, d, bias_role="bias_out")
        r = b.op("Add", [z, y], "res_out")
        y = b.op("LayerNormalization", [r, b.const(np.ones(d, np.float32)), b.const(np.zeros(d, np.float32))], "ln_out",
                 axis=-1)
    m = b.model({"x": ([1, t, d], np.float32)}, y)
    feeds = {"x": rng.normal(0, 1, (1, t, d)).astype(np.float32)}
    ranges = measure_ranges(m, feeds)
    run_pattern("MatMul -> residual Add -> LayerNormalization (3 blocks)", m, feeds, q_variants(m, ranges, {"x"}, {
        "A: LN out only": {"ln_out"},
        "B: LN out + LN in (res_out)": {"ln_out", "res_out"},
        "C: B + Add inputs (QLinearAdd)": {"ln_out", "res_out", "bias_out"},
        "D: LN out + MatMul bias-add out (Add + LN float)": {"ln_out", "bias_out"},
    }, b.roles), rounds, tmp)


def exp_concat(rounds, tmp):
    b = Builder()
    x = b.op("Relu", [b.conv("x", 16, 64)], "a0")
    for _ in range(2):
        a = b.op("Relu", [b.conv(x, 64, 32)], "a1")
        c = b.op("Relu", [b.conv(x, 64, 32, k=1)], "a2")
        x = b.op("Concat", [a, c], "cat", axis=1)
    out = b.conv(x, 64, 64, role="head")
    m = b.model({"x": ([1, 16, 32, 32], np.float32)}, out)
    feeds = {"x": rng.normal(0, 1, (1, 16, 32, 32)).astype(np.float32)}
    ranges = measure_ranges(m, feeds)
    cats = [t for t, r in b.roles.items() if r == "cat"]
    groups = []
    for node in m.graph.node:
        if node.op_type == "Concat":
            groups.append(list(node.input) + list(node.output))
    ins = {t for t, r in b.roles.items() if r in ("a0", "a1", "a2", "head")}
    run_pattern("Concat of two Conv branches -> Conv", m, feeds, {
        "A: inputs own ranges, no Q after Concat": quantize(m, ranges, {"x"} | ins),
        "B: inputs own ranges + Concat out (QLinearConcat requantizes)": quantize(m, ranges, {"x"} | ins | set(cats)),
        "C: one shared range for inputs and output": quantize(m, ranges, {"x"} | ins | set(cats), share=groups),
        "D: shared range on inputs, no Q after Concat": quantize(m, ranges, {"x"} | ins, share=[g[:-1] for g in groups]),
    }, rounds, tmp)


def exp_resize_pool(rounds, tmp):
    for kind in ("Resize-nearest", "Resize-linear", "MaxPool"):
        b = Builder()
        x = b.op("Relu", [b.conv("x", 16, 64)], "r0")
        for _ in range(2):
            if kind == "MaxPool":
                y = b.op("MaxPool", [x], "rs", kernel_shape=[2, 2], strides=[2, 2])
            else:
                y = b.op("Resize", [x, "", b.const(np.array([1, 1, 2, 2], np.float32))], "rs",
                         mode="nearest" if kind == "Resize-nearest" else "linear")
            x = b.op("Relu", [b.conv(y, 64, 64)], "r0")
        out = b.conv(x, 64, 64, role="head")
        hw = 64 if kind == "MaxPool" else 16
        m = b.model({"x": ([1, 16, hw, hw], np.float32)}, out)
        feeds = {"x": rng.normal(0, 1, (1, 16, hw, hw)).astype(np.float32)}
        ranges = measure_ranges(m, feeds)
        groups = [[n.input[0], n.output[0]] for n in m.graph.node if n.op_type in ("MaxPool", "Resize")]
        base = {"x"} | {t for t, r in b.roles.items() if r in ("r0", "head")}
        rs = {t for t, r in b.roles.items() if r == "rs"}
        run_pattern(f"Conv -> Relu -> {kind} -> Conv", m, feeds, {
            "A: Q/DQ before only": quantize(m, ranges, base),
            "B: Q/DQ before and after, same params": quantize(m, ranges, base | rs, share=groups),
            "C: Q/DQ before and after, own range after": quantize(m, ranges, base | rs),
        }, rounds, tmp)


def exp_gap(rounds, tmp, op="GlobalAveragePool"):
    b = Builder()
    x = b.op("Relu", [b.conv("x", 16, 256)], "r0")
    x = b.op("Relu", [b.conv(x, 256, 256)], "r0")
    if op == "GlobalAveragePool":
        p = b.op("GlobalAveragePool", [x], "pool")
    else:
        p = b.op("ReduceMean", [x], "pool", axes=[2, 3], keepdims=1)
    f = b.op("Flatten", [p], "flat")
    w = b.const((rng.normal(0, 1, (256, 512)) / 16).astype(np.float32), "w")
    y = b.op("MatMul", [f, w], "head")
    m = b.model({"x": ([1, 16, 16, 16], np.float32)}, y)
    feeds = {"x": rng.normal(0, 1, (1, 16, 16, 16)).astype(np.float32)}
    ranges = measure_ranges(m, feeds)
    base = {"x"} | {t for t, r in b.roles.items() if r == "r0"}
    pool = {t for t, r in b.roles.items() if r == "pool"}
    flat = {t for t, r in b.roles.items() if r == "flat"}
    run_pattern(f"Conv -> Relu -> {op} -> Flatten -> MatMul", m, feeds, {
        "A: nothing after the pool (MatMul float)": quantize(m, ranges, base),
        "B: pool out, own range": quantize(m, ranges, base | pool),
        "C: flatten out, own range": quantize(m, ranges, base | flat),
        "D: pool out + flatten out (same range)": quantize(m, ranges, base | pool | flat, share=[sorted(pool | flat)]),
    }, rounds, tmp)


def exp_residual(rounds, tmp):
    b = Builder()
    x = b.op("Relu", [b.conv("x", 16, 64)], "r0")
    for _ in range(3):
        y = b.op("Relu", [b.conv(x, 64, 64)], "r1")
        y = b.conv(y, 64, 64, role="c2")
        x = b.op("Relu", [b.op("Add", [x, y], "add")], "r0")
    out = b.conv(x, 64, 64, role="head")
    m = b.model({"x": ([1, 16, 32, 32], np.float32)}, out)
    feeds = {"x": rng.normal(0, 1, (1, 16, 32, 32)).astype(np.float32)}
    ranges = measure_ranges(m, feeds)
    roles = b.roles
    run_pattern("Residual: Relu(x + Conv(Relu(Conv(x))))", m, feeds, q_variants(m, ranges, {"x"}, {
        "A: block outputs only (Add float)": {"r0", "r1", "head"},
        "B: A + second conv out (Add inputs both quantized -> QLinearAdd)": {"r0", "r1", "c2", "head"},
        "C: B + add out before Relu": {"r0", "r1", "c2", "add", "head"},
    }, roles), rounds, tmp)


def exp_shape_ops(rounds, tmp):
    b = Builder()
    d, t = 256, 64
    y = b.matmul("x", d, d, bias_role="o0")
    y = b.op("Relu", [y], "a")
    r = b.op("Reshape", [y, b.const(np.array([1, t, 4, 64], np.int64))], "reshape")
    tr = b.op("Transpose", [r], "transpose", perm=[0, 2, 1, 3])
    sl = b.op("Slice", [tr, b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64)),
                        b.const(np.array([1], np.int64))], "slice")
    f = b.op("Reshape", [sl, b.const(np.array([1, 2 * t, 64], np.int64))], "flat")
    out = b.matmul(f, 64, 256, role="head", bias_role="head_b")
    m = b.model({"x": ([1, t, d], np.float32)}, out)
    feeds = {"x": rng.normal(0, 1, (1, t, d)).astype(np.float32)}
    ranges = measure_ranges(m, feeds)
    chain = [t_ for t_, r in b.roles.items() if r in ("a", "reshape", "transpose", "slice", "flat")]
    a = {t_ for t_, r in b.roles.items() if r == "a"}
    fl = {t_ for t_, r in b.roles.items() if r == "flat"}
    base = {"x"} | {t_ for t_, r in b.roles.items() if r in ("o0", "head_b")}  # the two MatMul+bias outputs
    run_pattern("MatMul+bias -> Relu -> Reshape -> Transpose -> Slice -> Reshape -> MatMul+bias", m, feeds, {
        "A: Q/DQ after Relu only": quantize(m, ranges, base | a),
        "B: Q/DQ after each shape op, same params": quantize(m, ranges, base | set(chain), share=[chain]),
        "C: Q/DQ after each shape op, own ranges": quantize(m, ranges, base | set(chain)),
        "D: after Relu and before the MatMul only (same params)": quantize(m, ranges, base | a | fl, share=[sorted(a | fl)]),
    }, rounds, tmp)


def exp_split_gather(rounds, tmp):
    # C2f-style Split of a conv output into two halves feeding convs
    b = Builder()
    x = b.op("Relu", [b.conv("x", 16, 128)], "r0")
    h1, h2 = b.op("Split", [x, b.const(np.array([64, 64], np.int64))], "half", n_out=2, axis=1)
    y = b.op("Concat", [b.op("Relu", [b.conv(h1, 64, 64)], "r1"), b.op("Relu", [b.conv(h2, 64, 64)], "r1")], "cat", axis=1)
    out = b.conv(y, 128, 64, role="head")
    m = b.model({"x": ([1, 16, 32, 32], np.float32)}, out)
    feeds = {"x": rng.normal(0, 1, (1, 16, 32, 32)).astype(np.float32)}
    ranges = measure_ranges(m, feeds)
    base = {"x"} | {t for t, r in b.roles.items() if r in ("r0", "head")}
    r1 = {t for t, r in b.roles.items() if r in ("r1", "cat")}
    halves = {t for t, r in b.roles.items() if r == "half"}
    cat_group = [sorted(r1)]
    run_pattern("Conv -> Relu -> Split -> 2 x Conv -> Concat -> Conv", m, feeds, {
        "A: no pair after the Split": quantize(m, ranges, base | r1, share=cat_group),
        "B: pairs after the Split, same parameters as its input": quantize(m, ranges, base | r1 | halves,
                                                                          share=cat_group + [sorted(halves | {x})]),
    }, rounds, tmp)
    # ViT/BERT head: Gather of the CLS token (axis 1, index 0) -> MatMul
    b = Builder()
    y = b.matmul("x", 128, 128, bias_role="o0")
    g = b.op("Gather", [y, b.const(np.array(0, np.int64))], "cls", axis=1)
    out = b.matmul(g, 128, 64, role="head", bias_role="head_b")
    m = b.model({"x": ([1, 65, 128], np.float32)}, out)
    feeds = {"x": rng.normal(0, 1, (1, 65, 128)).astype(np.float32)}
    ranges = measure_ranges(m, feeds)
    base = {"x"} | {t for t, r in b.roles.items() if r in ("o0", "head_b")}
    cls = {t for t, r in b.roles.items() if r == "cls"}
    o0 = {t for t, r in b.roles.items() if r == "o0"}
    run_pattern("MatMul+bias -> Gather(CLS) -> MatMul+bias", m, feeds, {
        "A: no pair after the Gather": quantize(m, ranges, base),
        "B: pair after the Gather, same parameters": quantize(m, ranges, base | cls, share=[sorted(cls | o0)]),
    }, rounds, tmp)


def exp_lstm(rounds, tmp):
    """The zoo's LSTM tagger: what quantize_static and quantize_dynamic make of an LSTM."""
    import logging

    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    logging.getLogger().setLevel(logging.ERROR)
    here = os.environ.get("LSTM_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
    path = os.path.join(here, "lstm.onnx")
    calib = dict(np.load(os.path.join(here, "lstm.calib.npz")))
    feeds = {"features": calib["features"][:1]}
    pre = os.path.join(tmp, "lstm_pre.onnx")
    quant_pre_process(path, pre)

    class Reader:
        def __init__(self):
            self.it = iter([{"features": calib["features"][i:i + 16]} for i in range(0, len(calib["features"]), 16)])

        def get_next(self):
            return next(self.it, None)

    st = os.path.join(tmp, "lstm_static.onnx")
    quantize_static(pre, st, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    dy = os.path.join(tmp, "lstm_dynamic.onnx")
    quantize_dynamic(pre, dy, weight_type=QuantType.QInt8)
    dy_mm = os.path.join(tmp, "lstm_dynamic_matmul.onnx")
    quantize_dynamic(pre, dy_mm, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
    run_pattern("Zoo LSTM tagger (2-layer LSTM 128 + Linear): onnxruntime's own tools", onnx.load(path), feeds, {
        "quantize_static (QDQ, per-channel)": onnx.load(st),
        "quantize_dynamic (all: DynamicQuantizeLSTM)": onnx.load(dy),
        "quantize_dynamic (MatMul/Gemm only)": onnx.load(dy_mm),
    }, rounds, tmp)


EXPERIMENTS = {
    "conv_acts": lambda r, t: exp_conv_acts(r, t, ["Relu", "Relu6", "SiLU", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh",
                                                   "LeakyRelu", "PRelu", "Elu"]),
    "mlp_acts": lambda r, t: exp_mlp_acts(r, t, ["none", "Relu", "GeluErf", "GeluTanh", "Gelu", "SiLU", "Tanh"]),
    "matmul_axis": exp_matmul_axis,
    "gemm": exp_gemm,
    "se": lambda r, t: (exp_se(r, t, "Sigmoid", "SiLU"), exp_se(r, t, "HardSigmoid", "HardSwish")),
    "attention": lambda r, t: [exp_attention(r, t, m) for m in ("none", "-1e4", "finfo.min")],
    "layernorm": exp_layernorm,
    "concat": exp_concat,
    "resize_pool": exp_resize_pool,
    "gap": lambda r, t: (exp_gap(r, t), exp_gap(r, t, "ReduceMean")),
    "residual": exp_residual,
    "shape_ops": exp_shape_ops,
    "split_gather": exp_split_gather,
    "lstm": exp_lstm,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(EXPERIMENTS), help="comma-separated: " + ",".join(EXPERIMENTS))
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--dynamic-batch", action="store_true", help="symbolic batch axis on the graph inputs, as exporters write")
    args = ap.parse_args()
    global DYNAMIC_BATCH
    DYNAMIC_BATCH = args.dynamic_batch
    print(f"onnxruntime {ort.__version__}, onnx {onnx.__version__}; one thread, batch 1, median of {args.rounds} rounds"
          + ("; symbolic batch axis" if DYNAMIC_BATCH else "; static shapes"))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            EXPERIMENTS[name](args.rounds, tmp)


if __name__ == "__main__":
    main()
