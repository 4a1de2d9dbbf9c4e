"""Observers: reduce each batch of a tensor to running statistics, right away.

The runner hands every batch of every calibrated tensor to that tensor's
observer and drops the batch; an observer keeps a fixed-size state, so memory
does not grow with the number of samples. ``range()`` gives the (min, max)
to quantize with, before TF's widening to 0 (the encoder does that).

Methods (``--calibration-method``): ``minmax``, ``ema`` (TF's moving
average), and on a streaming histogram ``percentile``, ``entropy`` (TensorRT's
KL search) and ``mse`` (the range with the least FakeQuant error); the math
is in ``qtool.kernels.histogram``. More methods register a factory with
:func:`register_observer`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from qtool.errors import QtoolError
from qtool.kernels import minmax
from qtool.kernels.histogram import Histogram


class DataIssues:
    """What was wrong with one tensor's values: non-finite ones (by kind, first batch) and the largest magnitude.

    Observers count every batch's values and classify the non-finite ones only
    in batches that have some (their min/max or histogram pass finds them), so
    clean data costs no extra pass. ``minmax`` and ``ema`` see NaN only when a
    batch has no number at all (their kernel skips NaN).
    """

    def __init__(self) -> None:
        self.batches = 0
        self.values = 0
        self.nan = self.posinf = self.neginf = 0
        self.first_bad: int | None = None  # 1-based batch number
        self.absmax = 0.0  # largest finite magnitude

    def batch(self, batch: np.ndarray) -> None:
        self.batches += 1
        self.values += int(batch.size)

    def finite(self, lo: float, hi: float) -> None:
        for v in (lo, hi):
            if math.isfinite(v) and abs(v) > self.absmax:
                self.absmax = abs(v)

    def nonfinite(self, batch: np.ndarray) -> None:
        """Tally the NaN and +-inf of the current batch (called only when it has some)."""
        a = np.asarray(batch)
        if a.dtype.kind not in "fc":
            return
        nan, pos, neg = (int(np.count_nonzero(f(a))) for f in (np.isnan, np.isposinf, np.isneginf))
        if nan + pos + neg and self.first_bad is None:
            self.first_bad = self.batches
        self.nan += nan
        self.posinf += pos
        self.neginf += neg

    @property
    def bad(self) -> int:
        return self.nan + self.posinf + self.neginf


class Observer:
    """Base class: one per calibrated tensor.

    ``issues`` (a :class:`DataIssues`, optional for registered observers)
    feeds the calibration warnings about the data.
    """

    name = "base"
    issues: DataIssues | None = None

    def update(self, batch: np.ndarray) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def range(self) -> tuple[float, float] | None:  # pragma: no cover - interface
        """The range to quantize with, or None when no finite value was seen."""
        raise NotImplementedError


class MinMaxObserver(Observer):
    """Running min and max over all batches (NaN and +-inf ignored), with qtool's parallel kernel."""

    name = "minmax"

    def __init__(self) -> None:
        self.min = math.inf
        self.max = -math.inf
        self.count = 0
        self.issues = DataIssues()

    def update(self, batch: np.ndarray) -> None:
        found = _batch_range(batch, self.issues)
        if found is None:
            return
        lo, hi = found
        if lo < self.min:
            self.min = lo
        if hi > self.max:
            self.max = hi
        self.count += batch.size

    def range(self) -> tuple[float, float] | None:
        if not (math.isfinite(self.min) and math.isfinite(self.max)):
            return None
        return self.min, self.max


class EmaObserver(Observer):
    """TF's moving-average min/max (``MovingAvgQuantize``), one step per batch.

    Each batch's min/max is widened to contain 0 (as TF does before the
    update), then ``v = decay * v + (1 - decay) * batch``. TF's training
    variables start at (-6, 6); for calibration the average is zero-debiased
    instead (TF's ``assign_moving_average(zero_debias=True)``): it starts at 0
    and is divided by ``1 - decay**steps``, so the first batch gives its own
    range and later batches a decay-weighted mean of the batch ranges.
    Depends on the batch size (one step per batch), like TF.
    """

    name = "ema"

    def __init__(self, ema_decay: float = 0.999) -> None:
        decay = float(ema_decay)
        if not (0.0 <= decay < 1.0):
            raise QtoolError(f"--ema-decay must be in [0, 1), got {ema_decay}")
        self.decay = decay
        self.min = 0.0
        self.max = 0.0
        self.steps = 0
        self.count = 0
        self.issues = DataIssues()

    def update(self, batch: np.ndarray) -> None:
        found = _batch_range(batch, self.issues)
        if found is None:
            return
        lo, hi = min(found[0], 0.0), max(found[1], 0.0)
        self.min = self.decay * self.min + (1.0 - self.decay) * lo
        self.max = self.decay * self.max + (1.0 - self.decay) * hi
        self.steps += 1
        self.count += batch.size

    def range(self) -> tuple[float, float] | None:
        if self.steps == 0:
            return None
        debias = 1.0 - self.decay**self.steps
        return self.min / debias, self.max / debias


def _batch_range(batch: np.ndarray, issues: DataIssues) -> tuple[float, float] | None:
    """The finite min and max of one batch (qtool's kernel), told to ``issues``; None for an empty batch (not
    counted) or one with no finite value (``minmax`` and ``ema`` alike)."""
    if batch.size == 0:
        return None
    issues.batch(batch)
    lo, hi = minmax(batch)
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):  # +-inf, or no number at all: left out, tallied
        issues.nonfinite(batch)
        finite = batch[np.isfinite(batch)]
        if finite.size == 0:
            return None
        lo, hi = float(finite.min()), float(finite.max())
    issues.finite(lo, hi)
    return lo, hi


class HistogramObserver(Observer):
    """A streaming histogram of the tensor (``qtool.kernels.histogram``), reduced to a range at the end.

    Memory: ``2 * num_bins`` int64 counts per tensor, whatever the number of
    samples. NaN and +-inf are left out (and counted in ``histogram.nonfinite``).
    """

    name = "histogram"

    def __init__(self, num_bins: int = 2048, num_bits: int = 8, symmetric: bool = False) -> None:
        if int(num_bins) < 16:
            raise QtoolError(f"--num-bins must be at least 16, got {num_bins}")
        self.histogram = Histogram(int(num_bins))
        self.num_bits = int(num_bits)
        self.symmetric = bool(symmetric)
        self.issues = DataIssues()

    def update(self, batch: np.ndarray) -> None:
        if np.size(batch) == 0:
            return
        self._count(self.histogram, batch)

    def _count(self, histogram: Histogram, batch: np.ndarray) -> None:
        self.issues.batch(batch)
        before = histogram.nonfinite
        histogram.update(batch)
        if histogram.nonfinite != before:
            self.issues.nonfinite(batch)
        if histogram.total:
            self.issues.finite(histogram.min, histogram.max)

    def range(self) -> tuple[float, float] | None:
        if self.histogram.total == 0:
            return None
        lo, hi = self._range()
        return float(lo), float(hi)

    def _range(self):  # pragma: no cover - interface
        raise NotImplementedError


class PercentileObserver(HistogramObserver):
    """The range keeping ``percentile`` % of the values ((100 - P) / 2 % cut on each side)."""

    name = "percentile"

    def __init__(self, percentile: float = 99.999, num_bins: int = 2048, num_bits: int = 8,
                 symmetric: bool = False) -> None:
        self.percentile = _percentile(percentile)  # checked first, as before the histogram's options
        super().__init__(num_bins, num_bits, symmetric)

    def _range(self):
        return self.histogram.percentile_range(self.percentile)


def _percentile(percentile) -> float:
    p = float(percentile)
    if not (0.0 < p <= 100.0):
        raise QtoolError(f"--percentile must be in (0, 100], got {percentile}")
    return p


class EntropyObserver(HistogramObserver):
    """TensorRT's KL-divergence threshold (``2**num_bits`` quantized bins over the window)."""

    name = "entropy"

    def __init__(self, num_bins: int = 2048, num_bits: int = 8, symmetric: bool = False) -> None:
        need = 4 << int(num_bits)
        if int(num_bins) < need:
            raise QtoolError(
                f"entropy calibration of {num_bits}-bit activations needs --num-bins >= {need} "
                f"(4 x 2**bits), got {num_bins}: with about as many histogram bins as quantized bins "
                "the KL search can only return min/max"
            )
        super().__init__(num_bins, num_bits, symmetric)

    def _range(self):
        return self.histogram.entropy_range(num_bits=self.num_bits, symmetric=self.symmetric)


class MseObserver(HistogramObserver):
    """The range minimising the mean squared error of TF's FakeQuant over the histogram."""

    name = "mse"

    def _range(self):
        return self.histogram.mse_range(num_bits=self.num_bits, symmetric=self.symmetric)


AUTO = "auto"  # rewrite-eval's --calibration-method auto: each method's ranges tried, the best output kept
# in order of preference at equal output SQNR. Not entropy: on two detectors its ranges brought the output
# check closer to float while they lost detections (ddddocr's YOLOX: F1 against float 93.3 % with min/max,
# 76.6 % with entropy, whose output SQNR on held-out samples was 17.2 dB against min/max's 7.8): it clips
# the tails of logits that decide a detection, which an output's SQNR (dominated by the boxes) cannot see
AUTO_METHODS = ("minmax", "percentile", "mse")


class CandidatesObserver(HistogramObserver):
    """Streaming histograms reduced to the range of each of :data:`AUTO_METHODS` (``auto``): every
    method's ranges from one pass over the data. ``range()`` is the min/max one.

    The first ``held_out`` batches (the ones the choice is checked on) go to a histogram of their own,
    ``held``, the others to ``histogram``: ranges from the batches after the held-out ones judge each
    method on samples it did not see (a method fitted to the tails of the samples it is checked on looks
    better than it is); the two merged (exactly: ``Histogram.merge``) give the ranges from every batch."""

    name = AUTO

    def __init__(self, percentile: float = 99.999, num_bins: int = 2048, num_bits: int = 8,
                 symmetric: bool = False, held_out: int = 0) -> None:
        self.percentile = _percentile(percentile)
        super().__init__(num_bins, num_bits, symmetric)
        self.held_out = int(held_out)
        self.held = Histogram(int(num_bins))

    def update(self, batch: np.ndarray) -> None:
        if np.size(batch) == 0:
            return
        self._count(self.held if self.issues.batches < self.held_out else self.histogram, batch)

    def whole(self) -> Histogram:
        """The histogram of every batch."""
        if self.held.total == 0:
            return self.histogram
        return Histogram(self.histogram.num_bins).merge(self.histogram).merge(self.held)

    def range(self) -> tuple[float, float] | None:
        h = self.whole()
        return (float(h.min), float(h.max)) if h.total else None

    def candidates(self, held_out: bool = False) -> dict[str, tuple[float, float] | None]:
        """The range each method of :data:`AUTO_METHODS` chooses (None: no finite value seen), from every
        batch or (``held_out``) from the batches after the held-out ones."""
        h = self.histogram if held_out else self.whole()
        if h.total == 0:
            return dict.fromkeys(AUTO_METHODS)
        found = {"minmax": (h.min, h.max), "percentile": h.percentile_range(self.percentile),
                 "mse": h.mse_range(num_bits=self.num_bits, symmetric=self.symmetric)}
        return {m: (float(found[m][0]), float(found[m][1])) for m in AUTO_METHODS}


_F32_MAX = float(np.finfo(np.float32).max)
_SQRT_F32_MAX = math.sqrt(_F32_MAX)  # 1.8e19: the product of two larger float32 values is inf


def _kinds(issues: DataIssues) -> str:
    kinds = [(n, k) for n, k in ((issues.posinf, "+inf"), (issues.neginf, "-inf"), (issues.nan, "NaN")) if n]
    if len(kinds) == 1:
        return kinds[0][1]
    return "non-finite (" + ", ".join(f"{n:,} {k}" for n, k in kinds) + ")"


def data_warnings(ranges: Mapping[str, tuple[float, float] | None], observers: Mapping[str, Observer],
                  limit: int = 5) -> list[str]:
    """One line per problem with the calibration data, naming the tensor and what is wrong.

    - non-finite values among finite ones (left out of every range);
    - tensors with no finite value at all (no range: ``rewrite-eval`` uses the default one);
    - magnitudes beyond 1.8e19, where float32 products overflow (unscaled or corrupt data), and
      ranges wider than float32's largest value, which 8-bit quantization's float32 arithmetic
      (``scale = (max - min) / 255``) cannot hold.
    At most ``limit`` tensors are described one by one; the rest are named in one line.
    """
    lines: list[str] = []
    partial, empty, unknown, huge = [], [], [], []
    for name, obs in observers.items():
        issues = getattr(obs, "issues", None)
        rng = ranges.get(name)
        if not isinstance(issues, DataIssues) or issues.values == 0:
            if rng is None:
                unknown.append(name)
            continue
        if rng is None:
            empty.append((name, issues))
        elif issues.bad:
            partial.append((name, issues))
        if issues.absmax > _SQRT_F32_MAX:
            huge.append((name, issues, rng))

    def more(items, what):
        if len(items) > limit:
            rest = [n for n, *_ in items[limit:]]
            lines.append(f"{len(rest)} more tensor(s) {what}: " + ", ".join(rest[:limit]) + (" ..." if len(rest) > limit else ""))

    for name, issues in partial[:limit]:
        verb = "is" if issues.bad == 1 else "are"
        lines.append(f"tensor '{name}': {issues.bad:,} of {issues.values:,} values {verb} {_kinds(issues)} "
                     f"(first in batch {issues.first_bad}); the range ignores non-finite values")
    more(partial, "have non-finite values the range ignores")
    for name, issues in empty[:limit]:
        what = f"{_kinds(issues)}" if issues.bad == issues.values else "non-finite"
        lines.append(f"tensor '{name}': all {issues.values:,} values are {what}: no range "
                     "(rewrite-eval gives it the default range)")
    more(empty, "have no finite value and no range")
    if unknown:
        lines.append(f"{len(unknown)} tensor(s) saw no finite value and have no range (rewrite-eval gives them "
                     "the default range, or the range of a Concat they feed): " + ", ".join(unknown[:limit])
                     + (" ..." if len(unknown) > limit else ""))
    if huge:
        huge.sort(key=lambda item: -item[1].absmax)
        name, issues, _ = huge[0]
        others = f" and {len(huge) - 1} more tensor(s)" if len(huge) > 1 else ""
        lines.append(f"values reach {issues.absmax:.3g} (tensor '{name}'{others}): beyond {_SQRT_F32_MAX:.2g} a "
                     "product of two float32 values overflows to inf, so the data is likely unscaled or corrupt")
        wide = [n for n, _, rng in huge if rng is not None and rng[1] - rng[0] > _F32_MAX]
        if wide:
            lines.append(f"the range of tensor '{wide[0]}'" + (f" and {len(wide) - 1} more" if len(wide) > 1 else "")
                         + f" is wider than float32's largest value ({_F32_MAX:.3g}): it overflows the float32 "
                         "arithmetic of quantization (scale = (max - min) / levels is inf)")
    return lines


_OBSERVERS: dict[str, Callable[..., Observer]] = {
    "minmax": MinMaxObserver,
    "ema": EmaObserver,
    "percentile": PercentileObserver,
    "entropy": EntropyObserver,
    "mse": MseObserver,
    AUTO: CandidatesObserver,  # rewrite-eval only (qtool.api): the choice needs the written model
}

# Option names a factory may take (each factory gets the ones its signature names).
OPTION_NAMES = ("percentile", "num_bins", "ema_decay", "num_bits", "symmetric")


def register_observer(name: str, factory: Callable[..., Observer]) -> None:
    """Make a calibration method available by name.

    ``factory`` is called with the keyword options (``OPTION_NAMES``) its
    signature accepts, or with none.
    """
    _OBSERVERS[name] = factory


def observer_names() -> list[str]:
    return sorted(_OBSERVERS)


def make_observer(method: str, **options) -> Observer:
    """A new observer for ``method``; ``options`` its factory does not take are ignored."""
    try:
        factory = _OBSERVERS[method]
    except KeyError:
        raise QtoolError(
            f"unknown calibration method {method!r} (available: {', '.join(observer_names())})"
        ) from None
    return factory(**_accepted(factory, options))


def _accepted(factory, options: dict) -> dict:
    import inspect

    options = {k: v for k, v in options.items() if v is not None}
    if not options:
        return {}
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return options
    return {k: v for k, v in options.items() if k in params}
