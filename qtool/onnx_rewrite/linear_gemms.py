"""A Linear layer on an input with symbolic dims written as ``Reshape -> Gemm -> Reshape`` (eval graph).

A transformer's Linear exported with a dynamic batch (and sequence) is ``Add(MatMul(x[B, S, K], W[K, N]), b)``.
With a static or 2-D input onnxruntime's MatMulAddFusion makes it a Gemm, and the QDQ Gemm (int32 bias
through its DequantizeLinear) runs as one ``QGemm``. With a symbolic dim it stays a MatMul: onnxruntime runs
``DQ -> MatMul`` as ``MatMulIntegerToFloat`` and leaves the bias ``Add`` a separate float Add (its bias fusion in
``matmul_integer_to_float.cc`` matches only dynamic quantization's ``MatMulInteger -> Cast -> Mul -> Add``), and
an int32 bias there only added a DequantizeLinear per layer (the zoo's BERT 0.91x -> 1.06x float).

:func:`linears_as_gemms` writes such a layer as onnxruntime's own fusion would with static shapes: the input's
codes reshaped to ``[-1, K]`` (a Reshape of the uint8 codes before their DequantizeLinear, one per quantized
tensor, shared by the layers reading it: q, k, v), ``Gemm(x, W, b)`` with the int32 bias the eval graph stores for
it (``eval_graph.bias_slot``: :func:`reshapes_to_gemm`), and the output reshaped back to ``[..., N]`` (after the
output's QuantizeLinear when that is its only reader, so that ``QGemm`` writes the codes itself). The target of
the second Reshape is a constant where one leading dim is symbolic (``[-1, S, N]``), else ``Shape`` of the codes
without its last dim, concatenated with ``N``. The values are those of ``MatMul + Add`` with the int32 bias: the
same integer products and the same bias, which the training graph adds too (``qtool::FakeQuantBias``, as for a
Gemm's bias; ``docs/spec-changes.md``). Measured in ``benchmarks/zoo/FINDINGS.md`` section 30.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from qtool.model.codec import DEQUANTIZE, QUANTIZE, dequantize_node, is_onnx, value_dtype
from qtool.model.constants import constant_array, remove_if_unused
from qtool.model.graph import take_over
from qtool.model.names import NameScope
from qtool.model.opset import inferred_dims
from qtool.onnx_rewrite.kernel_forms import static_shape
from qtool.onnx_rewrite.placement.integer import becomes_gemm

Initializer = Callable[[str, np.ndarray], ir.Value]
SHAPE_START_END_OPSET = 15  # Shape's start/end attributes


def _weight_rank(weight: ir.Value | None) -> int | None:
    """The rank of a layer's constant weight (looking through its DequantizeLinear in the eval graph)."""
    if weight is None:
        return None
    array = constant_array(weight)
    producer = weight.producer()
    if array is None and producer is not None and is_onnx(producer, DEQUANTIZE):
        array = constant_array(producer.inputs[0])
    if array is not None:
        return array.ndim
    return len(weight.shape) if weight.shape is not None else None


def reshapes_to_gemm(matmul: ir.Node) -> bool:
    """Whether the eval graph writes ``matmul`` (a layer: constant weight) and its bias Add as ``Reshape -> Gemm ->
    Reshape``: its input has rank 3 or more, a static last dim and a symbolic one (where it is 2-D or static,
    onnxruntime makes the Gemm itself: :func:`becomes_gemm`), its weight is 2-D. Its bias is then stored as int32
    (``eval_graph.bias_slot``), in the training graph too."""
    if matmul.op_type != "MatMul" or len(matmul.inputs) != 2 or matmul.inputs[0] is None or becomes_gemm(matmul):
        return False
    graph = matmul.graph
    shape = static_shape(graph, matmul.inputs[0]) if graph is not None else None
    return shape is not None and len(shape) >= 3 and shape[-1] is not None and _weight_rank(matmul.inputs[1]) == 2


def _dq(value: ir.Value | None) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and is_onnx(node, DEQUANTIZE) and len(node.inputs) >= 2 else None


def _per_tensor(dq: ir.Node) -> bool:
    params = [constant_array(v) for v in dq.inputs[1:] if v is not None]
    return all(p is not None and p.size == 1 for p in params)


def _sole_reader(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0][0] if len(uses) == 1 and not value.is_graph_output() else None


def _linear(matmul: ir.Node):
    """``(x's DQ, weight DQ, bias Add, bias DQ, x's shape, N)`` of a quantized Linear :func:`reshapes_to_gemm`
    takes whose bias the eval graph stored as int32, or None."""
    if not is_onnx(matmul, "MatMul") or len(matmul.inputs) != 2 or None in matmul.inputs \
            or not reshapes_to_gemm(matmul):
        return None
    x_dq, w_dq = _dq(matmul.inputs[0]), _dq(matmul.inputs[1])
    if x_dq is None or w_dq is None or not _per_tensor(x_dq):
        return None
    codes = constant_array(w_dq.inputs[0])
    if codes is None or codes.ndim != 2 or (not _per_tensor(w_dq) and w_dq.attributes.get_int("axis", 1) not in (1, -1)):
        return None
    add = _sole_reader(matmul.outputs[0])
    if add is None or not is_onnx(add, "Add") or len(add.inputs) != 2 or None in add.inputs:
        return None
    bias = add.inputs[1] if add.inputs[0] is matmul.outputs[0] else add.inputs[0]
    b_dq = _dq(bias)
    b_codes = constant_array(b_dq.inputs[0]) if b_dq is not None else None
    n = codes.shape[1]
    if b_codes is None or b_codes.dtype != np.int32 or b_codes.size != n or b_codes.shape[-1] != n \
            or _sole_reader(bias) is not add:
        return None
    shape = static_shape(matmul.graph, matmul.inputs[0])
    return x_dq, w_dq, add, b_dq, shape, n


def _flat_bias(b_dq: ir.Node, initializer: Initializer, names: NameScope) -> None:
    """The int32 bias codes as ``[N]`` (a Gemm's ``C``; a MatMul's bias Add may hold ``[1, 1, N]``)."""
    codes = constant_array(b_dq.inputs[0])
    if codes.ndim == 1:
        return
    old = b_dq.inputs[0]
    b_dq.replace_input_with(0, initializer(names.value(f"{old.name}_flat"), codes.reshape(-1)))
    if "axis" in b_dq.attributes:
        b_dq.attributes["axis"] = ir.AttrInt64("axis", 0)
    b_dq.outputs[0].shape = ir.Shape([codes.size])
    if not old.uses() and old.name in b_dq.graph.initializers and not old.is_graph_output():
        del b_dq.graph.initializers[old.name]


class _Inputs:
    """The flattened input of each quantized tensor, and the leading shape to reshape back to (shared)."""

    def __init__(self, graph: ir.Graph, names: NameScope, initializer: Initializer, opset: int):
        self.graph, self.names, self.initializer, self.opset = graph, names, initializer, opset
        self.flat: dict[int, ir.Value] = {}
        self.targets: dict[tuple, ir.Value] = {}
        self.leading: dict[object, ir.Value] = {}

    def flat_input(self, x_dq: ir.Node, k: int, before: ir.Node) -> ir.Value:
        """``x`` reshaped to ``[-1, K]`` and read through a pair of its own grid (a carried quantizer: onnxruntime drops
        the pair around the Reshape, which then moves the codes)."""
        if id(x_dq) not in self.flat:
            x = x_dq.outputs[0]
            base = self.names.prefix(f"{x_dq.name or 'input'}/gemm_input", ["Reshape"], ["shape", "flat"])
            reshape = ir.node("Reshape", [x, self.initializer(f"{base}/shape", np.array([-1, k], np.int64))],
                              name=f"{base}/Reshape")
            reshape.outputs[0].name, reshape.outputs[0].dtype = f"{base}/flat", ir.DataType.FLOAT
            self.graph.insert_before(before, reshape)
            self.flat[id(x_dq)] = _same_grid(self.graph, self.names, reshape.outputs[0], x_dq, f"{base}_quant", reshape)
        return self.flat[id(x_dq)]

    def target(self, x_dq: ir.Node, shape: tuple, n: int, before: ir.Node) -> ir.Value:
        """``[..., N]`` with the leading dims of x: a constant where one is symbolic, else from ``Shape`` (one per
        set of named leading dims: every Linear of a transformer reads [batch, tokens, ...])."""
        leading = shape[:-1]
        codes = x_dq.inputs[0]
        if sum(d is None for d in leading) == 1:
            key = (tuple(leading), n)
            if key not in self.targets:
                dims = np.array([-1 if d is None else d for d in leading] + [n], np.int64)
                self.targets[key] = self.initializer(
                    self.names.value(f"{codes.name or 'input'}/gemm_output/shape_{n}"), dims)
            return self.targets[key]
        named = _named_dims(self.graph, x_dq)
        lead_key = named[:-1] if named is not None else id(x_dq)
        if lead_key not in self.leading:
            base = self.names.prefix(f"{codes.name or 'input'}/gemm_output", ["Shape", "Slice"],
                                     ["shape", "leading", "starts", "ends"])
            if self.opset >= SHAPE_START_END_OPSET:
                nodes = [ir.node("Shape", [codes], {"start": 0, "end": -1}, name=f"{base}/Shape")]
            else:
                whole = ir.node("Shape", [codes], name=f"{base}/Shape")
                whole.outputs[0].name = f"{base}/shape"
                nodes = [whole, ir.node("Slice", [whole.outputs[0],
                                                  self.initializer(f"{base}/starts", np.array([0], np.int64)),
                                                  self.initializer(f"{base}/ends", np.array([-1], np.int64))],
                                        name=f"{base}/Slice")]
            nodes[-1].outputs[0].name, nodes[-1].outputs[0].dtype = f"{base}/leading", ir.DataType.INT64
            self.graph.insert_before(before, nodes)
            self.leading[lead_key] = nodes[-1].outputs[0]
        key = (lead_key, n)
        if key not in self.targets:
            leading_value = self.leading[lead_key]
            base = self.names.prefix(f"{leading_value.name}_{n}", ["Concat"], ["last", "shape"])
            concat = ir.node("Concat", [leading_value, self.initializer(f"{base}/last", np.array([n], np.int64))],
                             {"axis": 0}, name=f"{base}/Concat")
            concat.outputs[0].name, concat.outputs[0].dtype = f"{base}/shape", ir.DataType.INT64
            self.graph.insert_before(before, concat)
            self.targets[key] = concat.outputs[0]
        return self.targets[key]


def _named_dims(graph: ir.Graph, x_dq: ir.Node) -> tuple | None:
    """The dims of the tensor ``x_dq`` dequantizes, symbolic ones by name (one name, one size: ONNX's ``dim_param``),
    from the model or shape inference; None where a symbolic dim has no name."""
    value = x_dq.outputs[0]
    dims = inferred_dims(graph)
    while value is not None:
        if value.shape is not None and all(isinstance(d, int) or d.value for d in value.shape):
            return tuple(d if isinstance(d, int) else str(d.value) for d in value.shape)
        if value.name in dims:
            found = dims[value.name]
            return found if None not in found else None
        producer = value.producer()
        if producer is None or not is_onnx(producer, QUANTIZE, DEQUANTIZE):
            return None
        value = producer.inputs[0]
    return None


def _same_grid(graph: ir.Graph, names: NameScope, value: ir.Value, like: ir.Node, base: str, after: ir.Node
               ) -> ir.Value:
    """``value`` through a QuantizeLinear/DequantizeLinear pair with the scale and zero point of ``like`` (a Q or a
    DQ), inserted after ``after``; returns the dequantized value."""
    base = names.prefix(base, [QUANTIZE, DEQUANTIZE], ["quantized", "dequantized"])
    params = list(like.inputs[1:3])
    quantize = ir.node(QUANTIZE, [value, *params], name=f"{base}/{QUANTIZE}")
    codes = like.outputs[0] if is_onnx(like, QUANTIZE) else like.inputs[0]
    quantize.outputs[0].name, quantize.outputs[0].dtype = f"{base}/quantized", value_dtype(codes)
    dq = dequantize_node(quantize.outputs[0], params[0], params[1] if len(params) > 1 else None, base, None, None)
    graph.insert_after(after, [quantize, dq])
    return dq.outputs[0]


def linears_as_gemms(graph: ir.Graph, names: NameScope, initializer: Initializer, opset: int) -> list[dict]:
    """Every quantized ``MatMul + Add(int32 bias)`` on an input with symbolic dims becomes ``Reshape -> Gemm ->
    Reshape`` (module docstring: the same values, one QGemm in onnxruntime); returns what was rewritten."""
    done = []
    inputs = _Inputs(graph, names, initializer, opset)
    for matmul in list(graph):
        found = _linear(matmul)
        if found is None:
            continue
        x_dq, w_dq, add, b_dq, shape, n = found
        _flat_bias(b_dq, initializer, names)
        x2d = inputs.flat_input(x_dq, shape[-1], matmul)
        target = inputs.target(x_dq, shape, n, matmul)
        base = names.prefix(f"{matmul.name or 'MatMul'}/gemm", ["Gemm", "Reshape"], ["output", "codes"])
        gemm = ir.node("Gemm", [x2d, w_dq.outputs[0], b_dq.outputs[0]], name=f"{base}/Gemm")
        gemm.outputs[0].name, gemm.outputs[0].dtype = f"{base}/output", ir.DataType.FLOAT
        graph.insert_before(add, gemm)
        out = add.outputs[0]
        q = _sole_reader(out)
        quantized = q is not None and is_onnx(q, QUANTIZE) and not q.outputs[0].is_graph_output()
        if quantized:  # Gemm -> Q -> DQ -> Reshape -> the output's Q: QGemm writes the codes, the Reshape moves them
            y = _same_grid(graph, names, gemm.outputs[0], q, f"{base}_quant", gemm)
        else:
            y = gemm.outputs[0]
        reshape = ir.node("Reshape", [y, target], name=f"{base}/Reshape")
        graph.insert_after(y.producer(), reshape)
        take_over(out, reshape.outputs[0])
        graph.remove([add, matmul], safe=True)
        remove_if_unused(graph, [x_dq])
        done.append({"matmul": matmul.name, "add": add.name, "gemm": gemm.name,
                     "input_shape": [d if d is not None else "?" for d in shape], "output_quantized": quantized})
    return done
