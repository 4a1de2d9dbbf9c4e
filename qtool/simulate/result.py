"""``SimulateResult``: every number of a simulation, typed; dicts only for JSON.

The renderings (:mod:`qtool.simulate.report` for the terminal and JSON,
:mod:`qtool.simulate.html` for the page) read :meth:`SimulateResult.to_dict`,
the same document ``--json`` writes, so a saved JSON file renders the same
page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from qtool.kernels import metrics as m
from qtool.simulate import html as html_page
from qtool.simulate import report as text_report

CONVENTIONS = {
    "sqnr_db": "10*log10(sum(float^2) / sum((float - quantized)^2)) over every value of every sample; "
               "\"inf\" when the two are identical (no error)",
    "relative_rms_error": "sqrt(sum((float - quantized)^2) / sum(float^2)): 10^(-SQNR/20)",
    "non_finite": "JSON has no infinity: +-infinity and NaN are written as the strings \"inf\", \"-inf\", \"nan\"",
    "null": "null means not measured (no labels, no float counterpart, ...); a reason is given beside it",
    "accuracy": "top-1 (argmax over each sample's output, numpy's first-maximum rule) equal to the label",
    "agreement": "fraction of samples whose top-1 class equals the float model's; null for outputs without a "
                 "top-1 (output_kind \"values\", why in no_top1: one value per sample, several axes without "
                 "--class-axis, rows sorted like TopK's values), which are judged by SQNR and relative error",
    "cosine": "cosine similarity of the float and quantized tensors, all samples as one vector",
    "order": "activations, weights and sensitivity lists are sorted worst (lowest SQNR) first",
}


def sqnr_db(signal: float, noise: float) -> float:
    """``10 log10(signal / noise)``; ``inf`` when there is no noise (identical tensors)."""
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    if not (math.isfinite(signal) and math.isfinite(noise)):
        return math.nan
    return 10.0 * math.log10(signal / noise)


@dataclass(frozen=True)
class ErrorNumbers:
    """Float vs quantized over all values of all samples (from the metric kernels' float64 sums)."""

    sqnr_db: float
    relative_rms_error: float
    mean_abs_error: float
    max_abs_error: float
    cosine: float
    values: int
    nonfinite_values: int = 0

    @classmethod
    def from_stats(cls, stats: np.ndarray) -> ErrorNumbers:
        s, t, e = float(stats[m.SUM_REF2]), float(stats[m.SUM_TEST2]), float(stats[m.SUM_ERR2])
        count = int(stats[m.COUNT])
        if s > 0 and t > 0:
            cosine = float(stats[m.DOT]) / math.sqrt(s * t)
        elif s == 0 and t == 0:
            cosine = 1.0 if count else math.nan
        else:
            cosine = 0.0
        if not count:
            return cls(math.nan, math.nan, math.nan, math.nan, cosine, 0, int(stats[m.NONFINITE]))
        relative = math.sqrt(e / s) if s > 0 else (0.0 if e == 0 else math.inf)
        return cls(sqnr_db(s, e), relative, float(stats[m.SUM_ABS_ERR]) / count, float(stats[m.MAX_ABS_ERR]),
                   cosine, count, int(stats[m.NONFINITE]))

    def to_dict(self) -> dict:
        out = {"sqnr_db": self.sqnr_db, "relative_rms_error": self.relative_rms_error,
               "mean_abs_error": self.mean_abs_error, "max_abs_error": self.max_abs_error,
               "cosine": self.cosine, "values": self.values}
        if self.nonfinite_values:
            out["nonfinite_values"] = self.nonfinite_values
        return out


def value_ranges(stats: np.ndarray) -> tuple[list[float], list[float]]:
    """(float range, quantized range) seen by the metric kernel."""
    return [float(stats[m.REF_MIN]), float(stats[m.REF_MAX])], [float(stats[m.TEST_MIN]), float(stats[m.TEST_MAX])]


@dataclass(frozen=True)
class Histogram:
    range: tuple[float, float]
    counts: list[int]
    below: int
    above: int

    def to_dict(self) -> dict:
        return {"range": list(self.range), "counts": self.counts, "below": self.below, "above": self.above}


@dataclass(frozen=True)
class ActivationError:
    """One activation quantizer of a quantized model against its float tensor."""

    quantizer: str
    tensor: str
    float_tensor: str
    matched_by: str
    layer: str | None  # the layer the quantizer belongs to (reads it, or produced it)
    quantizer_range: tuple[float, float] | None
    error: ErrorNumbers | None = None  # None: not measured (``problem`` says why)
    problem: str | None = None
    float_range: list[float] | None = None
    quantized_range: list[float] | None = None
    clipped_low: int | None = None
    clipped_high: int | None = None
    histogram: Histogram | None = None
    readers_saturate: tuple[float, float] | None = None  # compared clipped to it (where its readers saturate)

    @property
    def sqnr_db(self) -> float | None:
        return None if self.error is None else self.error.sqnr_db

    @property
    def clipped_fraction(self) -> float | None:
        if self.clipped_low is None or self.error is None:
            return None
        count = self.error.values + self.error.nonfinite_values
        return (self.clipped_low + self.clipped_high) / count if count else None

    def to_dict(self) -> dict:
        e = {"quantizer": self.quantizer, "tensor": self.tensor, "float_tensor": self.float_tensor,
             "matched_by": self.matched_by, "layer": self.layer,
             "quantizer_range": None if self.quantizer_range is None else list(self.quantizer_range),
             "readers_saturate": None if self.readers_saturate is None else list(self.readers_saturate)}
        if self.error is None:
            e.update({"sqnr_db": None, "problem": self.problem})
        else:
            e.update(self.error.to_dict())
            e["float_range"], e["quantized_range"] = self.float_range, self.quantized_range
            if self.clipped_low is not None:
                e.update({"clipped_low": self.clipped_low, "clipped_high": self.clipped_high,
                          "clipped_fraction": self.clipped_fraction})
        if self.histogram is not None and self.error is not None:
            e["histogram"] = self.histogram.to_dict()
        return e


@dataclass(frozen=True)
class WeightError:
    """One weight (or bias) as dequantized in the model against the folded float value."""

    quantizer: str
    layer: str
    op: str
    role: str  # "weight" or "bias"
    dtype: str | None
    error: ErrorNumbers | None = None
    problem: str | None = None
    float_range: list[float] | None = None
    quantized_range: list[float] | None = None

    @property
    def sqnr_db(self) -> float | None:
        return None if self.error is None else self.error.sqnr_db

    def to_dict(self) -> dict:
        e = {"quantizer": self.quantizer, "layer": self.layer, "op": self.op, "role": self.role, "dtype": self.dtype}
        if self.error is None:
            e.update({"sqnr_db": None, "problem": self.problem})
        else:
            e.update(self.error.to_dict())
            e["float_range"], e["quantized_range"] = self.float_range, self.quantized_range
        return e


@dataclass(frozen=True)
class LayerSensitivity:
    """The model with only this layer quantized."""

    layer: str
    op: str
    output: ErrorNumbers
    accuracy: float | None
    agreement: float | None

    @property
    def sqnr_db(self) -> float:
        return self.output.sqnr_db

    def to_dict(self) -> dict:
        return {"layer": self.layer, "op": self.op, "output": self.output.to_dict(), "sqnr_db": self.sqnr_db,
                "accuracy": self.accuracy, "agreement": self.agreement}


@dataclass(frozen=True)
class Unmatched:
    quantizer: str
    tensor: str
    reason: str

    def to_dict(self) -> dict:
        return {"quantizer": self.quantizer, "tensor": self.tensor, "reason": self.reason}


def worst_first(entry) -> tuple:
    v = entry.sqnr_db
    if v is None:
        return (2, 0.0)
    if math.isnan(v):
        return (1, 0.0)
    return (0, v)


@dataclass(frozen=True)
class ModelResult:
    """One quantized model against the float model."""

    name: str
    source: str
    accuracy: float | None
    correct: int | None
    agreement: float | None  # None for outputs with one value per sample
    output: ErrorNumbers
    activations: list[ActivationError]
    weights: list[WeightError]
    unmatched_activations: list[Unmatched]
    sensitivity: list[LayerSensitivity] | None = None  # None: not asked
    notes: list[str] = field(default_factory=list)
    weight_bits: int | None = None  # for the models made in memory
    activation_bits: int | None = None
    # the layers of onnxruntime's optimized graph of this model by kernel kind (runtime_graph.LayerKernels.to_dict)
    in_onnxruntime: dict | None = None

    def to_dict(self) -> dict:
        r = {"source": self.source}
        if self.weight_bits is not None:
            r.update({"weight_bits": self.weight_bits, "activation_bits": self.activation_bits})
        r.update({
            "name": self.name, "accuracy": self.accuracy, "correct": self.correct, "agreement": self.agreement,
            "output": self.output.to_dict(),
            "activations": [a.to_dict() for a in self.activations],
            "weights": [w.to_dict() for w in self.weights],
            "unmatched_activations": [u.to_dict() for u in self.unmatched_activations],
        })
        if self.sensitivity is not None:
            r["sensitivity"] = [s.to_dict() for s in self.sensitivity]
        r["in_onnxruntime"] = self.in_onnxruntime
        r["notes"] = list(self.notes)
        return r


@dataclass(frozen=True)
class CalibrationInfo:
    """Where the ranges of the in-memory models came from (one calibration for every bit width pair, or one
    per distinct plan: ``runs``)."""

    source: str
    on_evaluation_data: bool
    samples: int | None
    seconds: float | None = None
    runs: int = 1

    def to_dict(self) -> dict:
        return {"source": self.source, "on_evaluation_data": self.on_evaluation_data, "samples": self.samples,
                "runs": self.runs, "seconds": self.seconds}


@dataclass(frozen=True)
class SimulateResult:
    """Every number of a simulation, with text, JSON and HTML renderings."""

    model: str
    data: str
    samples: int
    batch_size: int
    output: str
    output_kind: str  # "classes" (top-1 metrics) or "values" (no top-1: SQNR only; why in no_top1)
    batch_axis: int | None  # None: the output has no samples axis
    labels: str | None
    calibration: CalibrationInfo | None
    float_accuracy: float | None
    float_correct: int | None
    models: list[ModelResult]
    notes: list[str]
    seconds: float
    stage_seconds: dict[str, float] = field(default_factory=dict)
    class_axis: int | None = None  # top-1 per position along this output axis (None: one per sample)
    positions: int | None = 1  # top-1 predictions per sample (None: they differ, samples of different shapes)
    predictions: int | None = None  # top-1 predictions in all (samples x positions)
    latency: dict | None = None  # one-thread batch-1 timings (latency.Latency.to_dict), when asked
    memory_note: str | None = None  # the batches were made smaller than asked to fit in memory: why
    no_top1: str | None = None  # output_kind "values": why the output has no top-1 (one value per sample, sorted...)
    float_in_onnxruntime: dict | None = None  # the float model's layers in onnxruntime's optimized graph, by kernel

    def to_dict(self) -> dict:
        """The report as plain Python values (``inf``/``nan`` kept as floats; :meth:`write_json` writes them as strings)."""
        return {
            "model": self.model, "data": self.data, "samples": self.samples, "batch_size": self.batch_size,
            "output": self.output, "output_kind": self.output_kind, "no_top1": self.no_top1,
            "batch_axis": self.batch_axis,
            "labels": self.labels, "class_axis": self.class_axis, "positions": self.positions,
            "predictions": self.predictions,
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "float": {"accuracy": self.float_accuracy, "correct": self.float_correct,
                      "in_onnxruntime": self.float_in_onnxruntime},
            "models": [mdl.to_dict() for mdl in self.models],
            "notes": list(self.notes),
            "seconds": self.seconds,
            "stage_seconds": dict(self.stage_seconds),
            "latency": self.latency,
            "memory_note": self.memory_note,
            "conventions": CONVENTIONS,
        }

    @property
    def report(self) -> dict:
        """``to_dict()`` (the name the first releases used)."""
        return self.to_dict()

    def format_text(self, limit: int = 10, verbose: bool = False, width: int = 80) -> str:
        return text_report.format_text(self.to_dict(), limit=limit, verbose=verbose, width=width)

    def write_json(self, path) -> None:
        text_report.write_json(self.to_dict(), path)

    def write_html(self, path) -> None:
        html_page.write_html(self.to_dict(), path)
