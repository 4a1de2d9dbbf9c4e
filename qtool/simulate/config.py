"""``SimulateConfig``: the options of a simulation, checked and normalized in one place.

Every way a user can spell an option (``weight_bits=8``, ``"4,8"``, ``[4, 8]``;
``batch_axis=1``, ``"1"``, ``"state=1"``, ``{"state": 1}``) becomes one form
here, and every bad value is a :class:`~qtool.errors.QtoolError` naming the
option, raised before anything is loaded or run.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from qtool.errors import QtoolError

ALL_OUTPUTS = ""  # the batch_axis key that applies to every output without one of its own


def parse_bits(bits, what: str) -> tuple[int, ...]:
    """``8``, ``"4,8"`` or ``[4, 8]`` -> ``(4, 8)`` (order kept, duplicates dropped)."""
    if isinstance(bits, (int, np.integer)) and not isinstance(bits, bool):
        bits = [bits]
    elif isinstance(bits, str):
        try:
            bits = [int(b) for b in bits.replace(" ", "").split(",") if b]
        except ValueError:
            raise QtoolError(f"{what}: expected comma-separated integers like 4,8, got {bits!r}") from None
    out: list[int] = []
    for b in bits:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 2 <= int(b) <= 16:
            raise QtoolError(f"{what}: bit widths must be integers from 2 to 16, got {b!r}")
        if int(b) not in out:
            out.append(int(b))
    if not out:
        raise QtoolError(f"{what}: give at least one bit width")
    return tuple(out)


def _axis(text, what: str) -> int | None:
    if text is None or str(text).strip().lower() == "none":
        return None  # the output has no samples axis: it holds one sample (a model exported for batch 1)
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        return int(text)
    try:
        return int(str(text).strip())
    except ValueError:
        raise QtoolError(f"batch axis {what}: expected an integer axis like 1 (or OUTPUT=1, or none), "
                         f"got {text!r}") from None


def parse_batch_axis(spec) -> dict[str, int | None]:
    """``None``/``0``/``"1"``/``"out=1"``/``["a=1", "b=0"]``/``{"a": 1}`` -> ``{output or "": axis}``; an axis
    ``"none"`` (None) is an output without a samples axis (Yolo-FastestV2's [605, 95] for its one image)."""
    if spec is None:
        return {ALL_OUTPUTS: 0}
    if isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    else:
        parts = [spec] if isinstance(spec, (str, int, np.integer)) else list(spec)
        items = []
        for p in parts:
            if isinstance(p, str) and "=" in p:
                name, _, axis = p.rpartition("=")
                if not name:
                    raise QtoolError(f"batch axis {p!r}: expected OUTPUT=AXIS or AXIS")
                items.append((name, axis))
            else:
                items.append((ALL_OUTPUTS, p))
    out: dict[str, int | None] = {}
    for name, axis in items:
        if name in out:
            where = f"output {name!r}" if name else "all outputs"
            raise QtoolError(f"batch axis given twice for {where}")
        out[name] = _axis(axis, repr(name) if name else "")
    out.setdefault(ALL_OUTPUTS, 0)
    return out


def _as_sources(quantized) -> tuple:
    if quantized is None:
        return ()
    if isinstance(quantized, (str, os.PathLike)) or not isinstance(quantized, Iterable):
        return (quantized,)
    return tuple(quantized)


@dataclass(frozen=True)
class SimulateConfig:
    """What to simulate and how; see :func:`qtool.simulate.core.simulate` for the meaning of each field.

    ``quantized``: models to compare (paths, ``onnx.ModelProto`` or
    ``onnx_ir.Model``). Without them, one model per (weight, activation) pair
    of ``weight_bits`` x ``activation_bits`` is quantized in memory, all from
    one calibration on ``calibration_data`` (the evaluation data when None).
    ``batch_axis``: the samples axis of each output (``{name: axis}``, ``""``
    for all outputs without their own; default 0).
    """

    labels: str | None = None
    output: str | None = None
    quantized: tuple = ()
    weight_bits: tuple[int, ...] = (8,)
    activation_bits: tuple[int, ...] = (8,)
    calibration_data: object = None
    sensitivity: bool = False
    batch_size: int = 16
    histograms: bool = False
    batch_axis: dict[str, int | None] = field(default_factory=lambda: {ALL_OUTPUTS: 0})  # None: no samples axis
    class_axis: int | None = None  # the compared output's class axis: top-1 per position (frame, pixel, token)
    latency_rounds: int = 0  # > 0: also time every model (one thread, batch 1), median of this many rounds
    scope: str | None = None  # the what-if table quantizes nodes under this prefix only
    exclude: frozenset = frozenset()  # and keeps these nodes in float

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "scope", self.scope or None)
        set_(self, "exclude", frozenset(self.exclude or ()))
        bs = self.batch_size
        if isinstance(bs, bool) or not isinstance(bs, (int, np.integer)) or bs < 1:
            raise QtoolError(f"batch size must be a positive integer, got {bs!r}")
        set_(self, "batch_size", int(bs))
        set_(self, "quantized", _as_sources(self.quantized))
        if self.quantized and self.calibration_data is not None:
            raise QtoolError("--calibration-data is for the what-if table; the --quantized models are already calibrated")
        set_(self, "weight_bits", parse_bits(self.weight_bits, "weight bits"))
        set_(self, "activation_bits", parse_bits(self.activation_bits, "activation bits"))
        set_(self, "batch_axis", parse_batch_axis(self.batch_axis))
        ca = self.class_axis
        if ca is not None and (isinstance(ca, bool) or not isinstance(ca, (int, np.integer))):
            raise QtoolError(f"class axis must be an integer, got {ca!r}")
        set_(self, "class_axis", None if ca is None else int(ca))
        lr = self.latency_rounds
        if isinstance(lr, bool) or not isinstance(lr, (int, np.integer)) or lr < 0:
            raise QtoolError(f"latency rounds must be a non-negative integer, got {lr!r}")
        set_(self, "latency_rounds", int(lr))
        set_(self, "sensitivity", bool(self.sensitivity))
        set_(self, "histograms", bool(self.histograms))
        for name in ("labels", "output"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise QtoolError(f"{name} must be a name (a string), got {type(value).__name__}")

    @property
    def what_if(self) -> bool:
        """True when the quantized models are made in memory (no ``quantized`` given)."""
        return not self.quantized

    def axis_for(self, output: str) -> int | None:
        return self.batch_axis.get(output, self.batch_axis[ALL_OUTPUTS])

    def check_outputs(self, outputs: list[str], model_label: str) -> None:
        """Every output named in ``batch_axis`` must exist."""
        for name in self.batch_axis:
            if name != ALL_OUTPUTS and name not in outputs:
                raise QtoolError(
                    f"batch axis given for output {name!r}, but the model '{model_label}' has no such output "
                    f"(outputs: {', '.join(outputs)})"
                )
