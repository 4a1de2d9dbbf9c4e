"""Run a model on calibration data in onnxruntime and reduce activations as they come.

The tensors to calibrate become extra graph outputs of a copy of the model;
each batch runs once, every requested tensor goes to its observer and the
batch's outputs are dropped before the next batch runs. Peak memory is one
batch's activations plus the session, whatever the number of samples.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qtool.calibrate.observers import AUTO_METHODS, CandidatesObserver, Observer, data_warnings, make_observer
from qtool.config import CalibrationConfig, QuantConfig
from qtool.data import CalibrationData
from qtool.errors import QtoolError
from qtool.model.session import TappedSession, session_options, tapped_session, value_map

Progress = Callable[[int, int], None]  # (samples done, samples total)
# (a batch, the model's outputs on it by name) -> whether the next batch's outputs are wanted too
Outputs = Callable[[dict, dict[str, np.ndarray]], bool]


@dataclass
class CalibrationResult:
    ranges: dict[str, tuple[float, float] | None]
    observers: dict[str, Observer]
    method: str
    num_samples: int
    num_batches: int
    seconds: float
    ignored_arrays: list[str] = field(default_factory=list)
    options: dict = field(default_factory=dict)
    chosen: str | None = None  # auto: the method whose ranges were kept (qtool.api)

    def candidates(self, held_out: bool = False) -> dict[str, dict[str, tuple[float, float] | None]]:
        """``auto``: each method's ranges, by method, from all batches or (``held_out``) from those after
        the held-out ones (a tensor observed by min/max whatever the method, a Softmax output, keeps its
        range in each)."""
        found = {name: obs.candidates(held_out) if isinstance(obs, CandidatesObserver)
                 else dict.fromkeys(AUTO_METHODS, self.ranges[name]) for name, obs in self.observers.items()}
        return {m: {name: ranges[m] for name, ranges in found.items()} for m in AUTO_METHODS}

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            **({"chosen": self.chosen} if self.chosen else {}),
            "samples": self.num_samples,
            "batches": self.num_batches,
            "seconds": round(self.seconds, 3),
            "tensors": len(self.ranges),
            "ignored_arrays": self.ignored_arrays,
            **({"options": self.options} if self.options else {}),
        }

    def warnings(self) -> list[str]:
        """What is wrong with the data, by tensor (non-finite values, no finite value, overflow)."""
        return data_warnings(self.ranges, self.observers)


def _options():
    """Session options for calibration: onnxruntime's idle threads do not spin.

    Between two runs the observers reduce the outputs on the same cores
    (numba kernels); spinning pool threads took those cores (scheduling
    only: the outputs do not change).
    """
    options = session_options()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _run_batch(session: TappedSession, names: list[str], feed: dict, observers: dict, number: int,
               outputs: list[str] = (), give: Outputs | None = None) -> bool:
    """Run one batch and hand each output to its observer; with ``give``, also compute the model's
    ``outputs`` and hand them to it (returns what it returns: whether the next batch's are wanted).

    A function of its own so that no OrtValue outlives it: each OrtValue of
    ``run_with_ort_values`` keeps the whole output vector alive, so one left
    in a loop variable kept all of a batch's tapped outputs (1.1 GB at batch
    16 on ResNet-50) during the next batch's run, and peak memory doubled.
    """
    extra = [name for name in outputs if name not in names] if give is not None else []
    values = dict(zip(names + extra, session.run(feed, names + extra, what=f"calibration batch {number}")))
    for name in names:
        observers[name].update(values[name].numpy())
    return give is not None and give(feed, {name: values[name].numpy() for name in outputs})


def _one_sample_error(session: TappedSession, data: CalibrationData, feed: dict) -> QtoolError | None:
    """The error to give when the first batch failed but its first sample alone runs: a model whose inputs
    declare a free batch axis although it was exported for one sample (a Reshape to a fixed batch of 1 in
    khmersm's transformer). None when one sample fails too (the batch size is not the cause)."""
    size = data.samples_in(feed)
    if size <= 1:
        return None
    try:
        session.run(data.first_sample(feed), session.outputs[:1])
    except QtoolError:
        return None
    return QtoolError(f"the model runs on one sample but fails on a batch of {size} (its inputs declare a free "
                      f"batch size, its graph does not take one): calibrate with --batch-size 1")


def collect_ranges(model: ir.Model, tensors: Sequence[str], data: CalibrationData,
                   calibration: CalibrationConfig = CalibrationConfig(), quant: QuantConfig = QuantConfig(),
                   progress: Progress | None = None, whole: Sequence[str] = (), held_out: int = 0,
                   outputs: Outputs | None = None) -> CalibrationResult:
    """Observe ``tensors`` of ``model`` over ``data`` with ``calibration.method``; returns their ranges.
    The tensors in ``whole`` (Softmax outputs: ``QuantPlan.whole_range_tensors``) are observed by
    min/max whatever the method: their largest values are the ones that matter.

    ``held_out``: with the method ``auto``, the number of first batches its candidates can be checked on
    (``CandidatesObserver``). Tensors that are graph inputs are observed on the fed batches directly.
    The histogram searches quantize with ``quant``'s activation bits and
    symmetry. Bad methods and options fail before anything runs. ``outputs``: handed the model's outputs
    on the first batches, for as long as it returns True (the float outputs ``rewrite_eval`` checks its
    model against, with no run of their own).
    """
    method, batch_size = calibration.method, calibration.batch_size
    options = calibration.method_options(quant)
    start = time.perf_counter()
    values = value_map(model.graph)
    make_observer(method, **options)  # bad methods and options fail before the session is built
    whole = set(whole)
    made = {**options, "held_out": held_out} if held_out else options
    observers = {name: make_observer("minmax" if name in whole else method, **made) for name in tensors}
    unknown = [t for t in tensors if t not in values]
    if unknown:
        raise QtoolError(f"cannot calibrate tensor '{unknown[0]}': not in the model")
    from_inputs = [t for t in tensors if values[t].is_graph_input()]
    from_outputs = [t for t in tensors if not values[t].is_graph_input()]
    total = data.num_samples
    batches = 0
    model_outputs = [v.name for v in model.graph.outputs]
    if from_outputs or from_inputs:
        session = (tapped_session(model, [values[t] for t in from_outputs], options=_options(),
                                  what="the model for calibration") if from_outputs else None)
        done = 0
        if progress is not None:
            progress(0, total)
        for feed in data.batches(batch_size):
            for name in from_inputs:
                observers[name].update(np.asarray(feed[name]))
            if session is not None:
                try:
                    outputs = outputs if _run_batch(session, from_outputs, feed, observers, batches + 1,
                                                    model_outputs, outputs) else None
                except QtoolError as exc:
                    hint = _one_sample_error(session, data, feed) if batches == 0 else None
                    if hint is None:
                        raise
                    raise hint from exc
            batches += 1
            done += data.samples_in(feed)
            if progress is not None:
                progress(done, total)
        del session
    ranges = {name: obs.range() for name, obs in observers.items()}
    if ranges and all(r is None for r in ranges.values()):  # every range would be the default: a useless model
        source = f" of '{data.source}'" if data.source else ""
        raise QtoolError(f"calibration found no finite value in any of the {len(ranges)} tensor(s) it observed over "
                         f"the {total} sample(s){source}: is the data NaN, or not what the model is fed?")
    return CalibrationResult(
        ranges, observers, method, total, batches, time.perf_counter() - start, list(data.ignored), options
    )
