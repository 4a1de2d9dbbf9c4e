"""An ONNX graph as a pure JAX function, op by op.

:class:`Interpreter` reads a model once (nodes, attributes, constants) and
checks that every op is known; calling :meth:`Interpreter.run` with a dict of
feeds evaluates the graph with ``jax.numpy`` and returns the graph outputs.
``run`` is pure, so it can be wrapped in ``jax.jit``/``jax.grad``.

Static shapes inside ``jit``: a value computed only from constants stays a
numpy array (it is evaluated on the host, like onnxruntime's constant
folding), so ``Shape -> Gather -> Concat -> Reshape`` chains, ``Slice``
bounds, ``ConstantOfShape``, ``Expand`` targets and ``Resize`` sizes are
concrete numbers at trace time. An op that needs a concrete value (a shape,
axes, pads) and gets a traced one is a :class:`~qtool.errors.QtoolError`
naming the node.

``qtool::FakeQuant`` runs natively (:mod:`qtool.finetune.fake_quant`), not by
inlining its function body; ``fake_quant=False`` turns every one into the
identity (the float model). Other model-local functions are interpreted
from their bodies. Division keeps its divisor behind
``lax.optimization_barrier`` so XLA does not turn ``a / constant`` into a
multiplication (onnxruntime divides).

int64 tensors that flow through traced computations are int32 (JAX's
default without ``jax_enable_x64``); float64 is computed in float32.
"""

from __future__ import annotations

import functools
import math
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from jax import lax
from onnx import numpy_helper

from qtool.errors import QtoolError
from qtool.finetune.fake_quant import fake_quant, fake_quant_bias

HIGHEST = lax.Precision.HIGHEST
FQ_DOMAIN = "qtool"
FQ_NAME = "FakeQuant"
FQ_BIAS_NAME = "FakeQuantBias"


# --- the model, read once -------------------------------------------------------------------------
@dataclass
class Node:
    op_type: str
    domain: str
    name: str
    inputs: list[str]  # "" for a missing optional input
    outputs: list[str]  # "" for an unused optional output
    attrs: dict  # python values; a function body's references are _Ref
    opset: int

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def label(self) -> str:
        return f"'{self.name}' ({self.domain + '::' if self.domain else ''}{self.op_type})"


@dataclass
class Body:
    """A subgraph (an If branch, a Loop or Scan body): its nodes, own constants, formal inputs and outputs, and
    ``reads``: the enclosing scopes' values it (or a graph nested in it) reads."""

    name: str
    nodes: list[Node]
    initializers: dict[str, np.ndarray]
    inputs: list[str]
    outputs: list[str]
    reads: frozenset


@dataclass(frozen=True)
class _Ref:
    name: str  # an attribute reference inside a function body


@dataclass
class Function:
    name: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    nodes: list[Node]
    defaults: dict


def _attr_value(a: onnx.AttributeProto):
    if a.ref_attr_name:
        return _Ref(a.ref_attr_name)
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode("utf-8") for s in v]
    if isinstance(v, onnx.GraphProto):
        return v
    return v


def _read_nodes(protos, opsets: dict[str, int], where: str) -> list[Node]:
    nodes = []
    for i, n in enumerate(protos):
        domain = "" if n.domain == "ai.onnx" else n.domain
        name = n.name or f"{where}{n.op_type}_{i}"
        attrs = {a.name: _attr_value(a) for a in n.attribute}
        for key, value in attrs.items():
            if isinstance(value, onnx.GraphProto):
                attrs[key] = _read_body(value, opsets, f"{name}/{key}/")
        nodes.append(Node(n.op_type, domain, name, list(n.input), list(n.output), attrs,
                          opsets.get(domain, opsets.get("", 13))))
    return nodes


def _read_body(graph: onnx.GraphProto, opsets: dict[str, int], where: str) -> Body:
    nodes = _read_nodes(graph.node, opsets, where)
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    inputs, outputs = [i.name for i in graph.input], [o.name for o in graph.output]
    defined = set(inputs) | set(inits) | {o for n in nodes for o in n.outputs}
    read = {i for n in nodes for i in n.inputs if i}
    read |= {r for n in nodes for b in n.attrs.values() if isinstance(b, Body) for r in b.reads}
    return Body(graph.name, nodes, inits, inputs, outputs, frozenset((read | set(outputs)) - defined))


def bodies(node: Node) -> list[Body]:
    """The subgraphs of ``node`` (an If's two branches, a Loop's or Scan's body)."""
    return [v for v in node.attrs.values() if isinstance(v, Body)]


def _as_proto(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        import onnx_ir as ir
    except ImportError:  # pragma: no cover - onnx-ir is a dependency
        ir = None
    if ir is not None and isinstance(model, ir.Model):
        return ir.serde.serialize_model(model)
    raise TypeError(f"expected an onnx.ModelProto or onnx_ir.Model, got {type(model).__name__}")


def _initializers(model, graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """The initializers' arrays. An onnx-ir model's are read through onnx-ir, which knows the folder its
    external data is in; the proto serialized from it names the data file relative to no folder (the
    current directory would be searched)."""
    if isinstance(model, onnx.ModelProto):
        return {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    values = model.graph.initializers
    return {t.name: values[t.name].const_value.numpy() for t in graph.initializer}


# --- op registry ------------------------------------------------------------------------------------
OpFn = Callable[["Context", Node, list], list]
OPS: dict[tuple[str, str], OpFn] = {}
ATTRS: dict[tuple[str, str], frozenset] = {}  # the attributes each implementation reads (none when not listed)


def op(*names: str, domain: str = "", attrs: tuple = ()):
    """Register an implementation of ``names``. ``attrs``: the attributes it reads, each for every value ONNX
    allows (or refusing the values it does not implement with a clear error); any other attribute is refused
    unless it holds its schema's default (:func:`check_attributes`)."""
    def register(fn: OpFn) -> OpFn:
        for n in names:
            OPS[(domain, n)] = fn
            ATTRS[(domain, n)] = frozenset(attrs)
        return fn

    return register


def supported_ops() -> list[str]:
    return sorted(f"{d + '::' if d else ''}{n}" for d, n in OPS)


@functools.cache
def _all_schemas() -> dict:
    index = {}
    for s in sorted(onnx.defs.get_all_schemas_with_history(), key=lambda s: -s.since_version):
        index.setdefault((s.domain, s.name), []).append(s)
    return index


def _schemas(domain: str, op_type: str) -> list:
    """Every version of the op's ONNX schema, the newest first (none for qtool's own ops)."""
    return _all_schemas().get(("" if domain == "ai.onnx" else domain, op_type), [])


def attribute_default(node: Node, name: str):
    """``(known, default)``: whether a version of the op's schema defines attribute ``name``, and its default
    (``None``: it has none) in the newest version up to the node's opset that defines it, else in the newest
    (ONNX Runtime's optimizer writes ``LayerNormalization`` with opset 17's ``stash_type`` into opset 14 models;
    older exporters, ``BatchNormalization``'s ``training_mode=0`` or ``spatial=1`` where they are not defined)."""
    defining = [s for s in _schemas(node.domain, node.op_type) if name in s.attributes]
    if not defining:
        return False, None
    spec = next((s for s in defining if s.since_version <= node.opset), defining[0])
    default = spec.attributes[name].default_value
    return True, (_attr_value(default) if default.type else None)


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b)
    return a == b


def check_attributes(node: Node, label: str) -> None:
    """Refuse an attribute no version of the op's schema defines (for an op without a schema: any the
    implementation does not read), and one with another value than its default that the implementation does
    not read (:func:`op`'s ``attrs``) or reads only at other opsets (Squeeze's ``axes`` from opset 13: an
    input), where the default is what it computes. The version in effect is the newest up to the node's
    opset, else the oldest (an op newer than the model's opset, as ONNX Runtime's optimizer writes them)."""
    read = ATTRS.get((node.domain, node.op_type), frozenset())
    versions = _schemas(node.domain, node.op_type)
    spec = next((s for s in versions if s.since_version <= node.opset), versions[-1] if versions else None)
    for name, value in node.attrs.items():
        if isinstance(value, _Ref) or (name in read and (spec is None or name in spec.attributes)):
            continue
        known, default = attribute_default(node, name)
        where = f"{label}: node {node.label()}"
        if not known:
            raise QtoolError(f"{where}: '{name}' is not an attribute of {node.op_type}; qtool finetune cannot "
                             "train this model")
        if default is None or not _same(default, value):
            only = "its absence" if default is None else f"its default, {default!r},"
            raise QtoolError(f"{where}: attribute {name}={value!r} is not supported by the JAX interpreter (only "
                             f"{only} is); qtool finetune cannot train this model")


@dataclass
class Context:
    fake_quant: bool = True
    range_grad: Callable[[str], bool] = field(default=lambda name: True)
    functions: dict = field(default_factory=dict)
    no_grad: frozenset = frozenset()  # values whose gradient stops (lax.stop_gradient)
    # control flow (qtool.finetune.control_flow): the scope of the node being run (its values by name),
    # ``run_body(body, scope, inputs) -> outputs``, and the values that reach a trainable feed
    scope: Mapping = field(default_factory=dict)
    run_body: Callable = None
    trained: Callable[[str], bool] = field(default=lambda name: False)


def concrete(v) -> bool:
    return isinstance(v, np.ndarray)


def _xp(*vals):
    return np if all(concrete(v) for v in vals if v is not None) else jnp


def _np(v) -> np.ndarray:
    return np.asarray(v)


class NeedsConstant(QtoolError):
    """A value that must be known at trace time is traced (a loop then unrolls: its counter stays constant)."""


def _static(node: Node, v, what: str) -> np.ndarray:
    """A value that must be known at trace time (a shape, axes, pads, sizes)."""
    if v is None:
        return None
    if not concrete(v):
        raise NeedsConstant(f"node {node.label()}: its {what} is computed from data or trainable values; "
                         "the JAX interpreter needs it constant (static shapes)")
    return v


def _result(v):
    """numpy scalars from numpy ops back to arrays (so ``concrete`` sees them)."""
    if isinstance(v, np.generic):
        return np.asarray(v)
    return v


_ONNX_TO_NP = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT16: np.int16,
    onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.UINT32: np.uint32, onnx.TensorProto.UINT64: np.uint64, onnx.TensorProto.BOOL: np.bool_,
}
if hasattr(onnx.TensorProto, "BFLOAT16"):
    _ONNX_TO_NP[onnx.TensorProto.BFLOAT16] = jnp.bfloat16


_TRACED_DTYPES = {np.float64: np.float32, np.int64: np.int32, np.uint64: np.uint32}  # JAX without jax_enable_x64


def _np_dtype(node: Node, to: int):
    if to not in _ONNX_TO_NP:
        raise QtoolError(f"node {node.label()}: data type {onnx.TensorProto.DataType.Name(to)} is not supported")
    return _ONNX_TO_NP[to]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _axes_of(node: Node, inputs, input_index: int, attr: str = "axes"):
    """Axes from the attribute (older opsets) or an optional input (newer)."""
    if len(inputs) > input_index and inputs[input_index] is not None:
        return [int(a) for a in _static(node, inputs[input_index], "axes input").reshape(-1)]
    a = node.attr(attr)
    return None if a is None else [int(x) for x in a]


# --- elementwise --------------------------------------------------------------------------------------
def _unary(fn_np, fn_jnp):
    def impl(ctx, node, inputs):
        x = inputs[0]
        return [_result(fn_np(x)) if concrete(x) else fn_jnp(x)]

    return impl


@jax.custom_jvp
def _sqrt(x):
    """``jnp.sqrt`` whose derivative at 0 is 0, not inf: a magnitude ``Sqrt(re**2 + im**2)`` of fake-quantized
    values is exactly 0 wherever both round to 0 (silero-vad's STFT on quiet audio), and inf times the 0 of
    ``Pow``'s derivative made every gradient NaN (every fine-tuning step skipped). Forward unchanged."""
    return jnp.sqrt(x)


@_sqrt.defjvp
def _sqrt_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y = jnp.sqrt(x)
    positive = y > 0
    return y, jnp.where(positive, t / (2 * jnp.where(positive, y, 1)), jnp.zeros_like(t))


for _name, _fnp, _fj in [
    ("Neg", np.negative, jnp.negative), ("Abs", np.abs, jnp.abs), ("Sqrt", np.sqrt, _sqrt),
    ("Exp", np.exp, jnp.exp), ("Log", np.log, jnp.log), ("Floor", np.floor, jnp.floor), ("Ceil", np.ceil, jnp.ceil),
    ("Round", np.round, jnp.round), ("Sign", np.sign, jnp.sign), ("Tanh", np.tanh, jnp.tanh),
    ("Sin", np.sin, jnp.sin), ("Cos", np.cos, jnp.cos), ("Not", np.logical_not, jnp.logical_not),
    ("Identity", lambda x: x, lambda x: x), ("IsNaN", np.isnan, jnp.isnan),
]:
    OPS[("", _name)] = _unary(_fnp, _fj)


@op("Reciprocal")
def _reciprocal(ctx, node, inputs):
    x = inputs[0]
    if concrete(x):
        return [_result(np.asarray(1, x.dtype) / x)]
    return [jnp.asarray(1, x.dtype) / x]


@op("Erf")
def _erf(ctx, node, inputs):
    x = inputs[0]
    if concrete(x):
        return [np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()]
    return [lax.erf(x)]


def _binary(fn_name: str):
    def impl(ctx, node, inputs):
        a, b = inputs[0], inputs[1]
        xp = _xp(a, b)
        return [_result(getattr(xp, fn_name)(a, b))]

    return impl


for _name, _fn in [("Add", "add"), ("Sub", "subtract"), ("Mul", "multiply"), ("Equal", "equal"),
                   ("Greater", "greater"), ("GreaterOrEqual", "greater_equal"), ("Less", "less"),
                   ("LessOrEqual", "less_equal"), ("And", "logical_and"), ("Or", "logical_or"),
                   ("Xor", "logical_xor")]:
    OPS[("", _name)] = _binary(_fn)


def _divisor(a, b):
    """``b`` broadcast to the quotient's shape, behind a barrier: XLA rewrites ``a / constant`` and
    ``a / broadcast(b)`` into multiplications by a reciprocal, which onnxruntime does not do."""
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    return lax.optimization_barrier(jnp.broadcast_to(jnp.asarray(b), shape))


@op("Div")
def _div(ctx, node, inputs):
    a, b = inputs
    dtype = np.result_type(a.dtype, b.dtype) if concrete(a) and concrete(b) else jnp.result_type(a, b)
    if concrete(a) and concrete(b):
        if np.issubdtype(dtype, np.integer):
            q = np.abs(a) // np.abs(b) * np.sign(a) * np.sign(b)
            return [np.asarray(q, dtype)]
        return [_result(a / b)]
    if jnp.issubdtype(dtype, jnp.integer):
        a, b = jnp.broadcast_arrays(jnp.asarray(a, dtype), jnp.asarray(b, dtype))
        return [lax.div(a, b)]  # truncates toward zero, as ONNX
    return [jnp.asarray(a) / _divisor(a, b)]


@op("Pow")
def _pow(ctx, node, inputs):
    a, b = inputs
    if concrete(a) and concrete(b):
        return [_result(np.power(a, b.astype(a.dtype)))]
    b = b.astype(a.dtype) if hasattr(b, "astype") else b
    if concrete(b) and b.size == 1 and float(b.reshape(-1)[0]) == 2.0:
        return [a * a]
    return [jnp.power(a, b)]


@op("Mod", attrs=("fmod",))
def _mod(ctx, node, inputs):
    a, b = inputs
    xp = _xp(a, b)
    if node.attr("fmod", 0):
        return [_result(xp.fmod(a, b))]
    return [_result(xp.mod(a, b))]


@op("Where")
def _where(ctx, node, inputs):
    c, a, b = inputs
    return [_result(_xp(c, a, b).where(c, a, b))]


def _variadic(fn_name: str):
    def impl(ctx, node, inputs):
        vals = [v for v in inputs if v is not None]
        xp = _xp(*vals)
        out = vals[0]
        for v in vals[1:]:
            out = getattr(xp, fn_name)(out, v)
        if fn_name == "add" and node.op_type == "Mean":
            out = out / _divisor(out, jnp.asarray(len(vals), out.dtype)) if xp is jnp else out / len(vals)
        return [_result(out)]

    return impl


OPS[("", "Min")] = _variadic("minimum")
OPS[("", "Max")] = _variadic("maximum")
OPS[("", "Sum")] = _variadic("add")
OPS[("", "Mean")] = _variadic("add")


# --- activations --------------------------------------------------------------------------------------
@op("Relu")
def _relu(ctx, node, inputs):
    x = inputs[0]
    xp = _xp(x)
    return [_result(xp.where(x < 0, xp.zeros_like(x), x))]


@op("Clip", attrs=("min", "max"))
def _clip(ctx, node, inputs):
    x = inputs[0]
    if node.opset < 11:
        lo, hi = node.attr("min"), node.attr("max")
        lo = None if lo is None else np.asarray(lo, np.float32)
        hi = None if hi is None else np.asarray(hi, np.float32)
    else:
        lo = inputs[1] if len(inputs) > 1 else None
        hi = inputs[2] if len(inputs) > 2 else None
    xp = _xp(x, lo, hi)
    y = x
    if lo is not None:
        y = xp.where(y < lo, xp.asarray(lo, dtype=x.dtype), y)
    if hi is not None:
        y = xp.where(y > hi, xp.asarray(hi, dtype=x.dtype), y)
    return [_result(y)]


@op("LeakyRelu", attrs=("alpha",))
def _leaky(ctx, node, inputs):
    x = inputs[0]
    alpha = np.asarray(node.attr("alpha", 0.01), np.float32)
    xp = _xp(x)
    return [_result(xp.where(x >= 0, x, x * alpha))]


@op("PRelu")
def _prelu(ctx, node, inputs):
    x, slope = inputs
    xp = _xp(x, slope)
    return [_result(xp.where(x >= 0, x, x * slope))]


@op("Elu", attrs=("alpha",))
def _elu(ctx, node, inputs):
    x = inputs[0]
    alpha = np.asarray(node.attr("alpha", 1.0), np.float32)
    xp = _xp(x)
    return [_result(xp.where(x >= 0, x, alpha * (xp.exp(xp.minimum(x, 0)) - 1)))]


@op("Selu", attrs=("alpha", "gamma"))
def _selu(ctx, node, inputs):
    x = inputs[0]
    alpha = np.asarray(node.attr("alpha", 1.67326319217681884765625), np.float32)
    gamma = np.asarray(node.attr("gamma", 1.05070102214813232421875), np.float32)
    xp = _xp(x)
    return [_result(gamma * xp.where(x > 0, x, alpha * (xp.exp(xp.minimum(x, 0)) - 1)))]


@op("Sigmoid")
def _sigmoid(ctx, node, inputs):
    x = inputs[0]
    if concrete(x):
        return [_result(1 / (1 + np.exp(-x)))]
    return [jax.nn.sigmoid(x)]


@op("Softplus")
def _softplus(ctx, node, inputs):
    x = inputs[0]
    return [jax.nn.softplus(x)]


@op("HardSigmoid", attrs=("alpha", "beta"))
def _hard_sigmoid(ctx, node, inputs):
    x = inputs[0]
    alpha = np.asarray(node.attr("alpha", 0.2), np.float32)
    beta = np.asarray(node.attr("beta", 0.5), np.float32)
    xp = _xp(x)
    return [_result(xp.maximum(0, xp.minimum(1, alpha * x + beta)).astype(x.dtype))]


@op("HardSwish")
def _hard_swish(ctx, node, inputs):
    x = inputs[0]
    alpha = np.float32(1.0 / 6.0)
    xp = _xp(x)
    return [_result(x * xp.maximum(0, xp.minimum(1, alpha * x + np.float32(0.5))).astype(x.dtype))]


@op("Gelu", attrs=("approximate",))
def _gelu(ctx, node, inputs):
    x = inputs[0]
    return [jax.nn.gelu(x, approximate=node.attr("approximate", "none") == "tanh")]


def _softmax_impl(fn, ctx, node, inputs):
    x = inputs[0]
    rank = x.ndim
    if node.opset < 13:  # coerced to 2-D at axis
        axis = _axis(node.attr("axis", 1), rank)
        shape = x.shape
        flat = jnp.reshape(x, (int(np.prod(shape[:axis], dtype=np.int64)), -1))
        return [jnp.reshape(fn(flat, axis=-1), shape)]
    return [fn(jnp.asarray(x), axis=_axis(node.attr("axis", -1), rank))]


@op("Softmax", attrs=("axis",))
def _softmax(ctx, node, inputs):
    return _softmax_impl(jax.nn.softmax, ctx, node, inputs)


@op("LogSoftmax", attrs=("axis",))
def _log_softmax(ctx, node, inputs):
    return _softmax_impl(jax.nn.log_softmax, ctx, node, inputs)


# --- normalization ---------------------------------------------------------------------------------------
def _channel_shape(v, rank: int):
    return jnp.reshape(v, (1, -1) + (1,) * (rank - 2))


@op("BatchNormalization", attrs=("epsilon", "momentum", "training_mode"))
def _batch_norm(ctx, node, inputs):
    x, scale, bias, mean, var = inputs[:5]
    eps = np.float32(node.attr("epsilon", 1e-5))
    momentum = np.float32(node.attr("momentum", 0.9))
    training = bool(node.attr("training_mode", 0)) or (node.opset < 14 and len([o for o in node.outputs if o]) > 1)
    rank = x.ndim
    if not training:
        inv = jnp.sqrt(jnp.asarray(var) + eps)
        centered = x - _channel_shape(mean, rank)
        y = centered / _divisor(centered, _channel_shape(inv, rank))
        return [y * _channel_shape(scale, rank) + _channel_shape(bias, rank)]
    axes = (0,) + tuple(range(2, rank))
    count = float(np.prod([x.shape[a] for a in axes]))
    total = jnp.sum(x, axis=axes)
    bmean = total / _divisor(total, jnp.float32(count))
    centered = x - _channel_shape(bmean, rank)
    sq = jnp.sum(centered * centered, axis=axes)
    bvar = sq / _divisor(sq, jnp.float32(count))
    y = centered / _divisor(centered, _channel_shape(jnp.sqrt(bvar + eps), rank))
    y = y * _channel_shape(scale, rank) + _channel_shape(bias, rank)
    running_mean = mean * momentum + bmean * (1 - momentum)
    running_var = var * momentum + bvar * (1 - momentum)
    outs = [y, running_mean, running_var]
    if len(node.outputs) > 3:  # opset < 14: saved mean, saved inverse std
        outs += [bmean, 1 / jnp.sqrt(bvar + eps)]
    return outs


@op("LayerNormalization", attrs=("axis", "epsilon"))
def _layer_norm(ctx, node, inputs):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    rank = x.ndim
    axis = _axis(node.attr("axis", -1), rank)
    eps = np.float32(node.attr("epsilon", 1e-5))
    axes = tuple(range(axis, rank))
    count = jnp.float32(np.prod([x.shape[a] for a in axes]))
    total = jnp.sum(x, axis=axes, keepdims=True)
    mean = total / _divisor(total, count)
    centered = x - mean
    sq = jnp.sum(centered * centered, axis=axes, keepdims=True)
    var = sq / _divisor(sq, count)
    inv_std = 1 / jnp.sqrt(var + eps)
    y = centered * inv_std * scale
    if bias is not None:
        y = y + bias
    return [y, mean, inv_std][: max(1, len(node.outputs))]


@op("InstanceNormalization", attrs=("epsilon",))
def _instance_norm(ctx, node, inputs):
    x, scale, bias = inputs
    rank = x.ndim
    eps = np.float32(node.attr("epsilon", 1e-5))
    axes = tuple(range(2, rank))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=axes, keepdims=True)
    y = (x - mean) / jnp.sqrt(var + eps)
    return [y * _channel_shape(scale, rank) + _channel_shape(bias, rank)]


# --- layers ----------------------------------------------------------------------------------------------
_DIMS = {1: ("NCH", "OIH", "NCH"), 2: ("NCHW", "OIHW", "NCHW"), 3: ("NCDHW", "OIDHW", "NCDHW")}


def _conv_pads(node: Node, in_spatial, kernel, strides, dilations) -> list[tuple[int, int]]:
    n = len(in_spatial)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for i in range(n):
            out = -(-in_spatial[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_spatial[i])
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
        return pads
    if auto_pad == "VALID":
        return [(0, 0)] * n
    p = node.attr("pads") or [0] * (2 * n)
    return [(int(p[i]), int(p[i + n])) for i in range(n)]


def _spatial_attrs(node: Node, n: int):
    strides = [int(s) for s in (node.attr("strides") or [1] * n)]
    dilations = [int(d) for d in (node.attr("dilations") or [1] * n)]
    return strides, dilations


@op("Conv", attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def _conv(ctx, node, inputs):
    x, w = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    b = inputs[2] if len(inputs) > 2 else None
    n = x.ndim - 2
    if n not in _DIMS:
        raise QtoolError(f"node {node.label()}: {n}-D convolution is not supported (1-D to 3-D are)")
    strides, dilations = _spatial_attrs(node, n)
    pads = _conv_pads(node, x.shape[2:], w.shape[2:], strides, dilations)
    y = lax.conv_general_dilated(x, w, strides, pads, rhs_dilation=dilations,
                                 feature_group_count=int(node.attr("group", 1)),
                                 dimension_numbers=_DIMS[n], precision=HIGHEST)
    if b is not None:
        y = y + _channel_shape(b, y.ndim)
    return [y]


@op("ConvTranspose", attrs=("auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads",
                             "strides"))
def _conv_transpose(ctx, node, inputs):
    x, w = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    b = inputs[2] if len(inputs) > 2 else None
    n = x.ndim - 2
    if n not in _DIMS:
        raise QtoolError(f"node {node.label()}: {n}-D transposed convolution is not supported")
    group = int(node.attr("group", 1))
    strides, dilations = _spatial_attrs(node, n)
    kernel = list(w.shape[2:])
    out_pad = [int(v) for v in (node.attr("output_padding") or [0] * n)]
    in_sp = x.shape[2:]
    full = [strides[i] * (in_sp[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1 for i in range(n)]
    output_shape = node.attr("output_shape")
    auto_pad = node.attr("auto_pad", "NOTSET")
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [int(v) for v in output_shape[-n:]] if output_shape is not None else \
            [in_sp[i] * strides[i] for i in range(n)]
        pads = []
        for i in range(n):
            total = max(0, full[i] - target[i])
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))  # ONNX: NOTSET as SAME_LOWER
    elif auto_pad == "VALID":
        pads = [(0, 0)] * n
    else:
        p = node.attr("pads") or [0] * (2 * n)
        pads = [(int(p[i]), int(p[i + n])) for i in range(n)]
    # weight [Cin, Cout/g, k...] -> [Cout, Cin/g, k...], spatially flipped
    cin, cout_g = w.shape[0], w.shape[1]
    wg = jnp.reshape(w, (group, cin // group, cout_g) + tuple(kernel))
    wg = jnp.swapaxes(wg, 1, 2)
    wt = jnp.reshape(wg, (group * cout_g, cin // group) + tuple(kernel))
    wt = jnp.flip(wt, axis=tuple(range(2, 2 + n)))
    conv_pads = [((kernel[i] - 1) * dilations[i] - pads[i][0], (kernel[i] - 1) * dilations[i] - pads[i][1] + out_pad[i])
                 for i in range(n)]
    y = lax.conv_general_dilated(x, wt, [1] * n, conv_pads, lhs_dilation=strides, rhs_dilation=dilations,
                                 feature_group_count=group, dimension_numbers=_DIMS[n], precision=HIGHEST)
    if b is not None:
        y = y + _channel_shape(b, y.ndim)
    return [y]


@op("Gemm", attrs=("alpha", "beta", "transA", "transB"))
def _gemm(ctx, node, inputs):
    a, b = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    c = inputs[2] if len(inputs) > 2 else None
    if node.attr("transA", 0):
        a = a.T
    if node.attr("transB", 0):
        b = b.T
    y = jnp.matmul(a, b, precision=HIGHEST)
    alpha = float(node.attr("alpha", 1.0))
    beta = float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = y * np.float32(alpha)
    if c is not None:
        y = y + (c if beta == 1.0 else c * np.float32(beta))
    return [y]


@op("MatMul")
def _matmul(ctx, node, inputs):
    a, b = inputs
    if concrete(a) and concrete(b):
        return [_result(np.matmul(a, b))]
    return [jnp.matmul(a, b, precision=HIGHEST)]


@op("Einsum", attrs=("equation",))
def _einsum(ctx, node, inputs):
    return [jnp.einsum(node.attr("equation"), *inputs, precision=HIGHEST)]


# --- recurrent layers (LSTM, GRU, RNN) ----------------------------------------------------------------
_RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_RNN_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
_RNN_ACTIVATIONS = {"Sigmoid": jax.nn.sigmoid, "Tanh": jnp.tanh, "Relu": lambda v: jnp.maximum(v, 0)}


def _rnn_attrs(node: Node, num_directions: int) -> tuple[list, float | None]:
    """The activation functions of each direction, and the cell clip; a clear error for what is not
    implemented (activation_alpha/beta, other activation functions, LSTM input_forget)."""
    kind = node.op_type
    if node.attr("activation_alpha") or node.attr("activation_beta"):
        raise QtoolError(f"node {node.label()}: activation_alpha/activation_beta are not supported by the "
                         "JAX interpreter (activations: " + ", ".join(_RNN_ACTIVATIONS) + ")")
    if kind == "LSTM" and int(node.attr("input_forget", 0)):
        raise QtoolError(f"node {node.label()}: input_forget=1 is not supported by the JAX interpreter")
    names = node.attr("activations") or list(_RNN_DEFAULT_ACTIVATIONS[kind]) * num_directions
    per = len(_RNN_DEFAULT_ACTIVATIONS[kind])
    if len(names) != per * num_directions:
        raise QtoolError(f"node {node.label()}: {len(names)} activations for {num_directions} direction(s); "
                         f"{kind} takes {per} per direction")
    unknown = [n for n in names if n not in _RNN_ACTIVATIONS]
    if unknown:
        raise QtoolError(f"node {node.label()}: activation '{unknown[0]}' is not supported by the JAX interpreter "
                         "(supported: " + ", ".join(_RNN_ACTIVATIONS) + ")")
    acts = [[_RNN_ACTIVATIONS[n] for n in names[d * per:(d + 1) * per]] for d in range(num_directions)]
    clip = node.attr("clip")
    return acts, None if clip is None else float(clip)


def _rnn_step(kind: str, acts: list, clip: float | None, r, rb_h, p, linear_before_reset: bool, hidden: int):
    """One time step of one direction: ``(carry, (x_projected, mask)) -> (carry, y)``. ``x_projected``
    holds ``X W^T`` plus the biases that add to it (all of them but GRU's ``Rb[h]``)."""
    def clipped(v):
        return v if clip is None else jnp.clip(v, -clip, clip)

    def mm(a, b):
        return jnp.matmul(a, b.T, precision=HIGHEST)

    def step(carry, inputs):
        xp, mask = inputs
        h = carry[0]
        if kind == "LSTM":
            c = carry[1]
            g = xp + mm(h, r)
            i, o, f, cc = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
            if p is not None:
                i = i + p[:hidden] * c
                f = f + p[2 * hidden:] * c
            i, f, cc = acts[0](clipped(i)), acts[0](clipped(f)), acts[1](clipped(cc))
            c_new = f * c + i * cc
            if p is not None:
                o = o + p[hidden:2 * hidden] * c_new
            h_new = acts[0](clipped(o)) * acts[2](c_new)
            c_new = jnp.where(mask, c_new, c)
            h_new = jnp.where(mask, h_new, h)
            return (h_new, c_new), jnp.where(mask, h_new, 0.0)
        if kind == "GRU":
            zr = xp[:, :2 * hidden] + mm(h, r[:2 * hidden])
            z = acts[0](clipped(zr[:, :hidden]))
            rr = acts[0](clipped(zr[:, hidden:]))
            rh = r[2 * hidden:]
            if linear_before_reset:
                hh = xp[:, 2 * hidden:] + rr * (mm(h, rh) + rb_h)
            else:
                hh = xp[:, 2 * hidden:] + mm(rr * h, rh) + rb_h
            hh = acts[1](clipped(hh))
            h_new = jnp.where(mask, (1.0 - z) * hh + z * h, h)
            return (h_new,), jnp.where(mask, h_new, 0.0)
        h_new = jnp.where(mask, acts[0](clipped(xp + mm(h, r))), h)  # RNN
        return (h_new,), jnp.where(mask, h_new, 0.0)

    return step


def _rnn(ctx, node, inputs):
    """ONNX LSTM (gates iofc, peepholes iof), GRU (gates zrh, ``linear_before_reset``) and RNN: every
    direction, both layouts, ``sequence_lens`` (outputs past a sequence's end are 0, the last states
    are its last step's; ``reverse`` runs each sequence from its own end), initial states, ``clip``;
    default activations (Sigmoid/Tanh), or Sigmoid/Tanh/Relu by name. The input projection
    ``X W^T`` is one matmul over all steps; the recurrence is a ``lax.scan``."""
    kind = node.op_type
    gates = _RNN_GATES[kind]
    padded = list(inputs) + [None] * (8 - len(inputs))
    x, w, r, b, seq_lens, h0 = (padded[i] for i in range(6))
    c0, p = (padded[6], padded[7]) if kind == "LSTM" else (None, None)
    direction = node.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise QtoolError(f"node {node.label()}: direction '{direction}' is not forward, reverse or bidirectional")
    num_directions = 2 if direction == "bidirectional" else 1
    acts, clip = _rnn_attrs(node, num_directions)
    layout = int(node.attr("layout", 0))
    x = jnp.asarray(x, jnp.float32)
    if layout:
        x = jnp.swapaxes(x, 0, 1)
        h0 = None if h0 is None else jnp.swapaxes(jnp.asarray(h0), 0, 1)
        c0 = None if c0 is None else jnp.swapaxes(jnp.asarray(c0), 0, 1)
    steps, batch = x.shape[0], x.shape[1]
    hidden = int(node.attr("hidden_size", 0)) or int(np.shape(r)[-1])
    if np.shape(w)[0] != num_directions or np.shape(w)[1] != gates * hidden:
        raise QtoolError(f"node {node.label()}: W has shape {list(np.shape(w))}, expected "
                         f"[{num_directions}, {gates * hidden}, input_size]")
    t = jnp.arange(steps)[:, None]
    if seq_lens is None:
        mask = jnp.ones((steps, batch, 1), bool)
        backward = jnp.broadcast_to(steps - 1 - t, (steps, batch))
    else:
        lens = jnp.asarray(seq_lens).astype(jnp.int32)[None, :]
        mask = (t < lens)[..., None]
        backward = jnp.where(t < lens, lens - 1 - t, t)  # reverses each sequence's own steps (an involution)
    columns = jnp.arange(batch)[None, :]
    ys, last_h, last_c = [], [], []
    for d in range(num_directions):
        reverse = direction == "reverse" or d == 1
        xd = x[backward, columns] if reverse else x
        wb = jnp.zeros(gates * hidden, jnp.float32) if b is None else jnp.asarray(b)[d, :gates * hidden]
        rb = jnp.zeros(gates * hidden, jnp.float32) if b is None else jnp.asarray(b)[d, gates * hidden:]
        xp = jnp.einsum("tbi,gi->tbg", xd, jnp.asarray(w)[d], precision=HIGHEST) + wb
        rb_h = None
        if kind == "GRU":  # Rb[h] sits inside the reset gate's product
            xp = xp + jnp.concatenate([rb[:2 * hidden], jnp.zeros(hidden, jnp.float32)])
            rb_h = rb[2 * hidden:]
        else:
            xp = xp + rb
        h_init = jnp.zeros((batch, hidden), jnp.float32) if h0 is None else jnp.asarray(h0, jnp.float32)[d]
        carry = (h_init,)
        if kind == "LSTM":
            carry += (jnp.zeros((batch, hidden), jnp.float32) if c0 is None else jnp.asarray(c0, jnp.float32)[d],)
        pd = None if p is None else jnp.asarray(p)[d]
        step = _rnn_step(kind, acts[d], clip, jnp.asarray(r)[d], rb_h, pd,
                         bool(node.attr("linear_before_reset", 0)), hidden)
        carry, y = lax.scan(step, carry, (xp, mask))
        ys.append(y[backward, columns] if reverse else y)
        last_h.append(carry[0])
        if kind == "LSTM":
            last_c.append(carry[1])
    y = jnp.stack(ys, axis=1)  # [seq, num_directions, batch, hidden]
    y_h = jnp.stack(last_h)
    y_c = jnp.stack(last_c) if last_c else None
    if layout:
        y = jnp.transpose(y, (2, 0, 1, 3))
        y_h = jnp.swapaxes(y_h, 0, 1)
        y_c = None if y_c is None else jnp.swapaxes(y_c, 0, 1)
    return [y, y_h, y_c] if kind == "LSTM" else [y, y_h]


_RNN_ATTRS = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout")
op("LSTM", attrs=_RNN_ATTRS + ("input_forget",))(_rnn)
op("GRU", attrs=_RNN_ATTRS + ("linear_before_reset",))(_rnn)
op("RNN", attrs=_RNN_ATTRS)(_rnn)


# --- pooling ------------------------------------------------------------------------------------------------
def _pool_geometry(node: Node, x):
    n = x.ndim - 2
    kernel = [int(k) for k in node.attr("kernel_shape")]
    strides, dilations = _spatial_attrs(node, n)
    pads = _conv_pads(node, x.shape[2:], kernel, strides, dilations)
    extra = []
    for i in range(n):
        size = x.shape[2 + i] + pads[i][0] + pads[i][1]
        eff = (kernel[i] - 1) * dilations[i] + 1
        if node.attr("ceil_mode", 0):
            out = -(-(size - eff) // strides[i]) + 1
            if (out - 1) * strides[i] >= x.shape[2 + i] + pads[i][0]:
                out -= 1
        else:
            out = (size - eff) // strides[i] + 1
        extra.append(max(0, (out - 1) * strides[i] + eff - size))
    return kernel, strides, dilations, pads, extra


@op("MaxPool", attrs=("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"))
def _max_pool(ctx, node, inputs):
    if len(node.outputs) > 1 and node.outputs[1]:
        raise QtoolError(f"node {node.label()}: MaxPool's Indices output is not supported")
    x = jnp.asarray(inputs[0])
    kernel, strides, dilations, pads, extra = _pool_geometry(node, x)
    padding = [(0, 0), (0, 0)] + [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
    init = np.array(-np.inf, x.dtype)  # a concrete identity: JAX then differentiates reduce_window_max
    y = lax.reduce_window(x, init, lax.max, (1, 1) + tuple(kernel), (1, 1) + tuple(strides), padding,
                          window_dilation=(1, 1) + tuple(dilations))
    return [y]


@op("AveragePool", attrs=("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"))
def _avg_pool(ctx, node, inputs):
    x = jnp.asarray(inputs[0])
    kernel, strides, dilations, pads, extra = _pool_geometry(node, x)
    padding = [(0, 0), (0, 0)] + [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
    window = (1, 1) + tuple(kernel)
    stride = (1, 1) + tuple(strides)
    wdil = (1, 1) + tuple(dilations)
    total = lax.reduce_window(x, np.array(0, x.dtype), lax.add, window, stride, padding, window_dilation=wdil)
    # the divisor: positions inside the input (and the explicit pads with count_include_pad)
    ones = np.ones((1, 1) + tuple(x.shape[2:]), np.float32)
    if node.attr("count_include_pad", 0):
        ones = np.pad(ones, [(0, 0), (0, 0)] + [(lo, hi) for lo, hi in pads], constant_values=1.0)
        cpad = [(0, 0), (0, 0)] + [(0, e) for e in extra]
    else:
        cpad = padding
    counts = lax.reduce_window(ones, np.float32(0), lax.add, window, stride, cpad, window_dilation=wdil)
    return [total / _divisor(total, counts.astype(x.dtype))]


@op("GlobalAveragePool")
def _global_avg(ctx, node, inputs):
    x = jnp.asarray(inputs[0])
    axes = tuple(range(2, x.ndim))
    count = float(np.prod(x.shape[2:]))
    total = jnp.sum(x, axis=axes, keepdims=True)
    return [total / _divisor(total, jnp.asarray(count, x.dtype))]


@op("GlobalMaxPool")
def _global_max(ctx, node, inputs):
    x = jnp.asarray(inputs[0])
    return [jnp.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)]


# --- reductions ---------------------------------------------------------------------------------------------
def _reduce(kind: str):
    attr_until = {"ReduceSum": 13}.get(kind, 18)

    def impl(ctx, node, inputs):
        x = inputs[0]
        if node.opset >= attr_until:
            axes = _axes_of(node, inputs, 1)
        else:
            axes = node.attr("axes")
            axes = None if axes is None else [int(a) for a in axes]
        keep = bool(node.attr("keepdims", 1))
        if axes is not None and len(axes) == 0:
            axes = None
        if axes is None and node.attr("noop_with_empty_axes", 0):
            return [x]
        ax = tuple(range(x.ndim)) if axes is None else tuple(_axis(a, x.ndim) for a in axes)
        xp = _xp(x)
        if kind == "ReduceMean":
            count = float(np.prod([x.shape[a] for a in ax]))
            s = xp.sum(x, axis=ax, keepdims=keep)
            if xp is np:
                return [_result(s / np.asarray(count, x.dtype))]
            return [s / _divisor(s, jnp.asarray(count, x.dtype))]
        fn = {"ReduceSum": xp.sum, "ReduceMax": xp.max, "ReduceMin": xp.min, "ReduceProd": xp.prod}.get(kind)
        if kind in ("ReduceMax", "ReduceMin") and any(x.shape[a] == 0 for a in ax):
            # an empty set: -inf / +inf (the dtype's extremes), as onnxruntime; numpy and jax have no identity for
            # them (a key/value cache's empty past in a training graph's batch range)
            low = kind == "ReduceMax"
            extreme = (-np.inf if low else np.inf) if np.issubdtype(x.dtype, np.floating) else \
                (np.iinfo(x.dtype).min if low else np.iinfo(x.dtype).max)
            return [_result(fn(x, axis=ax, keepdims=keep, initial=extreme))]
        if fn is not None:
            return [_result(fn(x, axis=ax, keepdims=keep))]
        if kind == "ReduceSumSquare":
            return [_result(xp.sum(x * x, axis=ax, keepdims=keep))]
        if kind == "ReduceL2":
            return [_result(xp.sqrt(xp.sum(x * x, axis=ax, keepdims=keep)))]
        if kind == "ReduceL1":
            return [_result(xp.sum(xp.abs(x), axis=ax, keepdims=keep))]
        if kind == "ReduceLogSumExp":
            return [jax.scipy.special.logsumexp(x, axis=ax, keepdims=keep)]
        raise AssertionError(kind)

    return impl


for _kind in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL2",
              "ReduceL1", "ReduceLogSumExp"):
    op(_kind, attrs=("axes", "keepdims", "noop_with_empty_axes"))(_reduce(_kind))


def _arg(kind):
    def impl(ctx, node, inputs):
        x = inputs[0]
        axis = _axis(node.attr("axis", 0), x.ndim)
        keep = bool(node.attr("keepdims", 1))
        xp = _xp(x)
        fn = xp.argmax if kind == "max" else xp.argmin
        if node.attr("select_last_index", 0):
            flipped = xp.flip(x, axis=axis)
            idx = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            idx = fn(x, axis=axis)
        if keep:
            idx = xp.expand_dims(idx, axis)
        return [_result(idx.astype(np.int64) if xp is np else idx)]

    return impl


op("ArgMax", attrs=("axis", "keepdims", "select_last_index"))(_arg("max"))
op("ArgMin", attrs=("axis", "keepdims", "select_last_index"))(_arg("min"))


# --- shapes and data movement -------------------------------------------------------------------------------
@op("Shape", attrs=("start", "end"))
def _shape(ctx, node, inputs):
    shape = np.asarray(inputs[0].shape, np.int64)
    start = node.attr("start", 0)
    end = node.attr("end")
    return [shape[start:end]]


@op("Size")
def _size(ctx, node, inputs):
    return [np.asarray(int(np.prod(inputs[0].shape)), np.int64)]


@op("Constant", attrs=("value", "value_float", "value_floats", "value_int", "value_ints"))
def _constant(ctx, node, inputs):
    for key, dtype in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in node.attrs:
            v = node.attrs[key]
            return [np.array(v, dtype=dtype) if dtype is not None else np.array(v)]
    raise QtoolError(f"node {node.label()}: Constant without a supported value attribute")


@op("ConstantOfShape", attrs=("value",))
def _constant_of_shape(ctx, node, inputs):
    shape = [int(s) for s in _static(node, inputs[0], "shape input").reshape(-1)]
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    return [np.full(shape, value.reshape(-1)[0], value.dtype)]


@op("Reshape", attrs=("allowzero",))
def _reshape(ctx, node, inputs):
    x = inputs[0]
    target = [int(s) for s in _static(node, inputs[1], "target shape").reshape(-1)]
    if not node.attr("allowzero", 0):
        target = [x.shape[i] if s == 0 else s for i, s in enumerate(target)]
    xp = _xp(x)
    return [_result(xp.reshape(x, target))]


@op("Flatten", attrs=("axis",))
def _flatten(ctx, node, inputs):
    x = inputs[0]
    axis = _axis(node.attr("axis", 1), x.ndim)
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [_result(_xp(x).reshape(x, (outer, -1)))] if x.size else [_result(_xp(x).reshape(x, (outer, 0)))]


@op("Transpose", attrs=("perm",))
def _transpose(ctx, node, inputs):
    x = inputs[0]
    perm = node.attr("perm")
    perm = list(range(x.ndim))[::-1] if perm is None else [int(p) for p in perm]
    return [_result(_xp(x).transpose(x, perm))]


@op("Squeeze", attrs=("axes",))
def _squeeze(ctx, node, inputs):
    x = inputs[0]
    axes = _axes_of(node, inputs, 1) if node.opset >= 13 else node.attr("axes")
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = tuple(_axis(int(a), x.ndim) for a in axes)
    return [_result(_xp(x).squeeze(x, axis=axes))]


@op("Unsqueeze", attrs=("axes",))
def _unsqueeze(ctx, node, inputs):
    x = inputs[0]
    axes = _axes_of(node, inputs, 1) if node.opset >= 13 else node.attr("axes")
    rank = x.ndim + len(axes)
    axes = sorted(_axis(int(a), rank) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [_result(_xp(x).reshape(x, shape))]


@op("Expand")
def _expand(ctx, node, inputs):
    x = inputs[0]
    shape = [int(s) for s in _static(node, inputs[1], "shape input").reshape(-1)]
    out = np.broadcast_shapes(tuple(x.shape), tuple(shape))
    return [_result(_xp(x).broadcast_to(x, out))]


@op("Tile")
def _tile(ctx, node, inputs):
    x = inputs[0]
    reps = [int(r) for r in _static(node, inputs[1], "repeats").reshape(-1)]
    return [_result(_xp(x).tile(x, reps))]


@op("Trilu", attrs=("upper",))
def _trilu(ctx, node, inputs):
    """The upper (``upper=1``, default) or lower triangle of the last two axes, from diagonal ``k``."""
    x = inputs[0]
    k = int(_static(node, inputs[1], "diagonal k").reshape(-1)[0]) if len(inputs) > 1 and inputs[1] is not None else 0
    xp = _xp(x)
    return [_result(xp.triu(x, k) if int(node.attr("upper", 1)) else xp.tril(x, k))]


@op("Cast", attrs=("to", "saturate"))
def _cast(ctx, node, inputs):
    x = inputs[0]
    dtype = _np_dtype(node, int(node.attr("to")))
    if concrete(x):
        return [np.asarray(x).astype(dtype)]
    return [x.astype(_TRACED_DTYPES.get(dtype, dtype))]


@op("CastLike", attrs=("saturate",))
def _cast_like(ctx, node, inputs):
    x, like = inputs
    return [np.asarray(x).astype(like.dtype) if concrete(x) else x.astype(like.dtype)]


@op("Dropout", attrs=("ratio", "seed"))
def _dropout(ctx, node, inputs):
    """The identity (inference); a ``training_mode`` input that is not the constant false (random dropout) is
    refused."""
    x = inputs[0]
    training = inputs[2] if len(inputs) > 2 else None
    if training is not None and (not concrete(training) or bool(np.asarray(training).reshape(-1)[0])):
        raise QtoolError(f"node {node.label()}: Dropout in training mode (random) is not supported by the JAX "
                         "interpreter; only its inference mode (the identity) is")
    outs = [x]
    if len(node.outputs) > 1 and node.outputs[1]:
        outs.append(np.ones(x.shape, np.bool_))
    return outs


@op("Concat", attrs=("axis",))
def _concat(ctx, node, inputs):
    vals = [v for v in inputs if v is not None]
    axis = _axis(int(node.attr("axis")), vals[0].ndim)
    return [_result(_xp(*vals).concatenate(vals, axis=axis))]


@op("Split", attrs=("axis", "split", "num_outputs"))
def _split(ctx, node, inputs):
    x = inputs[0]
    axis = _axis(int(node.attr("axis", 0)), x.ndim)
    n_out = len(node.outputs)
    if node.opset >= 13 and len(inputs) > 1 and inputs[1] is not None:
        sizes = [int(s) for s in _static(node, inputs[1], "split sizes").reshape(-1)]
    elif node.opset < 13 and node.attr("split") is not None:
        sizes = [int(s) for s in node.attr("split")]
    else:
        num = int(node.attr("num_outputs", n_out))
        dim = x.shape[axis]
        each = -(-dim // num)
        sizes = [min(each, dim - i * each) for i in range(num)]
    offsets = np.cumsum([0] + sizes)
    xp = _xp(x)
    outs = []
    for i in range(len(sizes)):
        index = [slice(None)] * x.ndim
        index[axis] = slice(int(offsets[i]), int(offsets[i + 1]))
        outs.append(_result(x[tuple(index)] if xp is np else x[tuple(index)]))
    return outs


@op("Slice", attrs=("starts", "ends", "axes"))
def _slice(ctx, node, inputs):
    x = inputs[0]
    if node.opset < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes = node.attr("axes")
        steps = None
    else:
        starts = _static(node, inputs[1], "starts").reshape(-1)
        ends = _static(node, inputs[2], "ends").reshape(-1)
        axes = _static(node, inputs[3], "axes").reshape(-1) if len(inputs) > 3 and inputs[3] is not None else None
        steps = _static(node, inputs[4], "steps").reshape(-1) if len(inputs) > 4 and inputs[4] is not None else None
    axes = list(range(len(starts))) if axes is None else [_axis(int(a), x.ndim) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        dim = x.shape[a]
        s, e = int(s), int(e)
        if s < 0:
            s += dim
        if e < 0:
            e += dim
        if st > 0:
            s = min(max(s, 0), dim)
            e = min(max(e, 0), dim)
            index[a] = slice(s, e, st)
        else:
            s = min(max(s, -1), dim - 1)
            e = min(max(e, -1), dim - 1)
            index[a] = slice(s, None if e < 0 else e, st)
    return [_result(x[tuple(index)])]


@op("Gather", attrs=("axis",))
def _gather(ctx, node, inputs):
    x, idx = inputs
    axis = _axis(int(node.attr("axis", 0)), x.ndim)
    dim = x.shape[axis]
    if concrete(idx):
        idx = np.where(idx < 0, idx + dim, idx)
        if concrete(x):
            return [_result(np.take(x, idx, axis=axis))]
        return [jnp.take(x, jnp.asarray(idx), axis=axis)]
    idx = jnp.where(idx < 0, idx + dim, idx)
    return [jnp.take(jnp.asarray(x), idx, axis=axis)]


@op("GatherElements", attrs=("axis",))
def _gather_elements(ctx, node, inputs):
    x, idx = inputs
    axis = _axis(int(node.attr("axis", 0)), x.ndim)
    idx = jnp.where(idx < 0, idx + x.shape[axis], idx)
    return [jnp.take_along_axis(jnp.asarray(x), idx, axis=axis)]


@op("Pad", attrs=("mode", "pads", "value"))
def _pad(ctx, node, inputs):
    x = inputs[0]
    mode = node.attr("mode", "constant")
    if node.opset < 11:
        pads = [int(p) for p in node.attr("pads")]
        value = float(node.attr("value", 0.0))
        axes = None
    else:
        pads = [int(p) for p in _static(node, inputs[1], "pads").reshape(-1)]
        value = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros((), x.dtype)
        if not concrete(value):
            raise QtoolError(f"node {node.label()}: a traced constant_value is not supported")
        value = np.asarray(value).reshape(-1)[0] if np.size(value) else 0
        axes = _axes_of(node, inputs, 3) if len(inputs) > 3 else None
    rank = x.ndim
    axes = list(range(rank)) if axes is None else [_axis(a, rank) for a in axes]
    n = len(axes)
    width = [(0, 0)] * rank
    for i, a in enumerate(axes):
        width[a] = (pads[i], pads[i + n])
    if any(lo < 0 or hi < 0 for lo, hi in width):
        # negative pads crop
        index = tuple(slice(max(0, -lo), x.shape[i] - max(0, -hi)) for i, (lo, hi) in enumerate(width))
        x = x[index]
        width = [(max(0, lo), max(0, hi)) for lo, hi in width]
    xp = _xp(x)
    if mode == "constant":
        return [_result(xp.pad(x, width, mode="constant", constant_values=np.asarray(value, x.dtype)))]
    if mode in ("reflect", "edge", "wrap"):
        return [_result(xp.pad(x, width, mode=mode))]
    raise QtoolError(f"node {node.label()}: Pad mode '{mode}' is not supported")


@op("Range")
def _range(ctx, node, inputs):
    start, limit, delta = (_static(node, v, "range bound") for v in inputs)
    return [np.arange(start, limit, delta).astype(np.asarray(start).dtype)]


@op("TopK", attrs=("axis", "k", "largest", "sorted"))
def _topk(ctx, node, inputs):
    x = inputs[0]
    k = int(node.attr("k")) if node.opset < 10 else int(_static(node, inputs[1], "k").reshape(-1)[0])
    axis = _axis(int(node.attr("axis", -1)), x.ndim)
    largest = bool(node.attr("largest", 1))
    xt = jnp.moveaxis(jnp.asarray(x), axis, -1)
    vals, idx = lax.top_k(xt if largest else -xt, k)
    if not largest:
        vals = -vals
    return [jnp.moveaxis(vals, -1, axis), jnp.moveaxis(idx, -1, axis)]


# --- Resize / Upsample ----------------------------------------------------------------------------------------
def _source_coords(mode: str, out_size: int, in_size: int, scale: float, roi=None):
    i = np.arange(out_size, dtype=np.float64)
    if mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if out_size > 1 else np.zeros(out_size)
    if mode == "align_corners":
        return i * (in_size - 1) / (out_size - 1) if out_size > 1 else np.zeros(out_size)
    if mode == "asymmetric":
        return i / scale
    if mode == "tf_half_pixel_for_nn":
        return (i + 0.5) / scale
    if mode == "half_pixel_symmetric":
        adj = out_size / (scale * in_size)
        center = in_size / 2
        offset = center * (1 - adj)
        return offset + (i + 0.5) / scale - 0.5
    raise ValueError(mode)


def _nearest(coords: np.ndarray, mode: str) -> np.ndarray:
    if mode == "round_prefer_floor":
        return np.where(coords - np.floor(coords) == 0.5, np.floor(coords), np.round(coords))
    if mode == "round_prefer_ceil":
        return np.where(coords - np.floor(coords) == 0.5, np.ceil(coords), np.round(coords))
    if mode == "floor":
        return np.floor(coords)
    if mode == "ceil":
        return np.ceil(coords)
    raise ValueError(mode)


def cubic_near(v, a):
    """Keys' cubic convolution kernel at distances ``0 <= v <= 1`` (ONNX's, with ``a`` = cubic_coeff_a)."""
    return ((a + 2) * v - (a + 3)) * v * v + 1


def cubic_far(v, a):
    """Keys' cubic convolution kernel at distances ``1 <= v <= 2``."""
    return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a


def _resize_weights(node: Node, coords: np.ndarray, n_in: int, scale: float, antialias: bool) -> np.ndarray:
    """Resize ``linear`` or ``cubic`` along one axis as an [n_out, n_in] matrix, built on the host as ONNX's
    reference does: each output's kernel taps around its source coordinate (the pixel on its left first when
    it falls on one), the kernel stretched by ``1 / scale`` when ``antialias`` downscales, the weights
    normalized to sum 1; a tap outside the input reads the edge pixel, or with ``exclude_outside`` counts 0."""
    mode = node.attr("mode")
    a = float(node.attr("cubic_coeff_a", -0.75))
    support = 1 if mode == "linear" else 2
    stretch = min(scale, 1.0) if antialias else 1.0
    start = int(np.floor(-support / stretch)) + 1
    offsets = np.arange(start, 2 - start)
    base = np.floor(coords)
    ratio = coords - base
    on_pixel = ratio == 0
    base, ratio = np.where(on_pixel, base - 1, base), np.where(on_pixel, 1.0, ratio)
    d = np.abs(offsets[None, :] - ratio[:, None]) * stretch
    if mode == "linear":
        w = np.maximum(1 - d, 0)
    else:
        w = np.where(d <= 1, cubic_near(d, a), np.where(d < 2, cubic_far(d, a), 0.0))
    taps = base[:, None].astype(np.int64) + offsets[None, :]
    if node.attr("exclude_outside", 0):
        w = np.where((taps >= 0) & (taps < n_in), w, 0.0)
    w = w / w.sum(axis=1, keepdims=True)
    matrix = np.zeros((len(coords), n_in))
    np.add.at(matrix, (np.arange(len(coords))[:, None], np.clip(taps, 0, n_in - 1)), w)
    return matrix.astype(np.float32)


def _resize_impl(node: Node, x, scales, sizes, mode: str, coord_mode: str, nearest_mode: str, antialias=False):
    rank = x.ndim
    in_shape = x.shape
    if sizes is not None:
        out_shape = [int(s) for s in sizes]
        scales = [out_shape[i] / in_shape[i] for i in range(rank)]
    else:
        scales = [float(s) for s in scales]
        out_shape = [int(math.floor(in_shape[i] * scales[i])) for i in range(rank)]
    if mode not in ("nearest", "linear", "cubic"):
        raise QtoolError(f"node {node.label()}: Resize mode '{mode}' is not supported (nearest, linear and cubic are)")
    y = jnp.asarray(x)
    for axis in range(rank):
        n_in, n_out = in_shape[axis], out_shape[axis]
        if n_in == n_out and scales[axis] == 1.0:
            continue
        try:
            coords = _source_coords(coord_mode, n_out, n_in, scales[axis])
        except ValueError:
            raise QtoolError(f"node {node.label()}: coordinate_transformation_mode '{coord_mode}' is not supported")
        if mode == "nearest":
            try:
                idx = _nearest(coords, nearest_mode)
            except ValueError:
                raise QtoolError(f"node {node.label()}: nearest_mode '{nearest_mode}' is not supported")
            idx = np.clip(idx, 0, n_in - 1).astype(np.int32)
            y = jnp.take(y, jnp.asarray(idx), axis=axis)
        elif mode == "linear" and not (antialias and scales[axis] < 1):
            c = np.clip(coords, 0, n_in - 1)
            lo = np.floor(c).astype(np.int32)
            hi = np.minimum(lo + 1, n_in - 1)
            frac = (c - lo).astype(np.float32)
            shape = [1] * rank
            shape[axis] = n_out
            frac = jnp.asarray(frac.reshape(shape))
            a = jnp.take(y, jnp.asarray(lo), axis=axis)
            b = jnp.take(y, jnp.asarray(hi), axis=axis)
            y = a * (1 - frac) + b * frac
        else:
            weights = _resize_weights(node, coords, n_in, scales[axis], antialias)
            y = jnp.moveaxis(jnp.tensordot(weights, y, axes=([1], [axis]), precision=HIGHEST), 0, axis)
    return y


@op("Resize", attrs=("mode", "coordinate_transformation_mode", "nearest_mode", "axes", "keep_aspect_ratio_policy",
                     "extrapolation_value", "cubic_coeff_a", "exclude_outside", "antialias"))
def _resize(ctx, node, inputs):
    """nearest, linear and cubic (``cubic_coeff_a``, ``exclude_outside``), ``antialias`` for linear and cubic
    downscales; every coordinate transformation but tf_crop_and_resize (so ``extrapolation_value``, which only
    it reads, never matters)."""
    x = inputs[0]
    mode = node.attr("mode", "nearest")
    if node.opset < 11:
        scales = _static(node, inputs[1], "scales").reshape(-1)
        return [_resize_impl(node, x, scales, None, mode, "asymmetric", "floor")]
    scales = inputs[2] if len(inputs) > 2 and inputs[2] is not None and np.size(inputs[2]) else None
    sizes = inputs[3] if len(inputs) > 3 and inputs[3] is not None and np.size(inputs[3]) else None
    scales = None if scales is None else _static(node, scales, "scales").reshape(-1)
    sizes = None if sizes is None else _static(node, sizes, "sizes").reshape(-1)
    axes = node.attr("axes")
    if axes is not None:  # opset 18: scales/sizes for some axes only
        full_scales = [1.0] * x.ndim
        full_sizes = list(x.shape)
        for i, a in enumerate(axes):
            a = _axis(int(a), x.ndim)
            if scales is not None:
                full_scales[a] = float(scales[i])
            if sizes is not None:
                full_sizes[a] = int(sizes[i])
        scales = full_scales if scales is not None else None
        sizes = full_sizes if sizes is not None else None
    if node.attr("keep_aspect_ratio_policy", "stretch") != "stretch" and sizes is not None:
        raise QtoolError(f"node {node.label()}: keep_aspect_ratio_policy other than 'stretch' is not supported")
    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    nearest_mode = node.attr("nearest_mode", "round_prefer_floor")
    if mode == "nearest" and node.opset < 11:
        nearest_mode = "floor"
    return [_resize_impl(node, x, scales, sizes, mode, coord, nearest_mode, bool(node.attr("antialias", 0)))]


@op("Upsample", attrs=("mode", "scales"))
def _upsample(ctx, node, inputs):
    x = inputs[0]
    scales = node.attr("scales") if len(inputs) < 2 else _static(node, inputs[1], "scales").reshape(-1)
    return [_resize_impl(node, x, scales, None, node.attr("mode", "nearest"), "asymmetric", "floor")]


# --- qtool::FakeQuant ---------------------------------------------------------------------------------------------
@op(FQ_NAME, domain=FQ_DOMAIN, attrs=("num_bits", "narrow_range", "half_to_even"))
def _fake_quant(ctx, node, inputs):
    x, mn, mx = inputs
    if not ctx.fake_quant:
        return [x]
    num_bits = int(node.attr("num_bits", 8))
    narrow = bool(node.attr("narrow_range", 0))
    return [fake_quant(jnp.asarray(x), jnp.asarray(mn), jnp.asarray(mx), num_bits, narrow,
                       bool(ctx.range_grad(node.name)), bool(node.attr("half_to_even", 0)))]


@op(FQ_BIAS_NAME, domain=FQ_DOMAIN, attrs=("saturate",))
def _fake_quant_bias(ctx, node, inputs):
    b, scale = inputs
    if not ctx.fake_quant:
        return [b]
    return [fake_quant_bias(jnp.asarray(b), jnp.asarray(scale), bool(node.attr("saturate", 1)))]


# --- the interpreter ----------------------------------------------------------------------------------------------
class Interpreter:
    """An ONNX model as a JAX function of its inputs.

    ``model``: an ``onnx.ModelProto`` or ``onnx_ir.Model``. ``feedable`` lists
    the initializers that :meth:`run` may receive (the training contract's
    state and parameters; by default every initializer that is also a graph
    input); the others are constants, evaluated on the host where possible.
    """

    def __init__(self, model, *, label: str = "the model"):
        proto = _as_proto(model)
        graph = proto.graph
        self.label = label
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
        self.initializers: dict[str, np.ndarray] = _initializers(model, graph)
        for t in graph.sparse_initializer:
            raise QtoolError(f"{label}: sparse initializer '{t.values.name}' is not supported")
        self.input_names = [i.name for i in graph.input]
        self.data_inputs = [n for n in self.input_names if n not in self.initializers]
        self.output_names = [o.name for o in graph.output]
        self.output_types = {o.name: o.type.tensor_type.elem_type for o in graph.output}  # 0: not declared
        self.nodes = _read_nodes(graph.node, self.opsets, "")
        self.functions: dict[tuple[str, str], Function] = {}
        for f in proto.functions:
            fops = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in f.opset_import}
            defaults = {a.name: _attr_value(a) for a in f.attribute_proto}
            self.functions[(f.domain, f.name)] = Function(f.name, f.domain, list(f.input), list(f.output),
                                                          _read_nodes(f.node, fops, f"{f.name}/"), defaults)
        self._check(self.nodes, set())
        self.feedable = {n for n in self.input_names if n in self.initializers}
        self._reached: dict[frozenset, frozenset] = {}

    def _check(self, nodes: list[Node], seen: set) -> None:
        for node in nodes:
            if (node.domain, node.op_type) in OPS:
                check_attributes(node, self.label)
                for body in bodies(node):
                    self._check(body.nodes, seen)
                continue
            fn = self.functions.get((node.domain, node.op_type))
            if fn is not None:
                if (fn.domain, fn.name) not in seen:
                    self._check(fn.nodes, seen | {(fn.domain, fn.name)})
                continue
            if any(isinstance(v, onnx.GraphProto) for v in node.attrs.values()):
                why = "control flow with subgraphs is not supported"
            else:
                why = "the JAX interpreter does not implement this op"
            dom = f"domain '{node.domain}'" if node.domain else "the default domain"
            article = "an" if node.op_type[:1] in "AEIOU" else "a"
            raise QtoolError(f"{self.label}: node '{node.name}' is {article} {node.op_type} ({dom}): {why}; "
                             "qtool finetune cannot train this model")

    # --- evaluation ---------------------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, object], *, fake_quant: bool = True,
            range_grad: Callable[[str], bool] | None = None, outputs: list[str] | None = None,
            no_grad: frozenset = frozenset(), trainable: frozenset = frozenset()) -> dict:
        """Evaluate the graph. ``feeds``: data inputs and any feedable initializer (traced or not);
        initializers not fed use their stored value. Returns ``{output name: array}``. The gradient
        stops at the values named in ``no_grad``. ``trainable``: the feeds a gradient is taken for (a
        while loop that reads them is refused: JAX cannot differentiate it in reverse mode)."""
        ctx = self.context(fake_quant=fake_quant, range_grad=range_grad, no_grad=no_grad, trainable=trainable)
        env: dict[str, object] = {}
        for name, value in self.initializers.items():
            env[name] = value
        for name, value in feeds.items():
            env[name] = value
        missing = [n for n in self.data_inputs if n not in env]
        if missing:
            raise QtoolError(f"{self.label}: no value fed for input '{missing[0]}'")
        self._run_nodes(self.nodes, env, ctx, {})
        wanted = outputs if outputs is not None else self.output_names
        return {n: env[n] for n in wanted}

    def context(self, *, fake_quant: bool = True, range_grad: Callable[[str], bool] | None = None,
                no_grad: frozenset = frozenset(), trainable: frozenset = frozenset()) -> Context:
        """The context :meth:`run` evaluates in (its arguments); :meth:`run_nodes` takes one."""
        ctx = Context(fake_quant=fake_quant, range_grad=range_grad or (lambda name: True), no_grad=no_grad,
                      trained=lambda name: name in self.reaching(trainable))
        ctx.run_body = lambda body, scope, values: self._run_body(body, scope, values, ctx)
        return ctx

    def run_nodes(self, nodes: list[Node], env: dict, ctx: Context) -> None:
        """Evaluate ``nodes`` (some of the graph's, in order) into ``env``, which holds every value they read
        (``finetune``'s segmented step: qtool.finetune.segmented)."""
        self._run_nodes(nodes, env, ctx, {})

    def _run_nodes(self, nodes: list[Node], env: dict, ctx: Context, attrs: dict) -> None:
        for node in nodes:
            if attrs and any(isinstance(v, _Ref) for v in node.attrs.values()):
                resolved = {}
                for k, v in node.attrs.items():
                    if isinstance(v, _Ref):
                        if v.name in attrs:
                            resolved[k] = attrs[v.name]
                    else:
                        resolved[k] = v
                node = Node(node.op_type, node.domain, node.name, node.inputs, node.outputs, resolved, node.opset)
                if (node.domain, node.op_type) in OPS:
                    check_attributes(node, self.label)
            inputs = [env[n] if n else None for n in node.inputs]
            while inputs and inputs[-1] is None:
                inputs.pop()
            impl = OPS.get((node.domain, node.op_type))
            ctx.scope = env
            try:
                if impl is not None:
                    outs = impl(ctx, node, inputs)
                else:
                    outs = self._call_function(node, inputs, ctx)
            except QtoolError:
                raise
            except Exception as exc:  # noqa: BLE001 - name the node that failed
                raise QtoolError(f"{self.label}: node {node.label()} failed in the JAX interpreter: "
                                 f"{type(exc).__name__}: {exc}") from exc
            for name, value in zip(node.outputs, outs):
                if name:
                    env[name] = lax.stop_gradient(value) if name in ctx.no_grad and not concrete(value) else value

    def _run_body(self, body: Body, scope: Mapping, values: list, ctx: Context) -> list:
        """A subgraph's outputs: its formal inputs bound to ``values``, the enclosing ``scope`` readable."""
        local = dict(body.initializers)
        local.update(zip(body.inputs, values))
        env = ChainMap(local, scope)
        self._run_nodes(body.nodes, env, ctx, {})
        return [env[o] for o in body.outputs]

    def reaching(self, sources: frozenset) -> frozenset:
        """The names of the values computed from any of ``sources`` (through subgraphs too; a subgraph that
        reads one taints all its values)."""
        if sources not in self._reached:
            tainted = set(sources)

            def walk(nodes):
                for node in nodes:
                    subs = bodies(node)
                    if any(i in tainted for i in node.inputs if i) or any(r in tainted for b in subs for r in b.reads):
                        for b in subs:
                            tainted.update(b.inputs)
                            walk(b.nodes)
                        tainted.update(o for o in node.outputs if o)

            walk(self.nodes)
            self._reached[sources] = frozenset(tainted)
        return self._reached[sources]

    def _call_function(self, node: Node, inputs: list, ctx: Context) -> list:
        fn = self.functions[(node.domain, node.op_type)]
        attrs = dict(fn.defaults)
        attrs.update(node.attrs)
        local = {}
        for name, value in zip(fn.inputs, inputs):
            local[name] = value
        self._run_nodes(fn.nodes, local, ctx, attrs)
        return [local[o] for o in fn.outputs]


from qtool.finetune import control_flow, more_ops  # noqa: E402,F401 - register more ops (they import this module)
