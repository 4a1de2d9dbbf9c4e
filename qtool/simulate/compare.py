"""The comparison of one quantized model with the float model: what to read, and the streaming sums.

:func:`plan_model` reads the quantized graph (its quantizers, their float
counterparts, its weights against the folded float weights) and prepares
the sessions; :meth:`ModelAcc.update` adds one batch to the float64 sums of
the metric kernels; :meth:`ModelAcc.result` turns the sums into a
:class:`~qtool.simulate.result.ModelResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qtool.errors import QtoolError
from qtool.kernels import metrics as m
from qtool.model.float16 import float16_as_float32, same_type_casts_as_identities
from qtool.model.graph import remove_identities
from qtool.model.names import NameScope, name_unnamed_nodes
from qtool.onnx_rewrite.fold_affine import fold_affine
from qtool.onnx_rewrite.fold_batch_norms import fold_batch_norms
from qtool.simulate import graph as g
from qtool.simulate.result import (
    ActivationError,
    ErrorNumbers,
    Histogram,
    LayerSensitivity,
    ModelResult,
    Unmatched,
    WeightError,
    value_ranges,
    worst_first,
)
from qtool.simulate.session import Runner
from qtool.simulate.whatif import QuantizedModel

HIST_BINS = 64
HIST_MARGIN = 0.25  # histogram range: the quantizer's range widened by this fraction on each side


@dataclass(frozen=True)
class ClassLayout:
    """How a samples-first output holds classes: ``classes`` values along ``axis`` (None: all of a
    sample's values flattened, one top-1 per sample) at ``positions`` places per sample (frames,
    pixels, tokens). ``classes == 1``: one value per sample, no top-1; ``classes == 0`` (and
    ``positions == 0``): several axes and no class axis given, no top-1 either."""

    classes: int
    positions: int = 1
    axis: int | None = None

    @property
    def has_top1(self) -> bool:
        return self.classes > 1

    def rows(self, out: np.ndarray) -> np.ndarray:
        """``out`` as one row of classes per sample or position (samples first then positions)."""
        if self.axis is None:
            return out
        return np.ascontiguousarray(np.moveaxis(out, self.axis, -1)).reshape(-1, self.classes)

    def top1(self, out: np.ndarray) -> np.ndarray:
        """The top-1 class of every position, samples first then positions (flat)."""
        return m.argmax_rows(self.rows(out))


def class_layout(out: np.ndarray, raw_ndim: int, batch_axis: int | None, class_axis: int | None,
                 output: str) -> ClassLayout:
    """The :class:`ClassLayout` of ``out`` (samples first); ``class_axis`` counts the axes of the output
    as the model returns it (``raw_ndim`` axes, samples on ``batch_axis``)."""
    n = len(out)
    per_sample = out.size // n if n else 1
    if class_axis is None:
        spread = [d for d in out.shape[1:] if d != 1]
        return ClassLayout(per_sample) if len(spread) <= 1 else ClassLayout(0, positions=0)
    if not -raw_ndim <= class_axis < raw_ndim:
        raise QtoolError(f"--class-axis {class_axis}: output {output!r} has {raw_ndim} axes")
    c = class_axis % raw_ndim
    if batch_axis is None:  # a samples axis was put in front
        axis = c + 1
    else:
        b = batch_axis % raw_ndim
        if c == b:
            raise QtoolError(f"--class-axis {class_axis} is the samples axis of output {output!r}")
        axis = c + 1 if c < b else c  # where it is once the samples axis is moved first
    classes = out.shape[axis]
    return ClassLayout(classes, per_sample // classes if classes else 0, axis)


@dataclass
class Batch:
    """What every model of one batch is compared with: the float model's output and tensors."""

    number: int
    feed: dict[str, np.ndarray]
    float_out: np.ndarray  # samples first
    float_top: np.ndarray | None  # top-1 per sample or position (None without a top-1)
    labels: np.ndarray | None
    layout: ClassLayout
    float_values: dict[str, np.ndarray]
    batch_axis: int | None


@dataclass
class TensorAcc:
    quantizer: g.ActivationQuantizer
    read: str  # the quantized model's tensor that is read
    layer: str | None
    stats: np.ndarray = field(default_factory=m.empty_stats)
    hist: np.ndarray | None = None
    hist_range: tuple[float, float] | None = None
    problem: str | None = None

    def update(self, ref: np.ndarray | None, test: np.ndarray | None) -> None:
        if self.problem:
            return
        q = self.quantizer
        if ref is None or test is None:
            self.problem = "tensor not produced by onnxruntime"
            return
        if ref.size != test.size:
            self.problem = f"float tensor has shape {list(ref.shape)}, the quantized one {list(test.shape)}"
            return
        if q.bound is not None:  # what its readers see: beyond the bound they saturate
            ref = np.clip(ref, np.float32(q.bound[0]), np.float32(q.bound[1]))
        if q.reads_codes and self.read == q.codes.name:
            part = m.pair_stats(ref, test, q.scale, q.zero_point, q.clips_beyond)
        else:
            part = m.pair_stats(ref, test, None, 0, q.clips_beyond)
        m.combine(self.stats, part)
        if self.hist is not None:
            m.histogram_update(ref, self.hist_range[0], self.hist_range[1], self.hist)

    def result(self) -> ActivationError:
        q = self.quantizer
        base = dict(quantizer=q.name, tensor=q.float_value.name, float_tensor=q.counterpart, matched_by=q.how,
                    layer=self.layer, quantizer_range=q.representable, readers_saturate=q.bound)
        if self.problem:
            return ActivationError(**base, problem=self.problem)
        float_range, quantized_range = value_ranges(self.stats)
        clipped = {}
        if q.representable is not None and self.stats[m.COUNT] + self.stats[m.NONFINITE]:
            clipped = dict(clipped_low=int(self.stats[m.CLIP_LOW]), clipped_high=int(self.stats[m.CLIP_HIGH]))
        hist = None
        if self.hist is not None:
            hist = Histogram(self.hist_range, self.hist[:-2].tolist(), int(self.hist[-2]), int(self.hist[-1]))
        return ActivationError(**base, error=ErrorNumbers.from_stats(self.stats), float_range=float_range,
                               quantized_range=quantized_range, histogram=hist, **clipped)


def samples_first(out: np.ndarray, axis: int | None, n: int, label: str, output: str) -> np.ndarray:
    """``out`` with its samples axis first (``axis`` None: an output of one sample with no samples axis, which
    gets one); a clear error when it does not hold the batch's samples."""
    out = np.asarray(out)
    if axis is None:
        if n != 1:
            raise QtoolError(f"{label} output {output!r} has no samples axis (--batch-axis none): it holds one "
                             f"sample, but the batch has {n}; run with --batch-size 1")
        return out[None]
    if out.ndim == 0 or not -out.ndim <= axis < out.ndim:
        raise QtoolError(f"{label} output {output!r} has shape {list(out.shape)}: it has no batch axis {axis} "
                         "(name the samples axis with --batch-axis)")
    if out.shape[axis] != n:
        hint = (" (name the samples axis with --batch-axis OUTPUT=AXIS, or OUTPUT=none for an output that holds "
                "one sample and has no samples axis)" if axis == 0 else "")
        raise QtoolError(f"{label} output {output!r} has shape {list(out.shape)}: expected the {n} samples of "
                         f"the batch on axis {axis}{hint}")
    return np.ascontiguousarray(np.moveaxis(out, axis, 0)) if axis % out.ndim else out


@dataclass
class ModelAcc:
    """The running sums of one model (or of one single-layer model for sensitivity)."""

    name: str
    runner: Runner
    tensors: list[TensorAcc] = field(default_factory=list)
    stats: np.ndarray = field(default_factory=m.empty_stats)
    correct: int = 0
    agree: int = 0

    def update(self, batch: Batch) -> None:
        raw, values = self.runner.run(batch.feed, batch.number)
        out = samples_first(raw, batch.batch_axis, len(batch.float_out), f"the model '{self.runner.label}'",
                            self.runner.output)
        if out.shape != batch.float_out.shape:
            raise QtoolError(f"the model '{self.runner.label}' output {self.runner.output!r} has shape "
                             f"{list(out.shape)}, the float model's {list(batch.float_out.shape)} (samples first)")
        m.combine(self.stats, m.pair_stats(batch.float_out, out))
        if batch.float_top is not None:
            top = batch.layout.top1(out)
            self.agree += m.count_equal(top, batch.float_top)
            if batch.labels is not None:
                self.correct += m.count_equal(top, batch.labels)
        for t in self.tensors:
            test = values.get(t.read)
            if test is None and t.read == self.runner.output:
                test = raw
            t.update(batch.float_values.get(t.quantizer.counterpart), test)

    def rates(self, total: int, has_labels: bool, classes: bool):
        """(accuracy, correct, agreement); None where not measured."""
        correct = self.correct if has_labels and classes else None
        return (None if correct is None else correct / total), correct, (self.agree / total if classes else None)


@dataclass
class QuantizedAcc(ModelAcc):
    """A quantized model: its sums, what was found in its graph, and its single-layer models."""

    quantized: QuantizedModel | None = None
    unmatched: list[Unmatched] = field(default_factory=list)
    weights: list[WeightError] = field(default_factory=list)
    sensitivity: list[tuple[ir.Node, ModelAcc]] | None = None
    notes: list[str] = field(default_factory=list)

    def runners(self) -> list[Runner]:
        return [self.runner] + [s.runner for _, s in self.sensitivity or ()]

    def update(self, batch: Batch) -> None:
        super().update(batch)
        for _, s in self.sensitivity or ():
            s.update(batch)

    def result(self, total: int, has_labels: bool, classes: bool) -> ModelResult:
        if self.runner.plain_every_batch:
            self.notes.append("the output changed when tensors were added as outputs: the model numbers come "
                              "from the unmodified model, run beside the instrumented copy")
        accuracy, correct, agreement = self.rates(total, has_labels, classes)
        sens = None
        if self.sensitivity is not None:
            sens = [LayerSensitivity(layer.name, layer.op_type, ErrorNumbers.from_stats(s.stats),
                                     *[s.rates(total, has_labels, classes)[i] for i in (0, 2)])
                    for layer, s in self.sensitivity]
            sens.sort(key=worst_first)
        q = self.quantized
        return ModelResult(
            name=q.name, source=q.source, accuracy=accuracy, correct=correct, agreement=agreement,
            output=ErrorNumbers.from_stats(self.stats),
            activations=sorted((t.result() for t in self.tensors), key=worst_first),
            weights=sorted(self.weights, key=worst_first), unmatched_activations=self.unmatched,
            sensitivity=sens, notes=self.notes, weight_bits=q.weight_bits, activation_bits=q.activation_bits,
            in_onnxruntime=None if self.runner.runtime_layers is None else self.runner.runtime_layers.to_dict(),
        )


class FloatReference:
    """The float model named as ``rewrite_eval`` names it, and its folded copies (for the weights)."""

    def __init__(self, model: ir.Model):
        self.model = model  # ours: a fresh load or a copy
        name_unnamed_nodes(model.graph)
        self._folded: dict[frozenset, ir.Graph | None] = {}

    def folded(self, q_graph: ir.Graph) -> ir.Graph | None:
        """The float graph with the constant Mul/Add (``fold_affine``) and batch norms folded that ``q_graph``
        folded (None when it cannot be)."""
        exclude = g.kept_batch_norms(q_graph, self.model.graph)
        kept = frozenset(n.name for n in q_graph if n.op_type in ("Mul", "Add", "Sub"))  # a folded one is gone
        key = (exclude, kept)
        if key not in self._folded:
            folded = self.model.clone()
            float16_as_float32(folded)  # as rewrite_eval: a float16 body's weights are float32 there
            same_type_casts_as_identities(folded.graph)  # as rewrite_eval: nothing between a layer and its Mul/Add
            remove_identities(folded.graph)
            try:
                names = NameScope(folded.graph)
                fold_affine(folded.graph, names, exclude=kept)
                fold_batch_norms(folded.graph, names, exclude=exclude)
                self._folded[key] = folded.graph
            except QtoolError:
                self._folded[key] = None
        return self._folded[key]


def _weights(qg: g.QuantizedGraph, float_arrays: dict, lstms: list[g.LstmWeight]) -> list[WeightError]:
    entries = [(dict(quantizer=w.name, layer=w.layer.name, op=w.layer.op_type, role="weight" if w.index == 1 else "bias",
                     dtype=g.dtype_name(w.dq.inputs[0]) or g.dtype_name(w.dq.inputs[2] if len(w.dq.inputs) > 2 else None)),
                w.dequantized(), float_arrays.get(w.name)) for w in qg.weights]
    entries += [(dict(quantizer=w.name, layer=w.layer, op="LSTM", role="W" if w.index == 1 else "R", dtype=g.dtype_name(w.node.inputs[w.index])),
                 w.dequantized, w.float_value) for w in lstms]
    out = []
    for base, deq, ref in entries:
        deq = _unpadded(deq, ref)
        if deq is None or ref is None:
            out.append(WeightError(**base, problem="no float value to compare with"))
        elif ref.shape != deq.shape:
            out.append(WeightError(**base, problem=f"shape {list(deq.shape)} differs from the float {list(ref.shape)}"))
        else:
            st = m.pair_stats(ref, deq)
            fr, qr = value_ranges(st)
            out.append(WeightError(**base, error=ErrorNumbers.from_stats(st), float_range=fr, quantized_range=qr))
    return out


def _unpadded(deq: np.ndarray | None, ref: np.ndarray | None) -> np.ndarray | None:
    """``deq`` without the zero channels the eval graph padded it with (``channel_padding``: MTCNN's 10-channel
    Conv input read as 12), so that it compares with the float weight; as it is otherwise."""
    if deq is None or ref is None or deq.shape == ref.shape or deq.ndim != ref.ndim:
        return deq
    if any(d < r for d, r in zip(deq.shape, ref.shape)):
        return deq
    kept = tuple(slice(0, r) for r in ref.shape)
    rest = deq.copy()
    rest[kept] = 0
    return deq[kept] if not rest.any() else deq


def _tensor(act: g.ActivationQuantizer, layer: str | None, histograms: bool) -> TensorAcc:
    acc = TensorAcc(act, act.codes.name if act.reads_codes else act.output.name, layer)
    if histograms and act.representable is not None:
        lo, hi = act.representable
        pad = (hi - lo) * HIST_MARGIN if hi > lo else 1.0
        acc.hist_range = (lo - pad, hi + pad)
        acc.hist = np.zeros(HIST_BINS + 2, np.int64)
    return acc


def plan_model(q: QuantizedModel, ref: FloatReference, output: str, sensitivity: bool,
               histograms: bool) -> QuantizedAcc:
    """Find the quantizers of ``q``, their float counterparts, and the sessions that read them."""
    q_graph = q.model.model.graph
    g.name_unnamed_layers(q_graph)  # ours to edit (a fresh load or a copy); layers are found by name
    qg = g.find_quantizers(q_graph)
    g.map_counterparts(q_graph, ref.model.graph, qg)
    f_folded = ref.folded(q_graph)
    float_arrays = g.float_weights(f_folded, qg, ref.model.graph) if f_folded is not None else {w.name: None for w in qg.weights}
    layer_of = g.quantizer_layers(qg)
    lstms = g.lstm_weights(q_graph, ref.model.graph)
    acc = QuantizedAcc(q.name, None, quantized=q, weights=_weights(qg, float_arrays, lstms))
    acc.unmatched += [Unmatched(name, tensor, why) for name, tensor, why in qg.skipped]
    for act in qg.activations:
        if act.counterpart is None:
            acc.unmatched.append(Unmatched(act.name, act.float_value.name, act.how))
        else:
            acc.tensors.append(_tensor(act, layer_of.get(act.name), histograms))
    values = g.value_index(q_graph)
    readable = {t.read for t in acc.tensors if t.read in values and not values[t.read].is_graph_input()}
    for t in acc.tensors:
        if t.read not in readable:
            t.problem = f"cannot read '{t.read}' from the quantized model"
    dtypes = {a.codes.name: a.codes_dtype for a in qg.activations if a.codes_dtype is not None}
    extra = [values[name] for name in dict.fromkeys(t.read for t in acc.tensors) if name in readable]
    acc.runner = Runner(q.name, output, q.model.model, q.model.path, extra, dtypes)
    if sensitivity:
        acc.sensitivity = _single_layer_models(q, qg, f_folded, _single_layer_arrays(float_arrays, lstms, ref, qg),
                                               output, acc.notes)
    return acc


def _single_layer_arrays(float_arrays: dict, lstms: list[g.LstmWeight], ref: FloatReference,
                         qg: g.QuantizedGraph) -> dict:
    """What single-layer models read in float: the weights, and the LSTMs' and the other quantized constants'."""
    return {**float_arrays, **g.lstm_float_arrays(lstms), **g.float_constants(ref.model.graph, qg)}


def no_quantizer_model(quantized: ir.Model, float_model: ir.Model) -> tuple[ir.Model | None, str]:
    """The quantized model with every quantizer undone as ``--sensitivity``'s single-layer models undo all but one
    layer's: it computes the float model's values (to float rounding) when every form is undone right; (None, why)
    when it cannot be built. Reads copies of both models."""
    q = quantized.clone()
    q_graph = q.graph
    ref = FloatReference(float_model.clone())
    g.name_unnamed_layers(q_graph)
    qg = g.find_quantizers(q_graph)
    g.map_counterparts(q_graph, ref.model.graph, qg)
    f_folded = ref.folded(q_graph)
    if f_folded is None:
        return None, "the float model could not be folded like the quantized one"
    arrays = _single_layer_arrays(g.float_weights(f_folded, qg, ref.model.graph),
                                  g.lstm_weights(q_graph, ref.model.graph), ref, qg)
    return g.single_layer_model(q, None, arrays, g.clamping_quantizers(qg))


def _single_layer_models(q: QuantizedModel, qg: g.QuantizedGraph, f_folded, float_arrays, output: str,
                         notes: list[str]) -> list[tuple[ir.Node, ModelAcc]]:
    if f_folded is None:
        notes.append("sensitivity: the float model could not be folded like the quantized one")
    out = []
    clamping = g.clamping_quantizers(qg)
    for layer in qg.layers() + g.dynamic_lstms(q.model.model.graph):
        single, why = g.single_layer_model(q.model.model, layer.name, float_arrays, clamping)
        if single is None:
            notes.append(f"sensitivity: layer '{layer.name}' skipped: {why}")
            continue
        out.append((layer, ModelAcc(layer.name, Runner(f"{q.name} only {layer.name}", output, single))))
    return out


def float_runner(ref: FloatReference, path: str | None, accs: list[QuantizedAcc], output: str,
                 inputs: set[str]) -> Runner:
    """The float model's runner, reading every counterpart the quantized models need."""
    values = g.value_index(ref.model.graph)
    needed = [t.quantizer.counterpart for a in accs for t in a.tensors if not t.problem]
    needed = [n for n in dict.fromkeys(needed) if n not in inputs and n != output]
    for a in accs:
        for t in a.tensors:
            name = t.quantizer.counterpart
            if not t.problem and name not in inputs and name != output and name not in values:
                t.problem = f"cannot read float tensor '{name}'"
    extra = [values[n] for n in needed if n in values]
    return Runner("float", output, ref.model, path, extra)
