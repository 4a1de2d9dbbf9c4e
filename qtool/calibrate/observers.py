"""Observers: reduce each batch of a tensor to running statistics, right away.

The runner hands every batch of every calibrated tensor to that tensor's
observer and drops the batch; an observer keeps a fixed-size state, so memory
does not grow with the number of samples. ``range()`` gives the (min, max)
to quantize with, before TF's widening to 0 (the encoder does that).

New methods (histograms for percentile/entropy/MSE, EMA) register a factory
with :func:`register_observer`; ``--calibration-method`` picks one by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


class Observer:
    """Base class: one per calibrated tensor."""

    name = "base"

    def update(self, batch: np.ndarray) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def range(self) -> tuple[float, float] | None:  # pragma: no cover - interface
        """The range to quantize with, or None when no finite value was seen."""
        raise NotImplementedError


class MinMaxObserver(Observer):
    """Running min and max over all batches (NaN ignored), with qtool's parallel kernel."""

    name = "minmax"

    def __init__(self) -> None:
        self.min = math.inf
        self.max = -math.inf
        self.count = 0

    def update(self, batch: np.ndarray) -> None:
        from qtool.kernels import minmax

        if batch.size == 0:
            return
        lo, hi = minmax(batch)
        lo, hi = float(lo), float(hi)
        if lo < self.min:
            self.min = lo
        if hi > self.max:
            self.max = hi
        self.count += batch.size

    def range(self) -> tuple[float, float] | None:
        if not (math.isfinite(self.min) and math.isfinite(self.max)):
            return None
        return self.min, self.max


_OBSERVERS: dict[str, Callable[[], Observer]] = {"minmax": MinMaxObserver}


def register_observer(name: str, factory: Callable[[], Observer]) -> None:
    """Make a calibration method available by name."""
    _OBSERVERS[name] = factory


def observer_names() -> list[str]:
    return sorted(_OBSERVERS)


def make_observer(method: str) -> Observer:
    from qtool.errors import QtoolError

    try:
        return _OBSERVERS[method]()
    except KeyError:
        raise QtoolError(
            f"unknown calibration method {method!r} (available: {', '.join(observer_names())})"
        ) from None
