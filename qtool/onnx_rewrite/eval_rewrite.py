"""The eval rewrite's graph steps (TF's ``create_eval_graph``), on an in-memory model.

:func:`prepare_eval` takes a loaded model to the point where ranges are
needed: a qtool training graph becomes its float graph again (its trained
ranges are kept), the opset is raised when the encoding needs it, unnamed
nodes get names, a constant Mul/Add after a layer and batch norms are folded and the placement rules plan the
quantizers. :func:`encode_eval` writes the plan as
QuantizeLinear/DequantizeLinear with the ranges the caller found
(calibration lives in :mod:`qtool.calibrate`; ``qtool.api`` passes the
ranges from one to the other). Nothing here reads or writes files or runs a
model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from qtool.config import QuantConfig
from qtool.model.io import clamp_ir_version
from qtool.model.layers import is_layer
from qtool.model.names import NameScope
from qtool.model.opset import convert_opset, default_opset
from qtool.onnx_rewrite.cancelled_transposes import transposes_cancelled
from qtool.onnx_rewrite.conv_pads import pads_into_convs
from qtool.onnx_rewrite.depthwise_multipliers import multipliers_as_depthwise
from qtool.onnx_rewrite.global_pools import means_as_global_pools
from qtool.onnx_rewrite.noop_elimination import neutral_ops_removed
from qtool.onnx_rewrite.eval_graph import EvalEncoding, encode_eval_graph, needed_opset
from qtool.onnx_rewrite.fold_affine import fold_affine
from qtool.onnx_rewrite.fold_batch_norms import FoldReport, fold_batch_norms
from qtool.onnx_rewrite.hard_activations import split_hard_swish
from qtool.onnx_rewrite.layer_norms import layer_norms_fused
from qtool.onnx_rewrite.normalize import normalize
from qtool.onnx_rewrite.placement import QuantPlan, plan_quantization
from qtool.onnx_rewrite.reshape_targets import constant_reshape_targets
from qtool.onnx_rewrite.train_graph import TrainedState, is_training_graph, strip_training_graph
from qtool.onnx_rewrite.transposed_convs import convtransposes_as_convs


@dataclass
class EvalGraph:
    """A model folded and planned, waiting for its activation ranges."""

    model: ir.Model
    config: QuantConfig
    names: NameScope
    folds: FoldReport
    plan: QuantPlan
    trained: TrainedState | None  # the ranges of a qtool training graph, when the input was one
    opset_in: int
    ir_in: int
    warnings: list[str] = field(default_factory=list)

    def tensors_to_calibrate(self) -> list[str]:
        return self.plan.tensors_to_calibrate()

    def whole_range_tensors(self) -> list[str]:
        return self.plan.whole_range_tensors()

    def trained_ranges(self) -> dict[str, tuple[float, float]] | None:
        """TF's train-then-eval flow: the trained ranges, keyed by the folded graph's tensor names."""
        if self.trained is None:
            return None
        return self.trained.ranges_after_fold(self.model.graph, self.folds)


def raise_opset(model: ir.Model, config: QuantConfig) -> ir.Model:
    """The model at the opset the Q/DQ encoding of ``config`` needs (unchanged when it has it)."""
    target = needed_opset(config)
    if default_opset(model) >= target or not any(is_layer(n) for n in model.graph.all_nodes()):
        return model
    if any(n.domain == "" and n.op_type == "DequantizeLinear" for n in model.graph):
        return model  # already quantized (by qtool: another tool's model is refused before): nothing new
    why = []
    if config.per_channel and target >= 13:
        why.append("per-channel QuantizeLinear/DequantizeLinear need")
    if target >= 21:
        why.append(f"{config.weight_bits}/{config.activation_bits}-bit integer types need")
    return convert_opset(model, target, " and ".join(why) or "quantization needs")


def fold_and_plan(model: ir.Model, config: QuantConfig, *, trained: bool = False
                  ) -> tuple[NameScope, FoldReport, QuantPlan]:
    """Normalize (:mod:`~qtool.onnx_rewrite.normalize`, as the training rewrite), fold a constant Mul/Add after a
    layer into it (``fold_affine``), fold batch norms, split HardSwish into ``x * HardSigmoid(x)`` (``hard_activations``),
    write a ConvTranspose as Conv + DepthToSpace (``transposed_convs``)
    and plan the quantizers of ``model`` (in place). ``trained``: the
    model was a qtool training graph, whose batch norms fold in the training graph's float32 arithmetic
    (the deployed weights and biases are then bit for bit those it trained with; its ConvTransposes stay:
    their weights were trained in that form)."""
    graph = model.graph
    normalized = normalize(model, config, read_back_prelus=True)  # qtool's own output: the PRelus it wrote as sums
    names = NameScope(graph)
    constant_reshape_targets(graph, names)  # what onnxruntime's ReshapeFusion does, which Q/DQ would prevent
    pads_into_convs(graph, default_opset(model), config.out_of_scope)  # what onnxruntime's PadFusion does, which Q/DQ would prevent
    pools = means_as_global_pools(graph, default_opset(model), names, config.out_of_scope)  # dynamo's pools
    neutral = neutral_ops_removed(graph, config.out_of_scope)  # what onnxruntime's NoopElimination does
    transposes = transposes_cancelled(graph, config.out_of_scope)  # what onnxruntime's transpose optimizer does
    layer_norms = layer_norms_fused(graph, default_opset(model), names, config.out_of_scope)  # tf2onnx's Keras norms
    multipliers = multipliers_as_depthwise(graph, names, config.out_of_scope)  # onnxruntime's depthwise kernel
    affine = fold_affine(graph, names, exclude=config.exclude)
    folds = fold_batch_norms(graph, names, exclude=config.exclude, float32=trained)
    folds.affine, folds.weight_expressions, folds.float16 = affine, normalized.weight_expressions, normalized.float16
    folds.global_pools, folds.neutral_ops, folds.multipliers = pools, neutral, multipliers
    folds.transposes, folds.layer_norms = transposes, layer_norms
    if not trained:
        folds.transposed_convs = convtransposes_as_convs(graph, config, names, default_opset(model))
    split_hard_swish(graph, config, names)
    return names, folds, plan_quantization(graph, config)


def prepare_eval(model: ir.Model, config: QuantConfig, label: str = "<model>") -> EvalGraph:
    """Strip a training graph (it deploys with the options it was trained for), raise the opset,
    fold and plan; ``model`` may be edited in place."""
    trained = strip_training_graph(model, label) if is_training_graph(model) else None
    warnings: list[str] = []
    if trained is not None:
        config, warnings = contract_config(config, trained.contract)
    opset_in, ir_in = default_opset(model), model.ir_version
    model = raise_opset(model, config)
    names, folds, plan = fold_and_plan(model, config, trained=trained is not None)
    return EvalGraph(model, config, names, folds, plan, trained, opset_in, ir_in, warnings)


def prepare_branch(model: ir.Model, config: QuantConfig) -> EvalGraph:
    """An If branch's model (``branches.extract_branch``) folded and planned in place: it has the enclosing
    model's opset, raised (or not) with it."""
    names, folds, plan = fold_and_plan(model, config)
    return EvalGraph(model, config, names, folds, plan, None, default_opset(model), model.ir_version)


CONTRACT_OPTIONS = ("weight_bits", "activation_bits", "symmetric", "per_channel", "scope", "exclude",
                    "symmetric_weights", "float_rnn", "round_mode")


def contract_config(config: QuantConfig, contract: dict) -> tuple[QuantConfig, list[str]]:
    """The options a training graph was written (and trained) with, from its contract.

    An option left at its default takes the recorded value (a W3A3 training graph deploys at
    W3A3, not at the default 8 bits); an option given with another value wins, with a warning
    (the trained ranges and weights belong to the recorded options). Returns ``(config, warnings)``.
    """
    recorded = contract.get("options") or {}
    default = QuantConfig()
    values, warnings = {}, []
    for key in CONTRACT_OPTIONS:
        given = getattr(config, key)
        if key not in recorded:
            values[key] = given
            continue
        want = frozenset(recorded[key] or ()) if key == "exclude" else recorded[key]
        if given != getattr(default, key) and given != want:
            show = (lambda v: sorted(v) if isinstance(v, frozenset) else v)
            warnings.append(f"the training graph was written with {key}={show(want)}; deploying with "
                            f"{key}={show(given)} as asked, which is not what was trained")
            values[key] = given
        else:
            values[key] = want
    deployment = {key: getattr(config, key) for key in ("standard_ops", "pack_int4", "int8_activations")}
    return QuantConfig(**values, **deployment), warnings


def encode_eval(prepared: EvalGraph, ranges: dict[str, tuple[float, float] | None] | None) -> EvalEncoding:
    """Write the plan into the model as Q/DQ with ``ranges`` (None: TF's default ranges)."""
    model = prepared.model
    trained = prepared.trained
    widen = frozenset(q["layer"] for q in (trained.contract.get("bias_quantizers", []) if trained else [])
                      if q.get("widen_weight"))
    encoding = encode_eval_graph(model.graph, prepared.plan, prepared.names, opset=default_opset(model),
                                 ranges=ranges, trained=trained is not None, widen_for_bias=widen)
    clamp_ir_version(model)
    return encoding
