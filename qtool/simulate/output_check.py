"""rewrite-eval's look at what it wrote: the int8 model's outputs against the float model's.

A calibration can produce a model that runs and is useless: PP-OCRv5's recogniser, whose
activations reach -64..95 where most stay within a few units, read 0 % of its text lines right in 8
bits with min/max ranges (output SQNR 1.2 dB; 72.7 % with ``--calibration-method percentile``), and
nothing said so. With calibration data, ``rewrite_eval`` now runs the float model (folded, before
the rewrite) and the written int8 model on the first calibration batch and reports each float
output's SQNR against the float one; below :data:`WARN_DB` it warns, naming what to try. It is a
check on the calibration data itself (optimistic), on one batch: ``qtool simulate`` measures on held-out
data, per layer.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qtool.data import CalibrationData, same_feeds
from qtool.errors import QtoolError
from qtool.model.runtime_graph import LayerKernels, layer_kernels, saving_optimized_graph
from qtool.model.session import session_options, tapped_session
from qtool.simulate.result import sqnr_db as signal_to_noise_db

CHECK_SAMPLES = 16  # the default batch; a model exported for batch 1 runs this many batches
KEPT_VALUES = 1 << 22  # per output (16 MB of float32): larger outputs are compared on a regular subsample
WARN_DB = 10.0  # noise at a tenth of the signal's power (an RMS error of ~32 %): the output is degraded
_FLOAT = (np.float16, np.float32, np.float64)


def sqnr_db(reference: np.ndarray, test: np.ndarray) -> float | None:
    """``10 log10(sum(ref^2) / sum((ref - test)^2))`` over the values finite in the reference: inf when
    equal, None when the reference has no signal; a non-finite test value where the reference is finite
    is infinite noise (-inf)."""
    ref = np.asarray(reference, np.float64)
    got = np.asarray(test, np.float64)
    if ref.shape != got.shape:
        return float("-inf")
    finite = np.isfinite(ref)
    ref, got = ref[finite], got[finite]
    signal = float(np.sum(ref * ref))
    if signal == 0.0:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        noise = float(np.sum((ref - got) ** 2))
    return float("-inf") if not np.isfinite(noise) else signal_to_noise_db(signal, noise)


@dataclass
class OutputCheck:
    samples: int
    sqnr_db: dict[str, float | None] = field(default_factory=dict)  # per float output (None: no signal)
    error: str | None = None  # onnxruntime could not run the written model
    method: str = "minmax"  # the calibration method the ranges came from
    # --calibration-method auto: each method tried, with its worst output's SQNR (None: nothing to choose by)
    tried: dict[str, float | None] = field(default_factory=dict)
    tried_calibrated_on: int | None = None  # auto: the samples after these each method was calibrated on
    # the layers of onnxruntime's optimized graph of the written model by kernel kind (None: not looked at)
    runtime_layers: LayerKernels | None = None

    def worst(self) -> tuple[str, float] | None:
        scored = [(name, db) for name, db in self.sqnr_db.items() if db is not None]
        return min(scored, key=lambda item: item[1]) if scored else None

    def no_signal(self) -> list[str]:
        """The float outputs with nothing to compare: zero or not finite on every checked sample."""
        return [name for name, db in self.sqnr_db.items() if db is None]

    def to_dict(self) -> dict:
        silent = self.no_signal()
        return {"samples": self.samples,
                "sqnr_db": {name: _number(db) for name, db in self.sqnr_db.items() if db is not None},
                **({"no_signal": silent} if silent else {}),
                **({"method": self.method, "tried": {m: _number(db) for m, db in self.tried.items()},
                    "tried_calibrated_on": self.tried_calibrated_on} if self.tried else {}),
                **({"error": self.error} if self.error else {})}

    def warnings(self) -> list[str]:
        if self.error:
            return [self.error]
        worst = self.worst()
        if worst is None and self.sqnr_db:  # NaN calibration data, or a model whose outputs are all zero
            names = ", ".join(f"'{name}'" for name in self.no_signal())
            return [f"the float model's output(s) {names} are zero or not finite on the first {self.samples} "
                    "calibration sample(s): nothing to check the int8 model against (is the calibration data "
                    "what the model is fed?)" + ("; --calibration-method auto kept min/max ranges" if self.tried
                                                 else "")]
        if worst is None and self.tried:  # no float output at all (an argmax's integer ids)
            return ["--calibration-method auto had no float output to choose by: min/max ranges"]
        if worst is None or worst[1] >= WARN_DB:
            return []
        name, db = worst
        where = (f"the int8 model's output '{name}' is far from the float model's on the first {self.samples} "
                 f"calibration sample(s): SQNR {tenths(db)} dB (below {WARN_DB:.0f} dB)")
        if len(self.tried) > 1:
            return [f"{where} with the best of {len(self.tried)} calibration methods ({self.method}). Use qtool "
                    "simulate to find the layers that lose it (--exclude them), or more --activation-bits"]
        why = " (outliers widen min/max ranges)" if self.method in ("minmax", "ema") else ""
        return [f"{where}. Try --calibration-method auto (each method's ranges tried, the best output kept){why}, "
                "and qtool simulate to find the layers that lose it (--exclude them)"]


def tenths(db: float) -> str:
    """An SQNR as the summary and the warnings write it: rounded down to tenths (9.96 dB warned about as
    below 10 dB must not read "10.0"), "-inf" for infinite noise."""
    return "-inf" if db == float("-inf") else f"{math.floor(db * 10) / 10:.1f}"


def _number(db):
    """An SQNR in the JSON: hundredths rounded down (None: exact; "-inf")."""
    return None if db is None or db == float("inf") else (math.floor(db * 100) / 100 if np.isfinite(db) else "-inf")


class Reference:
    """The float model's outputs on the first calibration samples (:data:`CHECK_SAMPLES`, in the data's
    batches: a model exported for batch 1 runs several), taken before the rewrite changes it
    (:func:`reference`). The calibration pass computes them on its first batches (:meth:`take`, no run of
    its own); :meth:`finished` runs the float model on the batches it did not give."""

    def __init__(self, data: CalibrationData, batch_size: int):
        self.feeds, self.samples = [], 0
        batches = data.batches(batch_size)
        try:
            for feed in batches:
                self.feeds.append(feed)
                self.samples += data.samples_in(feed) or 1
                if self.samples >= CHECK_SAMPLES:
                    break
        finally:
            batches.close()
        self.outputs: dict[str, np.ndarray] | None = None
        self._runs: list[dict[str, np.ndarray]] | None = []  # None: the batches taken were not these

    def take(self, feed: dict, outputs: dict) -> bool:
        """The float model's ``outputs`` (name -> array, in the graph's order) on the calibration batch ``feed``,
        which must be the next of :attr:`feeds`. Returns whether the next batch's are wanted too."""
        if self.outputs is not None or self._runs is None:
            return False
        if not same_feeds(feed, self.feeds[len(self._runs)]):
            self._runs = None
            return False
        last = len(self._runs) + 1 == len(self.feeds)  # read in place: only a subsample is kept (_joined)
        self._runs.append({name: value if last else np.array(value) for name, value in outputs.items()
                           if np.asarray(value).dtype in _FLOAT})
        if not last:
            return True
        self.outputs, self._runs = _joined(self._runs), []
        return False

    def finished(self, model: ir.Model) -> Reference | None:
        """This reference, after running the float ``model`` on :attr:`feeds` if :meth:`take` did not give
        every output; None when the float model does not run on them (the calibration says why)."""
        if self.outputs is None:
            self._runs = []
            try:
                session = tapped_session(model, [], what="the float model")
                self.outputs = _outputs(session, self.feeds, "the float model", float_only=True)
            except QtoolError:
                return None
        return self

    def check(self, model: ir.Model, method: str, runtime_graph: bool = False) -> OutputCheck:
        """The written ``model``'s outputs on the same samples, against the float ones (``method``: how
        its ranges were calibrated, for the advice). ``runtime_graph``: also the layers onnxruntime's optimized
        graph of it runs in float (``OutputCheck.runtime_layers``; :mod:`qtool.model.runtime_graph`)."""
        options = session_options()
        with saving_optimized_graph(options) if runtime_graph else contextlib.nullcontext() as graph_path:
            try:
                session = tapped_session(model, [], options=options, what="the written model")
                layers = layer_kernels(graph_path) if graph_path is not None else None
                values = _outputs(session, self.feeds, "the written model")
            except QtoolError as exc:
                return OutputCheck(self.samples, error=str(exc), method=method)
        return OutputCheck(self.samples, {name: sqnr_db(ref, values[name]) for name, ref in self.outputs.items()
                                          if name in values}, method=method, runtime_layers=layers)


def _outputs(session, feeds: list[dict], what: str, float_only: bool = False) -> dict[str, np.ndarray]:
    """Each output over ``feeds`` (:func:`_joined`)."""
    runs = [dict(zip(session.outputs, (v.numpy() for v in session.run(feed, what=what)))) for feed in feeds]
    if float_only:
        runs = [{name: a for name, a in run.items() if a.dtype in _FLOAT} for run in runs]
    return _joined(runs)


def _joined(runs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each output over the runs, flattened and joined (batches of a batch-1 export may differ in size);
    one value in every k of an output larger than :data:`KEPT_VALUES` (a segmentation map of 16 samples
    would be held through the whole rewrite)."""
    out = {}
    for name in runs[0]:
        flat = np.concatenate([run[name].reshape(-1) for run in runs]) if len(runs) > 1 else runs[0][name].reshape(-1)
        out[name] = flat[::max(1, -(-flat.size // KEPT_VALUES))].copy()
    return out


def reference(data: CalibrationData, batch_size: int) -> Reference | None:
    """The batches to check the rewrite on, to be filled with the float model's outputs
    (:meth:`Reference.take`, :meth:`Reference.finished`); None when they cannot be read (the calibration that
    follows says why)."""
    try:
        return Reference(data, batch_size)
    except QtoolError:
        return None
