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

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from qtool.errors import QtoolError
from qtool.kernels import metrics as m
from qtool.simulate import inputs
from qtool.simulate.compare import Batch, FloatReference, QuantizedAcc, float_runner, plan_model, samples_first
from qtool.simulate.config import SimulateConfig
from qtool.simulate.result import SimulateResult
from qtool.simulate.whatif import QuantizedModel, quantize_in_memory

Progress = Callable[[str, int, int], None]  # (stage, samples done, samples total)

FLOAT_FUSION_NOTE = ("the float model's output changed when tensors were added as outputs: "
                     "its numbers come from the unmodified model, run beside it")


@dataclass
class _Totals:
    """The float model's side of the pass over the data."""

    samples: int = 0
    correct: int = 0
    classes: int | None = None  # values per sample of the compared output; 1: a regression or a score
    seconds: dict[str, float] = field(default_factory=dict)


def run_simulation(model, data, config: SimulateConfig, progress: Progress | None = None) -> SimulateResult:
    """Compare ``model`` (float: a path, ``onnx.ModelProto`` or ``onnx_ir.Model``) with quantized versions on ``data``."""
    start = time.perf_counter()
    totals = _Totals()
    f = inputs.load(model, "model")
    output = inputs.output_name(f, config.output)
    config.check_outputs([v.name for v in f.model.graph.outputs], f.label)
    dataset, labels = inputs.read_data(data, f.model, config.labels)
    quantized = [inputs.load(q, f"quantized model {i + 1}") for i, q in enumerate(config.quantized)]
    for q in quantized:
        inputs.check_inputs_match(f.model, q, output)
    models = [QuantizedModel(q.label, q) for q in quantized]
    calibration, notes = None, []
    if config.what_if:
        models, calibration, notes = quantize_in_memory(f, dataset, config, _stage_callback(progress, "calibrating"))
        totals.seconds["calibrating"] = calibration.seconds
    _stage(progress, "preparing", 0, 0)
    ref = FloatReference(f.model)
    accs = [plan_model(q, ref, output, config.sensitivity, config.histograms) for q in models]
    runner = float_runner(ref, f.path, accs, output, set(dataset.arrays))
    t = time.perf_counter()
    _evaluate(runner, accs, dataset, labels, config, output, totals, progress)
    totals.seconds["evaluating"] = round(time.perf_counter() - t, 3)
    if runner.plain_every_batch:
        notes.append(FLOAT_FUSION_NOTE)
    classes = totals.classes is None or totals.classes > 1
    has_labels = labels is not None
    return SimulateResult(
        model=f.label, data=dataset.source or "<data>", samples=totals.samples, batch_size=config.batch_size,
        output=output, output_kind="classes" if classes else "values", batch_axis=config.axis_for(output),
        labels=config.labels, calibration=calibration,
        float_accuracy=totals.correct / totals.samples if has_labels and classes and totals.samples else None,
        float_correct=totals.correct if has_labels and classes else None,
        models=[a.result(max(totals.samples, 1), has_labels, classes) for a in accs],
        notes=notes, seconds=round(time.perf_counter() - start, 3), stage_seconds=totals.seconds,
    )


def _stage(progress: Progress | None, stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


def _stage_callback(progress: Progress | None, stage: str):
    return None if progress is None else (lambda done, total: progress(stage, done, total))


def _evaluate(runner, accs: list[QuantizedAcc], dataset, labels, config: SimulateConfig, output: str,
              totals: _Totals, progress: Progress | None) -> None:
    """The pass over the data: every model on every batch, into the running sums."""
    runners = [runner] + [r for a in accs for r in a.runners()]
    for r in runners:
        r.open()
    axis = config.axis_for(output)
    _stage(progress, "evaluating", 0, dataset.num_samples)
    try:
        for number, feed in enumerate(dataset.batches(config.batch_size), start=1):
            batch = _float_batch(runner, number, feed, labels, axis, totals, config.labels)
            for acc in accs:
                acc.update(batch)
            totals.samples += len(batch.float_out)
            _stage(progress, "evaluating", totals.samples, dataset.num_samples)
    finally:
        for r in runners:
            r.close()


def _float_batch(runner, number: int, feed: dict, labels, axis: int, totals: _Totals, label_name) -> Batch:
    feed = {k: np.ascontiguousarray(v) for k, v in feed.items()}
    n = len(next(iter(feed.values())))
    out, values = runner.run(feed, number)
    values.update(feed)
    values[runner.output] = out
    out = samples_first(out, axis, n, "the float model's", runner.output)
    if totals.classes is None:
        totals.classes = out.size // n if n else 1
    top = m.argmax_rows(out) if totals.classes > 1 else None
    lab = None
    if labels is not None:
        if top is None:
            raise QtoolError(f"labels {label_name!r} are class ids, but output {runner.output!r} has one value per "
                             "sample (a regression or a score): compare it without labels (SQNR and relative error)")
        lab = np.ascontiguousarray(labels[totals.samples : totals.samples + n]).astype(np.int64)
        bad = (lab < 0) | (lab >= totals.classes)
        if bad.any():
            raise QtoolError(f"labels {label_name!r} hold class id {int(lab[bad][0])}, but output "
                             f"{runner.output!r} has {totals.classes} classes")
        totals.correct += m.count_equal(top, lab)
    return Batch(number, feed, out, top, lab, values, axis)


def simulate(
    model,
    data,
    *,
    labels: str | None = None,
    output: str | None = None,
    quantized: Sequence = (),
    weight_bits: Iterable[int] | str | int = (8,),
    activation_bits: Iterable[int] | str | int = (8,),
    calibration_data=None,
    sensitivity: bool = False,
    batch_size: int = 16,
    histograms: bool = False,
    batch_axis=None,
    json_path=None,
    html_path=None,
    progress: Progress | None = None,
) -> SimulateResult:
    """Compare ``model`` (float) with quantized versions of it on ``data``.

    ``model``: path (or ``onnx.ModelProto`` / ``onnx_ir.Model``) of the float model.
    ``data``: ``.npz`` path (or dict of arrays): one array per model input,
    samples first; ``labels`` names an array of integer class ids in it.
    ``output``: the model output to compare (default: the first);
    ``batch_axis``: its samples axis when it is not the first (an int for
    every output, or ``{"name": axis}`` / ``"name=axis"`` per output).
    ``quantized``: quantized models (paths, protos or IR models) to compare.
    Without them, the float model is quantized in memory with ``rewrite_eval``
    for every (weight, activation) pair of ``weight_bits`` x ``activation_bits``,
    all from one calibration on ``calibration_data`` (or, when it is None, on
    ``data`` itself, which the report says).
    ``sensitivity``: also run, for each quantized layer of each model, a model
    with only that layer quantized.
    ``histograms``: keep histograms of the quantized activations (for the HTML
    report; on when ``html_path`` is given). ``json_path``/``html_path``: write
    the report there. ``progress(stage, done, total)`` is called after each
    batch of each pass over data.
    """
    config = SimulateConfig(
        labels=labels, output=output, quantized=quantized, weight_bits=weight_bits,
        activation_bits=activation_bits, calibration_data=calibration_data, sensitivity=sensitivity,
        batch_size=batch_size, histograms=histograms or html_path is not None, batch_axis=batch_axis,
    )
    result = run_simulation(model, data, config, progress)
    if json_path is not None:
        result.write_json(json_path)
    if html_path is not None:
        result.write_html(html_path)
    return result
