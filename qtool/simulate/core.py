"""``simulate``: run the float model and its quantized versions on data, and compare.

One pass over the data: each batch runs the float model and every quantized
model (and, with ``sensitivity``, every single-layer model) in onnxruntime,
and every compared tensor goes straight to the streaming metric kernels of
:mod:`qtool.kernels.metrics`; nothing is kept from one batch to the next
except float64 sums, counts and histograms.

Exactness: the model-level numbers (accuracy, agreement, output error) come
from the model's output as onnxruntime computes it with its default session
options (all graph optimizations, CPU). Intermediate tensors are read by
adding them as graph outputs of a copy of the model; onnxruntime keeps its
QDQ fusions for such a copy (the quantized activations are read as the
integer codes the fused kernels produce), but to be certain, the first batch
also runs the unmodified model and compares its output bit for bit. If the
outputs differ, the unmodified model runs beside the instrumented copy on
every batch, model numbers come from it, and the report says so.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from qtool.errors import QtoolError
from qtool.model.io import check_outputs, model_files

Progress = Callable[[str, int, int], None]  # (pass label, samples done, samples total)

HIST_BINS = 64
HIST_MARGIN = 0.25  # histogram range: the quantizer's range widened by this fraction on each side


# --- numbers from streaming sums ----------------------------------------------------------------


def sqnr_db(signal: float, noise: float) -> float:
    """``10 log10(signal / noise)``; ``inf`` when there is no noise (identical tensors)."""
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    if not (math.isfinite(signal) and math.isfinite(noise)):
        return math.nan
    return 10.0 * math.log10(signal / noise)


def error_numbers(stats: np.ndarray) -> dict:
    from qtool.kernels import metrics as m

    s, t, e = float(stats[m.SUM_REF2]), float(stats[m.SUM_TEST2]), float(stats[m.SUM_ERR2])
    count = int(stats[m.COUNT])
    if s > 0 and t > 0:
        cosine = float(stats[m.DOT]) / math.sqrt(s * t)
    elif s == 0 and t == 0:
        cosine = 1.0 if count else math.nan
    else:
        cosine = 0.0
    out = {
        "sqnr_db": sqnr_db(s, e) if count else math.nan,
        "mean_abs_error": float(stats[m.SUM_ABS_ERR]) / count if count else math.nan,
        "max_abs_error": float(stats[m.MAX_ABS_ERR]) if count else math.nan,
        "cosine": cosine,
        "values": count,
    }
    if stats[m.NONFINITE]:
        out["nonfinite_values"] = int(stats[m.NONFINITE])
    return out


def _ranges(stats: np.ndarray) -> tuple[list[float], list[float]]:
    from qtool.kernels import metrics as m

    return [float(stats[m.REF_MIN]), float(stats[m.REF_MAX])], [float(stats[m.TEST_MIN]), float(stats[m.TEST_MAX])]


# --- sessions -----------------------------------------------------------------------------------------


def _session(source, what: str):
    """An onnxruntime session as a user gets it: default options (all optimizations), CPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # Several sessions take turns on every batch: idle ones must not spin on the
    # cores the running one needs (scheduling only; the numbers do not change).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
        raise QtoolError(f"onnxruntime cannot run {what}: {str(exc).strip().splitlines()[0]}") from exc


def _model_bytes(model) -> bytes:
    import onnx_ir as ir

    return ir.serde.serialize_model(model).SerializeToString()


def _run(session, names, feed, what: str, batch: int):
    try:
        return session.run(names, feed)
    except Exception as exc:  # noqa: BLE001
        raise QtoolError(f"onnxruntime failed on {what}, batch {batch}: {str(exc).strip().splitlines()[0]}") from exc


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@dataclass
class _Runner:
    """One model: an instrumented session (its output plus extra tensors) and the exactness check."""

    label: str
    output: str
    plain_source: object  # path or bytes of the unmodified model
    instrumented: object | None  # bytes of the copy with extra outputs, or None when nothing is read
    extra: list[str] = field(default_factory=list)
    session: object = None
    plain: object = None
    checked: bool = False
    plain_every_batch: bool = False

    def open(self) -> None:
        if self.instrumented is None:
            self.session = _session(self.plain_source, f"the model '{self.label}'")
            self.checked = True
        else:
            self.session = _session(self.instrumented, f"the model '{self.label}' (with extra outputs)")
            self.plain = _session(self.plain_source, f"the model '{self.label}'")

    def run(self, feed: dict, batch: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        names = [self.output] + self.extra
        outs = _run(self.session, names, feed, f"the model '{self.label}'", batch)
        out = outs[0]
        extra = dict(zip(self.extra, outs[1:]))
        if not self.checked or self.plain_every_batch:
            plain = _run(self.plain, [self.output], feed, f"the model '{self.label}'", batch)[0]
            if not self.checked:
                self.checked = True
                if _same(plain, out):
                    self.plain = None
                else:
                    self.plain_every_batch = True
            out = plain
        return out, extra

    def close(self) -> None:
        self.session = None
        self.plain = None


# --- per-model accumulators -----------------------------------------------------------------------------


@dataclass
class _TensorAcc:
    quantizer: object  # graph.ActivationQuantizer
    read_name: str  # output name of the instrumented quantized model
    stats: np.ndarray
    hist: np.ndarray | None = None
    hist_range: tuple[float, float] | None = None
    problem: str | None = None


@dataclass
class _ModelAcc:
    name: str
    info: dict
    runner: _Runner
    tensors: list[_TensorAcc]
    unmapped: list[dict]
    weights: list[dict]
    stats: np.ndarray
    correct: int = 0
    agree: int = 0
    sensitivity: list["_ModelAcc"] = field(default_factory=list)
    layer: dict | None = None
    notes: list[str] = field(default_factory=list)


# --- inputs ------------------------------------------------------------------------------------------------


def _files_read(model, data, quantized, calibration_data) -> list:
    """Every file simulate reads: the models with their external data, the data files."""
    paths = [model] + ([quantized] if isinstance(quantized, (str, os.PathLike)) else list(quantized or ()))
    files = [f for p in paths if isinstance(p, (str, os.PathLike)) for f in model_files(p)]
    return files + [data, calibration_data]


def _load(model, what: str):
    """(ir model, plain session source, label)."""
    import onnx
    import onnx_ir as ir

    from qtool.model.io import load_model

    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        loaded = load_model(path)
        return loaded.model, path, path
    if isinstance(model, onnx.ModelProto):
        return ir.serde.deserialize_model(model), model.SerializeToString(), f"<{what}>"
    if isinstance(model, ir.Model):
        return model, None, f"<{what}>"
    raise QtoolError(f"{what} must be a path, an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}")


def _read_data(data, specs, labels: str | None):
    from qtool.data import load_calibration_data

    label = None
    if isinstance(data, (str, os.PathLike)):
        label = os.fspath(data)
        if not os.path.exists(label):
            raise QtoolError(f"data file '{label}' does not exist")
        try:
            with np.load(label, allow_pickle=False) as archive:
                if not hasattr(archive, "files"):
                    raise QtoolError(f"data file '{label}' is not an .npz archive")
                arrays = {name: archive[name] for name in archive.files}
        except QtoolError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise QtoolError(f"cannot read data file '{label}': not a valid .npz file ({exc})") from exc
    elif isinstance(data, np.ndarray):
        arrays = {"": data}
    elif isinstance(data, dict):
        arrays = {str(k): np.asarray(v) for k, v in data.items()}
    else:
        raise QtoolError(f"data must be an .npz path or a dict of arrays, got {type(data).__name__}")
    where = f"'{label}'" if label else "the data"
    label_array = None
    if labels is not None:
        if labels not in arrays:
            have = ", ".join(repr(k) for k in arrays if k) or "none"
            raise QtoolError(f"no labels array {labels!r} in {where} (arrays: {have})")
        label_array = np.asarray(arrays.pop(labels))
        if label_array.ndim == 2 and label_array.shape[1] == 1:
            label_array = label_array[:, 0]
        if label_array.ndim != 1:
            raise QtoolError(f"labels {labels!r} must be one class id per sample (1-D), got shape {list(label_array.shape)}")
        if label_array.dtype.kind not in "iu":
            raise QtoolError(f"labels {labels!r} must be integer class ids, got dtype {label_array.dtype}")
    try:
        loaded = load_calibration_data(arrays, specs)
    except QtoolError as exc:
        raise QtoolError(f"{where}: {str(exc).replace('calibration data', 'data').replace('calibration arrays', 'arrays')}") from None
    if label_array is not None and len(label_array) != loaded.num_samples:
        raise QtoolError(
            f"labels {labels!r} hold {len(label_array)} class ids but {where} has {loaded.num_samples} samples"
        )
    loaded.source = label
    return loaded, label_array


def _check_inputs_match(float_specs, q_model, label: str) -> None:
    from qtool.data import input_specs

    q_specs = input_specs(q_model)
    fs = {s.name: s for s in float_specs}
    qs = {s.name: s for s in q_specs}
    if set(fs) != set(qs):
        raise QtoolError(
            f"quantized model '{label}' has inputs {sorted(qs)}, the float model has {sorted(fs)}: they must match"
        )
    for name, f in fs.items():
        q = qs[name]
        if f.dtype is not None and q.dtype is not None and f.dtype != q.dtype:
            raise QtoolError(f"quantized model '{label}': input '{name}' is {q.dtype}, in the float model {f.dtype}")
        if f.shape is not None and q.shape is not None:
            if len(f.shape) != len(q.shape) or any(
                isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(f.shape, q.shape)
            ):
                raise QtoolError(
                    f"quantized model '{label}': input '{name}' has shape {q.describe_shape()}, "
                    f"in the float model {f.describe_shape()}"
                )


def _parse_bits(bits, what: str) -> list[int]:
    if isinstance(bits, int):
        bits = [bits]
    elif isinstance(bits, str):
        try:
            bits = [int(b) for b in bits.replace(" ", "").split(",") if b]
        except ValueError:
            raise QtoolError(f"{what}: expected comma-separated integers like 4,8, got {bits!r}") from None
    out = []
    for b in bits:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 2 <= int(b) <= 16:
            raise QtoolError(f"{what}: bit widths must be integers from 2 to 16, got {b!r}")
        if int(b) not in out:
            out.append(int(b))
    if not out:
        raise QtoolError(f"{what}: give at least one bit width")
    return out


# --- the function ---------------------------------------------------------------------------------------------


@dataclass
class SimulateResult:
    """Every number of a simulation (``.report``), with text, JSON and HTML renderings."""

    report: dict

    def to_dict(self) -> dict:
        from qtool.simulate.report import json_safe

        return json_safe(self.report)

    def format_text(self, limit: int = 15) -> str:
        from qtool.simulate.report import format_text

        return format_text(self.report, limit=limit)

    def write_json(self, path) -> None:
        from qtool.simulate.report import write_json

        write_json(self.report, path)

    def write_html(self, path) -> None:
        from qtool.simulate.html import write_html

        write_html(self.report, path)


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
    json_path=None,
    html_path=None,
    progress: Progress | None = None,
) -> SimulateResult:
    """Compare ``model`` (float) with quantized versions of it on ``data``.

    ``model``: path (or ``onnx.ModelProto`` / ``onnx_ir.Model``) of the float model.
    ``data``: ``.npz`` path (or dict of arrays): one array per model input,
    samples first; ``labels`` names an array of integer class ids in it.
    ``output``: the model output to compare (default: the first).
    ``quantized``: quantized models (paths, protos or IR models) to compare.
    Without them, the float model is quantized in memory with ``rewrite_eval``
    for every (weight, activation) pair of ``weight_bits`` x ``activation_bits``,
    calibrated on ``calibration_data`` (or, when it is None, on ``data``
    itself, which the report says).
    ``sensitivity``: also run, for each quantized layer of each model, a model
    with only that layer quantized.
    ``histograms``: keep histograms of the quantized activations (for the HTML
    report; on when ``html_path`` is given). ``json_path``/``html_path``: write
    the report there. ``progress(label, done, total)`` is called after each batch
    of each pass over data.
    """
    start = time.perf_counter()
    check_outputs([json_path, html_path], _files_read(model, data, quantized, calibration_data))
    from qtool.data import input_specs
    from qtool.kernels import metrics as m
    from qtool.model.names import name_unnamed_nodes
    from qtool.simulate import graph as g

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise QtoolError(f"batch size must be a positive integer, got {batch_size!r}")
    if isinstance(quantized, (str, os.PathLike)):
        quantized = [quantized]
    quantized = list(quantized or ())
    if quantized and calibration_data is not None:
        raise QtoolError("--calibration-data is for the what-if table; the --quantized models are already calibrated")
    w_bits = _parse_bits(weight_bits, "weight bits")
    a_bits = _parse_bits(activation_bits, "activation bits")
    histograms = bool(histograms or html_path is not None)

    # --- float model, output, data: all checked before any work -------------------------------------
    f_model, f_source, f_label = _load(model, "model")
    if f_source is None:
        f_source = _model_bytes(f_model)
    out_names = [v.name for v in f_model.graph.outputs]
    if not out_names:
        raise QtoolError(f"the model '{f_label}' has no outputs")
    if output is None:
        output = out_names[0]
    elif output not in out_names:
        raise QtoolError(f"the model '{f_label}' has no output {output!r} (outputs: {', '.join(out_names)})")
    specs = input_specs(f_model)
    dataset, label_array = _read_data(data, specs, labels)
    d_label = dataset.source or "<data>"

    q_inputs = []
    for i, q in enumerate(quantized):
        q_model, q_source, q_label = _load(q, f"quantized model {i + 1}")
        _check_inputs_match(specs, q_model, q_label)
        q_outs = [v.name for v in q_model.graph.outputs]
        if output not in q_outs:
            raise QtoolError(
                f"quantized model '{q_label}' has no output {output!r} (its outputs: {', '.join(q_outs)})"
            )
        q_inputs.append((q_label, q_model, q_source, {"source": q_label}))

    notes: list[str] = []
    calibration = None
    if not quantized:
        from qtool.api import rewrite_eval  # TEMPORARY until the simulate refactor lands (injected by api)
        from qtool.config import CalibrationConfig, QuantConfig

        if calibration_data is None:
            cal_source = {k: v for k, v in dataset.arrays.items()}
            calibration = {"source": d_label, "on_evaluation_data": True, "samples": dataset.num_samples}
            notes.append(
                "calibrated on the evaluation data itself (no --calibration-data was given): "
                "ranges fit this data exactly, so the accuracy shown is optimistic"
            )
        else:
            cal_source = calibration_data
            calibration = {"source": os.fspath(calibration_data) if isinstance(calibration_data, (str, os.PathLike))
                           else "<arrays>", "on_evaluation_data": False}
        for wb in w_bits:
            for ab in a_bits:
                name = f"W{wb}A{ab}"
                cb = (lambda done, total, _n=name: progress(f"calibrating {_n}", done, total)) if progress else None
                result = rewrite_eval(
                    f_model if not isinstance(model, (str, os.PathLike)) else model,
                    calibration_data=cal_source,
                    calibration=CalibrationConfig(batch_size=batch_size),
                    quant=QuantConfig(weight_bits=wb, activation_bits=ab),
                    progress=cb,
                )
                if calibration is not None and "samples" not in calibration and result.summary.get("calibration"):
                    calibration["samples"] = result.summary["calibration"]["samples"]
                for w in result.warnings:
                    notes.append(f"{name}: {w}")
                q_inputs.append((name, result.model, None, {"source": "rewrite_eval (in memory)",
                                                           "weight_bits": wb, "activation_bits": ab}))

    # --- float model named like rewrite_eval names it, for the mapping ------------------------------------
    f_named = f_model if isinstance(model, (str, os.PathLike)) else g.clone(f_model)  # a fresh load is ours
    name_unnamed_nodes(f_named.graph)
    folded_cache: dict[frozenset, dict] = {}

    def folded_graph(exclude: frozenset):
        """The float model with the batch norms folded that the quantized model folded (for weights)."""
        if exclude not in folded_cache:
            from qtool.model.names import NameScope
            from qtool.onnx_rewrite.fold_batch_norms import fold_batch_norms

            folded = f_named.clone()
            try:
                fold_batch_norms(folded.graph, NameScope(folded.graph), exclude=exclude)
                folded_cache[exclude] = folded.graph
            except QtoolError:
                folded_cache[exclude] = None
        return folded_cache[exclude]

    f_bn = {n.name for n in f_named.graph if n.op_type == "BatchNormalization"}
    float_needed: list[str] = []
    accs: list[_ModelAcc] = []
    for name, q_model, q_source, info in q_inputs:
        qg = g.find_quantizers(q_model.graph)
        g.map_counterparts(q_model.graph, f_named.graph, qg)
        exclude = frozenset(n.name for n in q_model.graph if n.op_type == "BatchNormalization" and n.name in f_bn)
        f_folded = folded_graph(exclude)
        float_arrays = g.float_weights(f_folded, qg) if f_folded is not None else {w.name: None for w in qg.weights}
        weights = []
        for w in qg.weights:
            deq = w.dequantized()
            ref = float_arrays.get(w.name)
            entry = {"quantizer": w.name, "layer": w.layer.name, "op": w.layer.op_type,
                     "role": "weight" if w.index == 1 else "bias", "dtype": _dtype_name(w.dq.inputs[0])}
            if deq is None or ref is None or ref.shape != deq.shape:
                entry.update({"sqnr_db": None, "problem": "no float value to compare with" if ref is None or deq is None
                              else f"shape {list(deq.shape)} differs from the float {list(ref.shape)}"})
            else:
                st = m.pair_stats(ref, deq)
                entry.update(error_numbers(st))
                entry["float_range"], entry["quantized_range"] = _ranges(st)
            weights.append(entry)
        tensors, unmapped, reads = [], [], []
        for act in qg.activations:
            if act.counterpart is None:
                unmapped.append({"quantizer": act.name, "tensor": act.float_value.name, "reason": act.how})
                continue
            read = act.codes.name if act.reads_codes else act.output.name
            reads.append(read)
            acc = _TensorAcc(act, read, m.empty_stats())
            if histograms and act.representable is not None:
                lo, hi = act.representable
                pad = (hi - lo) * HIST_MARGIN if hi > lo else 1.0
                acc.hist_range = (lo - pad, hi + pad)
                acc.hist = np.zeros(HIST_BINS + 2, np.int64)
            tensors.append(acc)
            if act.counterpart not in float_needed and act.counterpart not in dataset.arrays:
                float_needed.append(act.counterpart)
        q_plain = q_source if q_source is not None else _model_bytes(q_model)
        instrumented = None
        if reads:
            dtypes = {a.codes.name: a.codes_dtype for a in qg.activations if a.codes_dtype is not None}
            instrumented, added = g.bytes_with_outputs(q_model, reads, dtypes)
            reads_ok = set(added) | {o.name for o in q_model.graph.outputs}
            for t in tensors:
                if t.read_name not in reads_ok:
                    t.problem = f"cannot read '{t.read_name}' from the quantized model"
            extra = [r for r in dict.fromkeys(reads) if r in reads_ok and r != output]
        else:
            extra = []
        runner = _Runner(name, output, q_plain, instrumented, extra)
        acc = _ModelAcc(name, info, runner, tensors, unmapped, weights, m.empty_stats())
        if sensitivity:
            layers = qg.layers()
            if f_folded is None:
                acc.notes.append("sensitivity: the float model could not be folded like the quantized one")
            for layer in layers:
                single, why = g.single_layer_model(q_model, layer.name, float_arrays)
                if single is None:
                    acc.notes.append(f"sensitivity: layer '{layer.name}' skipped: {why}")
                    continue
                s_runner = _Runner(f"{name} only {layer.name}", output, _model_bytes(single), None)
                s_acc = _ModelAcc(layer.name, {}, s_runner, [], [], [], m.empty_stats())
                s_acc.layer = {"layer": layer.name, "op": layer.op_type}
                acc.sensitivity.append(s_acc)
        accs.append(acc)

    f_inst = None
    if float_needed:
        f_inst, added = g.bytes_with_outputs(f_named, float_needed)
        missing = set(float_needed) - set(added) - {o.name for o in f_named.graph.outputs}
        for acc in accs:
            for t in acc.tensors:
                if t.quantizer.counterpart in missing:
                    t.problem = f"cannot read float tensor '{t.quantizer.counterpart}'"
        f_extra = [n for n in float_needed if n not in missing and n != output]
    else:
        f_extra = []
    f_runner = _Runner("float", output, f_source, f_inst, f_extra)

    # --- one pass over the data --------------------------------------------------------------------------------
    runners = [f_runner] + [a.runner for a in accs] + [s.runner for a in accs for s in a.sensitivity]
    for r in runners:
        r.open()
    total = dataset.num_samples
    f_correct = 0
    done = 0
    classes = None
    if progress:
        progress("evaluating", 0, total)
    for batch_no, feed in enumerate(dataset.batches(batch_size), start=1):
        feed = {k: np.ascontiguousarray(v) for k, v in feed.items()}
        n = len(next(iter(feed.values())))
        f_out, f_vals = f_runner.run(feed, batch_no)
        f_vals.update(feed)
        f_vals[output] = f_out
        f_out = np.asarray(f_out)
        if f_out.ndim == 0 or f_out.shape[0] != n:
            raise QtoolError(f"output {output!r} has shape {list(f_out.shape)}: expected the {n} samples of the batch first")
        f_top = m.argmax_rows(f_out)
        lab = None
        if label_array is not None:
            lab = np.ascontiguousarray(label_array[done : done + n]).astype(np.int64)
            if classes is None:
                classes = f_out.size // n
            bad = (lab < 0) | (lab >= classes)
            if bad.any():
                raise QtoolError(
                    f"labels {labels!r} hold class id {int(lab[bad][0])}, but output {output!r} has {classes} classes"
                )
            f_correct += m.count_equal(f_top, lab)
        for acc in accs:
            _update_model(acc, feed, batch_no, f_out, f_top, lab, f_vals, m)
            for s in acc.sensitivity:
                _update_model(s, feed, batch_no, f_out, f_top, lab, f_vals, m)
        done += n
        if progress:
            progress("evaluating", done, total)
    for r in runners:
        r.close()

    # --- the report ------------------------------------------------------------------------------------------------
    if f_runner.plain_every_batch:
        notes.append("the float model's output changed when tensors were added as outputs: "
                     "its numbers come from the unmodified model, run beside it")
    report = {
        "model": f_label,
        "data": d_label,
        "samples": total,
        "batch_size": batch_size,
        "output": output,
        "labels": labels,
        "calibration": calibration,
        "float": {
            "accuracy": f_correct / total if label_array is not None else None,
            "correct": f_correct if label_array is not None else None,
        },
        "models": [_model_report(a, total, label_array is not None, notes) for a in accs],
        "notes": notes,
        "seconds": None,
        "conventions": CONVENTIONS,
    }
    report["seconds"] = round(time.perf_counter() - start, 3)
    result = SimulateResult(report)
    if json_path is not None:
        result.write_json(json_path)
    if html_path is not None:
        result.write_html(html_path)
    return result


CONVENTIONS = {
    "sqnr_db": "10*log10(sum(float^2) / sum((float - quantized)^2)) over every value of every sample; "
               "\"inf\" when the two are identical (no error)",
    "non_finite": "JSON has no infinity: +-infinity and NaN are written as the strings \"inf\", \"-inf\", \"nan\"",
    "null": "null means not measured (no labels, no float counterpart, ...); a reason is given beside it",
    "accuracy": "top-1 (argmax over each sample's output, numpy's first-maximum rule) equal to the label",
    "agreement": "fraction of samples whose top-1 class equals the float model's",
    "cosine": "cosine similarity of the float and quantized tensors, all samples as one vector",
    "order": "activations, weights and sensitivity lists are sorted worst (lowest SQNR) first",
}


def _dtype_name(value) -> str | None:
    dtype = value.dtype if value is not None else None
    if dtype is None and value is not None and value.const_value is not None:
        dtype = value.const_value.dtype
    return dtype.name.lower() if dtype is not None else None


def _update_model(acc: _ModelAcc, feed, batch_no, f_out, f_top, lab, f_vals, m) -> None:
    out, vals = acc.runner.run(feed, batch_no)
    out = np.asarray(out)
    if out.shape != f_out.shape:
        raise QtoolError(
            f"the model '{acc.runner.label}' output {acc.runner.output!r} has shape {list(out.shape)}, "
            f"the float model's {list(f_out.shape)}"
        )
    m.combine(acc.stats, m.pair_stats(f_out, out))
    top = m.argmax_rows(out)
    acc.agree += m.count_equal(top, f_top)
    if lab is not None:
        acc.correct += m.count_equal(top, lab)
    vals = vals if vals else {}
    for t in acc.tensors:
        if t.problem:
            continue
        q = t.quantizer
        ref = f_vals.get(q.counterpart)
        test = vals.get(t.read_name)
        if test is None and t.read_name == acc.runner.output:
            test = out
        if ref is None or test is None:
            t.problem = "tensor not produced by onnxruntime"
            continue
        if ref.size != test.size:
            t.problem = f"float tensor has shape {list(ref.shape)}, the quantized one {list(test.shape)}"
            continue
        if q.reads_codes and t.read_name == q.codes.name:
            part = m.pair_stats(ref, test, q.scale, q.zero_point, q.representable)
        else:
            part = m.pair_stats(ref, test, None, 0, q.representable)
        m.combine(t.stats, part)
        if t.hist is not None:
            m.histogram_update(ref, t.hist_range[0], t.hist_range[1], t.hist)


def _model_report(acc: _ModelAcc, total: int, has_labels: bool, notes: list[str]) -> dict:
    from qtool.kernels import metrics as m

    r = dict(acc.info)
    r["name"] = acc.name
    r["accuracy"] = acc.correct / total if has_labels else None
    r["correct"] = acc.correct if has_labels else None
    r["agreement"] = acc.agree / total
    r["output"] = error_numbers(acc.stats)
    if acc.runner.plain_every_batch:
        acc.notes.append("the output changed when tensors were added as outputs: the model numbers come from "
                         "the unmodified model, run beside the instrumented copy")
    acts = []
    for t in acc.tensors:
        q = t.quantizer
        e = {
            "quantizer": q.name,
            "tensor": q.float_value.name,
            "float_tensor": q.counterpart,
            "matched_by": q.how,
        }
        rep = q.representable
        e["quantizer_range"] = list(rep) if rep is not None else None
        if t.problem:
            e.update({"sqnr_db": None, "problem": t.problem})
        else:
            e.update(error_numbers(t.stats))
            e["float_range"], e["quantized_range"] = _ranges(t.stats)
            count = t.stats[m.COUNT] + t.stats[m.NONFINITE]
            if rep is not None and count:
                e["clipped_low"] = int(t.stats[m.CLIP_LOW])
                e["clipped_high"] = int(t.stats[m.CLIP_HIGH])
                e["clipped_fraction"] = float((t.stats[m.CLIP_LOW] + t.stats[m.CLIP_HIGH]) / count)
        if t.hist is not None and not t.problem:
            e["histogram"] = {"range": list(t.hist_range), "counts": t.hist[:-2].tolist(),
                              "below": int(t.hist[-2]), "above": int(t.hist[-1])}
        acts.append(e)
    r["activations"] = sorted(acts, key=_worst_first)
    r["weights"] = sorted(acc.weights, key=_worst_first)
    r["unmatched_activations"] = acc.unmapped
    if acc.sensitivity or any("sensitivity" in n for n in acc.notes):
        sens = []
        for s in acc.sensitivity:
            e = dict(s.layer)
            e["output"] = error_numbers(s.stats)
            e["sqnr_db"] = e["output"]["sqnr_db"]
            e["accuracy"] = s.correct / total if has_labels else None
            e["agreement"] = s.agree / total
            sens.append(e)
        r["sensitivity"] = sorted(sens, key=_worst_first)
    r["notes"] = acc.notes
    return r


def _worst_first(entry: dict):
    v = entry.get("sqnr_db")
    if v is None:
        return (2, 0.0)
    if isinstance(v, float) and math.isnan(v):
        return (1, 0.0)
    return (0, v)
