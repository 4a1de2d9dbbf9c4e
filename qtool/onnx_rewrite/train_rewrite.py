"""The training rewrite's graph steps (TF's ``create_training_graph``), on an in-memory model.

Steps: stop on a graph that already has training state (qtool's: its
contract is returned, nothing to do; another tool's: an error) -> raise the
opset to 13 when lower (the ``qtool::FakeQuant`` body needs it) -> name
unnamed nodes -> fold a constant Mul/Add after a layer into it (``fold_affine``, as the eval
rewrite: the training graph trains the folded weight) -> **plan on the eval fold**: a copy of the model gets the eval
fold and the placement rules (the same code and the same plan as
``rewrite_eval``), and is what calibration runs on -> fold batch norms for
training (``fold_batch_norms_train``) -> encode the plan with ``train_graph``
(FakeQuant, state, ``qtool_step``).

One implementation of the rules, two encodings: the plan's points are tensor
names of the eval-folded copy; a folded batch norm's output there is its
layer's output, here the training fold's result, which keeps the batch
norm's output name (``TrainGraph.aliases``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qtool.config import QuantConfig, TrainSchedule
from qtool.errors import QtoolError
from qtool.model.codec import activation_params, qparams, weight_range
from qtool.model.constants import constant_array, constant_source, contiguous, root_array
from qtool.model.io import clamp_ir_version
from qtool.model.layers import (float_attr, group_of, layer_bias, layer_input, layer_weight, per_output_channel,
                                weight_rank)
from qtool.model.names import NameScope, context_of
from qtool.model.opset import convert_opset, default_opset
from qtool.onnx_rewrite import fake_quant_function as fqf
from qtool.onnx_rewrite import train_graph as tg
from qtool.onnx_rewrite._train_ops import Ops
from qtool.onnx_rewrite.conv_pads import pads_into_convs
from qtool.onnx_rewrite.global_pools import means_as_global_pools
from qtool.onnx_rewrite.eval_graph import bias_slot
from qtool.onnx_rewrite.fake_quant_function import MIN_OPSET, add_fake_quant_function
from qtool.onnx_rewrite.fold_affine import fold_affine
from qtool.onnx_rewrite.fold_batch_norms import FoldReport, fold_batch_norms
from qtool.onnx_rewrite.fold_batch_norms_train import TrainFold, TrainFolder, find_train_folds
from qtool.onnx_rewrite.hard_activations import gate_parameters, split_hard_swish
from qtool.onnx_rewrite.normalize import normalize
from qtool.onnx_rewrite.placement import QuantPlan, plan_quantization


def existing_contract(model: ir.Model, label: str) -> dict | None:
    """The contract of a qtool training graph (None for an inference graph); an error for a
    graph with training state qtool did not write, or a clash with the step input's name."""
    if tg.is_training_graph(model):
        if tg.METADATA_KEY not in model.metadata_props:
            raise QtoolError(f"'{label}' has qtool::FakeQuant nodes but no 'qtool.training' metadata: "
                             "its training state cannot be trusted; start from the float model")
        try:
            return tg.training_contract(model)
        except QtoolError as exc:
            raise QtoolError(f"'{label}': {exc}") from exc
    reason = tg.foreign_training_state(model)
    if reason is not None:
        raise QtoolError(
            f"'{label}' already contains training-only state from another tool: {reason}. "
            "qtool rewrites inference graphs; export the model for inference first"
        )
    for name in (tg.STEP_INPUT, tg.RANGE_UPDATE_INPUT):
        if any(v.name == name for v in model.graph.inputs):
            raise QtoolError(f"'{label}' already has an input named '{name}'")
    return None


def constants_to_initializers(graph: ir.Graph) -> int:
    """Every float ``Constant`` node becomes an initializer of the same name (trainable, feedable)."""
    moved = 0
    for node in list(graph):
        if node.op_type != "Constant" or node.domain != "" or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        array = root_array(out)
        if array is None or array.dtype != np.float32 or not out.name:
            continue
        name = out.name
        out.name = None
        new = ir.Value(name=name, const_value=ir.Tensor(contiguous(array), name=name))
        out.replace_all_uses_with(new, replace_graph_outputs=True)
        graph.remove(node, safe=True)
        graph.register_initializer(new)
        moved += 1
    return moved


@dataclass
class TrainGraph:
    """A model ready for the training encoding, and the eval-folded copy the plan was made on."""

    model: ir.Model
    config: QuantConfig
    names: NameScope
    matches: list  # the batch norms to fold for training (BN_FOLD matches)
    reasons: dict[str, str]  # batch norm name -> why it is not folded for training
    planned: ir.Model  # the eval-folded copy: calibration runs on it
    eval_folds: FoldReport
    plan: QuantPlan
    aliases: dict[str, str]  # tensor name in ``planned`` -> name in ``model``
    opset_in: int
    ir_in: int

    def tensors_to_calibrate(self) -> list[str]:
        return self.plan.tensors_to_calibrate()

    def whole_range_tensors(self) -> list[str]:
        return self.plan.whole_range_tensors()



def prepare_train(model: ir.Model, config: QuantConfig) -> TrainGraph:
    """Raise the opset, name nodes, and plan on an eval-folded copy (the model is edited in place)."""
    opset_in, ir_in = default_opset(model), model.ir_version
    if opset_in < MIN_OPSET:
        model = convert_opset(model, MIN_OPSET, "the qtool::FakeQuant function body needs")
    graph = model.graph
    # as the eval graph (a float16 body trains in float32); the PRelus of qtool's own output stay sums here
    normalized = normalize(model, config, read_back_prelus=False)
    constants_to_initializers(graph)
    pads_into_convs(graph, default_opset(model), config.out_of_scope)  # what onnxruntime's PadFusion does, which Q/DQ would prevent
    names = NameScope(graph)
    pools = means_as_global_pools(graph, default_opset(model), names, config.out_of_scope)  # as the eval graph
    affine = fold_affine(graph, names, exclude=config.exclude)  # as the eval graph: the folded weight trains
    split_hard_swish(graph, config, names)  # as the eval graph: the gate trains on its deployed grid
    matches, reasons = find_train_folds(graph, names, config.exclude)
    fold_names = {m.nodes["bn"].name for m in matches}
    all_bns = {n.name for n in graph if n.domain == "" and n.op_type == "BatchNormalization"}
    planned = model.clone()
    eval_folds = fold_batch_norms(planned.graph, NameScope(planned.graph),
                                  exclude=config.exclude | (all_bns - fold_names))
    eval_folds.affine, eval_folds.weight_expressions = affine, normalized.weight_expressions
    eval_folds.float16, eval_folds.global_pools = normalized.float16, pools
    bn_outputs = {n.name: n.outputs[0].name for n in graph if n.name in fold_names}
    aliases: dict[str, str] = {}
    planned_nodes = {n.name: n for n in planned.graph}
    for record in eval_folds.folded:
        end = tg.fold_end(planned.graph, record, planned_nodes)
        if end is not None and end.name and record.batch_norm in bn_outputs:
            aliases[end.name] = bn_outputs[record.batch_norm]
    plan = plan_quantization(planned.graph, config)
    return TrainGraph(model, config, names, matches, reasons, planned, eval_folds, plan, aliases, opset_in, ir_in)


@dataclass
class TrainEncoded:
    """What the training encoding did, for the contract and the report."""

    folds: list[TrainFold]
    encoding: tg.TrainEncoding
    contract: dict
    left_in_float: list[dict] = field(default_factory=list)


def _parameter_of(value: ir.Value | None, params: set[str]) -> None:
    src = constant_source(value) if value is not None else None
    if src is not None and src.root.is_initializer() and src.root.const_value.dtype == ir.DataType.FLOAT:
        params.add(src.root.name)


def _fold_for_training(prepared: TrainGraph, ops: Ops, step: ir.Value, schedule: TrainSchedule,
                       params: set[str]) -> list[TrainFold]:
    frozen = None
    if schedule.freeze_bn_delay is not None:
        frozen = tg.step_at_least(ops, step, schedule.freeze_bn_delay, f"{tg.SHARED_PREFIX}/use_moving_average")
    folder = TrainFolder(prepared.model.graph, ops, frozen)
    folds = []
    for match in prepared.matches:
        src = constant_source(match.nodes["layer"].inputs[1])
        if src is not None:
            params.add(src.root.name)
        folds.append(folder.fold(match, params))
    return folds


def _encode_weights(prepared: TrainGraph, encoder: tg.TrainEncoder, params: set[str]) -> None:
    nodes = {n.name: n for n in prepared.model.graph}
    for point in prepared.plan.new_weights():
        groups: dict[int, list] = {}
        for layer in (nodes[n.name] for n in point.layers if n.name in nodes):
            groups.setdefault(id(layer.inputs[1]), []).append(layer)
        for group in groups.values():
            weight = group[0].inputs[1]
            src = constant_source(weight)
            if src is not None:
                params.add(src.root.name)
            for layer in group:  # biases train too
                _parameter_of(layer_bias(layer), params)
            encoder.encode_weight(tg.TrainWeightPoint(point.name, group, point.axis), weight,
                                  weight_rank(group[0]) or 2)
    for match in prepared.plan.layers:  # a constant bias Add after a layer (MatMul + Add) trains too
        add = match.get("bias_add")
        real = nodes.get(add.name) if add is not None else None
        for v in (real.inputs if real is not None else ()):
            _parameter_of(v, params)


def _encode_recurrent(prepared: TrainGraph, encoder: tg.TrainEncoder, params: set[str]) -> None:
    """Each LSTM the eval graph runs as DynamicQuantizeLSTM: ``W``/``R`` fake-quantized on its grid;
    its weights and bias train."""
    nodes = {n.name: n for n in prepared.model.graph}
    for point in prepared.plan.recurrent:
        layer = nodes.get(point.node.name)
        if layer is None:
            continue
        for v in layer.inputs[1:4]:
            _parameter_of(v, params)
        encoder.encode_recurrent(point.name, layer, point.per_channel, point.symmetric)


def _encode_activations(prepared: TrainGraph, encoder: tg.TrainEncoder, ranges: dict, left: list[dict]) -> None:
    """Each new point of the plan as FakeQuant; carried and grouped points share their range's state,
    fixed ranges are constants. Points come in plan order, so a source is encoded before what carries it."""
    values = tg.values_by_name(prepared.model.graph)
    resolved = prepared.plan.resolve(ranges)
    plan_groups = prepared.plan.groups()
    gates = {id(node): gate_parameters(node) for node in prepared.plan.integer_gates}

    def real(point):
        return prepared.aliases.get(point.value.name, point.value.name)

    for point in prepared.plan.new_activations():
        value = values.get(real(point))
        if value is None:
            left.append({"node": point.producer.name if point.producer is not None else real(point), "op": "?",
                         "reason": f"tensor '{real(point)}' not found in the training graph"})
            continue
        (lo, hi), source = resolved[point.value.name]
        root = point.root()
        if point.source is not None:
            shares = f"group:{root.group}" if root.group is not None else real(root)
            key = None
        elif point.group is not None:
            shares = key = f"group:{point.group}"
        else:
            shares, key = None, real(point)
        # a group's range is the union of its Concat inputs' batch ranges; a Concat's output adds nothing
        # (its values are its inputs') and it reads the fake-quantized inputs: a cycle if it were used
        batch = [values[real(m)] for m in plan_groups.get(point.group, [])
                 if real(m) in values and not m.is_concat_output]
        encoder.encode_activation(tg.TrainActivationPoint(
            point.name, value, point.kind, point.rule, (lo, hi), "fixed" if point.fixed_range else
            ("calibration" if source == "calibration" else "default") if point.source is None else "carried",
            shares, key, batch, point.bound, gates.get(id(point.producer)) if _is_hard_sigmoid(value) else None))


def _is_hard_sigmoid(value: ir.Value) -> bool:
    node = value.producer()
    return node is not None and node.domain == "" and node.op_type == "HardSigmoid"


def _fake_quant_of(value: ir.Value | None) -> ir.Node | None:
    """The qtool::FakeQuant node whose output ``value`` is (through a quant-delay Where), or None."""
    node = value.producer() if value is not None else None
    if node is not None and node.domain == "" and node.op_type == "Where" and len(node.inputs) == 3:
        node = node.inputs[1].producer() if node.inputs[1] is not None else None
    if node is not None and node.domain == fqf.DOMAIN and node.op_type == fqf.NAME:
        return node
    return None


def _deployed_int32_bias(layer: ir.Node, slot, axis: int | None) -> bool:
    """Whether ``rewrite-eval`` stores the bias of ``layer`` (in the eval-folded copy, its weight quantized)
    as int32: ``eval_graph.QuantizeBias.check``'s conditions that do not depend on the encoded graph."""
    b = constant_array(slot[0].inputs[slot[1]])
    if b is None or b.dtype != np.float32:
        return False
    if layer.op_type == "Gemm" and (float_attr(layer, "beta", 1.0) != 1.0 or b.ndim != 1):
        return False
    if layer.op_type == "MatMul" and (b.ndim < 1 or any(d != 1 for d in b.shape[:-1])):
        return False
    w = constant_array(layer_weight(layer))
    if w is None:
        return False
    scales = np.zeros(1 if axis is None else w.shape[axis], np.float32)
    return per_output_channel(layer, scales, b.size) is not None


# a bias code |b| / (input_scale * weight_scale) above this when the graph is written, a factor 2**8 below int32's
# limit, gets the weight-range widening in the training graph (``TrainEncoder._widen_for_bias``)
WIDEN_CODE_LIMIT = 2.0**23


def _input_range(encoder: tg.TrainEncoder, x_fq: ir.Node) -> list[float] | None:
    """The initial (calibrated or default) range of the activation quantizer ``x_fq`` uses."""
    for new_min, new_max, _, _, initial in encoder.ranges.values():
        if new_min is x_fq.inputs[1] and new_max is x_fq.inputs[2]:
            return initial
    return None


def _bias_may_overflow(planned: ir.Node, slot, axis: int | None, x_range, config: QuantConfig) -> bool:
    """Whether the training graph widens the weight range of ``planned`` (the eval-folded layer) for its bias:
    where some bias code ``|b| / (input_scale * weight_scale)`` of the graph as written (its initial input range,
    the eval fold's weight and bias) is above :data:`WIDEN_CODE_LIMIT` (a batch norm's dead channel: SINet's
    first Conv, ~2**42). Whether a bias overflows during training is not known when the graph is written (the
    weights, the bias and the input range train), so this is a margin, not a rule: a channel that comes within
    2**8 of the limit only by training saturates, as every bias did before. Unknown input range: widen."""
    if axis is None:
        return False
    b = constant_array(slot[0].inputs[slot[1]])
    w = constant_array(layer_weight(planned))
    if x_range is None:
        return True
    lo, hi = weight_range(w, bits=config.weight_bits, symmetric=config.weights_symmetric, axis=axis)
    s_w = per_output_channel(planned, qparams(lo, hi, bits=config.weight_bits, narrow=True, signed=True).scale, b.size)
    s_in = activation_params(x_range[0], x_range[1], bits=config.activation_bits, symmetric=config.symmetric).scale
    if s_w is None or s_w.size != b.size:
        return False
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        codes = np.abs(b.astype(np.float64).reshape(-1)) / (np.float64(s_in.reshape(-1)[0]) * s_w.astype(np.float64))
    return bool(np.any(codes[np.isfinite(codes)] > WIDEN_CODE_LIMIT))


def _encode_biases(prepared: TrainGraph, encoder: tg.TrainEncoder, folds: list[TrainFold]) -> None:
    """``qtool::FakeQuantBias`` on the bias of each layer whose bias the eval graph stores as int32 (its input
    and weight quantized): the training graph adds the deployed bias. A folded layer's bias is the fold's
    bias vector; a layer folded by the eval rewrite only (grouped ConvTranspose) is left alone."""
    config = prepared.config
    nodes = {n.name: n for n in prepared.model.graph}
    folded = {f.layer.name: f for f in folds}
    eval_only = {r.layer for r in prepared.eval_folds.folded} - set(folded)
    axes = {layer.name: point.axis for point in prepared.plan.new_weights() for layer in point.layers}
    # a weight read by several layers is not widened for a bias: a later layer's input scale may depend on the
    # weight (a cycle), and the other layers' biases would take the widened scale
    shared = {layer.name for point in prepared.plan.new_weights() if len(point.layers) > 1 for layer in point.layers}
    # QuantizeBias saturates to int32 where onnxruntime may fuse 8-bit integer kernels
    saturate = config.activation_bits <= 8 and config.weight_bits <= 8 and config.weight_bits != 4
    for match in prepared.plan.layers:
        planned = match.layer
        layer = nodes.get(planned.name)
        if layer is None or planned.name not in axes or planned.name in eval_only:
            continue
        slot = bias_slot(planned, match.get("bias_add"))
        if slot is None or not _deployed_int32_bias(planned, slot, axes[planned.name]):
            continue
        x_fq, w_fq = _fake_quant_of(layer_input(layer)), _fake_quant_of(layer_weight(layer))
        if x_fq is None or w_fq is None or (x_fq.inputs[1].shape is not None and len(x_fq.inputs[1].shape)):
            continue  # the input is not quantized (one scale per tensor), or the weight is not
        fold = folded.get(layer.name)
        if fold is not None:
            bias, uses = fold.bias, list(fold.bias.uses())
        elif layer.op_type == "MatMul":  # the constant operand of its bias Add
            add = nodes.get(slot[0].name)
            if add is None or add.op_type != "Add" or len(add.inputs) != 2:
                continue
            index = slot[1]
            bias, uses = add.inputs[index], [(add, index)]
        else:
            bias = layer_bias(layer)
            if bias is None:
                continue
            uses = [(layer, 2)]  # Conv, ConvTranspose and Gemm read their bias as input 2
        channels = int(np.size(constant_array(slot[0].inputs[slot[1]])))
        groups = group_of(layer) if layer.op_type == "ConvTranspose" else 1
        widen = saturate and groups == 1 and planned.name not in shared \
            and _bias_may_overflow(planned, slot, axes[planned.name], _input_range(encoder, x_fq), config)
        point = tg.TrainBiasPoint(f"{context_of(layer.name or layer.op_type)}/bias_quant", layer, bias, uses,
                                  channels, axes[planned.name] is not None, groups, saturate, widen)
        encoder.encode_bias(point, x_fq, w_fq)


def _range_update_input(prepared: TrainGraph, graph: ir.Graph) -> ir.Value:
    """``qtool_range_update``: a graph input with a default of 1 (an initializer of the same name), so a
    runtime that does not feed it trains the ranges, and an evaluation feeds 0 to hold them."""
    value = ir.Value(name=tg.RANGE_UPDATE_INPUT, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([]),
                     const_value=ir.tensor(np.array(1.0, np.float32), name=tg.RANGE_UPDATE_INPUT))
    prepared.names.reserve_value(tg.RANGE_UPDATE_INPUT)
    graph.inputs.append(value)
    graph.register_initializer(value)
    return value


def _parameters_as_inputs(graph: ir.Graph, params: set[str]) -> list[str]:
    for name in sorted(params):
        value = graph.initializers.get(name)
        if value is None or value.is_graph_input():
            continue
        tensor = value.const_value
        value.type = ir.TensorType(tensor.dtype)
        value.shape = ir.Shape(tensor.shape)
        graph.inputs.append(value)
    return sorted(p for p in params if p in graph.initializers)


def _left_in_float(prepared: TrainGraph) -> list[dict]:
    left: list[dict] = [s.to_dict() for s in prepared.eval_folds.skipped]
    skipped = {s.node for s in prepared.eval_folds.skipped}
    for name, why in sorted(prepared.reasons.items()):
        if name not in skipped:
            left.append({"node": name, "op": "BatchNormalization", "reason": why})
    left.extend(x.to_dict() for x in prepared.plan.left_in_float)
    return left


def encode_train(prepared: TrainGraph, schedule: TrainSchedule, ranges: dict) -> TrainEncoded:
    """The training graph: step input, training folds, FakeQuant with state, the contract."""
    model, config = prepared.model, prepared.config
    graph = model.graph
    ops = Ops(graph, prepared.names, default_opset(model))
    step = ir.Value(name=tg.STEP_INPUT, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    prepared.names.reserve_value(tg.STEP_INPUT)
    graph.inputs.append(step)
    range_update = _range_update_input(prepared, graph)
    params: set[str] = set()
    folds = _fold_for_training(prepared, ops, step, schedule, params)
    encoder = tg.TrainEncoder(graph, ops, config, step, schedule.quant_delay, range_update)
    left = _left_in_float(prepared)
    _encode_weights(prepared, encoder, params)
    _encode_recurrent(prepared, encoder, params)
    _encode_activations(prepared, encoder, ranges, left)
    _encode_biases(prepared, encoder, folds)
    updates = {}
    for fold in folds:
        updates.update(fold.updates)
    updates.update(encoder.updates)
    state = encoder.add_state_outputs(updates)
    parameters = _parameters_as_inputs(graph, params)
    add_fake_quant_function(model)
    contract = {
        "version": tg.CONTRACT_VERSION,
        "step_input": tg.STEP_INPUT,
        "range_update_input": tg.RANGE_UPDATE_INPUT,
        "quant_delay": schedule.quant_delay,
        "freeze_bn_delay": schedule.freeze_bn_delay,
        "ema_decay": tg.EMA_DECAY,
        "state": state,
        "parameters": parameters,
        "options": {**config.to_dict(), "quant_delay": schedule.quant_delay,
                    "freeze_bn_delay": schedule.freeze_bn_delay},
        "activation_quantizers": encoder.result.activations,
        "weight_quantizers": encoder.result.weights,
        "bias_quantizers": encoder.result.biases,
        "batch_norms": [f.record for f in folds],
    }
    model.metadata_props[tg.METADATA_KEY] = tg.metadata_json(contract)
    graph.sort()
    clamp_ir_version(model)
    return TrainEncoded(folds, encoder.result, contract, left)
