"""Calibration data for an ``If`` branch rewritten as a model of its own (``onnx_rewrite.branches``).

The branch runs on what the enclosing graph computes: each batch of the
enclosing model's data runs through a session of the enclosing model that
taps the If's condition and the tensors the branch reads, and the batch is the
branch's when the condition selects it. Streamed like the data it comes from:
one batch's tensors at a time, whatever the number of samples (the enclosing
model runs again for each branch, and once more to count the samples and
keep the element types of the branch's first batch).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from qtool.errors import QtoolError
from qtool.model.constants import constant_array
from qtool.model.opset import inferred_types
from qtool.model.session import TappedSession, tapped_session, value_map


class BranchCapture:
    """One session of the enclosing model that computes every If condition and every tensor the
    branches read (built before the branches leave the model)."""

    def __init__(self, model: ir.Model, reads: list[ir.Value], conditions: list[ir.Value]):
        values = value_map(model.graph)
        taps, seen = [], set()
        # a constant condition (exporters fold a sample-rate test into one when the rate is fixed)
        self.constants = {v.name: a for v in conditions if (a := constant_array(v)) is not None}
        for value in [*conditions, *reads]:
            if value.name in seen or value.name in self.constants or value.is_graph_input() \
                    or values.get(value.name) is not value:
                continue  # fed as it is, or a constant (the branch model holds its own copy)
            seen.add(value.name)
            taps.append(value)
        self.taps = [v.name for v in taps]
        untyped = any(v.type is None for v in taps)
        self.session: TappedSession | None = (
            tapped_session(model, taps, what="the model around its If branches",
                           dtypes=inferred_types(model.graph) if untyped else None) if taps else None)

    def values(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The fed arrays and the tapped tensors of one batch (copies: the session's buffers are reused)."""
        out = {**self.constants, **feed}
        if self.session is not None:
            for name, value in zip(self.taps, self.session.run(feed, self.taps, what="the model around its If")):
                out[name] = np.array(value.numpy())
        return out


class BranchData:
    """The batches of ``data`` whose If condition ``condition`` is ``taken``, as the inputs
    ``inputs`` of the branch model; the interface of :class:`qtool.data.CalibrationData` that
    :func:`qtool.calibrate.collect_ranges` uses."""

    def __init__(self, capture: BranchCapture, data, batch_size: int, condition: str, taken: bool,
                 inputs: list[str]):
        self.capture, self.data, self.batch_size = capture, data, batch_size
        self.condition, self.taken, self.inputs = condition, taken, inputs
        self.ignored: list[str] = []
        self._samples: dict[int, int] = {}
        self.num_samples = 0
        self.dtypes: dict[str, np.dtype] = {}  # of the first batch that takes the branch, by input name
        for feed in self.batches(batch_size):
            self.num_samples += self.samples_in(feed)
            self.dtypes = self.dtypes or {name: array.dtype for name, array in feed.items()}

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        for feed in self.data.batches(self.batch_size):
            values = self.capture.values(feed)
            cond = np.asarray(values[self.condition])
            if cond.size != 1:
                raise QtoolError(f"the If condition '{self.condition}' has {cond.size} elements on the calibration "
                                 "data (If needs one)")
            if bool(cond.reshape(-1)[0]) != self.taken:
                continue
            branch = {name: values[name] for name in self.inputs}
            self._samples = {id(branch): self.data.samples_in(feed)}
            yield branch

    def samples_in(self, feed: dict[str, np.ndarray]) -> int:
        return self._samples.get(id(feed), 0)
