"""``rewrite_train``: the port of ``tf.contrib.quantize.create_training_graph`` to ONNX files.

Steps: read and check the inputs -> stop on a graph that already has
training state (qtool's: report it, nothing to do; another tool's: an error)
-> raise the opset to 13 when lower (the ``qtool::FakeQuant`` body needs it)
-> name unnamed nodes -> **plan on the eval fold**: a copy of the model gets
the eval fold and TF's placement rules (``placement.plan_quantization``, the
same code and the same plan as ``rewrite_eval``), and is calibrated there
when data is given -> fold batch norms for training
(``fold_batch_norms_train``) -> encode the plan with ``train_graph``
(FakeQuant, state, ``qtool_step``) -> write atomically.

One implementation of the rules, two encodings: the plan's points are tensor
names of the eval-folded copy; a folded batch norm's output there is its
layer's output, here the training fold's result, which keeps the batch
norm's output name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from qtool.errors import QtoolError
from qtool.onnx_rewrite.eval_rewrite import RewriteEvalResult


class RewriteTrainResult(RewriteEvalResult):
    """The training graph (an ``onnx_ir.Model``) and the summary of what was done."""

    def format_text(self) -> str:
        return format_train_summary(self.summary)


def _delay(value, label: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise QtoolError(f"{label} must be a non-negative integer number of steps, got {value!r}")
    return int(value)


def _constants_to_initializers(graph) -> int:
    """Every float ``Constant`` node becomes an initializer of the same name (trainable, feedable)."""
    import onnx_ir as ir

    from qtool.onnx_rewrite.constants import contiguous, root_array

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


def rewrite_train(
    model,
    output=None,
    *,
    weight_bits: int = 8,
    activation_bits: int = 8,
    symmetric: bool = False,
    quant_delay: int = 0,
    freeze_bn_delay: int | None = None,
    scope: str | None = None,
    per_channel: bool = True,
    exclude: Iterable[str] = (),
    calibration_data=None,
    batch_size: int = 16,
    calibration_method: str = "minmax",
    calibration_options: dict | None = None,
    in_place: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> RewriteTrainResult:
    """Write a quantization-aware training graph (TF's ``create_training_graph``).

    ``model``: path to an ONNX file (or an ``onnx.ModelProto`` / ``onnx_ir.Model``,
    rewritten in memory). ``output``: where to write; ``in_place=True`` replaces
    the input file. ``quant_delay``: steps before fake quantization switches on
    (``qtool_step >= quant_delay``). ``freeze_bn_delay``: the step from which
    batch norms use their moving statistics and stop updating them (None: never).
    ``calibration_data``: initial activation ranges (else TF's (-6, 6), and
    (0, 6) after Relu/Clip), observed with ``calibration_method`` and its
    ``calibration_options`` (see ``qtool.calibrate``).

    The training contract (state, step input, delays) is in the model's
    ``metadata_props["qtool.training"]``; see ``docs/training.md``.
    """
    import onnx_ir as ir

    from qtool.onnx_rewrite import train_graph as tg
    from qtool.onnx_rewrite._io import clamp_ir_version, save_model
    from qtool.onnx_rewrite._names import NameScope, name_unnamed_nodes
    from qtool.onnx_rewrite._train_ops import Ops
    from qtool.onnx_rewrite.constants import constant_source
    from qtool.onnx_rewrite.eval_rewrite import open_for_rewrite
    from qtool.onnx_rewrite.fake_quant_function import MIN_OPSET, add_fake_quant_function
    from qtool.onnx_rewrite.fold_batch_norms import fold_batch_norms
    from qtool.onnx_rewrite.fold_batch_norms_train import TrainFolder, find_train_folds
    from qtool.onnx_rewrite.opset import convert_opset, default_opset
    from qtool.onnx_rewrite.patterns import weight_rank
    from qtool.onnx_rewrite.placement import QuantConfig, check_exclude, plan_quantization

    config = QuantConfig(weight_bits, activation_bits, symmetric, per_channel, scope, exclude)
    quant_delay = _delay(quant_delay if quant_delay is not None else 0, "quant delay")
    freeze_bn_delay = _delay(freeze_bn_delay, "freeze_bn_delay")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise QtoolError(f"batch size must be a positive integer, got {batch_size!r}")

    # --- paths: every check before any work -----------------------------------------------
    ir_model, output, external_in, label = open_for_rewrite(model, output, in_place)

    opset_in = default_opset(ir_model)
    ir_in = ir_model.ir_version
    options = {
        "weight_bits": config.weight_bits,
        "activation_bits": config.activation_bits,
        "symmetric": config.symmetric,
        "per_channel": config.per_channel,
        "scope": config.scope,
        "exclude": sorted(config.exclude),
        "quant_delay": quant_delay,
        "freeze_bn_delay": freeze_bn_delay,
    }

    # --- already rewritten: report, do not rewrite twice ----------------------------------------
    if tg.is_training_graph(ir_model):
        if tg.METADATA_KEY not in ir_model.metadata_props:
            raise QtoolError(f"'{label}' has qtool::FakeQuant nodes but no 'qtool.training' metadata: "
                             "its training state cannot be trusted; start from the float model")
        try:
            contract = tg.training_contract(ir_model)
        except QtoolError as exc:
            raise QtoolError(f"'{label}': {exc}") from exc
        summary = _already_summary(label, output, in_place, options, contract, opset_in, ir_in)
        if output is not None and not in_place:
            summary["external_data"] = save_model(ir_model, output, external_data=external_in)
        return RewriteTrainResult(ir_model, summary)
    reason = tg.foreign_training_state(ir_model)
    if reason is not None:
        raise QtoolError(
            f"'{label}' already contains training-only state from another tool: {reason}. "
            "qtool rewrites inference graphs; export the model for inference first"
        )
    if any(v.name == tg.STEP_INPUT for v in ir_model.graph.inputs):
        raise QtoolError(f"'{label}' already has an input named '{tg.STEP_INPUT}'")

    # --- calibration data: checked against the inputs before the rewrite ------------------
    data = None
    if calibration_data is not None:
        from qtool.calibrate.data import input_specs, load_calibration_data

        data = load_calibration_data(calibration_data, input_specs(ir_model))
    else:
        progress = None

    # --- opset -------------------------------------------------------------------------------------
    if opset_in < MIN_OPSET:
        ir_model = convert_opset(ir_model, MIN_OPSET, "the qtool::FakeQuant function body needs")
    opset_out = default_opset(ir_model)
    graph = ir_model.graph

    # --- plan on the eval fold (one implementation of the rules) ---------------------------------
    name_unnamed_nodes(graph)
    check_exclude(graph, config.exclude)
    _constants_to_initializers(graph)
    names = NameScope(graph)
    matches, train_reasons = find_train_folds(graph, names, config.exclude)
    fold_names = {m.nodes["bn"].name for m in matches}
    all_bns = {n.name for n in graph if n.domain == "" and n.op_type == "BatchNormalization"}
    clone = ir_model.clone()
    eval_folds = fold_batch_norms(clone.graph, NameScope(clone.graph),
                                  exclude=config.exclude | (all_bns - fold_names))
    bn_outputs = {n.name: n.outputs[0].name for n in graph if n.name in fold_names}
    aliases: dict[str, str] = {}
    clone_nodes = {n.name: n for n in clone.graph}
    for record in eval_folds.folded:
        end = tg.fold_end(clone.graph, record, clone_nodes)
        if end is not None and end.name and record.batch_norm in bn_outputs:
            aliases[end.name] = bn_outputs[record.batch_norm]
    plan = plan_quantization(clone.graph, config)

    calibration = None
    ranges: dict[str, tuple[float, float] | None] = {}
    tensors = plan.tensors_to_calibrate()
    if data is not None and tensors:
        from qtool.calibrate.runner import collect_ranges

        method_options = {"num_bits": config.activation_bits, "symmetric": config.symmetric,
                          **(calibration_options or {})}
        calibration = collect_ranges(clone, tensors, data, batch_size=batch_size, method=calibration_method,
                                     progress=progress, options=method_options)
        ranges = {aliases.get(k, k): v for k, v in calibration.ranges.items()}

    # --- the training graph ---------------------------------------------------------------------------
    ops = Ops(graph, names, opset_out)
    step = ir.Value(name=tg.STEP_INPUT, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    names.reserve_value(tg.STEP_INPUT)
    graph.inputs.append(step)
    frozen = None
    if freeze_bn_delay is not None:
        frozen = tg.step_at_least(ops, step, freeze_bn_delay, f"{tg.SHARED_PREFIX}/use_moving_average")
    params: set[str] = set()
    folder = TrainFolder(graph, ops, frozen)
    folds = []
    for match in matches:
        layer = match.nodes["layer"]
        src = constant_source(layer.inputs[1])
        if src is not None:
            params.add(src.root.name)
        folds.append(folder.fold(match, params))

    encoder = tg.TrainEncoder(graph, ops, config, step, quant_delay)
    nodes = {n.name: n for n in graph}
    left: list[dict] = [s.to_dict() for s in eval_folds.skipped]
    for name, why in sorted(train_reasons.items()):
        if name not in {s.node for s in eval_folds.skipped}:
            left.append({"node": name, "op": "BatchNormalization", "reason": why})
    left.extend(x.to_dict() for x in plan.left_in_float)

    for point in plan.new_weights():
        layers = [nodes[n.name] for n in point.layers if n.name in nodes]
        groups: dict[int, list] = {}
        for layer in layers:
            groups.setdefault(id(layer.inputs[1]), []).append(layer)
        for group in groups.values():
            weight = group[0].inputs[1]
            src = constant_source(weight)
            if src is not None:
                params.add(src.root.name)
            for layer in group:  # biases train too
                if len(layer.inputs) > 2 and layer.inputs[2] is not None:
                    bias_src = constant_source(layer.inputs[2])
                    if bias_src is not None and bias_src.root.is_initializer():
                        params.add(bias_src.root.name)
            rank = weight_rank(group[0]) or 2
            encoder.encode_weight(tg.TrainWeightPoint(point.name, group, point.axis), weight, rank)
    for match in plan.layers:  # a constant bias Add after a layer (MatMul + Add) trains too
        add = match.get("bias_add")
        real = nodes.get(add.name) if add is not None else None
        for v in (real.inputs if real is not None else ()):
            src = constant_source(v)
            if src is not None and src.root.is_initializer() and src.root.const_value.dtype == ir.DataType.FLOAT:
                params.add(src.root.name)
    values = tg.values_by_name(graph)
    for point in plan.new_activations():
        name = aliases.get(point.value.name, point.value.name)
        value = values.get(name)
        if value is None:
            left.append({"node": point.producer.name if point.producer is not None else name, "op": "?",
                         "reason": f"tensor '{name}' not found in the training graph"})
            continue
        observed = ranges.get(name)
        initial = observed if observed is not None else point.default_range
        encoder.encode_activation(tg.TrainActivationPoint(
            point.name, value, point.kind, point.rule, initial, "calibration" if observed is not None else "default"))

    updates = {}
    for fold in folds:
        updates.update(fold.updates)
    updates.update(encoder.updates)
    state = encoder.add_state_outputs(updates)
    for name in sorted(params):
        value = graph.initializers.get(name)
        if value is None or value.is_graph_input():
            continue
        tensor = value.const_value
        value.type = ir.TensorType(tensor.dtype)
        value.shape = ir.Shape(tensor.shape)
        graph.inputs.append(value)
    add_fake_quant_function(ir_model)
    contract = {
        "version": tg.CONTRACT_VERSION,
        "step_input": tg.STEP_INPUT,
        "quant_delay": quant_delay,
        "freeze_bn_delay": freeze_bn_delay,
        "ema_decay": tg.EMA_DECAY,
        "state": state,
        "parameters": sorted(p for p in params if p in graph.initializers),
        "options": options,
        "activation_quantizers": encoder.result.activations,
        "weight_quantizers": encoder.result.weights,
        "batch_norms": [f.record for f in folds],
    }
    ir_model.metadata_props[tg.METADATA_KEY] = tg.metadata_json(contract)
    graph.sort()
    clamp_ir_version(ir_model)

    summary = _summary(label, output, in_place, options, opset_in, opset_out, ir_in, ir_model.ir_version,
                       folds, encoder.result, left, plan, contract, calibration, data)
    if output is not None:
        summary["external_data"] = save_model(ir_model, output, external_data=external_in)
    return RewriteTrainResult(ir_model, summary)


def _already_summary(label, output, in_place, options, contract, opset, ir_version) -> dict:
    notes = ["the model is already a qtool training graph: nothing to do (not rewritten twice)"]
    recorded = contract.get("options", {})
    differ = [k for k, v in options.items() if k in recorded and recorded[k] != v]
    if differ:
        notes.append("it was rewritten with other options (" + ", ".join(
            f"{k}={recorded[k]!r}" for k in differ) + "); rewrite the float model to change them")
    return {
        "input": label,
        "output": output,
        "in_place": bool(in_place),
        "opset": {"input": opset, "output": opset},
        "ir_version": {"input": ir_version, "output": ir_version},
        "options": recorded or options,
        "already_training_graph": True,
        "counts": {
            "batch_norms_folded": 0,
            "batch_norms_not_folded": 0,
            "layers_quantized": 0,
            "weights_quantized": 0,
            "activations_quantized": 0,
            "state_tensors": len(contract.get("state", {})),
            "parameters": len(contract.get("parameters", [])),
            "left_in_float": 0,
        },
        "batch_norms_folded": [],
        "weights": [],
        "activations": [],
        "left_in_float": [],
        "step_input": contract.get("step_input"),
        "state": contract.get("state", {}),
        "calibration": None,
        "changed": False,
        "warnings": [],
        "notes": notes,
        "external_data": None,
    }


def _summary(label, output, in_place, options, opset_in, opset_out, ir_in, ir_out, folds, encoding, left, plan,
             contract, calibration, data) -> dict:
    warnings: list[str] = []
    notes: list[str] = []
    defaults = [a for a in encoding.activations if a["range_source"] == "default"]
    if defaults and data is None:
        notes.append(
            "no calibration data: activation ranges start at TensorFlow's defaults ((-6, 6), and (0, 6) after "
            "Relu/Clip) and move by the EMA (decay 0.999) during training"
        )
    if calibration is not None:  # what is wrong with the data, by tensor (qtool.calibrate.observers)
        from qtool.calibrate.observers import data_warnings

        warnings.extend(data_warnings(calibration.ranges, calibration.observers))
        if data is not None and data.ignored:
            notes.append(f"calibration data: ignored array(s) not named like a model input: {', '.join(data.ignored)}")
    if opset_in != opset_out:
        notes.append(f"opset raised from {opset_in} to {opset_out} (the qtool::FakeQuant function body needs 13)")
    return {
        "input": label,
        "output": output,
        "in_place": bool(in_place),
        "opset": {"input": opset_in, "output": opset_out},
        "ir_version": {"input": ir_in, "output": ir_out},
        "options": options,
        "already_training_graph": False,
        "counts": {
            "batch_norms_folded": len(folds),
            "batch_norms_not_folded": sum(1 for x in left if x["op"] == "BatchNormalization"),
            "layers_quantized": sum(len(w["layers"]) for w in encoding.weights),
            "weights_quantized": len(encoding.weights),
            "activations_quantized": len(encoding.activations),
            "state_tensors": len(contract["state"]),
            "parameters": len(contract["parameters"]),
            "left_in_float": len(left),
        },
        "batch_norms_folded": [{"batch_norm": f.batch_norm, "layer": f.layer.name, "op": f.layer.op_type,
                                "state": f.state} for f in folds],
        "weights": encoding.weights,
        "activations": encoding.activations,
        "left_in_float": left,
        "other_float_ops": dict(sorted(plan.other_ops.items())),
        "step_input": contract["step_input"],
        "state": contract["state"],
        "calibration": calibration.to_dict() if calibration is not None else None,
        "changed": True,
        "warnings": warnings,
        "notes": notes,
        "external_data": None,
    }


def format_train_summary(s: dict) -> str:
    c = s["counts"]
    o = s["options"]
    lines = [f"qtool rewrite-train: {s['input']} -> {s['output'] or '(not written)'}"]
    if s.get("already_training_graph"):
        lines.append(f"  state tensors          {c['state_tensors']} (step input '{s['step_input']}')")
        for note in s["notes"]:
            lines.append(f"  note: {note}")
        return "\n".join(lines)
    if s["opset"]["input"] != s["opset"]["output"]:
        lines.append(f"  opset                  {s['opset']['input']} -> {s['opset']['output']}")
    total_bn = c["batch_norms_folded"] + c["batch_norms_not_folded"]
    freeze = o["freeze_bn_delay"]
    lines.append(f"  batch norms folded     {c['batch_norms_folded']} of {total_bn}  (training fold, "
                 + (f"frozen from step {freeze})" if freeze is not None else "never frozen)"))
    mode = "per-channel" if o["per_channel"] else "per-tensor"
    sym = ", symmetric" if o["symmetric"] else ""
    lines.append(f"  layers quantized       {c['layers_quantized']}  ({c['weights_quantized']} weight tensor(s), "
                 f"{o['weight_bits']}-bit {mode}{sym}, ranges recomputed every step)")
    calib = s.get("calibration")
    where = (f"initial ranges calibrated: {calib['samples']} samples, {calib['method']}" if calib
             else "initial ranges: TensorFlow's defaults")
    lines.append(f"  activations quantized  {c['activations_quantized']}  ({o['activation_bits']}-bit, EMA ranges, {where})")
    lines.append(f"  quant delay            {o['quant_delay']} step(s)")
    lines.append(f"  state tensors          {c['state_tensors']}  (fed by '{s['step_input']}' loop, "
                 f"outputs '<state>:updated'), {c['parameters']} trainable parameters")
    left = s["left_in_float"]
    if left:
        lines.append(f"  left in float          {len(left)}")
        width = max(len(f"{x['node']} ({x['op']})") for x in left)
        for x in left:
            lines.append(f"    {x['node'] + ' (' + x['op'] + ')':<{width}}  {x['reason']}")
    if s.get("external_data"):
        lines.append(f"  external data          {s['external_data']}")
    for note in s["notes"]:
        lines.append(f"  note: {note}")
    return "\n".join(lines)
