"""Reading a QDQ model against its float model: quantizers, float counterparts, edits.

Everything here is read from the quantized graph itself, so it works for a
model ``rewrite_eval`` made in memory and for a file given with
``--quantized``:

- **activation quantizers**: ``QuantizeLinear -> [Clip | Cast, Clip, Cast] ->
  DequantizeLinear`` on a float tensor. The quantized activation is read as
  the integer codes that reach the ``DequantizeLinear`` (the codes the model
  really computes, fused or not) and dequantized in the metrics kernel
  exactly as ``DequantizeLinear`` does.
- **weight quantizers**: a ``DequantizeLinear`` of a constant read by a layer
  (``Conv``, ``ConvTranspose``, ``Gemm``, ``MatMul``) as its weight (input 1)
  or bias (input 2); the int8 ``W``/``R`` of a ``DynamicQuantizeLSTM`` (``lstm_weights``).
- **float counterparts**: the tensor of the *float* model that a quantizer
  quantizes. ``rewrite_eval`` names unnamed nodes ``<Op>_<k>`` in graph order
  and keeps the names of the nodes it does not remove, but folding a batch
  norm gives the layer's output the batch norm's value (the layer output
  name now holds what the batch norm's output held). So the counterpart is
  found by node: the producer of the quantized tensor, found by name (and op
  type) in the float model (named the same way), then followed forward
  through the ``BatchNormalization`` / bias ``Add`` nodes the quantized model
  no longer has. Graph inputs and outputs match by name; a tensor whose
  producer is not found falls back to the value of the same name.
- **single-layer models** (for ``--sensitivity``): a copy of the quantized
  model with every quantizer removed except one layer's (its weight and
  bias, the activation quantizers it reads, and the quantizers after it that
  no layer reads directly, such as a final output's; a ``DynamicQuantizeLSTM``
  is a layer of its own). Removing every quantizer must give back the float
  model, so each form a tool writes is undone as what it computes: a float
  weight in the form the layer reads (widened channels, a SpaceToDepth stem,
  a ConvTranspose's phases, a MatMul's Gemm, a pool's depthwise Conv), codes
  moved between Q and DQ (``Pad``, ``Tile``, ``SpaceToDepth``, ``Slice``) moved
  in float, a rescaling pair as its affine map, a DynamicQuantizeLSTM as the
  float LSTM, other quantized constants (embedding tables, LayerNorm scales)
  as their float values (``benchmarks/sensitivity_check.py`` checks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from types import SimpleNamespace

import numpy as np
import onnx_ir as ir

from qtool.model.codec import CONTAINER_RANGE, DynamicLstmWeight
from qtool.model.layers import LAYER_OPS
from qtool.model.session import value_map
from qtool.model.constants import constant_array, contiguous
from qtool.model.graph import GraphView
from qtool.model.weight_expressions import ExpressionFolder
from qtool.onnx_rewrite.placement.integer import saturation_bound
from qtool.onnx_rewrite.kernel_forms import space_to_depth_conv
from qtool.onnx_rewrite.transposed_convs import phase_weight

# nodes a tool may fuse into the layer before them (and so remove from the quantized model)
_FUSED_AFTER_LAYER = ("Relu", "Clip", "BatchNormalization", "Add", "LeakyRelu", "Sigmoid", "HardSigmoid")
_CODE_DTYPES = CONTAINER_RANGE  # the codes a container type holds
# code types numpy (and so onnxruntime's Python outputs) holds as plain integers
_NUMPY_CODES = (ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT16, ir.DataType.UINT16)


def _is(node: ir.Node | None, *ops: str) -> bool:
    return node is not None and node.domain in ("", "ai.onnx") and node.op_type in ops


def quantizer_name(dq: ir.Node) -> str:
    name = dq.name or ""
    for suffix in ("/DequantizeLinear",):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name or (dq.outputs[0].name or "?")


@dataclass
class ActivationQuantizer:
    """One ``Q -> [Clip] -> DQ`` on a float tensor of the quantized model."""

    name: str
    q: ir.Node
    dq: ir.Node
    nodes: list[ir.Node]  # Q, clip/cast nodes, DQ (graph order)
    float_value: ir.Value  # the quantized model's tensor before Q
    codes: ir.Value  # what DQ reads
    codes_dtype: ir.DataType | None
    scale: float | None  # None: per-axis or not constant (read the DQ output instead)
    zero_point: int
    grid: tuple[int, int] | None  # codes the tensor can take (after Clip)
    counterpart: str | None = None  # the float model's tensor, or None
    how: str = ""  # how the counterpart was found, or why not
    clamps: bool = False  # it also does the work of an activation (Relu, Clip) the quantized model dropped
    bound: tuple[float, float] | None = None  # where every reader of the float tensor saturates (a HardSwish input)
    # the QuantizeLinear's own scale and zero point where they differ from the DequantizeLinear's: the pair then
    # computes a clipped affine map of its input, not its input rounded (rewrite-eval's integer HardSigmoid gate:
    # Q(x + 3) on 6/255, read back on 1/255 as clip(x + 3, 0, 6) / 6)
    q_params: tuple[float, int] | None = None

    @property
    def moves(self) -> list[ir.Node]:
        """The ops of the chain that move codes (:data:`_CODE_MOVES`), in graph order."""
        return [n for n in self.nodes[1:-1] if _is(n, *_CODE_MOVES)]

    @property
    def reshapes(self) -> bool:
        """Its codes reach the DequantizeLinear moved into another shape than its input's (all but a Slice that
        crops a widened Conv's channels back): the DequantizeLinear's output is no longer the quantized input."""
        return any(not _is(n, "Slice") for n in self.moves)

    @property
    def rescaled_range(self) -> tuple[float, float] | None:
        """Where the QuantizeLinear of a rescaling pair saturates (its input's range), or None."""
        if self.q_params is None or self.grid is None:
            return None
        s, z = np.float32(self.q_params[0]), self.q_params[1]
        return float(np.float32(self.grid[0] - z) * s), float(np.float32(self.grid[1] - z) * s)

    @property
    def output(self) -> ir.Value:
        return self.dq.outputs[0]

    @property
    def reads_codes(self) -> bool:
        return self.scale is not None and self.codes_dtype in _NUMPY_CODES

    @cached_property
    def representable(self) -> tuple[float, float] | None:
        if self.scale is None or self.grid is None:
            return None
        s = np.float32(self.scale)
        lo = float(np.float32(self.grid[0] - self.zero_point) * s)
        hi = float(np.float32(self.grid[1] - self.zero_point) * s)
        return lo, hi

    @cached_property
    def clips_beyond(self) -> tuple[float, float] | None:
        """Where clipping starts: half a step past the grid's ends (a value within half a step of an end rounds to
        that code, as every value rounds to its nearest one; counted as clipped, a GELU output whose minimum lies
        just below the nudged grid's end read as 9 % clipped)."""
        if self.representable is None:
            return None
        half = float(self.scale) / 2
        return self.representable[0] - half, self.representable[1] + half


@dataclass
class WeightQuantizer:
    """A ``DequantizeLinear`` of constant codes, or a ``QuantizeLinear -> DequantizeLinear`` of a constant
    float weight (onnxruntime's quantizer writes that for weights held by ``Constant`` nodes)."""

    name: str
    dq: ir.Node
    layer: ir.Node
    index: int  # 1 weight, 2 bias
    q: ir.Node | None = None

    def dequantized(self) -> np.ndarray | None:
        """The layer's weight as the model computes it (``DequantizeLinear`` in float32)."""
        codes = quantize_constant(self.q) if self.q is not None else None
        return dequantize_constant(self.dq, codes)


@dataclass
class LstmWeight:
    """``W`` or ``R`` of a ``com.microsoft.DynamicQuantizeLSTM`` (int8 codes, scales per gate row or per
    direction) and the float LSTM's weight, both in ONNX's ``[num_directions, 4*hidden, K]`` layout."""

    name: str
    node: ir.Node
    layer: str  # the float LSTM's name (the quantized node's when none matches)
    index: int  # 1: W, 2: R
    dequantized: np.ndarray | None
    float_value: np.ndarray | None


def _float_lstm(node: ir.Node, lstms: dict[str, ir.Node]) -> ir.Node | None:
    """The float LSTM a DynamicQuantizeLSTM came from: qtool names it ``<lstm>/lstm_quant/...``,
    onnxruntime's ``quantize_dynamic`` ``<lstm>_quant``; a model with one LSTM needs no name."""
    name = node.name or ""
    for suffix in ("/lstm_quant/DynamicQuantizeLSTM", "_quant", ""):
        if name.endswith(suffix) and name[: len(name) - len(suffix)] in lstms:
            return lstms[name[: len(name) - len(suffix)]]
    return next(iter(lstms.values())) if len(lstms) == 1 else None


def _lstm_base(node: ir.Node) -> str:
    return node.name.rsplit("/", 1)[0] if node.name and "/" in node.name else (node.name or "DynamicQuantizeLSTM")


def dynamic_lstms(graph: ir.Graph) -> list[ir.Node]:
    """The ``com.microsoft.DynamicQuantizeLSTM`` nodes of ``graph`` (layers of their own for ``--sensitivity``)."""
    return [n for n in graph if n.domain == "com.microsoft" and n.op_type == "DynamicQuantizeLSTM"]


def lstm_float_arrays(lstms: list[LstmWeight]) -> dict[str, np.ndarray | None]:
    """``W`` / ``R`` float values keyed ``lstm:<node>/W`` (by node: two quantized LSTMs of one scope share a
    ``base``), for :func:`single_layer_model`."""
    return {f"lstm:{w.node.name}/{'W' if w.index == 1 else 'R'}": w.float_value for w in lstms}


def _lstm_to_float(graph: ir.Graph, node: ir.Node, float_arrays: dict[str, np.ndarray | None]) -> str:
    """A DynamicQuantizeLSTM replaced by the float ``LSTM`` it quantizes (its float ``W`` and ``R``, its float
    bias, states and peepholes, the same attributes); a reason when it cannot be."""
    base = _lstm_base(node)
    arrays = [float_arrays.get(f"lstm:{node.name}/{what}") for what in ("W", "R")]
    if any(a is None or np.asarray(a).dtype != np.float32 for a in arrays):
        return f"no float value for the LSTM '{base}'"
    inputs = list(node.inputs[:8])
    for index, (what, array) in enumerate(zip(("W", "R"), arrays), start=1):
        inputs[index] = _initializer(graph, f"{node.name}/{what}/float", array)
    while inputs and inputs[-1] is None:
        inputs.pop()
    lstm = ir.node("LSTM", inputs, dict(node.attributes.items()), num_outputs=len(node.outputs),
                   name=f"{node.name}/float")
    graph.insert_before(node, lstm)
    for old, new in zip(node.outputs, lstm.outputs):
        new.type, new.shape = old.type, old.shape
        name, old.name = old.name, None
        new.name = name
        for i, o in enumerate(graph.outputs):
            if o is old:
                graph.outputs[i] = new
        old.replace_all_uses_with(new)
    graph.remove(node, safe=True)
    return ""


def lstm_weights(q_graph: ir.Graph, f_graph: ir.Graph) -> list[LstmWeight]:
    """The int8 weights of every DynamicQuantizeLSTM of ``q_graph``, dequantized as the kernel reads them,
    with the float weights they stand for."""
    lstms = {n.name or "": n for n in f_graph if _is(n, "LSTM")}
    folder = ExpressionFolder(f_graph.opset_imports.get("", 13))
    out = []
    for node in q_graph:
        if node.domain != "com.microsoft" or node.op_type != "DynamicQuantizeLSTM":
            continue
        f = _float_lstm(node, lstms)
        base = _lstm_base(node)
        for index, what, params in ((1, "W", 8), (2, "R", 10)):
            codes, scale, zero = (constant_array(node.inputs[i]) if i < len(node.inputs) else None
                                  for i in (index, params, params + 1))
            deq = None
            if codes is not None and scale is not None and codes.ndim == 3:
                zero = np.zeros(scale.shape, np.int8) if zero is None else zero
                deq = DynamicLstmWeight(codes, scale.astype(np.float32), zero, None).dequantized()
            ref = None
            if f is not None and index < len(f.inputs):  # a constant, or computed from constants (OpenVINO's
                ref = constant_array(f.inputs[index])     # Unsqueeze of each weight)
                ref = folder.value(f.inputs[index]) if ref is None else ref
            out.append(LstmWeight(f"{base}/{what}", node, f.name if f is not None else base, index, deq, ref))
    return out


@dataclass
class QuantizedGraph:
    activations: list[ActivationQuantizer] = field(default_factory=list)
    weights: list[WeightQuantizer] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (quantizer, tensor, why not compared)
    # activation quantizers whose codes are moved into another shape before their DequantizeLinear (a stem's
    # input padded to 4 channels, a gate tiled): nothing to compare, but undone in single-layer models
    moved: list[ActivationQuantizer] = field(default_factory=list)
    # DequantizeLinear nodes of constants no layer reads as its weight (onnxruntime's quantizer quantizes embedding
    # tables, LayerNorm scales, Add/Mul operands): (name, DequantizeLinear, the QuantizeLinear of a float constant)
    constants: list[tuple[str, ir.Node, ir.Node | None]] = field(default_factory=list)

    def layers(self) -> list[ir.Node]:
        seen: dict[int, ir.Node] = {}
        for w in self.weights:
            if w.index == 1:
                seen.setdefault(id(w.layer), w.layer)
        return list(seen.values())


def _per_axis(node: ir.Node, param: np.ndarray, ndim: int) -> np.ndarray:
    """A per-axis scale or zero point shaped to broadcast along the node's ``axis`` (default 1)."""
    if param.ndim != 1 or ndim == 0 or (param.size == 1 and "axis" not in node.attributes):
        return param
    axis = node.attributes["axis"].as_int() if "axis" in node.attributes else 1
    shape = [1] * ndim
    shape[axis % ndim] = param.size
    return param.reshape(shape)


def dequantize_constant(dq: ir.Node, codes: np.ndarray | None = None) -> np.ndarray | None:
    """``DequantizeLinear`` of constant codes (``codes``, or the node's constant input) in float32."""
    codes = constant_array(dq.inputs[0]) if codes is None else codes
    scale = constant_array(dq.inputs[1]) if len(dq.inputs) > 1 else None
    if codes is None or scale is None:
        return None
    zp = constant_array(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else None
    c = np.asarray(codes).astype(np.int64)
    z = np.zeros((), np.int64) if zp is None else _per_axis(dq, np.asarray(zp).astype(np.int64), c.ndim)
    s = _per_axis(dq, np.asarray(scale, dtype=np.float32), c.ndim)
    return ((c - z).astype(np.float32) * s).astype(np.float32)


def quantize_constant(q: ir.Node) -> np.ndarray | None:
    """``QuantizeLinear`` of a constant as onnxruntime computes it: float32 ``x / scale``, round half to
    even, add the zero point, saturate to the codes' type."""
    x = constant_array(q.inputs[0])
    scale = constant_array(q.inputs[1]) if len(q.inputs) > 1 else None
    if x is None or scale is None:
        return None
    zp_value = q.inputs[2] if len(q.inputs) > 2 else None
    zp = constant_array(zp_value) if zp_value is not None else None
    dtype = zp_value.dtype if zp_value is not None and zp_value.dtype is not None else ir.DataType.UINT8
    if dtype not in _CODE_DTYPES:
        return None
    x = np.asarray(x, dtype=np.float32)
    s = _per_axis(q, np.asarray(scale, dtype=np.float32), x.ndim)
    z = np.zeros((), np.int64) if zp is None else _per_axis(q, np.asarray(zp).astype(np.int64), x.ndim)
    lo, hi = _CODE_DTYPES[dtype]
    return np.clip(np.rint(x / s).astype(np.int64) + z, lo, hi)


def _scalar_param(value: ir.Value | None, dtype=np.float32):
    if value is None:
        return None
    arr = constant_array(value)
    if arr is None or arr.size != 1:
        return None
    return np.asarray(arr).reshape(()).astype(dtype)


# ops that move codes between a QuantizeLinear and its DequantizeLinear (rewrite-eval's kernel forms: a widened Conv's
# output codes sliced back to its channels, a stem's input codes padded to 4 channels or read through SpaceToDepth,
# a squeeze-excite gate's codes tiled over the width); undoing the quantizer applies them to the float tensor
_CODE_MOVES = ("Slice", "Pad", "Tile", "SpaceToDepth", "DepthToSpace", "Reshape", "Transpose", "Squeeze",
               "Unsqueeze", "Flatten", "Expand", "Gather")


def _chain_to_quantize(x: ir.Value) -> tuple[ir.Node | None, list[ir.Node], tuple[int, int] | None]:
    """Back from a ``DequantizeLinear`` input through ``Clip``/``Cast`` and the ops that move codes
    (:data:`_CODE_MOVES`): (the ``QuantizeLinear``, the chain, grid)."""
    chain: list[ir.Node] = []
    grid = None
    v = x
    for _ in range(6):
        p = v.producer()
        if p is None:
            break
        if _is(p, "QuantizeLinear"):
            return (p, chain, grid) if p.inputs and p.inputs[0] is not None else (None, chain, grid)
        if not (_is(p, "Clip", "Cast", *_CODE_MOVES) and p.inputs and p.inputs[0] is not None):
            break
        if _is(p, *_CODE_MOVES) and any(constant_array(i) is None for i in p.inputs[1:] if i is not None):
            break  # a shape computed at run time: not a fixed move of the codes
        if _is(p, "Clip") and len(p.inputs) >= 3:
            lo, hi = _scalar_param(p.inputs[1], np.int64), _scalar_param(p.inputs[2], np.int64)
            if lo is not None and hi is not None:
                grid = (int(lo), int(hi))
        chain.insert(0, p)
        v = p.inputs[0]
    return None, chain, grid


def _weight_users(dq: ir.Node) -> list[tuple[ir.Node, int]]:
    return [(user, index) for user, index in _uses(dq.outputs[0]) if _is(user, *LAYER_OPS) and index in (1, 2)]


def _activation(dq: ir.Node, q: ir.Node, chain: list[ir.Node], grid) -> ActivationQuantizer:
    x = dq.inputs[0]
    scale = _scalar_param(dq.inputs[1] if len(dq.inputs) > 1 else None)
    zp_value = dq.inputs[2] if len(dq.inputs) > 2 else None
    zp = _scalar_param(zp_value, np.int64) if zp_value is not None else np.int64(0)
    dtype = x.dtype
    if dtype is None and zp_value is not None and zp_value.const_value is not None:
        dtype = zp_value.const_value.dtype
    if grid is None and dtype in _CODE_DTYPES:
        grid = _CODE_DTYPES[dtype]
    q_scale = _scalar_param(q.inputs[1] if len(q.inputs) > 1 else None)
    q_zp_value = q.inputs[2] if len(q.inputs) > 2 else None
    q_zp = _scalar_param(q_zp_value, np.int64) if q_zp_value is not None else np.int64(0)
    rescales = (scale is not None and zp is not None and q_scale is not None and q_zp is not None
                and (float(q_scale) != float(scale) or int(q_zp) != int(zp)))
    return ActivationQuantizer(
        name=quantizer_name(dq), q=q, dq=dq, nodes=[q, *chain, dq], float_value=q.inputs[0], codes=x,
        codes_dtype=dtype, scale=None if scale is None or zp is None else float(scale),
        zero_point=0 if zp is None else int(zp), grid=grid,
        q_params=(float(q_scale), int(q_zp)) if rescales else None,
    )


def find_quantizers(graph: ir.Graph) -> QuantizedGraph:
    """Every weight and activation quantizer of ``graph`` (a constant quantized for another op is skipped)."""
    result = QuantizedGraph()
    for node in graph:
        if not _is(node, "DequantizeLinear") or not node.inputs or node.inputs[0] is None:
            continue
        x = node.inputs[0]
        q = None
        if constant_array(x) is None:
            q, chain, grid = _chain_to_quantize(x)
            if q is None:
                continue
            if constant_array(q.inputs[0]) is None:
                act = _activation(node, q, chain, grid)
                (result.moved if act.reshapes else result.activations).append(act)
                continue
        users = _weight_users(node)
        for user, index in users:
            result.weights.append(WeightQuantizer(quantizer_name(node), node, user, index, q))
        if not users:
            result.constants.append((quantizer_name(node), node, q))
            readers = ", ".join(sorted({u.op_type for u, _ in _uses(node.outputs[0])})) or "nothing"
            result.skipped.append((quantizer_name(node), (q.inputs[0] if q else x).name or "?",
                                   f"a constant read by {readers} (not a layer's weight or bias)"))
    return result


def name_unnamed_layers(graph: ir.Graph) -> None:
    """Unnamed nodes of a quantized model (onnxruntime's quantizer keeps exporters' empty names) get
    ``Op(first output)``: unique, readable, and never the float model's ``Op_k`` names."""
    for node in graph:
        if not node.name and node.outputs and not _is(node, "QuantizeLinear", "DequantizeLinear"):
            node.name = f"{node.op_type}({node.outputs[0].name})"


def _uses(value: ir.Value) -> list[tuple[ir.Node, int]]:
    return [(u[0], u[1]) for u in value.uses()]


value_index = value_map  # every named tensor of a graph (the one definition is the session floor's)


class FloatIndex:
    """Nodes and values of the float model (named like ``rewrite_eval`` names them)."""

    def __init__(self, graph: ir.Graph, quantized_node_names: set[str]):
        self.graph = graph
        self.nodes = {n.name: n for n in graph if n.name}
        self.values = value_index(graph)
        self.inputs = {v.name for v in graph.inputs}
        self.outputs = {v.name for v in graph.outputs}
        self.q_nodes = quantized_node_names

    def follow_folds(self, value: ir.Value, name: str | None = None) -> ir.Value:
        """Past the batch norms (and their bias Adds, and the constant Mul / Sub / Div onnxruntime's pre-processing
        folds into a Conv: ``ConvMulFusion``) the quantized model no longer has.

        When the quantized tensor's ``name`` is found further along, through
        nodes the quantized model also lost (an activation fused into the
        layer, a Relu onnxruntime's quantizer dropped because its range
        covers it), that tensor is the counterpart: fusing tools name the
        fused output after the last fused node.
        """
        folded = None
        for _ in range(6):
            if folded is not None and value.name == name:
                return value  # past a fused activation: the quantized tensor is this one
            uses = _uses(value)
            if len(uses) != 1 or value.is_graph_output():
                break
            user = uses[0][0]
            affine = _is(user, "Mul", "Sub", "Div") and all(v is value or constant_array(v) is not None
                                                             for v in user.inputs if v is not None)
            if user.name in self.q_nodes or not (affine or _is(user, *_FUSED_AFTER_LAYER)) or not user.outputs:
                break
            if folded is None and not affine and not _is(user, "BatchNormalization", "Add"):
                folded = value  # batch norms and bias Adds end here
            value = user.outputs[0]
        return folded if folded is not None else value

    def folded_through_moves(self, value: ir.Value, moved: bool = False) -> bool:
        """``value`` reaches, through Transpose / Squeeze (and same-type Casts and Identities) alone, an Add, Sub
        or Mul the quantized model no longer has: the layer's output there holds the folded value in the layer's
        layout, which no float tensor holds (Open-NSFW's NHWC bias and batch norm; ``moved``: ``value`` is a
        Transpose's / Squeeze's already)."""
        for _ in range(8):
            uses = _uses(value)
            if len(uses) != 1 or value.is_graph_output() or not uses[0][0].outputs:
                return False
            user = uses[0][0]
            if _is(user, "Add", "Sub", "Mul"):
                return moved and user.name not in self.q_nodes
            if not _is(user, "Transpose", "Squeeze", "Cast", "Identity"):
                return False
            moved = moved or _is(user, "Transpose", "Squeeze")
            value = user.outputs[0]
        return False

    def counterpart(self, act: ActivationQuantizer, q_graph: ir.Graph) -> tuple[str | None, str]:
        """The float tensor ``act`` quantizes, and how it was found.

        By node: the producer of the quantized tensor, found by name (and op
        type) in the float model, followed forward through the nodes the
        quantized model no longer has. Else by name: the float tensor of the
        same name (onnxruntime's quantizer leaves exporters' nodes unnamed).
        """
        v = act.float_value
        out = act.output
        if out.is_graph_output() and out.name in self.outputs:
            return out.name, "graph output of the same name"
        if v.is_graph_input():
            return (v.name, "graph input") if v.name in self.inputs else (None, f"no float input named '{v.name}'")
        p = v.producer()
        if p is not None and p.name in self.nodes and self.nodes[p.name].op_type == p.op_type:
            fp = self.nodes[p.name]
            index = list(p.outputs).index(v)
            if index < len(fp.outputs):
                if self.folded_through_moves(fp.outputs[index], moved=_is(fp, "Transpose", "Squeeze")):
                    return None, (f"the constant Add/Mul after node '{p.name}' were folded into the layer through "
                                  "a Transpose / Squeeze (fold_affine): no float tensor holds this value")
                fv = self.follow_folds(fp.outputs[index], v.name)
                return fv.name, f"output of node '{p.name}'"
        if p is not None and _is(p, "Add") and p.name not in self.nodes and p.inputs and p.inputs[0] is not None:
            # an Add inserted by batch-norm folding (MatMul bias): its layer is the first input's producer
            lp = p.inputs[0].producer()
            if lp is not None and lp.name in self.nodes and self.nodes[lp.name].op_type == lp.op_type:
                fv = self.follow_folds(self.nodes[lp.name].outputs[0], v.name)
                return fv.name, f"folded output of node '{lp.name}'"
        if v.name in self.values:
            return v.name, "tensor of the same name"
        if p is not None:  # e.g. the Add of an integer HardSigmoid gate qtool wrote
            return None, f"made by {p.op_type} '{p.name}', a node the float model lacks"
        return None, f"no float tensor matches '{v.name}' (its name is not in the float model)"


def map_counterparts(q_graph: ir.Graph, f_graph: ir.Graph, quantized: QuantizedGraph) -> None:
    index = FloatIndex(f_graph, {n.name for n in q_graph if n.name})
    ctx = SimpleNamespace(view=GraphView(f_graph))  # what ``saturation_bound`` reads of a placement context
    for act in quantized.activations:
        act.counterpart, act.how = index.counterpart(act, q_graph)
        fv = index.values.get(act.counterpart) if act.counterpart else None
        fp, qp = (fv.producer() if fv is not None else None), act.float_value.producer()
        act.clamps = not _is(qp, "Relu", "Clip") and (_is(fp, "Relu", "Clip") or _read_by_dropped_clamp(fv, index))
        act.bound = _readers_saturate(ctx, fv) if fv is not None else None


def _read_by_dropped_clamp(value: ir.Value | None, index: FloatIndex) -> bool:
    """The float tensor's one reader is a Relu / Clip the quantized model does not have (onnxruntime's
    pre-processing moved a Transpose across it, and the quantized tensor is named neither like its input nor its
    output)."""
    uses = _uses(value) if value is not None and not value.is_graph_output() else []
    return len(uses) == 1 and _is(uses[0][0], "Relu", "Clip") and uses[0][0].name not in index.q_nodes


def _readers_saturate(ctx, value: ir.Value) -> tuple[float, float] | None:
    """The interval outside which no reader of the float tensor changes (the hull of
    ``placement.integer.saturation_bound`` over its readers: a HardSwish input, -3 and up), or None.
    Beyond it the quantizer may clip at no cost (``rewrite-eval`` narrows such ranges), so the tensor is
    compared inside it."""
    readers = [u for u, _ in _uses(value)]
    if not readers or value.is_graph_output():
        return None
    bounds = [saturation_bound(ctx, r, value) for r in readers]
    if None in bounds:
        return None
    return min(b[0] for b in bounds), max(b[1] for b in bounds)


def _clamping_source(act: ActivationQuantizer, quantized: QuantizedGraph, clamping: set[str]) -> bool:
    """A moved quantizer whose QuantizeLinear a clamping quantizer shares (the dropped Relu/Clip is its input's too)."""
    return any(a.q is act.q and a.name in clamping for a in quantized.activations)


def clamping_quantizers(quantized: QuantizedGraph) -> set[str]:
    """Names of the activation quantizers that stand for a dropped Relu/Clip (see ``clamps``)."""
    return {a.name for a in quantized.activations if a.clamps}


def _output_names(layer: ir.Node) -> list[str]:
    """The layer's output name, and the names its quantizer's ``DequantizeLinear`` outputs carry."""
    out = layer.outputs[0]
    names = [out.name]
    for user, _ in _uses(out):
        if _is(user, "QuantizeLinear"):
            for dq, _ in _uses(user.outputs[0]):
                if _is(dq, "DequantizeLinear"):
                    names.append(dq.outputs[0].name)
    return names


def _float_layer(layer: ir.Node, nodes: dict[str, ir.Node], values: dict[str, ir.Value]) -> ir.Node | None:
    """The float node of ``layer``: by name, else back from the float tensor of its output's name
    through the nodes a tool may have fused into it (batch norm, bias Add, activation)."""
    node = nodes.get(layer.name)
    if node is not None and node.op_type == layer.op_type:
        return node
    for name in _output_names(layer):
        v = values.get(name)
        for _ in range(4):
            p = v.producer() if v is not None else None
            if p is None:
                break
            if p.op_type == layer.op_type or {p.op_type, layer.op_type} == {"Gemm", "MatMul"}:
                return p  # (onnxruntime's pre-processing fuses a MatMul and its batch norm into a Gemm)
            if p.op_type not in _FUSED_AFTER_LAYER or not p.inputs:
                break
            v = p.inputs[0]
    return None


def kept_batch_norms(q_graph: ir.Graph, f_graph: ir.Graph) -> frozenset[str]:
    """The float model's batch norms the quantized model did not fold: by name, or (for a tool that
    renames nodes) those after the float layer of a quantized layer that a BatchNormalization reads."""
    f_bns = {n.name for n in f_graph if _is(n, "BatchNormalization")}
    kept = {n.name for n in q_graph if _is(n, "BatchNormalization") and n.name in f_bns}
    nodes = {n.name: n for n in f_graph if n.name}
    values = value_index(f_graph)
    for bn in q_graph:
        if not _is(bn, "BatchNormalization") or bn.name in f_bns or not bn.inputs or bn.inputs[0] is None:
            continue
        p = bn.inputs[0].producer()
        while p is not None and _is(p, "QuantizeLinear", "DequantizeLinear") and p.inputs and p.inputs[0] is not None:
            p = p.inputs[0].producer()
        layer = _float_layer(p, nodes, values) if p is not None and _is(p, *LAYER_OPS) else None
        if layer is not None:
            kept |= {u.name for u, _ in _uses(layer.outputs[0]) if _is(u, "BatchNormalization")}
    return frozenset(kept)


def float_weights(
    f_folded: ir.Graph, quantized: QuantizedGraph, f_graph: ir.Graph | None = None
) -> dict[str, np.ndarray | None]:
    """The folded float model's weight/bias for each weight quantizer (its layer found by name or output;
    ``f_graph``, the float graph before folding, holds output names the folding removed)."""
    nodes = {n.name: n for n in f_folded if n.name}
    values = value_index(f_folded)
    unfolded = ({n.name: n for n in f_graph if n.name}, value_index(f_graph)) if f_graph is not None else None
    out: dict[str, np.ndarray | None] = {}
    folder = ExpressionFolder(f_folded.opset_imports.get("", 13))
    for w in quantized.weights:
        layer = _float_layer(w.layer, nodes, values)
        if layer is None and unfolded is not None:
            before = _float_layer(w.layer, *unfolded)
            layer = nodes.get(before.name) if before is not None else None
        arr = None
        if layer is not None and _is(layer, "MatMul") and _is(w.layer, "Gemm"):
            arr = _matmul_as_gemm(w, layer)
        elif layer is not None and w.index < len(layer.inputs):
            arr = constant_array(layer.inputs[w.index])
            if arr is None:  # computed from constants (tf2onnx's Reshape of a constant by a Concat of shapes)
                arr = folder.value(layer.inputs[w.index])
            if arr is not None:
                arr = _space_to_depth_form(w, layer, np.asarray(arr))
        elif layer is None:
            arr = _rewritten_layer_form(w, nodes)
        if arr is not None and arr.dtype != np.float32:
            arr = None
        out[w.name] = arr
    return out


CONSTANT_KEY = "constant:"  # float_arrays' key prefix of the constants no layer reads as its weight


def float_constants(f_graph: ir.Graph, quantized: QuantizedGraph) -> dict[str, np.ndarray]:
    """The float value of each quantized constant that no layer reads as its weight (``quantized.constants``), keyed
    ``constant:<name>``: the float constant its QuantizeLinear reads; else the float model's input of the node that
    reads it (same name and op, same input); else the float tensor its codes are named after (onnxruntime's
    ``<name>_quantized``). Only a float32 value of the dequantized shape."""
    nodes = {n.name: n for n in f_graph if n.name}
    values = value_index(f_graph)
    out = {}
    for name, dq, q in quantized.constants:
        deq = dequantize_constant(dq, quantize_constant(q) if q is not None else None)
        if deq is None:
            continue
        found = [constant_array(q.inputs[0])] if q is not None else []
        for user, index in _uses(dq.outputs[0]):
            f = nodes.get(user.name)
            if f is not None and f.op_type == user.op_type and index < len(f.inputs) and f.inputs[index] is not None:
                found.append(constant_array(f.inputs[index]))
        codes = dq.inputs[0].name or ""
        if codes.endswith("_quantized") and codes[: -len("_quantized")] in values:
            found.append(constant_array(values[codes[: -len("_quantized")]]))
        for arr in found:
            if arr is not None and np.asarray(arr).dtype == np.float32 and np.shape(arr) == deq.shape:
                out[CONSTANT_KEY + name] = np.asarray(arr)
                break
    return out


def _matmul_as_gemm(w: WeightQuantizer, matmul: ir.Node) -> np.ndarray | None:
    """A float MatMul's weight (or its bias Add's constant) as the Gemm that stands for it reads it."""
    if w.index == 1:
        arr = constant_array(matmul.inputs[1]) if len(matmul.inputs) > 1 and matmul.inputs[1] is not None else None
        if arr is not None and arr.ndim == 2 and w.layer.attributes.get_int("transB", 0):
            arr = arr.T
        return arr
    adds = [u for u, _ in _uses(matmul.outputs[0]) if _is(u, "Add")]
    consts = [constant_array(v) for a in adds for v in a.inputs if v is not matmul.outputs[0] and v is not None]
    consts = [c for c in consts if c is not None]
    return consts[0] if len(consts) == 1 else None


def _codes_producer(layer: ir.Node) -> ir.Node | None:
    """The op between the layer's input DequantizeLinear and its codes, if any."""
    dq = layer.inputs[0].producer() if layer.inputs and layer.inputs[0] is not None else None
    if not _is(dq, "DequantizeLinear") or dq.inputs[0] is None:
        return None
    return dq.inputs[0].producer()


def _space_to_depth_form(w: WeightQuantizer, layer: ir.Node, arr: np.ndarray) -> np.ndarray:
    """A stride-2 stem's float weight as rewrite-eval's stride-1 Conv on the input's SpaceToDepth reads it
    (``kernel_forms.space_to_depth_conv``: the same taps at their phases), when the quantized layer is that."""
    if w.index != 1 or arr.ndim != 4 or not _is(_codes_producer(w.layer), "SpaceToDepth"):
        return arr
    attrs = layer.attributes
    valid = attrs.get_string("auto_pad", "NOTSET") == "VALID"
    pads = [0] * 4 if valid else list(attrs.get_ints("pads", [0] * 4))
    codes = constant_array(w.dq.inputs[0])
    form = space_to_depth_conv(arr, pads, (1 << 16, 1 << 16))  # the taps' places do not depend on the size
    return form[0] if form is not None and codes is not None and form[0].shape == codes.shape else arr


def _rewritten_layer_form(w: WeightQuantizer, nodes: dict[str, ir.Node]) -> np.ndarray | None:
    """The float weight or bias of a layer rewrite-eval wrote in another form, as that form reads it:
    ``<MatMul>/gemm/Gemm`` (``linear_gemms``: the MatMul's weight, its bias Add's constant), ``<ConvTranspose>/Conv``
    (``transposed_convs``: the phase weight, the bias repeated per phase), ``<AveragePool>/depthwise/Conv``
    (``kernel_forms.pools_as_depthwise``: weights 1/n, exact in int8)."""
    name, layer = w.layer.name or "", w.layer
    codes = w.dequantized()
    arr = None
    for suffix, float_op, op in (("/gemm/Gemm", "MatMul", "Gemm"), ("/Conv", "ConvTranspose", "Conv"),
                                 ("/depthwise/Conv", "AveragePool", "Conv")):
        f = nodes.get(name[: -len(suffix)]) if name.endswith(suffix) else None
        if f is None or not _is(f, float_op) or not _is(layer, op):
            continue
        if float_op == "AveragePool":
            arr = codes  # 1/n (a power of two) is exact
        elif float_op == "MatMul":
            arr = _matmul_as_gemm(w, f)
        else:
            w_float = constant_array(f.inputs[1]) if len(f.inputs) > 1 and f.inputs[1] is not None else None
            strides = list(f.attributes.get_ints("strides", [1, 1]))
            if w_float is None or w_float.ndim != 4 or len(strides) != 2:
                break
            if w.index == 1:
                arr = phase_weight(w_float, strides[0], list(f.attributes.get_ints("pads", [0, 0, 0, 0])))[0]
            elif len(f.inputs) > 2 and f.inputs[2] is not None:
                b = constant_array(f.inputs[2])
                arr = None if b is None else np.repeat(b, strides[0] * strides[0])
        break
    if arr is None or codes is None or np.asarray(arr).size != codes.size:
        return None
    return np.asarray(arr).reshape(codes.shape)


# --- edits on a copy -----------------------------------------------------------------------------


def dtype_name(value: ir.Value | None) -> str | None:
    """The element type of ``value`` (from its type or its constant), lower case."""
    dtype = value.dtype if value is not None else None
    if dtype is None and value is not None and value.const_value is not None:
        dtype = value.const_value.dtype
    return dtype.name.lower() if dtype is not None else None


def _initializer(graph: ir.Graph, name: str, array) -> ir.Value:
    """A new initializer ``name`` of ``graph`` holding ``array`` (its shape kept, 0-d too)."""
    value = ir.Value(name=name, const_value=ir.Tensor(contiguous(array), name=name))
    graph.register_initializer(value)
    return value


def _clamp(graph: ir.Graph, act: ActivationQuantizer, bounds: tuple[float, float] | None = None) -> ir.Value:
    """A float ``Clip`` after the quantizer's input to ``bounds`` (default: the quantizer's range): the activation
    it stood for, unrounded."""
    lo, hi = act.representable if bounds is None else bounds
    bounds = [_initializer(graph, f"{act.name}/bypass_{which}", np.array(v, np.float32))
              for which, v in (("min", lo), ("max", hi))]
    clip = ir.node("Clip", [act.float_value, *bounds], name=f"{act.name}/bypass_clip")
    clip.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    clip.outputs[0].name = f"{act.name}/bypass_clip_output"
    graph.insert_after(act.dq, clip)
    return clip.outputs[0]


def _rescaled(graph: ir.Graph, act: ActivationQuantizer) -> ir.Value:
    """The float map a rescaling pair computes, unrounded: ``Clip`` to where its QuantizeLinear saturates, then
    ``x * (dq_scale / q_scale) + (q_zero_point - dq_zero_point) * dq_scale`` (rewrite-eval's integer HardSigmoid
    gate: ``clip(x + 3, 0, 6) / 6``)."""
    q_scale, q_zero = act.q_params
    ratio = np.float32(act.scale) / np.float32(q_scale)
    shift = np.float32((q_zero - act.zero_point) * np.float32(act.scale))
    clipped = _clamp(graph, act, act.rescaled_range)
    mul = ir.node("Mul", [clipped, _initializer(graph, f"{act.name}/bypass_ratio", np.array(ratio, np.float32))],
                  name=f"{act.name}/bypass_rescale")
    add = ir.node("Add", [mul.outputs[0], _initializer(graph, f"{act.name}/bypass_shift",
                                                       np.array(shift, np.float32))], name=f"{act.name}/bypass_shift")
    for node in (mul, add):
        node.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
        node.outputs[0].name = f"{node.name}_output"
    graph.insert_after(clipped.producer(), [mul, add])
    return add.outputs[0]


def _moved(graph: ir.Graph, act: ActivationQuantizer, src: ir.Value) -> ir.Value | None:
    """``src`` moved as the quantizer's codes are (:data:`_CODE_MOVES`: the same ops on the float tensor; a
    ``Pad`` pads with the value its code dequantizes to); None where that cannot be written."""
    anchor = act.dq if src is act.float_value else src.producer()
    for k, node in enumerate(act.moves):
        inputs, attributes = [src, *node.inputs[1:]], dict(node.attributes.items())
        if _is(node, "Pad"):
            if act.scale is None:
                return None
            code = np.asarray(constant_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None
                              else attributes["value"].as_float() if "value" in attributes else 0)
            value = np.float32((float(code.reshape(-1)[0]) - act.zero_point) * np.float32(act.scale))
            if len(node.inputs) > 2 or "value" not in attributes and len(node.inputs) > 1:
                const = _initializer(graph, f"{act.name}/bypass_pad_value_{k}", np.array(value, np.float32))
                inputs = [src, node.inputs[1], const, *node.inputs[3:]]
            else:
                attributes["value"] = ir.AttrFloat32("value", float(value))
        moved = ir.node(node.op_type, inputs, attributes, domain=node.domain, name=f"{act.name}/bypass_{node.op_type}_{k}")
        moved.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
        moved.outputs[0].name = f"{moved.name}_output"
        graph.insert_after(anchor, moved)
        anchor, src = moved, moved.outputs[0]
    return src


def _bypass(graph: ir.Graph, act: ActivationQuantizer, clamp: bool = False) -> None:
    """Remove an activation quantizer: its readers read the float tensor again (clamped to the
    quantizer's range when the quantizer stood for a Relu/Clip the quantized model dropped; through the clipped
    affine map a rescaling pair computes, ``_rescaled``; moved as its codes are, ``_moved``)."""
    out = act.dq.outputs[0]
    if act.q_params is not None and act.rescaled_range is not None:
        src = _rescaled(graph, act)
    elif clamp and act.representable is not None:
        src = _clamp(graph, act)
    else:
        src = act.float_value
    if act.moves:
        src = _moved(graph, act, src)
        if src is None:
            return  # kept as it is
    for i, o in enumerate(graph.outputs):
        if o is out:
            if src.is_graph_output() or src.is_graph_input():
                ident = ir.node("Identity", [src], name=f"{act.name}/bypass")
                ident.outputs[0].name = out.name
                out.name = None
                ident.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
                graph.insert_after(act.dq, ident)
                graph.outputs[i] = ident.outputs[0]
            else:
                name = out.name
                out.name = None
                src.name = name
                graph.outputs[i] = src
    out.replace_all_uses_with(src)
    for node in reversed(act.nodes):
        if node.graph is graph and all(not o.uses() and not o.is_graph_output() for o in node.outputs):
            graph.remove(node, safe=True)


def as_read(w: WeightQuantizer, array: np.ndarray) -> np.ndarray:
    """The float ``array`` in the shape the layer reads: where rewrite-eval widened the layer (zero channels: a
    depthwise Conv's channels padded to 16, a stem's input channels to 4, a narrow Conv's outputs to 16), the
    float values in the leading block and the quantized weight's own (zero) values elsewhere."""
    deq = w.dequantized()
    if deq is None or deq.shape == array.shape or deq.ndim != array.ndim \
            or any(d < a for d, a in zip(deq.shape, array.shape)):
        return array
    out = deq.copy()
    out[tuple(slice(0, a) for a in array.shape)] = array
    return out


def _replace_output(graph: ir.Graph, dq: ir.Node, value: ir.Value) -> None:
    """Every reader of ``dq``'s output reads ``value`` (a graph output becomes an Identity of it); ``dq`` goes."""
    out = dq.outputs[0]
    for i, o in enumerate(graph.outputs):
        if o is out:
            ident = ir.node("Identity", [value], name=f"{dq.name}/float")
            name, out.name = out.name, None
            ident.outputs[0].name, ident.outputs[0].type = name, ir.TensorType(ir.DataType.FLOAT)
            graph.insert_after(dq, ident)
            graph.outputs[i] = ident.outputs[0]
    out.replace_all_uses_with(value)
    if not any(o.uses() or o.is_graph_output() for o in dq.outputs):
        graph.remove(dq, safe=True)


def _to_float(graph: ir.Graph, w: WeightQuantizer, array: np.ndarray) -> None:
    """``w.layer`` reads the float weight; other layers sharing the quantizer keep it (a shared weight)."""
    name = f"{w.name}/float"
    value = graph.initializers.get(name)
    array = as_read(w, array)
    if value is None:  # a weight shared by several layers gets one float copy
        value = _initializer(graph, name, array)
    direct = [i for i, v in enumerate(w.layer.inputs) if v is w.dq.outputs[0]]
    for i in direct:
        w.layer.replace_input_with(i, value)
    if not direct:  # reached through other nodes
        w.dq.outputs[0].replace_all_uses_with(value)
    if not any(o.uses() or o.is_graph_output() for o in w.dq.outputs):
        graph.remove(w.dq, safe=True)


def layer_owned_quantizers(quantized: QuantizedGraph) -> dict[int, set[str]]:
    """For each layer (by id), the activation quantizers that belong to it.

    A quantizer belongs to the layers that read it directly (they run on its
    codes); one that no layer reads directly (before a pool, an Add, a graph
    output) belongs to the layer before it.
    """
    owned: dict[int, set[str]] = {id(n): set() for n in quantized.layers()}  # in graph order, not by address
    layers = owned.keys()
    for act in quantized.activations + quantized.moved:
        readers = [u for u, i in _uses(act.output) if id(u) in layers and i == 0]
        if readers:
            for r in readers:
                owned[id(r)].add(act.name)
            continue
        # walk back to the layer that produced it
        v = act.float_value
        for _ in range(64):
            p = v.producer()
            if p is None:
                break
            if id(p) in layers:
                owned[id(p)].add(act.name)
                break
            if not p.inputs or p.inputs[0] is None:
                break
            v = p.inputs[0]
    return owned


def quantizer_layers(quantized: QuantizedGraph) -> dict[str, str]:
    """Activation quantizer name -> the name of the (first) layer it belongs to."""
    names = {id(n): n.name for n in quantized.layers()}
    out: dict[str, str] = {}
    for layer_id, owned in layer_owned_quantizers(quantized).items():
        for q in owned:
            out.setdefault(q, names[layer_id])
    return out


def single_layer_model(
    model: ir.Model, layer_name: str | None, float_arrays: dict[str, np.ndarray | None],
    clamping: set[str] = frozenset()
) -> tuple[ir.Model | None, str]:
    """A copy of ``model`` with only the quantizers of ``layer_name``; (None, reason) when impossible.

    ``layer_name`` None: no quantizer at all (every weight float, every activation quantizer bypassed): the
    float model as the single-layer models compute it, which must match the float model to float rounding.
    ``clamping``: quantizers that stand for a dropped activation (they become a float ``Clip``).
    """
    copy = model.clone()  # shares the tensors
    graph = copy.graph
    layer, owned = None, set()
    lstms = dynamic_lstms(graph)
    for lstm in lstms:
        if lstm.name != layer_name:
            _lstm_to_float(graph, lstm, float_arrays)  # without its float weights, it stays quantized
    quantized = find_quantizers(graph)  # after the LSTMs: the quantizers of their outputs read the float LSTMs'
    if layer_name is not None and any(n.name == layer_name for n in lstms):
        layer = next(n for n in lstms if n.name == layer_name)
        owned = {a.name for a in quantized.activations + quantized.moved
                 if any(u is layer and i == 0 for u, i in _uses(a.output))}
    elif layer_name is not None:
        layers = {n.name: n for n in quantized.layers()}
        layer = layers.get(layer_name)
        if layer is None:
            return None, f"layer '{layer_name}' not found"
        owned = layer_owned_quantizers(quantized)[id(layer)]
    for w in quantized.weights:
        if layer is not None and w.layer is layer:
            continue
        array = float_arrays.get(w.name)
        if array is None:
            return None, f"no float value for '{w.name}' (its layer is not in the float model)"
        _to_float(graph, w, array)
    for name, dq, _ in quantized.constants:
        array = float_arrays.get(CONSTANT_KEY + name)
        if array is not None:
            _replace_output(graph, dq, _initializer(graph, f"{name}/float", array))
    for act in quantized.activations + quantized.moved:
        if act.name not in owned:
            _bypass(graph, act, act.name in clamping or _clamping_source(act, quantized, clamping))
    return copy, ""
