"""``rewrite_eval``: the port of ``tf.contrib.quantize.create_eval_graph`` to ONNX files.

Steps: read and check the inputs -> raise the opset if the encoding needs it
-> name unnamed nodes -> fold batch norms -> plan (TF's placement rules) ->
calibrate the planned activations (or take TF's default ranges) -> encode the
plan as QuantizeLinear/DequantizeLinear -> write atomically. Every user
mistake is a :class:`~qtool.errors.QtoolError` raised before anything is
written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from qtool.errors import QtoolError

TRAINING_METADATA_KEY = "qtool.training"


@dataclass
class RewriteEvalResult:
    """The rewritten model (an ``onnx_ir.Model``) and the summary of what was done."""

    model: object
    summary: dict

    def to_dict(self) -> dict:
        return self.summary

    @property
    def warnings(self) -> list[str]:
        return list(self.summary.get("warnings", []))

    def format_text(self) -> str:
        from qtool.onnx_rewrite.report import format_summary

        return format_summary(self.summary)


def as_ir_model(model):
    """An ``onnx_ir.Model`` from a path, a ModelProto or an IR model (returned as is)."""
    import onnx
    import onnx_ir as ir

    from qtool.onnx_rewrite._io import load_model

    if isinstance(model, (str, os.PathLike)):
        return load_model(model).model
    if isinstance(model, onnx.ModelProto):
        return ir.serde.deserialize_model(model)
    if isinstance(model, ir.Model):
        return model
    raise QtoolError(f"model must be a path, an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}")


def _strip_training_graph(model, label: str):
    """A qtool training graph becomes its float graph, in place (issue 5); returns its trained
    state (ranges from the min/max state, batch norms with the moving statistics), else None."""
    from qtool.onnx_rewrite.train_graph import is_training_graph, strip_training_graph

    if not is_training_graph(model):
        return None
    return strip_training_graph(model, label)


def contract_config(config, contract: dict):
    """The options a training graph was written (and trained) with, from its contract.

    An option left at its default takes the recorded value (a W3A3 training graph deploys at
    W3A3, not at the default 8 bits); an option given with another value wins, with a warning
    (the trained ranges and weights belong to the recorded options). Returns ``(config, warnings)``.
    """
    from qtool.onnx_rewrite.placement import QuantConfig

    recorded = contract.get("options") or {}
    default = QuantConfig()
    values, warnings = {}, []
    for key in ("weight_bits", "activation_bits", "symmetric", "per_channel", "scope", "exclude"):
        given = getattr(config, key)
        if key not in recorded:
            values[key] = given
            continue
        want = frozenset(recorded[key] or ()) if key == "exclude" else recorded[key]
        if given != getattr(default, key) and given != want:
            warnings.append(f"the training graph was written with {key}={_show(want)}; deploying with "
                            f"{key}={_show(given)} as asked, which is not what was trained")
            values[key] = given
        else:
            values[key] = want
    return QuantConfig(**values), warnings


def _show(v):
    return sorted(v) if isinstance(v, frozenset) else v


class _Clock:
    """Seconds spent in each step, for the summary's ``timings``."""

    def __init__(self):
        import time

        self._time = time.perf_counter
        self._last = self._time()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = self._time()
        self.laps[name] = round(self.laps.get(name, 0.0) + now - self._last, 3)
        self._last = now


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def open_for_rewrite(model, output, in_place: bool):
    """Check the paths and load the model, before any work; shared by both rewrites.

    Returns ``(ir_model, output, external_in, label)``: the IR model (a clone when
    the caller passed an ``onnx_ir.Model``: the caller's model is never
    modified; the tensors are shared, which is safe as a rewrite never writes
    into one), the checked output path (the input with ``in_place``), whether
    the input used external data, and the name to use in messages.
    """
    import onnx_ir as ir

    from qtool.onnx_rewrite._io import check_output_path, load_model

    external_in = False
    if isinstance(model, (str, os.PathLike)):
        src_path = os.fspath(model)
        if in_place:
            if output is not None and not _same_file(os.fspath(output), src_path):
                raise QtoolError("give either an output path (-o) or --in-place, not both")
            output = src_path
        elif output is not None and os.path.exists(os.fspath(output)) and os.path.exists(src_path) \
                and _same_file(os.fspath(output), src_path):
            raise QtoolError(f"the output '{os.fspath(output)}' is the input model; use --in-place to replace it")
        loaded = load_model(src_path)
        ir_model = loaded.model
        external_in = loaded.external_data
        label = src_path
    else:
        if in_place:
            raise QtoolError("--in-place needs a model path")
        ir_model = as_ir_model(model)
        if isinstance(model, ir.Model):
            ir_model = model.clone()
        label = "<model>"
    if output is not None:
        output = check_output_path(output)
    return ir_model, output, external_in, label


def prepare_for_calibration(model, **options):
    """Load, fold and plan like ``rewrite_eval``; returns ``(folded ir model, tensor names)``."""
    from qtool.onnx_rewrite._names import NameScope, name_unnamed_nodes
    from qtool.onnx_rewrite.fold_batch_norms import fold_batch_norms
    from qtool.onnx_rewrite.placement import QuantConfig, check_exclude, plan_quantization

    config = QuantConfig(**{k: options[k] for k in QuantConfig.__dataclass_fields__ if k in options})
    ir_model = as_ir_model(model)
    if not isinstance(model, (str, os.PathLike)):
        ir_model = ir_model.clone() if hasattr(ir_model, "clone") else ir_model
    graph = ir_model.graph
    name_unnamed_nodes(graph)
    check_exclude(graph, config.exclude)
    fold_batch_norms(graph, NameScope(graph), exclude=config.exclude)
    plan = plan_quantization(graph, config)
    return ir_model, plan.tensors_to_calibrate()


def rewrite_eval(
    model,
    output=None,
    *,
    calibration_data=None,
    batch_size: int = 16,
    weight_bits: int = 8,
    activation_bits: int = 8,
    symmetric: bool = False,
    per_channel: bool = True,
    scope: str | None = None,
    exclude: Iterable[str] = (),
    in_place: bool = False,
    calibration_method: str = "minmax",
    progress: Callable[[int, int], None] | None = None,
    calibration_options: dict | None = None,
    ranges=None,
) -> RewriteEvalResult:
    """Fold batch norms, insert QuantizeLinear/DequantizeLinear, write a deployable int8 model.

    ``model``: path to an ONNX file (or an ``onnx.ModelProto`` / ``onnx_ir.Model``,
    rewritten in memory). ``output``: where to write; ``in_place=True`` replaces
    the input file instead (by one rename at the end). With neither, nothing is
    written and the rewritten model is returned in the result.
    ``calibration_data``: ``.npz``/``.npy`` path, array, or dict of arrays; without
    it activation ranges are TF's defaults and the summary warns.
    ``progress(done, total)`` is called after each calibration batch.
    ``calibration_method`` / ``calibration_options``: see ``qtool.calibrate``
    (``percentile``, ``num_bins``, ``ema_decay``; bits and symmetry follow the
    activation options). ``ranges``: a ranges file written by ``qtool
    calibrate`` (or an onnxruntime calibration cache), or a dict of
    ``(min, max)``, used instead of calibration data.

    Returns a :class:`RewriteEvalResult` (``.model``, ``.summary``, ``.format_text()``).
    """
    from qtool.onnx_rewrite._io import clamp_ir_version, save_model
    from qtool.onnx_rewrite._names import NameScope, name_unnamed_nodes
    from qtool.onnx_rewrite.eval_graph import encode_eval_graph, needed_opset
    from qtool.onnx_rewrite.fold_batch_norms import fold_batch_norms
    from qtool.onnx_rewrite.opset import convert_opset, default_opset
    from qtool.onnx_rewrite.patterns import LAYER_OPS
    from qtool.onnx_rewrite.placement import QuantConfig, check_exclude, plan_quantization

    config = QuantConfig(weight_bits, activation_bits, symmetric, per_channel, scope, exclude)
    clock = _Clock()
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise QtoolError(f"batch size must be a positive integer, got {batch_size!r}")

    # --- paths: every check before any work ----------------------------------------------
    ir_model, output, external_in, label = open_for_rewrite(model, output, in_place)
    clock.lap("load")
    if calibration_data is None and progress is not None:
        progress = None

    trained = _strip_training_graph(ir_model, label)
    contract_warnings: list[str] = []
    if trained is not None:  # the graph was trained for its recorded options: deploy those
        config, contract_warnings = contract_config(config, trained.contract)
        activation_bits, symmetric = config.activation_bits, config.symmetric
    opset_in = default_opset(ir_model)
    ir_in = ir_model.ir_version

    # --- calibration data: checked against the inputs before the rewrite ---------------
    data = None
    given_ranges = None
    ranges_source = ranges
    ranges_label = "the ranges file" if isinstance(ranges, (str, os.PathLike)) else "the given ranges"
    if ranges is not None:
        from qtool.calibrate.ranges_file import load_ranges

        if calibration_data is not None:
            raise QtoolError("give either calibration data or a ranges file (--ranges), not both")
        given_ranges = load_ranges(ranges)
    if calibration_data is not None:
        from qtool.calibrate.data import input_specs, load_calibration_data

        data = load_calibration_data(calibration_data, input_specs(ir_model))

    # --- opset ------------------------------------------------------------------------------
    target = needed_opset(config)
    has_layers = any(n.domain == "" and n.op_type in LAYER_OPS for n in ir_model.graph)
    if has_layers and opset_in < target:
        why = []
        if config.per_channel and target >= 13:
            why.append("per-channel QuantizeLinear/DequantizeLinear need")
        if target >= 21:
            why.append(f"{config.weight_bits}/{config.activation_bits}-bit integer types need")
        ir_model = convert_opset(ir_model, target, " and ".join(why) or "quantization needs")
        clock.lap("opset")
    graph = ir_model.graph

    # --- rewrite --------------------------------------------------------------------------------
    name_unnamed_nodes(graph)
    check_exclude(graph, config.exclude)
    names = NameScope(graph)
    folds = fold_batch_norms(graph, names, exclude=config.exclude)
    clock.lap("fold")
    plan = plan_quantization(graph, config)
    clock.lap("plan")

    calibration = None
    ranges = None
    tensors = plan.tensors_to_calibrate()
    if data is not None and tensors:
        from qtool.calibrate.runner import collect_ranges

        options = {"num_bits": activation_bits, "symmetric": bool(symmetric), **(calibration_options or {})}
        calibration = collect_ranges(
            ir_model, tensors, data, batch_size=batch_size, method=calibration_method, progress=progress,
            options=options,
        )
        ranges = calibration.ranges
    elif given_ranges is not None:
        from qtool.calibrate.ranges_file import select

        ranges = select(given_ranges, tensors, ranges_label)

    if trained is not None and ranges is None:  # TF's train-then-eval flow: the trained ranges
        ranges = trained.ranges_after_fold(graph, folds)

    opset_out = default_opset(ir_model)
    clock.lap("calibrate")
    encoding = encode_eval_graph(graph, plan, names, opset=opset_out, ranges=ranges)
    clock.lap("encode")
    clamp_ir_version(ir_model)

    summary = _summary(
        label, output, in_place, config, opset_in, opset_out, ir_in, ir_model.ir_version,
        folds, plan, encoding, calibration, data, ranges, calibration_method,
    )
    summary["warnings"].extend(contract_warnings)
    if trained is not None and calibration is None and given_ranges is None:
        summary["ranges_from"] = "the training graph's trained state"
    if given_ranges is not None:
        summary["ranges_from"] = os.fspath(ranges_source) if isinstance(ranges_source, (str, os.PathLike)) else "<ranges>"
    if output is not None:
        data_file = save_model(ir_model, output, external_data=external_in)
        summary["external_data"] = data_file
        clock.lap("save")
    summary["timings"] = clock.laps
    return RewriteEvalResult(ir_model, summary)


def _summary(label, output, in_place, config, opset_in, opset_out, ir_in, ir_out, folds, plan, encoding,
             calibration, data, ranges, method) -> dict:
    warnings: list[str] = []
    notes: list[str] = []
    new_acts = plan.new_activations()
    if new_acts and data is None and ranges is None:
        warnings.append(
            "no calibration data: activation ranges are TensorFlow's defaults ((-6, 6), and (0, 6) "
            "after Relu/Clip); the model needs calibration (--calibration-data) to be accurate"
        )
    if ranges is not None:
        missing = [name for name, r in ranges.items() if r is None]
        if missing:
            warnings.append(
                f"{len(missing)} tensor(s) saw no finite value during calibration and use the default range: "
                + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            )
    if data is not None and data.ignored:
        notes.append(f"calibration data: ignored array(s) not named like a model input: {', '.join(data.ignored)}")
    if encoding.activations:
        notes.append(
            "QuantizeLinear rounds activations half to even at run time; TensorFlow's FakeQuant rounds "
            "half up (exact ties differ by one step). Weights are rounded offline, exactly as TensorFlow."
        )
    if config.per_channel and any(w["op"] == "ConvTranspose" for w in encoding.weights):
        notes.append("ConvTranspose weights are quantized per channel along axis 1 (Cout/group ranges).")
    notes.extend(encoding.notes)
    left = [x.to_dict() for x in folds.skipped] + [x.to_dict() for x in plan.left_in_float] + \
        [x.to_dict() for x in encoding.left_in_float]
    already_w = sum(1 for p in plan.weights if p.exists)
    already_a = sum(1 for p in plan.activations if p.exists)
    if plan.is_empty() and (already_w or already_a) and not folds.folded:
        notes.append("the model is already quantized: nothing to do")
    layers_quantized = sum(len(w["layers"]) for w in encoding.weights)
    return {
        "input": label,
        "output": output,
        "in_place": bool(in_place),
        "opset": {"input": opset_in, "output": opset_out},
        "ir_version": {"input": ir_in, "output": ir_out},
        "options": {
            "weight_bits": config.weight_bits,
            "activation_bits": config.activation_bits,
            "symmetric": config.symmetric,
            "per_channel": config.per_channel,
            "scope": config.scope,
            "exclude": sorted(config.exclude),
        },
        "counts": {
            "batch_norms_folded": len(folds.folded),
            "batch_norms_not_folded": len(folds.skipped),
            "layers_quantized": layers_quantized,
            "weights_quantized": len(encoding.weights),
            "activations_quantized": len(encoding.activations),
            "propagated_input_quantizers": len(encoding.propagated),
            "biases_int32": len(encoding.biases),
            "already_quantized_weights": already_w,
            "already_quantized_activations": already_a,
            "left_in_float": len(left),
        },
        "batch_norms_folded": [f.to_dict() for f in folds.folded],
        "weights": encoding.weights,
        "activations": encoding.activations,
        "propagated_inputs": encoding.propagated,
        "biases": encoding.biases,
        "left_in_float": left,
        "other_float_ops": dict(sorted(plan.other_ops.items())),
        "calibration": calibration.to_dict() if calibration is not None else None,
        "changed": bool(folds.folded or encoding.weights or encoding.activations or encoding.propagated
                        or encoding.biases or opset_in != opset_out),
        "warnings": warnings,
        "notes": notes,
        "external_data": None,
    }
