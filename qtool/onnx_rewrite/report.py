"""What a rewrite did, as typed results: text for the terminal, a dict for ``--json``.

:class:`RewriteResult` (``rewrite_eval``) and :class:`TrainResult`
(``rewrite_train``) hold the typed pieces (the plan, the folds, the
encoding, the calibration); the summary dict is built only at the edge, by
``to_dict()`` (``.summary``).
"""

from __future__ import annotations

import math

import textwrap
from collections import Counter
from dataclasses import dataclass, field

import onnx_ir as ir

from qtool.config import QuantConfig, TrainSchedule
from qtool.model.layers import LAYER_OPS
from qtool.model.profile import op_summary_lines
from qtool.onnx_rewrite.eval_graph import EvalEncoding
from qtool.onnx_rewrite.eval_rewrite import EvalGraph
from qtool.onnx_rewrite.placement.plan import IN_SUBGRAPH
from qtool.onnx_rewrite.train_rewrite import TrainEncoded, TrainGraph


def _plural(n: int, word: str) -> str:
    if n == 1:
        return f"1 {word}"
    return f"{n} {word}" + ("es" if word.endswith(("s", "ch")) else "s")


def _first(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (" ..." if len(names) > n else "")


@dataclass
class Files:
    """Where a rewrite read and wrote."""

    input: str
    output: str | None
    in_place: bool = False
    external_data: str | None = None


@dataclass
class BranchResult:
    """One If branch: quantized as a model of its own (``result``), or left float (``reason``)."""

    node: str
    attribute: str
    layers: list[tuple[str, str]]  # (name, op) of its layer ops, for the report of a branch left float
    result: RewriteResult | None = None
    ranges: dict = field(default_factory=dict)  # its tensors' ranges (its own If branches' included)
    samples: int = 0  # calibration samples that took it
    reason: str | None = None  # why it stays float

    @property
    def where(self) -> str:
        return f"inside If '{self.node}' ({self.attribute})"

    def left_in_float(self) -> list[dict]:
        if self.result is None:  # float (or only calibrated, for a ranges file)
            return [{"node": name, "op": op, "reason": f"{self.where}: {self.reason}"} for name, op in self.layers]
        return [{**x, "reason": f"{self.where}: {x['reason']}"} for x in self.result.left_in_float()]

    def to_dict(self) -> dict:
        return {"node": self.node, "attribute": self.attribute, "quantized": self.result is not None,
                "samples": self.samples, "reason": self.reason,
                "counts": self.result.counts() if self.result is not None else None}


# the op types of the summary's "left in float" that onnxruntime's optimized graph keeps as float layer nodes
LISTED_LAYER_OPS = frozenset({*LAYER_OPS, "Attention", "MultiHeadAttention"})


@dataclass
class RewriteResult:
    """The rewritten model (an ``onnx_ir.Model``) and what was done to it."""

    model: ir.Model
    files: Files
    prepared: EvalGraph
    encoding: EvalEncoding
    calibration: object | None = None  # qtool.calibrate.CalibrationResult
    ranges_from: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    branches: list[BranchResult] = field(default_factory=list)  # the If branches that hold layer ops
    output_check: object | None = None  # qtool.simulate.output_check.OutputCheck: int8 vs float outputs
    latency: object | None = None  # qtool.simulate.latency.Latency: float and int8 timed (``latency_rounds``)

    @property
    def config(self) -> QuantConfig:
        return self.prepared.config

    @property
    def summary(self) -> dict:
        return self.to_dict()

    def left_in_float(self) -> list[dict]:
        """What runs in float, with the reason (an Add fused with its Relu into QLinearAdd does not)."""
        p, e = self.prepared, self.encoding
        handled = {name for b in self.branches for name, _ in b.layers}  # said by the branch, as it is now
        gelus = {name for g in e.fused_gelus for name in g["nodes"]}  # one com.microsoft.Gelu / FastGelu now
        plan = [x.to_dict() for x in p.plan.left_in_float
                if not _fused(x) and not (x.reason.endswith(IN_SUBGRAPH) and x.node in handled) and x.node not in gelus]
        return ([x.to_dict() for x in p.folds.skipped] + plan + [x.to_dict() for x in e.left_in_float]
                + [x for b in self.branches for x in b.left_in_float()])

    def in_onnxruntime(self) -> dict | None:
        """The layers onnxruntime's optimized graph of the written model runs in integer and in float kernels,
        against the layers this summary lists in float (None: not looked at: no output check, or a model too large
        to write its optimized graph)."""
        runtime = getattr(self.output_check, "runtime_layers", None)
        if runtime is None:
            return None
        listed = sum(1 for x in self.left_in_float() if x["op"] in LISTED_LAYER_OPS)
        return {**runtime.to_dict(), "float_layers_listed": listed}

    def runtime_warnings(self) -> list[str]:
        """A layer the summary counts as quantized that onnxruntime runs in float (the plan's prediction of
        onnxruntime's fusions was wrong for this model, and the summary must not call it quantized), or one it lists
        in float that onnxruntime runs in an integer kernel."""
        runtime = self.in_onnxruntime()
        if runtime is None:
            return []
        if len(runtime["float_layers"]) < runtime["float_layers_listed"]:
            fewer = runtime["float_layers_listed"] - len(runtime["float_layers"])
            why = ("with --standard-ops qtool does not read such a layer's input through a per-channel "
                   "DequantizeLinear, the form onnxruntime leaves float (docs/rewrite-eval.md, 'In onnxruntime')"
                   if self.config.standard_ops else
                   "Please report the model (docs/rewrite-eval.md, 'In onnxruntime')")
            return [f"onnxruntime runs {fewer} layer(s) in integer kernels that this summary lists in float "
                    f"({len(runtime['float_layers'])} float in its optimized graph, {runtime['float_layers_listed']} "
                    f"listed): it quantized them itself, so they do not compute what the summary says. {why}"]
        if len(runtime["float_layers"]) == runtime["float_layers_listed"]:
            return []
        listed = {x["node"] for x in self.left_in_float()}
        more = len(runtime["float_layers"]) - runtime["float_layers_listed"]
        names = [f"{x['node']} ({x['op']})" for x in runtime["float_layers"] if x["node"] not in listed][:5]
        return [f"onnxruntime runs {more} more layer(s) of the written model in float than this summary lists "
                f"({len(runtime['float_layers'])} in its optimized graph, {runtime['float_layers_listed']} listed"
                + (f"; there: {', '.join(names)}" if names else "") + "): they are counted as quantized but run a "
                f"float kernel on dequantized values. {self._runtime_reason()}"]

    def _runtime_reason(self) -> str:
        c = self.config
        if c.int8_activations:
            return ("--int8-activations does this: onnxruntime's x86 integer kernels take uint8 activations (the "
                    "default)")
        if c.pack_int4 and c.weight_bits <= 4:
            return "--pack-int4 does this: onnxruntime has no integer kernel for int4 weights (the default stores them in int8)"
        return ("qtool's placement missed an onnxruntime fusion on this model: please report it (docs/rewrite-eval.md, "
                "'In onnxruntime')")

    def other_float_ops(self) -> dict[str, int]:
        """The float ops that are no layer, by type, as the output has them (a fused GELU's parts as one
        ``Gelu``)."""
        ops = Counter(self.prepared.plan.other_ops)
        listed = {x.node for x in self.prepared.plan.left_in_float}  # counted there, not here
        for gelu in self.encoding.fused_gelus:
            ops.subtract(op for name, op in zip(gelu["nodes"], gelu["ops"]) if name not in listed)
            ops[gelu["op"]] += 1
        return {op: n for op, n in sorted(ops.items()) if n > 0}

    def counts(self) -> dict:
        plan, e, folds = self.prepared.plan, self.encoding, self.prepared.folds
        counts = {
            "batch_norms_folded": len(folds.folded),
            "batch_norms_not_folded": len(folds.skipped),
            **_affine_counts(folds),
            "layers_quantized": sum(len(w["layers"]) for w in e.weights),
            "weights_quantized": len(e.weights),
            "activations_quantized": len(e.activations),
            "propagated_input_quantizers": len(e.propagated),
            "biases_int32": len(e.biases),
            "lstms_dynamic": len(e.recurrent),
            "hard_sigmoids_integer": len(e.integer_gates),
            "scalar_operands_integer": len(e.scalar_operands),
            "conv_inputs_padded": len(e.padded_inputs),
            "depthwise_widened": len(e.padded_depthwise),
            "conv_outputs_widened": len(e.widened_outputs),
            "float_layers_kept_float": len(e.float_inputs_per_channel),
            "convs_on_space_to_depth": len(e.space_to_depth),
            "gates_tiled": len(e.tiled_gates),
            "pools_as_depthwise": len(e.depthwise_pools),
            "prelus_as_sums": sum(1 for x in e.prelu_sums if not x.get("existing")),
            "gelus_fused": sum(g["op"] == "Gelu" for g in e.fused_gelus),
            "fast_gelus_fused": sum(g["op"] == "FastGelu" for g in e.fused_gelus),
            "relus_on_their_grid": len(e.relus_on_grid),
            "residual_adds_as_sums": len(e.residual_sums),
            "linears_as_gemms": len(e.linear_gemms),
            "already_quantized_weights": sum(1 for p in plan.weights if p.exists),
            "already_quantized_activations": sum(1 for p in plan.activations if p.exists),
            "left_in_float": len(self.left_in_float()),
        }
        for branch in self.branches:  # the model's totals: the quantized If branches added in
            if branch.result is not None:
                for key, n in branch.result.counts().items():
                    if key != "left_in_float":  # already the merged list's length
                        counts[key] += n
        return counts

    def to_dict(self) -> dict:
        p, e = self.prepared, self.encoding
        opset_out = p.model.opset_imports.get("", p.opset_in)
        return {
            "input": self.files.input,
            "output": self.files.output,
            "in_place": bool(self.files.in_place),
            "opset": {"input": p.opset_in, "output": opset_out},
            "ir_version": {"input": p.ir_in, "output": p.model.ir_version},
            "options": self.config.to_dict(),
            "counts": self.counts(),
            "batch_norms_folded": [f.to_dict() for f in p.folds.folded],
            **_affine_lists(p.folds),
            "weights": e.weights,
            "activations": e.activations,
            "propagated_inputs": e.propagated,
            "biases": e.biases,
            "recurrent": e.recurrent,
            "integer_gates": e.integer_gates,
            "scalar_operands": e.scalar_operands,
            "padded_inputs": e.padded_inputs,
            "padded_depthwise": e.padded_depthwise,
            "widened_outputs": e.widened_outputs,
            "float_layers_kept_float": e.float_inputs_per_channel,
            "space_to_depth": e.space_to_depth,
            "tiled_gates": e.tiled_gates,
            "depthwise_pools": e.depthwise_pools,
            "prelu_sums": e.prelu_sums,
            "fused_gelus": e.fused_gelus,
            "relus_on_grid": e.relus_on_grid,
            "residual_sums": e.residual_sums,
            "linear_gemms": e.linear_gemms,
            "left_in_float": self.left_in_float(),
            "other_float_ops": self.other_float_ops(),
            "float_ops": [x.to_dict() for x in p.plan.float_ops],
            "calibration": self.calibration.to_dict() if self.calibration is not None else None,
            "changed": bool(p.folds.folded or _affine_counts(p.folds)["affine_folded"] or p.folds.weight_expressions
                            or p.folds.float16
                            or e.weights or e.activations or e.propagated or e.biases
                            or e.recurrent or p.opset_in != opset_out),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "external_data": self.files.external_data,
            **({"ranges_from": self.ranges_from} if self.ranges_from else {}),
            "timings": dict(self.timings),
            **({"if_branches": [b.to_dict() for b in self.branches]} if self.branches else {}),
            **({"output_check": self.output_check.to_dict()} if self.output_check is not None else {}),
            **({"in_onnxruntime": runtime} if (runtime := self.in_onnxruntime()) is not None else {}),
            **({"latency": self.latency.to_dict()} if self.latency is not None else {}),
        }

    def format_text(self) -> str:
        return format_summary(self.to_dict())


def _fused(x) -> bool:
    """TF's "not quantized: it feeds Relu" entries: the op runs in the activation's integer kernel."""
    return x.reason.endswith("(fused at inference)")


def eval_messages(prepared: EvalGraph, encoding: EvalEncoding, ranges: dict | None, calibration,
                  ignored_arrays: list[str], branches: list[BranchResult] = ()) -> tuple[list[str], list[str]]:
    """The warnings and notes of an eval rewrite (``calibration``: its result, which says what is wrong
    with the data; None when the ranges came from elsewhere), its quantized If branches' included."""
    warnings: list[str] = list(prepared.warnings)
    notes: list[str] = []
    if prepared.plan.new_activations() and ranges is None:
        warnings.append(
            "no calibration data: activation ranges are TensorFlow's defaults ((-6, 6), and (0, 6) "
            "after Relu/Clip); the model needs calibration (--data) to be accurate"
        )
    if calibration is not None:
        warnings.extend(calibration.warnings())
    else:  # a ranges file with entries that have no range
        missing = [name for name, r in (ranges or {}).items() if r is None]
        if missing:
            warnings.append(f"{len(missing)} tensor(s) have no range in the ranges file and use the default "
                            f"range: {_first(missing)}")
    if ignored_arrays:
        notes.append(f"calibration data: ignored array(s) not named like a model input: {', '.join(ignored_arrays)}")
    if encoding.activations and not prepared.config.half_to_even:
        notes.append(
            "QuantizeLinear rounds activations half to even at run time; TensorFlow's FakeQuant rounds "
            "half up (exact ties differ by one step; --round-mode half_to_even rounds as QuantizeLinear). Weights are "
            "rounded offline, exactly as TensorFlow."
        )
    if encoding.recurrent:
        notes.append("LSTMs run as onnxruntime's com.microsoft.DynamicQuantizeLSTM: int8 weights, and the kernel "
                     "quantizes its input and hidden state at run time (per matrix, uint8), outside the "
                     "calibrated ranges; --float-rnn keeps them float.")
    config = prepared.config
    packed = sum(w["dtype"] == "int4" for w in encoding.weights)
    if packed:
        notes.append(f"{packed} weight(s) packed as int4 (--pack-int4): onnxruntime has no integer kernel for int4 "
                     "weights and runs those layers in float, slower than the float model on CPU")
    if config.int8_activations and encoding.activations:
        notes.append("activations stored as int8 (--int8-activations): onnxruntime's x86 kernels leave many "
                     "int8-activation Conv/MatMul in float")
    if config.per_channel and any(w["op"] == "ConvTranspose" for w in encoding.weights):
        notes.append("ConvTranspose weights are quantized per channel along axis 1 (Cout/group ranges).")
    notes.extend(encoding.notes)
    plan = prepared.plan
    warnings.extend(_log_warning(*found) for found in logs_of_quantized(prepared.model.graph, plan))
    done = [b for b in branches if b.result is not None]
    for branch in done:
        warnings += [f"{branch.where}: {w}" for w in branch.result.warnings]
        notes += [n for n in branch.result.notes if n not in notes]
    inside = [x for x in plan.left_in_float if x.reason.endswith(IN_SUBGRAPH)]
    if inside and not plan.weights and not plan.recurrent and not done:  # silero-vad's: all its work in one If
        why = "; ".join(dict.fromkeys(f"{b.where}: {b.reason}" for b in branches)) or \
            "Loop/Scan bodies are not rewritten"
        warnings.append(f"no layer quantized: all {len(inside)} layer op(s) are inside If/Loop/Scan bodies "
                        f"({why}); the output computes the float model")
    if plan.is_empty() and any(p.exists for p in plan.weights + plan.activations) and not prepared.folds.folded:
        notes.append("the model is already quantized: nothing to do")
        asked = {k: v for k, v in prepared.config.to_dict().items() if v != QuantConfig().to_dict()[k]}
        if asked:  # options that would change what is already written are not applied: say so
            warnings.append("the model is already quantized by qtool, so these options change nothing: "
                            + ", ".join(f"{k}={v}" for k, v in asked.items()) + "; rewrite the float model")
    return warnings, notes


LOG_OPS = ("Log",)


def logs_of_quantized(graph: ir.Graph, plan) -> list[tuple[ir.Node, ir.Value, list[ir.Node]]]:
    """The Log nodes whose input is computed from a quantized activation: each with the quantized tensor
    nearest to it and the layers it is computed by (nearest first)."""
    quantized = {id(p.value) for p in plan.new_activations()}
    layers = {id(m.layer) for m in plan.layers}
    found = []
    for node in graph:
        if node.domain != "" or node.op_type not in LOG_OPS or node.inputs[0] is None:
            continue
        seen, frontier, nearest, on_way = set(), [node.inputs[0]], None, []
        while frontier:  # breadth first: the nearest quantized tensor first
            step = []
            for v in frontier:
                if id(v) in seen:
                    continue
                seen.add(id(v))
                nearest = nearest or (v if id(v) in quantized else None)
                producer = v.producer()
                if producer is not None:
                    on_way += [producer] if id(producer) in layers and producer not in on_way else []
                    step += [x for x in producer.inputs if x is not None]
            frontier = step
        if nearest is not None:
            found.append((node, nearest, on_way))
    return found


def _log_warning(log: ir.Node, value: ir.Value, layers: list[ir.Node]) -> str:
    names = [f"--exclude {n.name}" for n in layers[:4]] + ([f"... ({len(layers)} layers)"] if len(layers) > 4 else [])
    advice = f" ({' '.join(names)})" if layers else ""
    return (f"{log.op_type} '{log.name}' takes the log of values computed from the quantized '{value.name}': an "
            "8-bit grid spans about 48 dB, so small values (a quiet power spectrum) round to 0 and their log to "
            "its floor (openWakeWord's log-mel features of quiet audio: 100 dB below float's); "
            f"what feeds a log-power is better left in float{advice}")


def format_summary(s: dict) -> str:
    c = s["counts"]
    o = s["options"]
    lines = [f"qtool rewrite-eval: {s['input']} -> {s['output'] or '(not written)'}"]
    if s["opset"]["input"] != s["opset"]["output"]:
        lines.append(f"  opset                  {s['opset']['input']} -> {s['opset']['output']}")
    folded = c["batch_norms_folded"]
    lines.append(f"  batch norms folded     {folded} of {folded + c['batch_norms_not_folded']}")
    lines.extend(_affine_lines(c))
    mode = "per-channel" if o["per_channel"] else "per-tensor"
    sym = ", symmetric" if o["symmetric"] else ""
    lines.append(
        f"  layers quantized       {c['layers_quantized']}  "
        f"({_plural(c['weights_quantized'], 'weight tensor')}, {o['weight_bits']}-bit {mode}{sym})"
    )
    lines.append(f"  activations quantized  {c['activations_quantized']}  ({o['activation_bits']}-bit, "
                 f"{_ranges_source(s)})")
    if c.get("lstms_dynamic"):
        lines.append(f"  LSTMs                  {c['lstms_dynamic']}  (DynamicQuantizeLSTM: {o['weight_bits']}-bit "
                     "weights, activations quantized at run time)")
    extra = []
    if c["propagated_input_quantizers"]:
        extra.append(_plural(c["propagated_input_quantizers"], "quantizer") + " carried through shape ops")
    if c["biases_int32"]:
        extra.append(_plural(c["biases_int32"], "int32 bias"))
    if c.get("hard_sigmoids_integer"):
        extra.append(f"{c['hard_sigmoids_integer']} HardSwish/HardSigmoid gates as integer Add")
    if c.get("scalar_operands_integer"):
        extra.append(_plural(c["scalar_operands_integer"], "scalar constant") + " of Add/Mul read as integers")
    if c.get("conv_inputs_padded"):
        extra.append(_plural(c["conv_inputs_padded"], "Conv input") + " padded to 4k channels")
    if c.get("depthwise_widened"):
        extra.append(_plural(c["depthwise_widened"], "depthwise Conv") + " widened to 16k channels")
    if c.get("conv_outputs_widened"):
        extra.append(_plural(c["conv_outputs_widened"], "narrow Conv") + " widened to 16 / 8k output channels")
    if c.get("float_layers_kept_float"):
        extra.append(_plural(c["float_layers_kept_float"], "float layer") + " read through a per-channel "
                     "DequantizeLinear (else onnxruntime quantizes its weight)")
    if c.get("prelus_as_sums"):
        extra.append(_plural(c["prelus_as_sums"], "PRelu") + " as Relu + Min * slope")
    if c.get("gelus_fused"):
        extra.append(_plural(c["gelus_fused"], "GELU") + " written out as com.microsoft.Gelu")
    if c.get("fast_gelus_fused"):
        extra.append(_plural(c["fast_gelus_fused"], "tanh GELU") + " written out as com.microsoft.FastGelu")
    if c.get("relus_on_their_grid"):
        extra.append(_plural(c["relus_on_their_grid"], "Relu") + " as LeakyRelu(alpha=0) on the output grid")
    if c.get("residual_adds_as_sums"):
        extra.append(_plural(c["residual_adds_as_sums"], "Add") + " before a LayerNorm as Sum")
    if c.get("linears_as_gemms"):
        extra.append(_plural(c["linears_as_gemms"], "MatMul + bias Add") + " as Reshape -> Gemm -> Reshape")
    if extra:
        lines.append(f"  for onnxruntime        {', '.join(extra)}")
    if c["already_quantized_weights"] or c["already_quantized_activations"]:
        lines.append(
            f"  already quantized      {c['already_quantized_weights']} weights, "
            f"{c['already_quantized_activations']} activations (left as they are)"
        )
    lines.extend(_left_lines(s["left_in_float"]))
    if s["other_float_ops"]:
        ops = ", ".join(f"{op} x{n}" for op, n in s["other_float_ops"].items())
        wrapped = textwrap.wrap(ops, WIDTH - 25) or [""]
        lines.append(f"  ops in float           {wrapped[0]}")
        lines.extend(f"{'':25}{more}" for more in wrapped[1:])
    lines.extend(_check_lines(s.get("output_check")))
    lines.extend(_runtime_lines(s.get("in_onnxruntime")))
    lines.extend(_latency_lines(s.get("latency")))
    return "\n".join(lines + _tail_lines(s))


def _latency_lines(timed: dict | None) -> list[str]:
    """The float and the written model timed in onnxruntime, and where their time goes (qtool.simulate.latency)."""
    lines = [f"  latency                {m['x_float']:.2f}x float ({m['ms']:.3g} ms against {timed['float_ms']:.3g} ms; "
             f"one thread, batch 1, median of {timed['rounds']} rounds)" for m in (timed or {}).get("models", [])
             if m["x_float"] is not None]
    by_op = (timed or {}).get("by_op", {}) if lines else {}
    for name, label in (("quantized", "int8"), ("float", "float")):
        if by_op.get(name):
            wrapped = op_summary_lines(by_op[name], WIDTH - 25)
            lines.append(f"    {label + ' time by op':21}{wrapped[0]}")
            lines.extend(f"{'':25}{more}" for more in wrapped[1:])
    return lines


def _runtime_lines(runtime: dict | None) -> list[str]:
    """The layers of onnxruntime's optimized graph of the written model, by kernel kind (RewriteResult.in_onnxruntime)."""
    if runtime is None:
        return []
    floats, listed = len(runtime["float_layers"]), runtime["float_layers_listed"]
    where = ("none in float" if not floats and not listed else f"{floats} in float (listed above)"
             if floats == listed else f"{floats} in float: {floats - listed} more than listed above (see the warning)"
             if floats > listed else f"{floats} in float: {listed - floats} fewer than listed above (see the warning)")
    return [f"  in onnxruntime         {runtime['integer_layers']} layer(s) in integer kernels, {where}"]


def _check_lines(check: dict | None) -> list[str]:
    """The int8 model's outputs against the float model's (qtool.simulate.output_check)."""
    scored = {name: db for name, db in (check or {}).get("sqnr_db", {}).items()}
    if not scored:
        silent = (check or {}).get("no_signal")
        return [f"  output vs float        no signal: {', '.join(repr(n) for n in silent)} zero or not finite on "
                f"{check['samples']} calibration sample(s)"] if silent else []
    def text(db):
        # rounded down: SQNR 9.96 dB warned about as below 10 dB must not read "10.0 dB" here
        return "exact" if db is None else f"{db} dB" if db == "-inf" else f"{math.floor(db * 10) / 10:.1f} dB"
    worst = min(scored, key=lambda name: float("inf") if scored[name] is None else float(scored[name]))
    which = f"'{worst}'" if len(scored) == 1 else f"worst of {len(scored)} outputs: '{worst}'"
    lines = [f"  output vs float        SQNR {text(scored[worst])} on {check['samples']} calibration "
             f"sample(s) ({which})"]
    tried = check.get("tried", {})
    if len(tried) > 1:  # --calibration-method auto
        each = [f"{m} {text(db)}{' (kept)' if m == check['method'] else ''}" for m, db in tried.items()]
        on = check.get("tried_calibrated_on")
        lines.append(f"  calibration methods    {', '.join(each)}  (the worst output's SQNR with each"
                     + (f", calibrated on the other {on} samples)" if on else ")"))
    return lines


def _affine_counts(folds) -> dict:
    """The length of each of :func:`_affine_lists`, and the float16 values made float32."""
    return {**{key: len(items) for key, items in _affine_lists(folds).items()},
            "float16_as_float32": folds.float16 if folds is not None else 0}


def _affine_lists(folds) -> dict:
    affine = folds.affine if folds is not None else None
    return {"affine_folded": [f.to_dict() for f in affine.folded] if affine else [],
            "affine_not_folded": [x.to_dict() for x in affine.skipped] if affine else [],
            "weight_expressions_folded": list(folds.weight_expressions) if folds is not None else [],
            "convtransposes_as_convs": list(folds.transposed_convs) if folds is not None else [],
            "means_as_global_pools": list(folds.global_pools) if folds is not None else [],
            "neutral_ops_removed": list(folds.neutral_ops) if folds is not None else [],
            "depthwise_multipliers": list(folds.multipliers) if folds is not None else [],
            "transposes_cancelled": list(folds.transposes) if folds is not None else [],
            "layer_norms_fused": list(folds.layer_norms) if folds is not None else []}


# the eval rewrites before placement that the summary shows when they did anything: (count key, label, what it is)
_REWRITE_LINES = (
    ("float16_as_float32", "float16 -> float32", " weights and constants  (a float16 body between float32 inputs "
     "and outputs)"),
    ("weight_expressions_folded", "weights folded", "  (computed in the graph from constants by Slice/Concat/...: "
     "now initializers)"),
    ("convtransposes_as_convs", "ConvTranspose as Conv", "  (+ DepthToSpace where strided: onnxruntime has no integer "
     "ConvTranspose)"),
    ("means_as_global_pools", "ReduceMean as pool", "  (a mean over the spatial axes as GlobalAveragePool: onnxruntime "
     "has no integer ReduceMean)"),
    ("neutral_ops_removed", "x*1, x+0 removed", "  (a Mul by one / Add of zero: onnxruntime drops it from the float "
     "model)"),
    ("depthwise_multipliers", "depthwise x m as x 1", "  (a depthwise Conv with a channel multiplier as Gather + "
     "depthwise Conv: onnxruntime runs it group by group)"),
    ("transposes_cancelled", "Transpose pairs gone", "  (two Transposes that cancel around elementwise ops: onnxruntime "
     "drops them from the float model)"),
    ("layer_norms_fused", "LayerNorms as one op", "  (tf2onnx's written-out Keras LayerNormalization: its broadcasts "
     "ran per pixel in onnxruntime's NHWC integer graph)"),
)


def _affine_lines(c: dict) -> list[str]:
    """The constant Mul/Add after a layer folded into it (fold_affine): shown when there were any."""
    folded, skipped = c.get("affine_folded", 0), c.get("affine_not_folded", 0)
    lines = []
    for key, label, what in _REWRITE_LINES:
        if c.get(key):
            lines.append(f"  {label:22} {c[key]}{what}")
    if folded or skipped:
        lines.append(f"  Mul/Add folded         {folded} of {folded + skipped}  (a constant scale/shift after a layer, "
                     "into its weight and bias)")
    return lines


def _ranges_source(s: dict) -> str:
    calib = s.get("calibration")
    if calib:
        method = f"{calib['method']}: {calib['chosen']}" if calib.get("chosen") else calib["method"]
        return f"calibrated: {calib['samples']} samples, {_plural(calib['batches'], 'batch')}, {method}"
    taken = [b for b in s.get("if_branches", []) if b["quantized"]]
    if taken and not s.get("ranges_from"):
        samples = ", ".join(str(b["samples"]) for b in taken)
        return f"calibrated in If branches: {samples} samples"
    if s.get("ranges_from"):
        return f"ranges from {s['ranges_from']}"
    if s["counts"]["activations_quantized"]:
        return "TensorFlow's default ranges: NOT CALIBRATED"
    return "none new"


WIDTH = 80  # terminal tables fit 80 columns


def middle(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters with an ellipsis in the middle (both ends say the most)."""
    if len(text) <= width:
        return text
    keep = width - 1
    return text[: (keep + 1) // 2] + "…" + text[len(text) - keep // 2:]


def _left_lines(left: list[dict]) -> list[str]:
    if not left:
        return []
    lines = [f"  left in float          {len(left)}"]
    labels = [middle(f"{x['node']} ({x['op']})", 34) for x in left]
    width = max(len(label) for label in labels)
    for label, x in zip(labels, left):
        wrapped = textwrap.wrap(x["reason"], WIDTH - width - 6) or [""]
        lines.append(f"    {label:<{width}}  {wrapped[0]}")
        lines.extend(f"    {'':<{width}}  {more}" for more in wrapped[1:])
    return lines


def _tail_lines(s: dict) -> list[str]:
    lines = []
    if s.get("external_data"):
        lines.append(f"  external data          {s['external_data']}")
    lines.extend(f"  note: {note}" for note in s["notes"])
    return lines


@dataclass
class TrainResult:
    """The training graph (an ``onnx_ir.Model``) and what was done; ``prepared``/``encoded`` are
    None when the input already was a qtool training graph (``contract`` is then its own)."""

    model: ir.Model
    files: Files
    config: QuantConfig
    schedule: TrainSchedule
    contract: dict
    prepared: TrainGraph | None = None
    encoded: TrainEncoded | None = None
    calibration: object | None = None  # qtool.calibrate.CalibrationResult
    ignored_arrays: list[str] = field(default_factory=list)
    float_branches: list[BranchResult] = field(default_factory=list)  # If branches left float, and why
    trained_branches: list[str] = field(default_factory=list)  # "inside If '<name>' (<branch>)", encoded

    @property
    def summary(self) -> dict:
        return self.to_dict()

    @property
    def warnings(self) -> list[str]:
        return self.messages()[0]

    def options(self) -> dict:
        return {**self.config.to_dict(), "quant_delay": self.schedule.quant_delay,
                "freeze_bn_delay": self.schedule.freeze_bn_delay}

    def messages(self) -> tuple[list[str], list[str]]:
        if self.encoded is None:
            return [], self._already_notes()
        warnings, notes = [], []
        acts = self.encoded.encoding.activations
        defaults = [a["tensor"] for a in acts if a["range_source"] == "default"]
        if defaults and self.calibration is None:
            notes.append("no calibration data: activation ranges start at TensorFlow's defaults ((-6, 6), and (0, 6) "
                         "after Relu/Clip) and move by the EMA (decay 0.999) during training")
        if self.calibration is not None:  # what is wrong with the data, by tensor
            warnings.extend(self.calibration.warnings())
        if self.ignored_arrays:
            notes.append("calibration data: ignored array(s) not named like a model input: "
                         + ", ".join(self.ignored_arrays))
        p = self.prepared
        inside = [x for x in p.plan.left_in_float if x.reason.endswith(IN_SUBGRAPH)
                  and not any(x.reason.startswith(where) for where in self.trained_branches)]
        if inside:  # Loop/Scan bodies, and If branches no calibration sample took
            why = "; ".join(f"{b.where}: {b.reason}" for b in self.float_branches)
            warnings.append(f"{len(inside)} layer op(s) inside If/Loop/Scan bodies stay float in the training graph"
                            + (f" ({why})" if why else "") + "; rewrite-eval --data quantizes If branches "
                            "post-training")
        widened = [b["layer"] for b in self.encoded.encoding.biases if b.get("widen_weight")]
        if widened:
            notes.append("weight range widened every step so that the bias fits int32 (a channel of tiny weights "
                         "beside a large bias, as rewrite-eval widens it): " + ", ".join(widened))
        if self.trained_branches:
            notes.append("If branches quantized for training as models of their own (their state in the graph): "
                         + ", ".join(self.trained_branches))
        opset_out = self.model.opset_imports.get("", p.opset_in)
        if p.opset_in != opset_out:
            notes.append(f"opset raised from {p.opset_in} to {opset_out} (the qtool::FakeQuant function body needs 13)")
        return warnings, notes

    def _left_in_float(self) -> list[dict]:
        """What stays float in the training graph, with the reason: a layer of an If branch encoded for
        training is not (it is quantized there), one of a branch left float says the branch's reason."""
        branch_reason = {b.where: b.reason for b in self.float_branches}
        left = []
        for x in self.encoded.left_in_float:
            where = x["reason"].split(": ", 1)[0]
            if x["reason"].endswith("(fused at inference)") or where in self.trained_branches:
                continue
            reason = branch_reason.get(where) if x["reason"].endswith(IN_SUBGRAPH) else None
            left.append({**x, "reason": f"{where}: {reason}"} if reason else x)
        return left

    def _already_notes(self) -> list[str]:
        notes = ["the model is already a qtool training graph: nothing to do (not rewritten twice)"]
        recorded = self.contract.get("options", {})
        differ = [k for k, v in self.options().items() if k in recorded and recorded[k] != v]
        if differ:
            notes.append("it was rewritten with other options (" + ", ".join(
                f"{k}={recorded[k]!r}" for k in differ) + "); rewrite the float model to change them")
        return notes

    def counts(self) -> dict:
        contract = self.contract
        if self.encoded is None:
            left, weights, acts, folds = [], [], [], []
            affine = _affine_counts(None)
        else:
            affine = _affine_counts(self.prepared.eval_folds)
            left = self._left_in_float()
            folds = self.encoded.folds
            weights, acts = self.encoded.encoding.weights, self.encoded.encoding.activations
        return {
            "batch_norms_folded": len(folds),
            "batch_norms_not_folded": sum(1 for x in left if x["op"] == "BatchNormalization"),
            **affine,
            "layers_quantized": sum(len(w["layers"]) for w in weights),
            "weights_quantized": len(weights),
            "activations_quantized": len(acts),
            "state_tensors": len(contract.get("state", {})),
            "parameters": len(contract.get("parameters", [])),
            "left_in_float": len(left),
        }

    def to_dict(self) -> dict:
        warnings, notes = self.messages()
        e = self.encoded
        opset_in = self.prepared.opset_in if self.prepared else self.model.opset_imports.get("", 0)
        ir_in = self.prepared.ir_in if self.prepared else self.model.ir_version
        return {
            "input": self.files.input,
            "output": self.files.output,
            "in_place": bool(self.files.in_place),
            "opset": {"input": opset_in, "output": self.model.opset_imports.get("", opset_in)},
            "ir_version": {"input": ir_in, "output": self.model.ir_version},
            "options": self.options() if e is not None else (self.contract.get("options") or self.options()),
            "already_training_graph": e is None,
            "counts": self.counts(),
            "batch_norms_folded": [] if e is None else [
                {"batch_norm": f.batch_norm, "layer": f.layer.name, "op": f.layer.op_type, "state": f.state}
                for f in e.folds],
            **_affine_lists(self.prepared.eval_folds if e is not None else None),
            "weights": [] if e is None else e.encoding.weights,
            "activations": [] if e is None else e.encoding.activations,
            "left_in_float": [] if e is None else self._left_in_float(),
            **({} if e is None else {"other_float_ops": dict(sorted(self.prepared.plan.other_ops.items()))}),
            "step_input": self.contract.get("step_input"),
            "state": self.contract.get("state", {}),
            "calibration": self.calibration.to_dict() if self.calibration is not None else None,
            "changed": e is not None,
            "warnings": warnings,
            "notes": notes,
            "external_data": self.files.external_data,
        }

    def format_text(self) -> str:
        return format_train_summary(self.to_dict())


def format_train_summary(s: dict) -> str:
    c = s["counts"]
    o = s["options"]
    lines = [f"qtool rewrite-train: {s['input']} -> {s['output'] or '(not written)'}"]
    if s.get("already_training_graph"):
        lines.append(f"  state tensors          {c['state_tensors']} (step input '{s['step_input']}')")
        lines.extend(f"  {note}" for note in s["notes"])  # the answer, not advice: always shown
        return "\n".join(lines)
    if s["opset"]["input"] != s["opset"]["output"]:
        lines.append(f"  opset                  {s['opset']['input']} -> {s['opset']['output']}")
    total_bn = c["batch_norms_folded"] + c["batch_norms_not_folded"]
    freeze = o["freeze_bn_delay"]
    lines.append(f"  batch norms folded     {c['batch_norms_folded']} of {total_bn}  (training fold, "
                 + (f"frozen from step {freeze})" if freeze is not None else "never frozen)"))
    lines.extend(_affine_lines(c))
    mode = "per-channel" if o["per_channel"] else "per-tensor"
    sym = ", symmetric" if o["symmetric"] else ""
    lines.append(f"  layers quantized       {c['layers_quantized']}  ({c['weights_quantized']} weight tensor(s), "
                 f"{o['weight_bits']}-bit {mode}{sym}, ranges recomputed every step)")
    calib = s.get("calibration")
    in_branches = any(a["range_source"] == "calibration" for a in s["activations"])  # If branches' own calibration
    where = (f"initial ranges calibrated: {calib['samples']} samples, {calib['method']}" if calib
             else "initial ranges calibrated in If branches" if in_branches else "initial ranges: TensorFlow's defaults")
    lines.append(f"  activations quantized  {c['activations_quantized']}  ({o['activation_bits']}-bit, EMA ranges, {where})")
    lines.append(f"  quant delay            {o['quant_delay']} step(s)")
    lines.append(f"  state tensors          {c['state_tensors']}  (fed by '{s['step_input']}' loop, "
                 f"outputs '<state>:updated'), {c['parameters']} trainable parameters")
    lines.extend(_left_lines(s["left_in_float"]))
    return "\n".join(lines + _tail_lines(s))
