"""qtool's public functions: each a short story (load, plan, calibrate, rewrite, save).

They take typed options (:class:`~qtool.config.QuantConfig`,
:class:`~qtool.config.CalibrationConfig`, :class:`~qtool.config.TrainSchedule`)
and return typed results. The CLI calls these; ``qtool.rewrite_eval`` etc.
are these functions. This is the only module that joins the features:
``onnx_rewrite`` plans and encodes, ``calibrate`` observes ranges, and the
ranges pass between them here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from collections.abc import Callable

from qtool import calibrate as cal
from qtool.calibrate.branch_data import BranchCapture, BranchData
from qtool.calibrate.observers import AUTO, AUTO_METHODS
from qtool.config import CalibrationConfig, QuantConfig, TrainSchedule
from qtool.data import CalibrationData, input_specs, load_calibration_data
from qtool.errors import QtoolError
from qtool.finetune.config import FinetuneConfig
from qtool.model.codec import foreign_quantization
from qtool.model.io import (
    OpenedModel,
    as_ir_model,
    check_output_path,
    check_outputs,
    large_model_bytes,
    load_model,
    model_files,
    open_model,
    save_model,
    same_file,
)
from qtool.model.opset import inferred_types
from qtool.model.runtime_graph import worth_looking
from qtool.model.session import show_onnxruntime_warnings
from qtool.onnx_rewrite.branches import (
    branch_config,
    branch_layers,
    extract_branch,
    finish_branches,
    if_branches,
    outer_reads,
)
from qtool.onnx_rewrite.eval_rewrite import encode_eval, fold_and_plan, prepare_branch, prepare_eval, raise_opset
from qtool.onnx_rewrite.report import BranchResult, Files, RewriteResult, TrainResult, eval_messages
from qtool.onnx_rewrite.train_branches import TrainedBranch, join_branches, splice_trained
from qtool.onnx_rewrite.train_rewrite import encode_train, existing_contract, prepare_train
from qtool.simulate import latency
from qtool.simulate.config import SimulateConfig
from qtool.simulate.latency import timed_warnings
from qtool.simulate.output_check import reference as output_reference
from qtool.simulate.core import run_simulation
from qtool.simulate.result import SimulateResult

Progress = Callable[[int, int], None]  # (samples done, samples total)

__all__ = ["rewrite_eval", "rewrite_train", "calibrate", "calibrate_to_file", "simulate", "finetune",
           "show_onnxruntime_warnings"]


class _Clock:
    """Seconds spent in each step, for the summary's ``timings``."""

    def __init__(self):
        self._last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(self.laps.get(name, 0.0) + now - self._last, 3)
        self._last = now


def _check_float(opened: OpenedModel) -> None:
    """qtool quantizes float models (or its own output, idempotently); never a second time."""
    reason = foreign_quantization(opened.model.graph)
    if reason is not None:
        raise QtoolError(f"'{opened.label}' is already quantized: {reason}. qtool quantizes float models: "
                         "give it the float model (to compare quantized models, use qtool simulate --quantized)")


def _stage(progress, name: str) -> None:
    """Tell a ``progress`` that hears stages (a ``stage(name, done, total)`` method: the CLI's) that ``name``
    starts (a step over no data that takes seconds on a large model)."""
    stage = getattr(progress, "stage", None)
    if stage is not None:
        stage(name, 0, 0)


def _large_model_stage(progress, what: str, model) -> None:
    """The stage of reading or writing a model of ``LARGE_MODEL_BYTES`` or more (a BERT-base's 440 MB: 5 s to
    read); smaller ones have none, so that a mistake found while loading stays one line."""
    if getattr(progress, "stage", None) is None:
        return
    size = large_model_bytes(model)
    if size is not None:
        _stage(progress, f"{what} the model ({size / 2**20:.0f} MB)")


def _load_data(source, opened: OpenedModel) -> CalibrationData | None:
    return None if source is None else load_calibration_data(source, input_specs(opened.model))


def _save(opened: OpenedModel, progress=None) -> Files:
    files = Files(opened.label, opened.output, opened.in_place)
    if opened.output is not None:
        _large_model_stage(progress, "writing", opened.model)
        files.external_data = save_model(opened.model, opened.output, external_data=opened.external_data)
    return files


def rewrite_eval(model, output=None, *, quant: QuantConfig = QuantConfig(),
                 calibration: CalibrationConfig = CalibrationConfig(), calibration_data=None, ranges=None,
                 in_place: bool = False, progress: Progress | None = None,
                 latency_rounds: int | None = None) -> RewriteResult:
    """Fold batch norms, insert QuantizeLinear/DequantizeLinear, write a deployable int8 model.

    ``model``: path to an ONNX file (or an ``onnx.ModelProto`` / ``onnx_ir.Model``,
    rewritten in memory). ``output``: where to write; ``in_place=True`` replaces
    the input file instead (by one rename at the end). With neither, nothing is
    written and the rewritten model is returned in the result.
    ``calibration_data``: ``.npz``/``.npy`` path, array, or dict of arrays, observed
    as ``calibration`` says; ``ranges``: a ranges file written by ``qtool calibrate``
    (or an onnxruntime calibration cache), or a dict of ``(min, max)``, instead.
    With neither, a training graph's trained ranges, else TF's defaults (the
    summary warns). ``progress(done, total)`` is called after each calibration batch; a ``progress``
    with a ``stage(name, done, total)`` method also hears the other steps (loading and writing a model of
    ``LARGE_MODEL_BYTES`` or more, the check of the int8 model, ``--calibration-method auto``'s rewrites).
    ``latency_rounds``: also time the float model and the written one in onnxruntime on the first
    calibration sample (:mod:`qtool.simulate.latency`: one thread, interleaved, median of the rounds).
    """
    clock = _Clock()
    if ranges is not None and calibration_data is not None:
        raise QtoolError("give either calibration data or a ranges file (--ranges), not both")
    if latency_rounds and calibration_data is None:
        raise QtoolError("--latency times the models on the first sample of --data: give --data")
    _large_model_stage(progress, "loading", model)
    opened = open_model(model, output, in_place, inputs=[calibration_data, ranges])
    _check_float(opened)
    # the model as given, before the rewrite changes it
    float_timing = latency.one_thread_session(opened.model, what="the float model") if latency_rounds else None
    float_profiled = latency.one_thread_session(opened.model, what="the float model", profiled=True) \
        if latency_rounds else None
    clock.lap("load")
    given = cal.read_ranges(ranges) if ranges is not None else None
    auto = calibration.method == AUTO and calibration_data is not None
    source = opened.model.clone() if auto else None  # each method's ranges are written on a fresh copy
    prepared = prepare_eval(opened.model, quant, opened.label)
    opened.model = prepared.model  # a raised opset is a new model
    data = _load_data(calibration_data, opened)
    clock.lap("fold")
    # the float model's outputs on the first batch, for the check of what is written (before any rewrite):
    # the calibration pass computes them
    reference = output_reference(data, calibration.batch_size) if _worth_checking(prepared, data) else None
    observed, ranges_from, given_all = None, None, None
    if data is not None:  # (all of the model's tensors may be inside If branches)
        held = len(reference.feeds) if auto and reference is not None else 0  # auto's check batches
        observed, found = _observe(prepared, data, calibration, progress, held,
                                   reference.take if reference is not None else None)
        reference = reference.finished(prepared.model) if reference is not None else None
    elif given is not None:
        label = "the ranges file" if isinstance(ranges, (str, os.PathLike)) else "the given ranges"
        given_all = _given_ranges(given, prepared)  # If branches' tensors too
        found = cal.select(given_all, prepared.tensors_to_calibrate(), label)
        ranges_from = os.fspath(ranges) if isinstance(ranges, (str, os.PathLike)) else "<ranges>"
    else:
        found = prepared.trained_ranges()
        ranges_from = "the training graph's trained state" if found is not None else None
        given_all = prepared.trained.branch_ranges if prepared.trained is not None else None
    if auto:
        prepared, found, encoding, branches, check = _best_calibration(source, prepared, observed, reference, data,
                                                                       calibration, quant, opened.label, progress)
        clock.lap("calibrate, encode and check (auto)")
    else:
        encoding, branches = _encode(prepared, found, data, calibration, given_all, progress, clock)
        check = _check(reference, prepared.model, calibration.method, progress)
    warnings, notes = eval_messages(prepared, encoding, found, observed,
                                    list(data.ignored) if data is not None else [], branches)
    if check is not None:
        warnings += check.warnings()
        clock.lap("check")
    opened.model = prepared.model
    files = _save(opened, progress)
    clock.lap("save")
    timed = None
    if float_timing is not None and (check is None or check.error is None):
        _stage(progress, "timing the float and int8 models in onnxruntime")
        timed = _time_written(float_timing, float_profiled, prepared.model, data, calibration.batch_size,
                              latency_rounds)
        warnings += timed_warnings(timed)
        clock.lap("latency")
    result = RewriteResult(prepared.model, files, prepared, encoding, observed, ranges_from, warnings, notes,
                           clock.laps, branches, check, timed)
    result.warnings.extend(result.runtime_warnings())
    return result


def _time_written(float_session, float_profiled, written, data: CalibrationData, batch_size: int, rounds: int):
    """The float model's and the written model's one-thread latency on the data's first sample, and where the
    time of each goes (``float_profiled``: the float model's session with the profiler on)."""
    batches = data.batches(batch_size)
    try:
        feed = data.first_sample(next(batches))
    finally:
        batches.close()
    timed = latency.timed(float_session, {"quantized": latency.one_thread_session(written, what="the written model")},
                          feed, rounds)
    profiled = latency.one_thread_session(written, what="the written model", profiled=True)
    return timed.with_ops({latency.FLOAT: latency.op_times(float_profiled, feed),
                           "quantized": latency.op_times(profiled, feed)})


AUTO_MARGIN_DB = 0.5


def _encode(prepared, found: dict, data, calibration: CalibrationConfig, given_all=None, progress=None,
            clock: _Clock | None = None):
    """``prepared``'s model encoded with the ranges ``found`` (its If branches calibrated and rewritten
    first): ``(encoding, branch results)``."""
    branches = _rewrite_branches(prepared.model, prepared.config, data, calibration, given_all, progress=progress)
    if clock is not None:
        clock.lap("calibrate")
    encoding = encode_eval(prepared, found)
    if branches:
        finish_branches(prepared.model.graph)
    if clock is not None:
        clock.lap("encode")
    return encoding, branches


def _best_calibration(source, prepared, observed, reference, data, calibration: CalibrationConfig,
                      quant: QuantConfig, label, progress=None):
    """``--calibration-method auto``: the model written with each method's ranges (one histogram pass
    gave them all; If branches are calibrated by each method in turn), its outputs checked against the
    float model's on the first calibration batch. Each method is judged on ranges from the *other*
    batches (``CandidatesObserver``: a method that fits the tails of the samples it is checked on looks
    better than it is); the one kept is then written with ranges from all of them. In the order of
    :data:`AUTO_METHODS` (min/max first), a method replaces the one kept when its worst output is more
    than :data:`AUTO_MARGIN_DB` closer to float's (less is noise on 16 samples). ``(prepared, ranges,
    encoding, branches, check)`` of the one kept; without a check to choose by (nothing to quantize outside
    If branches, or no float output), min/max."""
    held = reference is not None and observed is not None and observed.num_batches > len(reference.feeds)
    candidates = observed.candidates(held_out=held) if observed is not None else dict.fromkeys(AUTO_METHODS, {})
    tried, kept, best = {}, None, None
    stage = getattr(progress, "stage", None)

    def report(done: int) -> None:
        if stage is not None:
            stage(f"writing the model with each of {len(candidates)} calibration methods", done, len(candidates))

    def written(method: str, found: dict, ready=None):
        """``(prepared, ranges, encoding, branches, check)``: the model written with ``found``."""
        ready = ready or prepare_eval(source.clone(), quant, label)
        encoding, branches = _encode(ready, found, data, dataclasses.replace(calibration, method=method),
                                     progress=progress)
        check = reference.check(ready.model, method, worth_looking(ready.model)) if reference else None
        return ready, found, encoding, branches, check

    report(0)
    for i, (method, found) in enumerate(candidates.items()):
        result, prepared = written(method, found, prepared), None
        check = result[4]
        worst = check.worst() if check is not None and check.error is None else None
        # the written model does not run: infinitely far; no float output with a signal: nothing to choose by
        tried[method] = worst[1] if worst is not None else (float("-inf") if check is not None and check.error
                                                             else None)
        if kept is None or (tried[method] is not None and tried[method] > tried[kept] + AUTO_MARGIN_DB):
            kept, best = method, None if held else result  # (held out: written again below, not kept)
        if tried[method] is None:  # nothing to choose by
            break
        report(i + 1)
    if held:  # the method kept, calibrated on every batch
        best = written(kept, observed.candidates()[kept])
    prepared, found, encoding, branches, check = best
    if observed is not None:
        observed.chosen, observed.ranges = kept, found
    if check is not None:
        check.tried = tried
        check.tried_calibrated_on = observed.num_samples - reference.samples if held else None
    return prepared, found, encoding, branches, check


def _check(reference, model, method: str, progress=None):
    """The written ``model``'s outputs against ``reference`` (None: no check), told to a ``progress`` that hears
    stages (an int8 run over the first samples: seconds on a large model)."""
    if reference is None:
        return None
    _stage(progress, "checking the int8 model against float")
    return reference.check(model, method, worth_looking(model))


def _worth_checking(prepared, data) -> bool:
    """Calibration data, and something to quantize (an already quantized model is left as it is)."""
    return data is not None and (not prepared.plan.is_empty() or bool(if_branches(prepared.model.graph)))


def _rewrite_branches(model, config: QuantConfig, data: CalibrationData | None, calibration: CalibrationConfig,
                      given: dict | None = None, encode: bool = True, progress=None) -> list[BranchResult]:
    """Every If branch of ``model``'s graph that holds a layer op, quantized as a model of its own
    (``onnx_rewrite.branches``): calibrated on the tensors ``data`` gives it (or its ranges taken from
    ``given``, named as a calibration names them), encoded (``encode``), and moved back; its own If
    branches in turn. ``encode=False``: only calibrated (``BranchResult.ranges``), for a ranges file.
    ``progress(done, total)`` after each batch of each branch's calibration pass."""
    def rewrite(extracted, layers, capture):
        node, attr = extracted.node, extracted.attribute
        try:
            done = _rewrite_branch(extracted, capture, data, config, calibration, given, encode, progress)
            return (BranchResult(node.name, attr, layers, reason=done) if isinstance(done, str) else
                    BranchResult(node.name, attr, layers, *done))
        finally:
            extracted.splice()
            for domain, version in extracted.model.opset_imports.items():  # com.microsoft (DynamicQuantizeLSTM)
                if domain:
                    model.opset_imports.setdefault(domain, version)

    return _each_branch(model, data, rewrite)


def _rewrite_branch(extracted, capture, data, config: QuantConfig, calibration: CalibrationConfig, given, encode,
                    progress):
    """A branch model's rewrite: ``(result, ranges, samples)``, or the reason it stays float."""
    node, attr = extracted.node, extracted.attribute
    setup = _branch_setup(extracted, capture, data, config, calibration)
    if isinstance(setup, str):
        return setup
    config, feeds = setup
    if feeds is None and given is None:
        return "not calibrated (no --data or --ranges)"
    prepared = prepare_branch(extracted.model, config)
    observed = None
    # a branch's ranges are named "<If>:<branch>:<tensor>": sibling branches read one enclosing tensor,
    # each calibrated on its own samples
    scope = f"{node.name}:{attr}:"
    if feeds is not None:
        observed, found = _observe(prepared, feeds, calibration, progress)
    else:
        tensors = prepared.tensors_to_calibrate()
        given = {name[len(scope):]: r for name, r in given.items() if name.startswith(scope)}
        missing = [t for t in tensors if t not in given]
        if missing:
            return (f"the ranges have none for its tensors (e.g. '{scope}{missing[0]}'): calibrate it with --data "
                    "or qtool calibrate")
        found = {t: given[t] for t in tensors}
    inner = _rewrite_branches(prepared.model, prepared.config, feeds, calibration, given, encode, progress)
    ranges = {scope + name: r for name, r in found.items()}
    ranges.update({scope + name: r for branch in inner for name, r in branch.ranges.items()})
    samples = feeds.num_samples if feeds is not None else 0
    if not encode:
        return None, ranges, samples
    encoding = encode_eval(prepared, found)
    warnings, notes = eval_messages(prepared, encoding, found, observed, [], inner)
    result = RewriteResult(prepared.model, Files(f"{node.name} ({attr})", None), prepared, encoding, observed,
                           None, warnings, notes, {}, inner)
    return result, ranges, samples


def _observe(prepared, data, calibration: CalibrationConfig, progress=None, held_out: int = 0, outputs=None):
    """``(calibration result, ranges)`` of the tensors ``prepared``'s plan calibrates, observed on ``data``;
    ``(None, {})`` when it calibrates none (its layers all inside If branches). ``held_out``, ``outputs``: see
    ``collect_ranges``."""
    tensors = prepared.tensors_to_calibrate()
    if not tensors:
        return None, {}
    observed = cal.collect_ranges(prepared.model, tensors, data, calibration, prepared.config, progress,
                                  whole=prepared.whole_range_tensors(), held_out=held_out, outputs=outputs)
    return observed, observed.ranges


def _given_ranges(given: cal.GivenRanges, prepared) -> dict:
    """The given ranges, checked against the rewrite: made for other options, or for tensors the
    batch-norm fold changes, they are refused or converted, never used silently."""
    recorded = given.quantization.get("symmetric")
    if recorded is not None and bool(recorded) != prepared.config.symmetric:
        raise QtoolError(f"{given.label} was calibrated for {'symmetric' if recorded else 'asymmetric'} activations "
                         f"and --{'no-' if recorded else ''}symmetric is asked for: the histogram methods choose "
                         "other ranges for each; calibrate again with the same options (qtool calibrate)")
    ranges = dict(given.ranges)
    if given.format != "onnxruntime":
        return ranges
    # onnxruntime calibrates the float graph: a folded layer's output there is before its batch norm; the
    # batch norm's output is what the folded layer now computes
    for record in prepared.folds.folded:
        if record.output in ranges:
            ranges[record.folded] = ranges[record.output]
        elif record.folded in ranges:
            raise QtoolError(
                f"{given.label} is an onnxruntime calibration cache with a range for '{record.folded}' (before the "
                f"batch norm '{record.batch_norm}' that qtool folds into '{record.layer}') but none for the batch "
                f"norm's output '{record.output}': the folded layer's range is unknown. Calibrate with qtool "
                "(qtool calibrate, or --data) instead")
    return ranges


def rewrite_train(model, output=None, *, quant: QuantConfig = QuantConfig(),
                  schedule: TrainSchedule = TrainSchedule(), calibration: CalibrationConfig = CalibrationConfig(),
                  calibration_data=None, in_place: bool = False, progress: Progress | None = None) -> TrainResult:
    """Write a quantization-aware training graph (TF's ``create_training_graph``).

    ``schedule``: ``quant_delay`` (steps before fake quantization switches on)
    and ``freeze_bn_delay`` (the step from which batch norms use their moving
    statistics; None: never). ``calibration_data``: initial activation ranges
    (else TF's (-6, 6), and (0, 6) after Relu/Clip), observed as ``calibration``
    says. The training contract is in ``metadata_props["qtool.training"]``
    (``docs/training.md``); a qtool training graph is returned as it is. ``progress``: as
    :func:`rewrite_eval`'s.
    """
    _only_rewrite_eval_chooses(calibration, "rewrite-train's initial ranges")
    _large_model_stage(progress, "loading", model)
    opened = open_model(model, output, in_place, inputs=[calibration_data])
    _check_float(opened)
    contract = existing_contract(opened.model, opened.label)
    if contract is not None:  # already rewritten: report, do not rewrite twice
        if in_place:
            opened.output = None
        return TrainResult(opened.model, _save(opened, progress), quant, schedule, contract)
    data = _load_data(calibration_data, opened)
    prepared = prepare_train(opened.model, quant)
    opened.model = prepared.model
    observed, ranges = None, {}
    tensors = prepared.tensors_to_calibrate()
    if data is not None and tensors:
        observed = cal.collect_ranges(prepared.planned, tensors, data, calibration, quant, progress,
                                      whole=prepared.whole_range_tensors())
        ranges = observed.ranges  # named as in the eval-folded copy the plan was made on
    encoded, branches = _encode_train(prepared, schedule, ranges, data, calibration, progress)
    branches = list(_every_branch(branches))
    trained = [b for b in branches if isinstance(b, TrainedBranch)]
    files = _save(opened, progress)
    ignored = list(data.ignored) if data is not None else []
    return TrainResult(prepared.model, files, quant, schedule, encoded.contract, prepared, encoded, observed, ignored,
                       [b for b in branches if not isinstance(b, TrainedBranch)],
                       [f"inside If '{b.node.name}' ({b.attribute})" for b in trained])


def _encode_train(prepared, schedule: TrainSchedule, ranges: dict, data: CalibrationData | None,
                  calibration: CalibrationConfig, progress=None):
    """``prepared`` encoded for training with its If branches (:func:`_train_branches`, their own If branches
    in turn), their state joined to its graph: ``(encoding, branch results)``."""
    branches = _train_branches(prepared.model, prepared.config, schedule, data, calibration, progress)
    prepared.names.reserve_graph(prepared.model.graph)  # the names the branches brought (their state moved up)
    encoded = encode_train(prepared, schedule, ranges)
    trained = [b for b in branches if isinstance(b, TrainedBranch)]
    if trained:
        join_branches(prepared.model, trained, encoded.contract)
        finish_branches(prepared.model.graph)
    return encoded, branches


def _every_branch(branches: list):
    """``branches`` and, after each trained one, its own (at any depth)."""
    for branch in branches:
        yield branch
        yield from _every_branch(getattr(branch, "inner", []))


def _train_branches(model, config: QuantConfig, schedule: TrainSchedule, data: CalibrationData | None,
                    calibration: CalibrationConfig, progress=None) -> list:
    """Every If branch of ``model``'s graph that holds a layer op, encoded for training as a model of its own
    (``onnx_rewrite.train_branches``; its own If branches in turn, :func:`_encode_train`): calibrated on the samples that take it (none: it stays float, as
    ``rewrite-eval`` leaves it; no data at all: TensorFlow's default ranges), encoded by ``encode_train``,
    and moved back with its training state in the enclosing graph. Returns a :class:`TrainedBranch`, or a
    :class:`BranchResult` saying why it stays float, per branch. Before the enclosing graph's encoding (the
    branches read its tensors as the calibration session computes them)."""
    def train(extracted, layers, capture):
        try:
            done = _train_branch(extracted, capture, data, config, calibration, schedule, progress)
        except BaseException:
            extracted.splice()
            raise
        if isinstance(done, tuple):
            return splice_trained(extracted, *done, model.graph)
        extracted.splice()
        return BranchResult(extracted.node.name, extracted.attribute, layers, reason=done)

    return _each_branch(model, data, train)


def _train_branch(extracted, capture, data, config: QuantConfig, calibration: CalibrationConfig,
                  schedule: TrainSchedule, progress) -> tuple[dict, list] | str:
    """A branch model's training encoding: ``(its contract, its own If branches' results)``, or the reason it
    stays float."""
    setup = _branch_setup(extracted, capture, data, config, calibration)
    if isinstance(setup, str):
        return setup
    config, feeds = setup
    prepared = prepare_train(extracted.model, config)
    if prepared.model is not extracted.model:
        return "its opset had to be raised"
    ranges = {}
    if feeds is not None and prepared.tensors_to_calibrate():
        ranges = cal.collect_ranges(prepared.planned, prepared.tensors_to_calibrate(), feeds, calibration, config,
                                    progress, whole=prepared.whole_range_tensors()).ranges
    encoded, inner = _encode_train(prepared, schedule, ranges, feeds, calibration, progress)
    return encoded.contract, inner


def _branch_capture(model, found: list, data: CalibrationData | None):
    """The session that computes what the If branches ``found`` read, on ``data`` (None without data), and
    the reason none could be built (then every branch stays float)."""
    if not found or data is None:
        return None, None
    reads = [v for node, attr in found for v in outer_reads(node.attributes[attr].as_graph())]
    try:
        return BranchCapture(model, reads, [node.inputs[0] for node, _ in found]), None
    except QtoolError as exc:
        return None, str(exc)


def _each_branch(model, data: CalibrationData | None, handle) -> list:
    """``handle(extracted, layers, capture)`` of every If branch of ``model``'s graph that holds a layer op, taken
    out as a model of its own in turn (``handle`` puts it back), ``capture`` the session that computes what the
    branches read on ``data``; when none can be built, every branch stays float with the reason, none taken out."""
    found = if_branches(model.graph)
    capture, why = _branch_capture(model, found, data)
    if why is not None:
        return [BranchResult(node.name, attr, branch_layers(node, attr), reason=why) for node, attr in found]
    types = inferred_types(model.graph) if found else {}
    results = []
    for node, attr in found:
        layers = branch_layers(node, attr)  # before the branch is taken out
        results.append(handle(extract_branch(node, attr, model, types), layers, capture))
    return results


def _branch_setup(extracted, capture, data, config: QuantConfig, calibration: CalibrationConfig):
    """``(the branch's config, its calibration batches or None)``, or the reason the branch stays float."""
    config = branch_config(config, extracted.model.graph)
    if config is None:
        return "outside --scope"
    feeds = _branch_feeds(extracted, capture, data, calibration)
    return feeds if isinstance(feeds, str) else (config, feeds)


def _branch_feeds(extracted, capture, data, calibration: CalibrationConfig):
    """The calibration batches that take the branch (None without data), or why there are none."""
    if capture is None:
        return None
    node, attr = extracted.node, extracted.attribute
    feeds = BranchData(capture, data, calibration.batch_size, node.inputs[0].name, attr == "then_branch",
                       [v.name for v in extracted.model.graph.inputs])
    if feeds.num_samples == 0:
        return "no calibration sample took this branch"
    extracted.type_inputs(feeds.dtypes)
    return feeds


def calibrate(model, data, tensors=None, *, quant: QuantConfig = QuantConfig(),
              calibration: CalibrationConfig = CalibrationConfig(), progress: Progress | None = None):
    """Observe activation ranges of ``model`` on ``data``.

    ``model``: a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``; ``data``: a
    ``.npz``/``.npy`` path, an array, or a dict of arrays. ``tensors``: names of
    the tensors to observe in ``model`` as given; when None, the model's batch
    norms are folded (on a copy) and the tensors are the ones ``rewrite_eval``
    would quantize with ``quant``, named as in the folded model.

    Returns a :class:`~qtool.calibrate.CalibrationResult` whose ``ranges`` map
    tensor names to ``(min, max)`` (None when only non-finite values were seen).
    """
    ir_model = as_ir_model(model)
    if not isinstance(model, (str, os.PathLike)):
        ir_model = ir_model.clone()
    return _calibrate(ir_model, data, tensors, quant, calibration, progress)


def _only_rewrite_eval_chooses(calibration: CalibrationConfig, what: str) -> None:
    if calibration.method == AUTO:
        raise QtoolError(f"--calibration-method auto chooses by the int8 model it writes: rewrite-eval only, not "
                         f"{what} (give the method rewrite-eval's summary says it kept)")


def _calibrate(ir_model, data, tensors, quant: QuantConfig, calibration: CalibrationConfig, progress):
    _only_rewrite_eval_chooses(calibration, "a ranges file" if tensors is None else "a calibration")
    whole, planned = [], tensors is None
    if planned:  # at the opset rewrite-eval raises it to: its rewrites (a ConvTranspose as Conv) depend on it
        ir_model = raise_opset(ir_model, quant)
        plan = fold_and_plan(ir_model, quant)[2]
        tensors, whole = plan.tensors_to_calibrate(), plan.whole_range_tensors()
    loaded = load_calibration_data(data, input_specs(ir_model))
    result = cal.collect_ranges(ir_model, list(tensors), loaded, calibration, quant, progress, whole=whole)
    if planned:  # the If branches' tensors too, named as rewrite-eval names them
        start = time.perf_counter()
        found = _branch_ranges(ir_model, quant, loaded, calibration, progress)
        if found:  # the data was streamed through the model in batches for them as well
            result.ranges.update(found)
            batches = loaded.num_batches(calibration.batch_size)
            result = dataclasses.replace(result, num_batches=max(result.num_batches, batches),
                                         seconds=result.seconds + time.perf_counter() - start)
    return result


def _branch_ranges(model, quant: QuantConfig, data: CalibrationData, calibration: CalibrationConfig,
                   progress=None) -> dict:
    return {name: r for branch in _rewrite_branches(model, quant, data, calibration, encode=False, progress=progress)
            for name, r in branch.ranges.items()}


def calibrate_to_file(model, data, output, *, quant: QuantConfig = QuantConfig(),
                      calibration: CalibrationConfig = CalibrationConfig(),
                      progress: Progress | None = None) -> cal.RangesFileSummary:
    """Calibrate ``model`` on ``data`` and write the ranges file ``output`` (``docs/calibration.md``).

    Nothing is written unless calibration succeeds; the file is written atomically. ``progress``: as
    :func:`rewrite_eval`'s.
    """
    out = os.fspath(output)
    check_output_path(out)
    label = None
    if isinstance(model, (str, os.PathLike)):
        label = os.fspath(model)
        if os.path.exists(out) and os.path.exists(label) and same_file(out, label):
            raise QtoolError(f"the output '{os.fspath(output)}' is the input model")
        _large_model_stage(progress, "loading", label)
        ir_model = load_model(label).model
        check_outputs([out], model_files(label, ir_model) + [data])
    else:
        check_outputs([out], [data])
        ir_model = as_ir_model(model).clone()
    result = _calibrate(ir_model, data, None, quant, calibration, progress)
    return cal.write_ranges_file(out, result, label, quant, calibration.batch_size)


def simulate(model, data, config: SimulateConfig | None = None, *, json_path=None, html_path=None,
             progress=None) -> SimulateResult:
    """Compare a float model with quantized versions of it on ``data`` (``docs/simulate.md``).

    ``config``: the quantized models to compare, or the bit widths of a what-if table quantized
    here in memory (one calibration for every pair), labels, output, batch axis, sensitivity.
    ``json_path``/``html_path``: also write the report there. ``progress(stage, done, total)``.
    """
    config = config or SimulateConfig()
    check_simulate_outputs(model, data, config, json_path, html_path)
    if html_path is not None and not config.histograms:
        config = dataclasses.replace(config, histograms=True)
    result = run_simulation(model, data, config, _quantize_pairs, progress)
    if json_path is not None:
        result.write_json(json_path)
    if html_path is not None:
        result.write_html(html_path)
    return result


def check_simulate_outputs(model, data, config: SimulateConfig, *outputs) -> None:
    """The report files ``outputs`` are none of the files ``simulate`` reads (the models with their
    external data, the data) and can be written (``qtool.model.io.check_outputs``)."""
    read = [f for m in (model, *config.quantized) if isinstance(m, (str, os.PathLike)) for f in model_files(m)]
    check_outputs(list(outputs), read + [data, config.calibration_data])


def _quantize_pairs(model, data: CalibrationData, pairs: list, config: SimulateConfig, progress=None):
    """The what-if table's models, ``([(model, warnings)] in the order of the pairs, calibration runs)``: each pair
    folded and planned as ``rewrite_eval`` does (at the opset it raises the model to), one calibration per
    distinct plan (one for the whole table unless the bit widths change a rewrite: a ConvTranspose becomes a
    Conv at 8-bit weights only), each pair written from its plan's ranges."""
    scope = {"scope": config.scope, "exclude": config.exclude}
    widest = QuantConfig(max(w for w, _ in pairs), max(a for _, a in pairs), **scope)  # the histograms' bits
    calibration = CalibrationConfig(batch_size=config.batch_size)
    by_plan: dict[tuple, dict] = {}  # the tensors a plan calibrates -> their ranges
    out = []
    for wb, ab in pairs:
        quant = QuantConfig(wb, ab, **scope)
        planned = raise_opset(model.clone(), quant)
        tensors = fold_and_plan(planned, quant)[2].tensors_to_calibrate()
        key = tuple(sorted(tensors))  # the same tensors at another opset: the same ranges
        if key not in by_plan:
            ranges = cal.collect_ranges(planned, tensors, data, calibration, widest, progress).ranges if tensors else {}
            ranges.update(_branch_ranges(planned, quant, data, calibration, progress))
            by_plan[key] = ranges
        result = rewrite_eval(model, quant=quant, ranges=by_plan[key] or None)
        out.append((result.model, result.warnings))
    return out, len(by_plan)


TRAIN_EXTRA_MESSAGE = "qtool finetune needs the train extra: pip install 'qtool[train]'"


def finetune(model, data, output, config: FinetuneConfig | None = None, *, progress=None):
    """Quantization-aware fine-tuning of a ``rewrite_train`` graph with JAX (``docs/finetune.md``):
    the same contract written to ``output`` with the trained values. Needs the ``train`` extra."""
    read = model_files(model) if isinstance(model, (str, os.PathLike)) else []
    check_outputs([output], read + [data, config.validation_data if config is not None else None])
    if any(importlib.util.find_spec(name) is None for name in ("jax", "jaxlib", "optax")):
        raise QtoolError(TRAIN_EXTRA_MESSAGE)
    from qtool.finetune import train  # jax: an optional heavy engine, imported only when used

    return train.finetune(model, data, output, config, progress=progress)
