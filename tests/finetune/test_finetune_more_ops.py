"""The ops of :mod:`qtool.finetune.more_ops`: each variant's forward against onnxruntime, and (where the op is
differentiable) ``jax.grad`` against central finite differences along random directions."""

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from qtool.errors import QtoolError
from qtool.finetune.interpreter import ATTRS, Interpreter, _schemas

RNG = np.random.default_rng(7)


def _r(*shape, lo=None, hi=None):
    if lo is not None:
        return RNG.uniform(lo, hi, shape).astype(np.float32)
    return RNG.standard_normal(shape).astype(np.float32)


def _i(values):
    return np.asarray(values, np.int64)


def _model(op_type, inputs: dict, consts: dict, attrs: dict, opset: int, order, out_dtype, outputs):
    graph_inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                    for k, v in inputs.items()]
    node = helper.make_node(op_type, order, outputs, **attrs)
    outs = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)), None)
            for o in outputs if o]
    graph = helper.make_graph([node], "g", graph_inputs, outs,
                              initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _check(op_type, inputs, consts=None, attrs=None, opset=13, order=None, out_dtype=None, grad=True, tol=1e-5,
           outputs=("y",), reference=None):
    """Forward (every output) equal to onnxruntime's (within ``tol``; ``reference="onnx"``: ONNX's reference
    implementation, for what onnxruntime refuses); with ``grad``, the gradient of a weighted sum of the first
    output with respect to the first input equal to central differences along two random directions. Inside
    ``_batched()`` the check runs with the others at its end."""
    consts, attrs = consts or {}, attrs or {}
    first = next(iter(inputs.values()), None)
    case = {"op_type": op_type, "inputs": inputs, "consts": consts, "attrs": attrs, "opset": opset,
            "order": order or (list(inputs) + list(consts)), "out_dtype": out_dtype or first.dtype, "grad": grad,
            "tol": tol, "outputs": list(outputs), "reference": reference}
    if _PENDING is None:
        _check_all([case])
    else:
        _PENDING.append(case)


_PENDING = None


@contextlib.contextmanager
def _batched():
    """The checks made inside run together at the end: one model (a node per check), one onnxruntime session
    and one compiled function per opset, compiled without XLA's backend optimizations (the tests stay fast)."""
    global _PENDING
    _PENDING = []
    try:
        yield
        cases = _PENDING
    finally:
        _PENDING = None
    _check_all(cases)


def _batch(test):
    """A test whose checks run batched (``_batched``)."""
    @functools.wraps(test)
    def run():
        with _batched():
            test()

    return run


def _check_all(cases):
    groups = {}
    for k, case in enumerate(cases):
        groups.setdefault((case["opset"], case["reference"], not case["inputs"]), []).append((f"c{k}_", case))
    for (opset, reference, host), group in groups.items():
        _check_group(opset, reference, host, group)


def _check_group(opset, reference, host, group):
    nodes, graph_inputs, outs, inits, inputs = [], [], [], [], {}
    for pre, c in group:
        inputs.update({pre + n: v for n, v in c["inputs"].items()})
        graph_inputs += [helper.make_tensor_value_info(pre + n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                         for n, v in c["inputs"].items()]
        inits += [numpy_helper.from_array(v, pre + n) for n, v in c["consts"].items()]
        nodes.append(helper.make_node(c["op_type"], [pre + n if n else "" for n in c["order"]],
                                      [pre + o if o else "" for o in c["outputs"]], **c["attrs"]))
        outs += [helper.make_tensor_value_info(pre + o, helper.np_dtype_to_tensor_dtype(np.dtype(c["out_dtype"])),
                                               None) for o in c["outputs"] if o]
    model = helper.make_model(helper.make_graph(nodes, "g", graph_inputs, outs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    if reference == "onnx":
        values = ReferenceEvaluator(model).run(None, inputs)
    else:
        values = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    refs = dict(zip([o.name for o in outs], values))
    interp = Interpreter(model)
    if host:  # all constant: computed on the host
        got = interp.run({})
        for pre, c in group:
            y = got[pre + c["outputs"][0]]
            assert isinstance(y, np.ndarray), (c["op_type"], type(y))
            _compare(c, pre, got, refs)
        return
    graded = [(pre, c) for pre, c in group if c["grad"]]
    firsts = {pre: pre + next(iter(c["inputs"])) for pre, c in graded}
    feeds = {k: v.astype(np.int32) if v.dtype == np.int64 else v for k, v in inputs.items()}  # JAX's int32
    ws = {pre: _r(*refs[pre + c["outputs"][0]].shape) for pre, c in graded}

    def checks(feeds, ws):
        """Every output; each graded check's weighted sum (of its own first input only) and its gradient."""
        def sums(xs):
            out = interp.run({**feeds, **{firsts[pre]: x for pre, x in xs.items()}})
            return jnp.stack([jnp.sum(out[pre + c["outputs"][0]] * ws[pre]) for pre, c in graded]), out

        if not graded:
            return interp.run(feeds), None, None
        total, vjp, out = jax.vjp(sums, {pre: feeds[firsts[pre]] for pre in ws}, has_aux=True)
        return out, total, vjp(jnp.ones_like(total))[0]

    # one compiled function (forward and backward), also run at the moved inputs of the finite differences
    run = jax.jit(checks).lower(feeds, ws).compile({"xla_backend_optimization_level": 0})
    got, _, g = run(feeds, ws)
    for pre, c in group:
        _compare(c, pre, got, refs)
    if not graded:
        return
    eps, dirs = np.float32(1e-3), {pre: _r(2, *inputs[firsts[pre]].shape) for pre, c in graded}

    def moved(d, sign):
        return {**feeds, **{firsts[pre]: feeds[firsts[pre]] + sign * eps * dirs[pre][d] for pre in dirs}}

    fd = np.stack([(np.asarray(run(moved(d, 1), ws)[1], np.float64) - np.asarray(run(moved(d, -1), ws)[1])) / (2 * eps)
                   for d in range(2)])
    for j, (pre, c) in enumerate(graded):
        assert np.isfinite(np.asarray(g[pre])).all(), (c["op_type"], c["attrs"])
        ad = np.asarray(dirs[pre], np.float64).reshape(2, -1) @ np.asarray(g[pre], np.float64).reshape(-1)
        np.testing.assert_allclose(fd[:, j], ad, rtol=1e-2, atol=1e-2,
                                   err_msg=f"gradient of {c['op_type']} {c['attrs']} opset {c['opset']}")


def _compare(c, pre, got, refs):
    for out in (o for o in c["outputs"] if o):
        o, r = np.asarray(got[pre + out]), refs[pre + out]
        what = f"{c['op_type']} {c['attrs']} opset {c['opset']} output {out}"
        assert o.shape == r.shape, (what, o.shape, r.shape)
        assert o.dtype == r.dtype or (r.dtype == np.int64 and o.dtype == np.int32), (what, o.dtype, r.dtype)
        np.testing.assert_allclose(o, r, rtol=c["tol"], atol=c["tol"], err_msg=what)


X4 = (2, 4, 3, 5)


def _graded(cases, attrs_at: int):
    """``cases`` with a last field: whether to check the gradient, for the first case of each op (and
    ``mode``/``reduction``) only; the forward of every case is checked."""
    seen, out = set(), []
    for case in cases:
        attrs = case[attrs_at]
        key = (case[0], attrs.get("mode"), attrs.get("reduction"))
        out.append((*case, key not in seen))
        seen.add(key)
    return out


ELEMENTWISE = [
    ("Mish", {}, 18, {}), ("Mish", {}, 22, {}), ("Celu", {}, 12, {}), ("Celu", {"alpha": 0.5}, 12, {}),
    ("Softsign", {}, 13, {}), ("ThresholdedRelu", {}, 10, {}), ("ThresholdedRelu", {"alpha": 0.3}, 10, {}),
    ("Shrink", {}, 13, {}), ("Shrink", {"lambd": 0.8, "bias": 0.3}, 13, {}), ("Swish", {}, 24, {}),
    ("Swish", {"alpha": 1.7}, 24, {}), ("Tan", {}, 13, {"lo": -1.3, "hi": 1.3}), ("Atan", {}, 13, {}),
    ("Asin", {}, 13, {"lo": -0.9, "hi": 0.9}), ("Acos", {}, 13, {"lo": -0.9, "hi": 0.9}), ("Sinh", {}, 13, {}),
    ("Cosh", {}, 13, {}), ("Asinh", {}, 13, {}), ("Acosh", {}, 13, {"lo": 1.1, "hi": 4.0}),
    ("Atanh", {}, 13, {"lo": -0.9, "hi": 0.9}),
]


def test_elementwise():
    with _batched():
        for op_type, attrs, opset, dist, grad in _graded(ELEMENTWISE, 1):
            x = _r(2, 3, 4, **dist) if dist else _r(2, 3, 4) * 2
            _check(op_type, {"x": x}, attrs=attrs, opset=opset, grad=grad)


@_batch
def test_edge_values():
    """IsInf on infinities and NaN, Hardmax on ties (the first maximum wins), LpNormalization of a zero row (0);
    finite gradients where a pooling window or a normalized channel is all zeros."""
    x = np.asarray([[1.0, np.inf, -np.inf, np.nan], [0.0, -1.0, np.inf, 3.0]], np.float32)
    for attrs in ({}, {"detect_negative": 0}, {"detect_positive": 0}):
        _check("IsInf", {"x": x}, attrs=attrs, opset=10, out_dtype=np.bool_, grad=False)
    x = np.round(_r(2, 3, 4) * 2) / 2
    for attrs, opset in (({}, 13), ({"axis": 1}, 13), ({"axis": 0}, 13), ({}, 11), ({"axis": 2}, 11), ({}, 1)):
        _check("Hardmax", {"x": x}, attrs=attrs, opset=opset, grad=False)
    x = _r(3, 4)
    x[1] = 0
    for p in (1, 2):
        _check("LpNormalization", {"x": x}, attrs={"p": p}, opset=22, grad=False)
    # all-zero windows and channels (after a ReLU): finite gradients
    x = _r(1, 2, 4, 4)
    x[0, 0] = 0
    for op_type, attrs in (("LpPool", {"kernel_shape": [2, 2], "p": 3}), ("LpPool", {"kernel_shape": [2, 2]}),
                           ("GlobalLpPool", {})):
        _check(op_type, {"x": x}, attrs=attrs, opset=18)
    # a zero vector, a constant channel: 0 (MeanVarianceNormalization by ONNX's definition, its 1e-9, where
    # onnxruntime divides 0 by 0); not differentiable there (finite differences do not apply): a finite gradient
    for op_type, attrs in (("LpNormalization", {"axis": 2}), ("MeanVarianceNormalization", {"axes": [2, 3]})):
        interp = Interpreter(_model(op_type, {"x": x}, {}, attrs, 13, ["x"], np.float32, ["y"]))
        def weighted(v, interp=interp):
            y = interp.run({"x": v})["y"]
            return jnp.sum(y * jnp.arange(16.0).reshape(4, 4)), y

        g, y = jax.jit(jax.grad(weighted, has_aux=True))(x)
        assert np.isfinite(np.asarray(g)).all() and np.isfinite(np.asarray(y)).all(), op_type
        np.testing.assert_array_equal(np.asarray(y)[0, 0], 0)


NORMALIZATION = [
    ("GroupNormalization", {"num_groups": 2}, 18, {"s": _r(2), "b": _r(2)}),
    ("GroupNormalization", {"num_groups": 4, "epsilon": 1e-2}, 18, {"s": _r(4), "b": _r(4)}),
    ("GroupNormalization", {"num_groups": 2}, 21, {"s": _r(4), "b": _r(4)}),
    ("GroupNormalization", {"num_groups": 1}, 21, {"s": _r(4), "b": _r(4)}),
    ("RMSNormalization", {}, 23, {"s": _r(5)}),
    ("RMSNormalization", {"axis": 1, "epsilon": 1e-3}, 23, {"s": _r(4, 3, 5)}),
    ("LRN", {"size": 3}, 13, {}), ("LRN", {"size": 1, "alpha": 0.1, "beta": 0.5, "bias": 2.0}, 13, {}),
    ("LRN", {"size": 5, "alpha": 0.3}, 1, {}),
    ("LpNormalization", {}, 1, {}), ("LpNormalization", {"p": 1, "axis": 1}, 1, {}),
    ("LpNormalization", {"p": 2, "axis": 0}, 22, {}),
    ("MeanVarianceNormalization", {}, 13, {}), ("MeanVarianceNormalization", {"axes": [1, -1]}, 13, {}),
    ("MeanVarianceNormalization", {"axes": [2, 3]}, 9, {}),
    ("LpPool", {"kernel_shape": [2, 2]}, 11, {}),
    ("LpPool", {"kernel_shape": [3, 2], "p": 3, "strides": [2, 1], "pads": [1, 0, 1, 1]}, 11, {}),
    ("LpPool", {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]}, 18, {}),
    ("LpPool", {"kernel_shape": [2, 2], "dilations": [1, 2], "ceil_mode": 1, "strides": [2, 2]}, 18, {}),
    ("GlobalLpPool", {}, 2, {}), ("GlobalLpPool", {"p": 1}, 2, {}),
]


def test_normalization_and_pooling():
    with _batched():
        for op_type, attrs, opset, consts, grad in _graded(NORMALIZATION, 1):
            _check(op_type, {"x": _r(*X4) * 3 + 1}, consts, attrs, opset=opset, grad=grad, tol=2e-5)


@_batch
def test_reduce_log_sum():
    x = _r(2, 3, 4, lo=0.1, hi=2.0)
    _check("ReduceLogSum", {"x": x}, attrs={"axes": [1]}, opset=13)
    _check("ReduceLogSum", {"x": x}, attrs={"axes": [0, -1], "keepdims": 0}, opset=11, grad=False)
    _check("ReduceLogSum", {"x": x}, opset=13, grad=False)
    _check("ReduceLogSum", {"x": x}, {"a": _i([2])}, opset=18, grad=False)
    _check("ReduceLogSum", {"x": x}, {"a": _i([0, 1])}, {"keepdims": 0}, opset=18, grad=False)


DATA = [  # (op, inputs, consts, attrs, opset, differentiable)
    ("DepthToSpace", {"x": _r(2, 8, 2, 3)}, {}, {"blocksize": 2}, 13, True),
    ("DepthToSpace", {"x": _r(1, 8, 2, 3)}, {}, {"blocksize": 2, "mode": "CRD"}, 13, True),
    ("DepthToSpace", {"x": _r(1, 9, 2, 2)}, {}, {"blocksize": 3}, 1, True),
    ("SpaceToDepth", {"x": _r(2, 3, 4, 6)}, {}, {"blocksize": 2}, 13, True),
    ("GatherND", {"x": _r(3, 4, 5)}, {"i": _i([[0, 1], [2, -1], [-3, 3]])}, {}, 11, True),
    ("GatherND", {"x": _r(3, 4, 5), "i": _i([[[1]], [[-1]]])}, {}, {}, 12, True),
    ("GatherND", {"x": _r(2, 4, 5)}, {"i": _i([[[1, 2], [3, -1]], [[0, 0], [2, 4]]])}, {"batch_dims": 1}, 12, True),
    ("GatherND", {"x": _r(2, 3, 4, 5), "i": _i([[[1], [3]], [[0], [-2]], [[2], [2]]] * 2).reshape(2, 3, 2, 1)},
     {}, {"batch_dims": 2}, 13, True),
    ("ScatterElements", {"x": _r(3, 4), "u": _r(2, 4)}, {"i": _i([[1, 0, 2, -1], [0, 2, -3, 1]])}, {}, 11, True),
    ("ScatterElements", {"x": _r(3, 4), "u": _r(3, 2)}, {"i": _i([[1, 3], [0, -2], [3, 1]])}, {"axis": 1}, 13, True),
    ("Scatter", {"x": _r(3, 4), "u": _r(2, 4)}, {"i": _i([[1, 0, 2, -1], [0, 2, 1, 1]])}, {}, 9, True),
    *[("ScatterElements", {"x": _r(3, 4), "u": _r(3, 3)}, {"i": _i([[1, 1, 3], [0, -2, 0], [2, 1, 2]])},
       {"axis": 1, "reduction": red}, 18, True) for red in ("add", "mul", "max", "min")],
    ("ScatterElements", {"x": _r(3, 4), "u": _r(3, 2)}, {"i": _i([[0, 0], [1, 1], [2, 0]])},
     {"axis": 1, "reduction": "add"}, 16, True),
    ("OneHot", {"i": _i([[0, 2, -1], [5, -4, 1]])}, {"d": _i(4), "v": np.asarray([-1.0, 2.0], np.float32)},
     {}, 11, False),
    ("OneHot", {"i": _i([0, 2, -1, 3])}, {"d": _i([3]), "v": _i([0, 1])}, {"axis": 0}, 11, False),
    ("OneHot", {"i": np.asarray([[1.0, -2.0]], np.float32)}, {"d": np.asarray(3.0, np.float32),
     "v": np.asarray([0.5, 3.0], np.float32)}, {"axis": 1}, 9, False),
    ("CumSum", {"x": _r(3, 4)}, {"a": _i(1)}, {}, 11, True),
    ("CumSum", {"x": _r(3, 4)}, {"a": np.asarray(-2, np.int32)}, {"exclusive": 1}, 11, True),
    ("CumSum", {"x": _r(3, 4, 2)}, {"a": _i(1)}, {"reverse": 1}, 14, True),
    ("CumSum", {"x": _r(3, 4, 2)}, {"a": _i(1)}, {"reverse": 1, "exclusive": 1}, 14, True),
    ("CumSum", {"x": _i([[1, 2, 3], [4, 5, 6]]).astype(np.int32)}, {"a": _i(1)}, {"reverse": 1}, 14, False),
    ("CumProd", {"x": _r(3, 4)}, {"a": _i(1)}, {}, 26, True),
    ("CumProd", {"x": _r(3, 4)}, {"a": _i(0)}, {"exclusive": 1, "reverse": 1}, 26, True),
    ("EyeLike", {"x": _r(3, 4)}, {}, {}, 9, False),
    ("EyeLike", {"x": _r(4, 3)}, {}, {"k": -1, "dtype": 7}, 9, False),
    ("EyeLike", {"x": _r(3, 5)}, {}, {"k": 2}, 22, False),
    ("ReverseSequence", {"x": _r(4, 3, 2)}, {"l": _i([4, 1, 2])}, {}, 10, True),
    ("ReverseSequence", {"x": _r(3, 5, 2), "l": _i([5, 3, 0])}, {}, {"batch_axis": 0, "time_axis": 1}, 10, True),
]


def test_data_movement():
    with _batched():
        for op_type, inputs, consts, attrs, opset, differentiable, graded in _graded(DATA, 3):
            out_dtype = {"OneHot": consts.get("v", np.zeros(1)).dtype}.get(op_type)
            if op_type == "EyeLike" and "dtype" in attrs:
                out_dtype = np.int64
            order = {"ScatterElements": ["x", "i", "u"], "Scatter": ["x", "i", "u"]}.get(op_type)
            _check(op_type, inputs, consts, attrs, opset=opset, order=order, out_dtype=out_dtype,
                   grad=differentiable and graded)


GRID = [(mode, padding, (i + j) % 2, 16) for i, mode in enumerate(("bilinear", "nearest", "bicubic"))
        for j, padding in enumerate(("zeros", "border", "reflection"))]
GRID += [("linear", "zeros", 0, 20), ("nearest", "border", 1, 20), ("cubic", "reflection", 0, 20),
         (None, "zeros", 0, 20)]


def test_grid_sample():
    """2-D, every mode (opset 16's names and 20's; the default mode) with every padding, each with and without
    align_corners; the grid reaches past the image (padding matters); the gradient with respect to the image
    (bilinear, zeros padding); 3-D linear and nearest."""
    with _batched():
        for mode, padding, align, opset in GRID:
            attrs = {"padding_mode": padding, "align_corners": align} | ({"mode": mode} if mode else {})
            grad = mode == "bilinear" and padding == "zeros"
            _check("GridSample", {"x": _r(2, 3, 4, 5), "g": _r(2, 3, 4, 2, lo=-1.6, hi=1.6)}, attrs=attrs,
                   opset=opset, grad=grad)
        for mode in ("linear", "nearest"):
            _check("GridSample", {"x": _r(1, 2, 3, 4, 5), "g": _r(1, 2, 3, 2, 3, lo=-1.3, hi=1.3)},
                   attrs={"mode": mode, "padding_mode": "reflection"}, opset=20, grad=False)


@_batch
def test_affine_grid():
    for align in (0, 1):
        _check("AffineGrid", {"t": _r(2, 2, 3)}, {"s": _i([2, 3, 4, 5])}, {"align_corners": align}, opset=20,
               grad=not align)
        _check("AffineGrid", {"t": _r(1, 3, 4)}, {"s": _i([1, 1, 2, 3, 4])}, {"align_corners": align}, opset=20,
               grad=False)


@_batch
def test_det_windows_bits_center_crop_pad():
    _check("Det", {"x": _r(2, 3, 3)}, opset=11)
    for op_type in ("HannWindow", "HammingWindow", "BlackmanWindow"):
        for attrs in ({}, {"periodic": 0}):
            _check(op_type, {}, {"n": np.asarray(6, np.int32)}, attrs, opset=17, out_dtype=np.float32, grad=False)
    a, b = _i([[1, 6, 255], [7, 8, 9]]).astype(np.uint8), _i([1, 2, 3]).astype(np.uint8)
    for op_type in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        _check(op_type, {"a": np.asarray(a, np.int32), "b": np.asarray(b, np.int32)}, opset=18, grad=False)
    _check("BitwiseNot", {"a": a}, opset=18, grad=False)
    for direction in ("LEFT", "RIGHT"):
        _check("BitShift", {"a": a, "b": b}, attrs={"direction": direction}, opset=11, grad=False)
    x = _r(2, 5, 4)
    _check("CenterCropPad", {"x": x}, {"s": _i([3, 3, 7])}, opset=18)
    _check("CenterCropPad", {"x": x}, {"s": _i([2, 6])}, {"axes": [-1, 1]}, opset=18, grad=False)


LOSSES = [
    ({}, False, [[0, 2, 1, 3]]), ({"reduction": "sum"}, True, [[0, 2, 1, 3]]),
    ({"ignore_index": 2}, True, [[0, 2, 1, 3]]), ({"ignore_index": -1, "reduction": "none"}, False, [[0, -1, 1, 3]]),
]


def test_losses():
    """Both losses, every reduction, class weights, ignore_index (also out of the classes' range); labels
    [N, d] on scores [N, C, d]; the gradient for the scores."""
    with _batched():
        for op_type in ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"):
            for attrs, weighted, labels in LOSSES:
                consts = {"w": np.abs(_r(4)) + 0.5} if weighted else {}
                _check(op_type, {"x": _r(1, 4, 4), "t": np.asarray(labels, np.int64)}, consts, attrs, opset=13)


ATTENTION = [  # (attrs, 3-D, with a past cache, mask: None/"bool"/"float"/"short", nonpad_kv_seqlen)
    ({}, False, False, None, False), ({"is_causal": 1}, False, False, None, False),
    ({"scale": 0.3, "softcap": 2.0}, False, False, "float", False),
    ({"q_num_heads": 4, "kv_num_heads": 2}, True, False, "bool", False),
    ({"q_num_heads": 2, "kv_num_heads": 1, "is_causal": 1, "qk_matmul_output_mode": 1}, True, False, None, False),
    ({"is_causal": 1, "qk_matmul_output_mode": 2}, False, True, "short", False),
    ({"qk_matmul_output_mode": 3}, False, True, "bool", False),
    ({"is_causal": 1}, False, False, None, True), ({}, False, False, "float", True),
]


def test_attention():
    with _batched():
        for case in ATTENTION:
            _attention_case(*case)


def _attention_case(attrs, three_d, past, mask, nonpad):
    """Attention (opset 24): 4-D and 3-D (grouped-query heads), causal with and without a past cache, boolean
    (a fully masked row: 0), additive and short masks (padded; onnxruntime refuses them, ONNX's reference
    implementation is the check), nonpad_kv_seqlen, scale and softcap, the present cache and every
    qk_matmul_output_mode; the gradient for Q (no mask, boolean masks)."""
    b, hq, hk, s, kv, d = 2, 2, 2, 3, 4, 4
    if three_d:
        hq, hk = attrs["q_num_heads"], attrs["kv_num_heads"]
        q, k, v = _r(b, s, hq * d), _r(b, kv, hk * d), _r(b, kv, hk * d)
    else:
        q, k, v = _r(b, hq, s, d), _r(b, hk, kv, d), _r(b, hk, kv, d)
    inputs, names = {"q": q, "k": k, "v": v}, ["q", "k", "v"]
    total = kv + (2 if past else 0)
    if mask is not None:
        width = total - 1 if mask == "short" else total
        inputs["m"] = (RNG.random((s, width)) > 0.3) if mask == "bool" else _r(1, hq, s, width)
        inputs["m"][:, 0] = True if mask == "bool" else inputs["m"][:, 0]
        if mask == "bool" and not past:
            inputs["m"][1] = False  # a fully masked query row: 0
    names.append("m" if mask is not None else "")
    if past:
        inputs["pk"], inputs["pv"] = _r(b, hk, 2, d), _r(b, hk, 2, d)
        names += ["pk", "pv"]
    if nonpad:
        inputs["n"] = _i([4, 2])
        names += ["", "", "n"]
    outputs = ["y", "pk_out" if past else "", "pv_out" if past else "",
               "qk" if "qk_matmul_output_mode" in attrs else ""]
    while not outputs[-1]:
        outputs.pop()
    _check("Attention", inputs, attrs=attrs, opset=24, order=names, tol=2e-5, outputs=outputs,
           reference="onnx" if mask == "short" else None, grad=mask == "bool" or not attrs)


def test_rotary_embedding():
    with _batched():
        for attrs, three_d, positions in [
            ({}, False, True), ({"interleaved": 1}, False, True), ({"rotary_embedding_dim": 4}, False, False),
            ({"num_heads": 2, "interleaved": 1, "rotary_embedding_dim": 2}, True, True),
        ]:
            _rotary_case(attrs, three_d, positions)


def _rotary_case(attrs, three_d, positions):
    b, h, s, d = 2, 2, 3, 6
    x = _r(b, s, h * d) if three_d else _r(b, h, s, d)
    half = attrs.get("rotary_embedding_dim", d) // 2
    inputs = {"x": x}
    if positions:
        consts = {"c": _r(5, half), "s": _r(5, half), "p": _i([[0, 1, 4], [2, 3, 3]])}
    else:
        consts = {"c": _r(b, s, half), "s": _r(b, s, half)}
    _check("RotaryEmbedding", inputs, consts, attrs, opset=23)


FOURIER = [  # (op, inputs, consts, attrs, opset)
    ("DFT", {"x": _r(2, 8, 1)}, {}, {}, 17), ("DFT", {"x": _r(2, 8, 2)}, {"n": _i(6)}, {"inverse": 1}, 17),
    ("DFT", {"x": _r(2, 7, 1)}, {}, {"onesided": 1}, 17),
    ("DFT", {"x": _r(3, 4, 5, 2)}, {"n": _i(7), "a": _i(1)}, {}, 20),
    ("DFT", {"x": _r(3, 4, 5, 1)}, {"n": np.asarray(4, np.int64), "a": _i(-2)}, {"onesided": 1}, 20),
    ("STFT", {"x": _r(2, 16, 1)}, {"s": _i(4), "w": np.hanning(6).astype(np.float32)}, {}, 17),
    ("STFT", {"x": _r(1, 15, 2)}, {"s": _i(3), "w": _r(5)}, {"onesided": 0}, 17),
    ("STFT", {"x": _r(2, 12, 1)}, {"s": _i(2), "w": np.zeros(0, np.float32), "l": _i(5)}, {}, 17),
]


def test_fourier():
    """DFT (real and complex, dft_length padding and truncation, inverse, onesided, opset 17's axis attribute
    and 20's input) and STFT (with a window, without one by frame_length); the gradient for the signal."""
    with _batched():
        for op_type, inputs, consts, attrs, opset in FOURIER:
            order = None
            if op_type == "STFT" and not np.size(consts["w"]):
                order, consts = ["x", "s", "", "l"], {"s": consts["s"], "l": consts["l"]}
            _check(op_type, inputs, consts, attrs, opset=opset, order=order, tol=2e-5)


@_batch
def test_col2im_mel_swiglu_tensor_scatter():
    """Col2Im (strides, pads, dilations; the gradient for the columns), MelWeightMatrix (a constant), SwiGLU
    (opset 28: onnxruntime has no Swish-24 to expand it to, ONNX's reference is the check), TensorScatter
    (linear and circular, with and without write_indices)."""
    shapes = {"s": _i([5, 5]), "b": _i([2, 3])}
    _check("Col2Im", {"x": _r(2, 12, 12)}, shapes, opset=18)
    _check("Col2Im", {"x": _r(1, 12, 6)}, shapes, {"strides": [2, 1], "pads": [1, 0, 0, 1], "dilations": [1, 2]},
           opset=18, grad=False)
    edges = {"n": _i(5), "d": _i(32), "r": _i(8000), "lo": np.asarray(50.0, np.float32),
             "hi": np.asarray(3800.0, np.float32)}
    _check("MelWeightMatrix", {}, edges, opset=17, out_dtype=np.float32)
    _check("SwiGLU", {"a": _r(3, 4), "b": _r(3, 4)}, attrs={"alpha": 1.5}, opset=28, reference="onnx")
    cache = _r(2, 3, 5, 4)
    _check("TensorScatter", {"c": cache, "u": _r(2, 3, 2, 4)}, opset=24)
    _check("TensorScatter", {"c": cache, "u": _r(2, 3, 2, 4), "i": _i([1, 3])}, opset=24)
    _check("TensorScatter", {"c": cache, "u": _r(2, 3, 3, 4), "i": _i([1, 4])}, attrs={"mode": "circular"},
           opset=24, grad=False, reference="onnx")
    _check("TensorScatter", {"c": cache, "u": _r(2, 2, 5, 4), "i": _i([0, 1])}, attrs={"axis": 1}, opset=24,
           grad=False)


def test_deform_conv():
    with _batched():
        for case in [({}, 1, 1, False), ({"pads": [1, 1, 1, 1], "strides": [2, 1]}, 1, 1, True),
                     ({"dilations": [1, 2]}, 2, 2, True)]:
            _deform_case(*case)


def _deform_case(attrs, groups, offset_groups, with_mask):
    """DeformConv (v1; v2 with a mask): strides, pads, dilations, groups, offset groups; offsets large enough
    to read outside the image; the gradient for the input (v1; the offsets' and mask's: below)."""
    x, w = _r(2, 4, 5, 6), _r(6, 4 // groups, 3, 2)
    strides, pads, dil = attrs.get("strides", [1, 1]), attrs.get("pads", [0] * 4), attrs.get("dilations", [1, 1])
    oh = (5 + pads[0] + pads[2] - (3 - 1) * dil[0] - 1) // strides[0] + 1
    ow = (6 + pads[1] + pads[3] - (2 - 1) * dil[1] - 1) // strides[1] + 1
    consts = {"w": w, "o": _r(2, offset_groups * 3 * 2 * 2, oh, ow) * 1.5, "b": _r(6)}
    if with_mask:
        consts["m"] = _r(2, offset_groups * 3 * 2, oh, ow, lo=0.0, hi=1.0)
    attrs = {**attrs, "group": groups, "offset_group": offset_groups, "kernel_shape": [3, 2]}
    _check("DeformConv", {"x": x}, consts, attrs, opset=19, tol=2e-5, grad=groups == 1 and not with_mask)


@_batch
def test_deform_conv_offset_gradient():
    """The gradient for the offsets (what a DCN's offset branch trains by) and the mask. The offsets' fractions
    stay 0.2 from the integers: bilinear sampling has kinks there, where finite differences do not apply."""
    consts = {"x": _r(1, 2, 4, 5), "w": _r(3, 2, 2, 2)}
    offsets = (RNG.integers(-2, 2, (1, 8, 3, 4)) + _r(1, 8, 3, 4, lo=0.2, hi=0.8)).astype(np.float32)
    _check("DeformConv", {"o": offsets}, consts, {"kernel_shape": [2, 2]}, opset=19,
           order=["x", "w", "o"], tol=2e-5)
    consts["o"] = _r(1, 8, 3, 4)
    _check("DeformConv", {"m": _r(1, 4, 3, 4, lo=0.0, hi=1.0)}, consts, {"kernel_shape": [2, 2]}, opset=19,
           order=["x", "w", "o", "", "m"], tol=2e-5)


@_batch
def test_roi_align():
    """RoiAlign with a fixed sampling_ratio: avg and max, half_pixel (opset 16) and output_half_pixel (opset 10's
    only mode), spatial_scale, boxes past the map and smaller than a pixel; the gradient for the map (avg)."""
    rois = np.asarray([[0.5, 1.0, 6.0, 5.5], [-3.0, -2.0, 4.0, 9.5], [2.2, 2.2, 2.6, 2.5]], np.float32)
    consts = {"r": rois, "b": _i([1, 0, 1])}
    for mode, half, opset, ratio, scale in (("avg", "half_pixel", 16, 2, 1.0), ("avg", None, 10, 1, 0.5),
                                            ("max", "output_half_pixel", 16, 2, 1.0), ("max", None, 16, 3, 0.8)):
        attrs = {"mode": mode, "output_height": 2, "output_width": 3, "sampling_ratio": ratio, "spatial_scale": scale}
        if half:
            attrs["coordinate_transformation_mode"] = half
        _check("RoiAlign", {"x": _r(2, 3, 6, 7)}, consts, attrs, opset=opset, grad=mode == "avg", tol=2e-5)


def test_roi_align_adaptive_sampling_is_refused_naming_the_node():
    model = _model("RoiAlign", {"x": _r(1, 2, 4, 4)}, {"r": np.zeros((1, 4), np.float32), "b": _i([0])}, {}, 16,
                   ["x", "r", "b"], np.float32, ["y"])
    with pytest.raises(QtoolError, match=r"RoiAlign_0.*sampling_ratio 0.*fixed sampling_ratio"):
        Interpreter(model).run({"x": jnp.zeros((1, 2, 4, 4))})


@_batch
def test_max_roi_pool():
    """MaxRoiPool: boxes past the map, a box on a half pixel (rounded away from zero), bins of unequal sizes,
    spatial_scale; the gradient for the map."""
    rois = np.asarray([[1, 0.5, 1.0, 5.0, 4.5], [0, -3.0, -2.0, 4.0, 9.5], [1, 2.5, 2.2, 2.6, 2.5]], np.float32)
    for attrs in ({"pooled_shape": [2, 3]}, {"pooled_shape": [3, 2], "spatial_scale": 0.5}):
        _check("MaxRoiPool", {"x": _r(2, 3, 6, 7)}, {"r": rois}, attrs, opset=13)


# --- Resize: cubic, antialias ------------------------------------------------------------------------------------
RESIZE = [  # attrs, scales, sizes, opset
    ({"mode": "cubic"}, [1, 1, 2.3, 1.6], None, 11),
    ({"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, [1, 1, 0.6, 0.5], None, 13),
    ({"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}, None, [2, 3, 9, 4], 13),
    ({"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [2, 3, 1, 11], 13),
    ({"mode": "cubic", "coordinate_transformation_mode": "half_pixel_symmetric"}, [1, 1, 0.6, 1.5], None, 19),
    ({"mode": "cubic", "exclude_outside": 1}, [1, 1, 2, 3], None, 13),
    ({"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, None, [2, 3, 5, 16], 13),
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.5, 0.35], None, 18),
    ({"mode": "linear", "antialias": 1, "coordinate_transformation_mode": "align_corners"}, None, [2, 3, 3, 4], 18),
    ({"mode": "linear", "antialias": 1, "exclude_outside": 1}, [1, 1, 1.5, 0.4], None, 18),
    ({"mode": "cubic", "antialias": 1}, [1, 1, 0.5, 0.35], None, 18),
    ({"mode": "cubic", "antialias": 1, "coordinate_transformation_mode": "asymmetric", "exclude_outside": 1},
     [1, 1, 0.6, 0.3], None, 18),
    ({"mode": "cubic", "antialias": 1, "cubic_coeff_a": -0.5, "axes": [2, 3]}, None, [3, 4], 18),
]


@_batch
def test_resize_cubic_and_antialias():
    """Resize cubic (every coordinate transformation, ``exclude_outside``, ``cubic_coeff_a``) and ``antialias``
    (linear and cubic, downscaling one axis and upscaling the other); the gradient of a cubic and an antialiased
    one."""
    for k, (attrs, scales, sizes, opset) in enumerate(RESIZE):
        consts = {"roi": np.zeros(0, np.float32), "scales": np.asarray(scales or [], np.float32)}
        if sizes is not None:
            consts["sizes"] = _i(sizes)
        _check("Resize", {"x": _r(2, 3, 7, 9)}, consts, attrs, opset=opset, grad=k in (0, 10))


# --- attributes the interpreter does not implement ---------------------------------------------------------------
@pytest.mark.parametrize("op_type, consts, attrs, opset, message", [
    ("Relu", {}, {"alpha": 0.1}, 13, r"'Relu_0' \(Relu\): 'alpha' is not an attribute of Relu"),
    ("LayerNormalization", {"s": (5,)}, {"stash_type": 0}, 17,
     r"'LayerNormalization_0' \(LayerNormalization\): attribute stash_type=0 is not supported by the JAX "
     r"interpreter \(only its default, 1, is\)"),
    ("BatchNormalization", {"s": (3,), "b": (3,), "m": (3,), "v": (3,)}, {"spatial": 0}, 7,
     r"attribute spatial=0 is not supported"),
    ("Cast", {}, {"to": 1, "round_mode": "down"}, 24, r"attribute round_mode='down' is not supported"),
    ("Constant", {}, {"value_string": "a"}, 13, r"attribute value_string='a' is not supported .*only its absence"),
    ("Squeeze", {}, {"axes": [1]}, 13, r"attribute axes=\[1\] is not supported .*only its absence"),  # an input
])
def test_an_attribute_not_implemented_is_refused_naming_the_node(op_type, consts, attrs, opset, message):
    """(``consts``: the shapes of the initializers, so that collecting the cases draws nothing from ``RNG``.)"""
    consts = {k: np.ones(shape, np.float32) for k, shape in consts.items()}
    order = ([] if op_type == "Constant" else ["x"]) + list(consts)
    model = _model(op_type, {} if op_type == "Constant" else {"x": _r(2, 3, 5)}, consts, attrs, opset, order,
                   np.float32, ["y"])
    with pytest.raises(QtoolError, match=message):
        Interpreter(model, label="m.onnx")


def test_an_attribute_at_its_default_is_accepted_where_its_opset_does_not_define_it():
    """BatchNormalization's ``training_mode=0`` (opset 14) and ``spatial=1`` (opset 7) in an opset-9 model, and
    ONNX Runtime's optimizer's LayerNormalization with opset 17's ``stash_type=1`` in an opset-14 model: the
    default meaning, computed as without them."""
    bn = {"s": _r(3), "b": _r(3), "m": _r(3), "v": _r(3, lo=0.5, hi=1)}
    x = _r(2, 3, 5)
    for op_type, consts, attrs, opset in (("BatchNormalization", bn, {"training_mode": 0, "spatial": 1}, 9),
                                          ("LayerNormalization", {"s": _r(5)}, {"stash_type": 1}, 14)):
        ys = [Interpreter(_model(op_type, {"x": x}, consts, a, opset, ["x", *consts], np.float32, ["y"])).run(
            {"x": x})["y"] for a in (attrs, {})]
        np.testing.assert_array_equal(np.asarray(ys[0]), np.asarray(ys[1]))


def test_dropout_in_training_mode_is_refused():
    model = _model("Dropout", {"x": _r(2, 3)}, {"r": np.float32(0.1), "t": np.asarray(True)}, {}, 13,
                   ["x", "r", "t"], np.float32, ["y"])
    with pytest.raises(QtoolError, match=r"'Dropout_0' \(Dropout\): Dropout in training mode"):
        Interpreter(model).run({"x": _r(2, 3)})
    model = _model("Dropout", {"x": _r(2, 3)}, {"r": np.float32(0.1), "t": np.asarray(False)}, {}, 13,
                   ["x", "r", "t"], np.float32, ["y"])
    x = _r(2, 3)
    np.testing.assert_array_equal(np.asarray(Interpreter(model).run({"x": x})["y"]), x)


def test_top_k_before_opset_10_reads_k_from_its_attribute():
    x = _r(3, 6)
    model = _model("TopK", {"x": x}, {}, {"k": 2, "axis": 1}, 9, ["x"], np.float32, ["v", "i"])
    got = Interpreter(model).run({"x": x})
    np.testing.assert_array_equal(np.asarray(got["v"]), -np.sort(-x, axis=1)[:, :2])
    np.testing.assert_array_equal(np.asarray(got["i"]), np.argsort(-x, axis=1)[:, :2])


def test_every_attribute_an_implementation_reads_is_one_of_its_op():
    """The registry's declarations (``op(..., attrs=...)``) name attributes some version of the op's schema
    defines (a typo would let that attribute through unchecked)."""
    for (domain, op_type), attrs in ATTRS.items():
        versions = _schemas(domain, op_type)
        if versions:
            defined = set().union(*(s.attributes for s in versions))
            assert attrs <= defined, (op_type, attrs - defined)
