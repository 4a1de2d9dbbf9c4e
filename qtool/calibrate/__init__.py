"""Calibration: run a model on data with onnxruntime, reduce activations to ranges.

- ``observers``: per-tensor streaming statistics (``minmax``, ``ema``,
  ``percentile``, ``entropy``, ``mse``; more methods register themselves by name);
- ``runner``: the onnxruntime loop that feeds batches to the observers
  (:func:`collect_ranges`);
- ``ranges_file``: the ranges file of ``qtool calibrate`` (and onnxruntime's
  calibration caches) for ``rewrite-eval --ranges``.

Which tensors to observe is the caller's choice (``qtool.api`` asks the
placement rules); this package never imports ``onnx_rewrite``.
"""

from __future__ import annotations

from qtool.calibrate.observers import make_observer, observer_names, register_observer
from qtool.calibrate.ranges_file import (
    GivenRanges,
    RangesFileSummary,
    load_ranges,
    parse_ranges,
    ranges_document,
    read_ranges,
    save_ranges,
    select,
    write_ranges_file,
)
from qtool.calibrate.runner import CalibrationResult, collect_ranges

__all__ = [
    "CalibrationResult", "GivenRanges", "RangesFileSummary", "read_ranges", "collect_ranges", "load_ranges", "make_observer", "observer_names",
    "parse_ranges", "ranges_document", "register_observer", "save_ranges", "select", "write_ranges_file",
]
