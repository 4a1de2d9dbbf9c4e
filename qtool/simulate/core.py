"""``run_simulation``: run the float model and its quantized versions on data, and compare.

One pass over the data: each batch runs the float model and every quantized
model (and, with ``sensitivity``, every single-layer model) in onnxruntime,
and every compared tensor goes straight to the streaming metric kernels of
:mod:`qtool.kernels.metrics`; nothing is kept from one batch to the next
except float64 sums, counts and histograms.

The story: check the options (:class:`SimulateConfig`) -> load the float
model and the data -> get the quantized models (given, or made in memory
from one calibration) -> plan what to read from each -> one pass over the
data -> a typed :class:`SimulateResult`.

Exactness: the model-level numbers (accuracy, agreement, output error) come
from the model's output as onnxruntime computes it with its default session
options (see :mod:`qtool.simulate.session`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qtool.errors import QtoolError
from qtool.kernels import metrics as m
from qtool.model.io import large_model_bytes
from qtool.model.session import available_memory
from qtool.simulate import inputs, latency
from qtool.simulate.compare import (
    Batch,
    ClassLayout,
    FloatReference,
    QuantizedAcc,
    class_layout,
    float_runner,
    plan_model,
    samples_first,
)
from qtool.simulate.config import SimulateConfig
from qtool.simulate.result import SimulateResult
from qtool.simulate.whatif import Quantize, QuantizedModel, quantize_in_memory

Progress = Callable[[str, int, int], None]  # (stage, samples done, samples total)

FLOAT_FUSION_NOTE = ("the float model's output changed when tensors were added as outputs: "
                     "its numbers come from the unmodified model, run beside it")


@dataclass
class _Totals:
    """The float model's side of the pass over the data."""

    samples: int = 0
    correct: int = 0
    layout: ClassLayout | None = None  # where the compared output holds its classes (after the first batch)
    predictions: int = 0  # top-1 places compared: samples x positions, batch by batch (a folder's shapes differ)
    varying: bool = False  # the output's values per sample differ between batches (a folder's shapes): no classes
    uneven: bool = False  # its top-1 places per sample differ between batches (tokens of a folder's lengths)
    order: int = m.SORTED_DESCENDING | m.SORTED_ASCENDING  # the orders every float row kept (m.sorted_rows)
    seconds: dict[str, float] = field(default_factory=dict)
    batch_size: int | None = None  # the batches the pass ran in (smaller than asked where memory is short)
    memory_note: str | None = None  # why the batches are smaller than asked


def run_simulation(model, data, config: SimulateConfig, quantize: Quantize | None = None,
                   progress: Progress | None = None) -> SimulateResult:
    """Compare ``model`` (float: a path, ``onnx.ModelProto`` or ``onnx_ir.Model``) with quantized versions on
    ``data``. ``quantize`` makes the what-if table's models (``qtool.api`` gives it: it joins the rewrites and
    calibration); without ``config.quantized`` models it is needed."""
    start = time.perf_counter()
    totals = _Totals()
    if progress is not None:  # reading large files takes seconds (a BERT-base: 5 s); small ones have no stage
        large = [size for size in map(large_model_bytes, [model, *config.quantized]) if size is not None]
        if large:
            _stage(progress, f"loading the model{'s' if config.quantized else ''} ({sum(large) / 2**20:.0f} MB)", 0, 0)
    f = inputs.load(model, "model")
    output = inputs.output_name(f, config.output)
    config.check_outputs([v.name for v in f.model.graph.outputs], f.label)
    dataset, labels = inputs.read_data(data, f.model, config.labels, per_position=config.class_axis is not None)
    quantized = [inputs.load(q, f"quantized model {i + 1}") for i, q in enumerate(config.quantized)]
    for q in quantized:
        inputs.check_inputs_match(f.model, q, output)
    models = [QuantizedModel(q.label, q) for q in quantized]
    calibration, notes = None, []
    if config.what_if:
        if quantize is None:
            raise QtoolError("the what-if table needs a quantize function: call qtool.api.simulate")
        models, calibration, notes = quantize_in_memory(f, dataset, config, quantize,
                                                        _stage_callback(progress, "calibrating"))
        totals.seconds["calibrating"] = calibration.seconds
    _stage(progress, "preparing", 0, 0)
    ref = FloatReference(f.model)
    accs = [plan_model(q, ref, output, config.sensitivity, config.histograms) for q in models]
    runner = float_runner(ref, f.path, accs, output, set(dataset.input_names()))
    t = time.perf_counter()
    _evaluate(runner, accs, dataset, labels, config, output, totals, progress)
    totals.seconds["evaluating"] = round(time.perf_counter() - t, 3)
    timed = None
    if config.latency_rounds and totals.samples:
        t = time.perf_counter()
        _stage(progress, "timing", 0, 0)
        timed = latency.measure(runner, [a.runner for a in accs], _first_sample(dataset), config.latency_rounds)
        totals.seconds["timing"] = round(time.perf_counter() - t, 3)
    if runner.plain_every_batch:
        notes.append(FLOAT_FUSION_NOTE)
    layout = totals.layout or ClassLayout(2)  # no samples: nothing measured either way
    classes = layout.has_top1
    no_top1 = None
    if totals.varying:
        no_top1 = "values per sample differ between batches"
        notes.append(f"output {output!r} holds a different number of values per sample in batches of different "
                     "shapes: not classes; no top-1 and no agreement; judged by SQNR")
    elif layout.classes == 0:
        no_top1 = "several axes per sample, no --class-axis"
        notes.append(f"output {output!r} spreads each sample over several axes: no top-1 and no agreement without "
                     "--class-axis (e.g. the classes axis of a tagger, a segmenter or a recognizer); judged by SQNR")
    elif layout.classes == 1:
        no_top1 = "one value per sample"
    elif totals.samples and _sorted(totals, layout, inputs.sorting_node(f, output)):
        classes = False
        first = "first" if totals.order & m.SORTED_DESCENDING else "last"
        no_top1 = f"sorted: top-1 always the {first} place"
        notes.append(f"output {output!r} is sorted along its {layout.classes} classes in every one of the "
                     f"{totals.predictions} rows of the float model (TopK's values, scores in order): its top-1 is "
                     f"always the {first} place, so top-1, accuracy and agreement would mean nothing; judged by SQNR")
    has_labels = labels is not None
    predictions = totals.predictions
    return SimulateResult(
        model=f.label, data=dataset.source or "<data>", samples=totals.samples,
        batch_size=totals.batch_size or config.batch_size,
        output=output, output_kind="classes" if classes else "values", no_top1=no_top1,
        batch_axis=config.axis_for(output),
        labels=config.labels, calibration=calibration,
        float_accuracy=totals.correct / predictions if has_labels and classes and predictions else None,
        float_correct=totals.correct if has_labels and classes else None,
        float_in_onnxruntime=None if runner.runtime_layers is None else runner.runtime_layers.to_dict(),
        models=[a.result(max(predictions, 1), has_labels, classes) for a in accs],
        class_axis=config.class_axis, positions=None if totals.uneven else layout.positions, predictions=predictions,
        latency=None if timed is None else timed.to_dict(), memory_note=totals.memory_note,
        notes=notes, seconds=round(time.perf_counter() - start, 3), stage_seconds=totals.seconds,
    )


# Rows of C classes all sorted one way by chance: 2 / C! each. The float output is taken for sorted scores, not
# classes, when that chance over all its rows is below this, or when a sorting op (TopK) writes it.
SORTED_BY_CHANCE = 1e-6


def _sorted(totals: _Totals, layout: ClassLayout, sorting_node: str | None) -> bool:
    """Whether the float output's rows of classes were all sorted one way, and that is no chance (a classifier
    over 3 classes and 4 samples can be): then its top-1 is a fixed place, not a class."""
    if not totals.order:
        return False
    if sorting_node is not None:
        return True
    log_chance = totals.predictions * (math.log(2) - math.lgamma(layout.classes + 1))
    return log_chance < math.log(SORTED_BY_CHANCE)


def _first_sample(dataset) -> dict:
    """One sample (or the model's fixed batch) of the data, as fed."""
    batches = dataset.batches(1)
    try:
        return next(batches)
    finally:
        batches.close()


def _stage(progress: Progress | None, stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


def _stage_callback(progress: Progress | None, stage: str):
    return None if progress is None else (lambda done, total: progress(stage, done, total))


def _evaluate(runner, accs: list[QuantizedAcc], dataset, labels, config: SimulateConfig, output: str,
              totals: _Totals, progress: Progress | None) -> None:
    """The pass over the data: every model on every batch, into the running sums."""
    runners = [runner] + [r for a in accs for r in a.runners()]
    looked_at = [runner] + [a.runner for a in accs]  # not the single-layer models of --sensitivity
    for r in runners:
        r.open(runtime_graph=any(r is x for x in looked_at))
    axis = config.axis_for(output)
    _stage(progress, "evaluating", 0, dataset.num_samples)
    try:
        totals.batch_size = _fitted_batch(runners, dataset, config.batch_size, totals, available_memory())
        for number, feed in enumerate(dataset.batches(totals.batch_size), start=1):
            batch = _float_batch(runner, number, feed, dataset.samples_in(feed), labels, axis, totals, config)
            for acc in accs:
                acc.update(batch)
            totals.samples += len(batch.float_out)
            _stage(progress, "evaluating", totals.samples, dataset.num_samples)
    finally:
        for r in runners:
            r.close()


# One sample's tensors, held at once: those read from the float model and from one quantized model, and as much
# again for onnxruntime's own while a model runs. A batch takes at most this share of the memory available.
MEMORY_SHARE = 0.6


def _fitted_batch(runners, dataset, batch_size: int, totals: _Totals, available: int | None) -> int:
    """``batch_size``, or fewer samples where one sample's tensors (measured on the first sample: the float model's
    and the largest quantized model's, twice) would not fit in ``available`` bytes: simulate reads every compared
    tensor of a batch, and a batch past the memory was killed by the system with no message (LYT-Net at 16: 0.85 GB
    a frame measured this way)."""
    if batch_size <= 1 or available is None:
        return batch_size
    feed = {k: np.ascontiguousarray(v) for k, v in _first_sample(dataset).items()}
    held = []
    for r in runners:
        out, extra = r.run(feed, 1)
        held.append(out.nbytes + sum(v.nbytes for v in extra.values()))
    per_sample = 2 * (held[0] + max(held[1:], default=0)) / max(dataset.samples_in(feed), 1)
    fits = max(1, int(MEMORY_SHARE * available // max(per_sample, 1)))
    if fits >= batch_size:
        return batch_size
    totals.memory_note = (f"batches of {fits} sample(s), not {batch_size}: one sample's compared tensors take "
                          f"{per_sample / 2**30:.2f} GB, {available / 2**30:.1f} GB is available (--batch-size)")
    return fits


def _float_batch(runner, number: int, feed: dict, n: int, labels, axis: int, totals: _Totals,
                 config: SimulateConfig) -> Batch:
    feed = {k: np.ascontiguousarray(v) for k, v in feed.items()}
    raw, values = runner.run(feed, number)
    values.update(feed)
    values[runner.output] = raw
    out = samples_first(raw, axis, n, "the float model's", runner.output)
    layout = _layout(totals, class_layout(out, np.ndim(raw), axis, config.class_axis, runner.output), config,
                     runner.output)
    top = None
    if layout.has_top1:
        rows = layout.rows(out)
        top = m.argmax_rows(rows)
        if totals.order:
            totals.order &= m.sorted_rows(rows)
    lab = None
    if labels is not None:
        lab = _batch_labels(labels[totals.samples : totals.samples + n], layout, out, config, runner.output)
        totals.correct += m.count_equal(top, lab)
    totals.predictions += n * layout.positions if layout.has_top1 else 0
    return Batch(number, feed, out, top, lab, layout, values, axis)


def _layout(totals: _Totals, layout: ClassLayout, config: SimulateConfig, output: str) -> ClassLayout:
    """The layout of this batch's output, the first batch's unless the classes differ (batches of a folder's
    shapes): then a class axis given is an error, else the output holds values, not classes."""
    known = totals.layout
    if known is None:
        totals.layout = known = layout
    if totals.varying:
        return known
    if (layout.classes, layout.axis) != (known.classes, known.axis):
        if config.class_axis is not None:
            raise QtoolError(f"--class-axis {config.class_axis}: output {output!r} has {known.classes} classes in one "
                             f"batch and {layout.classes} in another (samples of different shapes): the classes axis "
                             "must have one size")
        totals.layout, totals.varying = ClassLayout(0, positions=0), True
        return totals.layout
    totals.uneven = totals.uneven or layout.positions != known.positions  # tokens of a folder's lengths
    return layout


def _batch_labels(labels: np.ndarray, layout: ClassLayout, out: np.ndarray, config: SimulateConfig,
                  output: str) -> np.ndarray:
    """One batch's labels, flat like ``layout.top1``, checked against the output."""
    name = config.labels
    if layout.classes == 1:
        raise QtoolError(f"labels {name!r} are class ids, but output {output!r} has one value per "
                         "sample (a regression or a score): compare it without labels (SQNR and relative error)")
    if layout.classes == 0:
        raise QtoolError(f"labels {name!r}: output {output!r} has shape {list(out.shape)} (samples first), several "
                         "axes per sample: name its classes axis with --class-axis")
    if layout.axis is not None:
        want = [len(out)] + [d for i, d in enumerate(out.shape) if i not in (0, layout.axis)]
        if int(np.prod(labels.shape)) != int(np.prod(want)):
            raise QtoolError(f"labels {name!r} have shape {list(labels.shape[1:])} per sample, but output {output!r} "
                             f"has {want[1:]} positions per sample (its shape without the class axis)")
    lab = np.ascontiguousarray(labels).astype(np.int64).reshape(-1)
    bad = (lab < 0) | (lab >= layout.classes)
    if bad.any():
        raise QtoolError(f"labels {name!r} hold class id {int(lab[bad][0])}, but output "
                         f"{output!r} has {layout.classes} classes")
    return lab


