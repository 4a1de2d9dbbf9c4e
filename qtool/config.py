"""Typed options: frozen dataclasses, normalized and validated in one place.

Every entry point (``qtool.api``), every rewrite and calibration takes these
instead of long keyword lists; the CLI builds them from its options. A
config is valid once constructed: a bad value raises
:class:`~qtool.errors.QtoolError` here, before any work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from qtool.errors import QtoolError

CALIBRATION_METHODS = ("minmax", "ema", "percentile", "entropy", "mse")
# half_up: TensorFlow's FakeQuant; half_to_even: what QuantizeLinear computes (docs/training.md)
ROUND_MODES = ("half_up", "half_to_even")


def _positive_int(value, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise QtoolError(f"{label} must be a positive integer, got {value!r}")
    return int(value)


def _delay(value, label: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 0:
        raise QtoolError(f"{label} must be a non-negative integer number of steps, got {value!r}")
    return int(value)


# why a layer that in-graph peak picking reads stays float (``onnx_rewrite.placement.peaks``)
PEAK_REASON = ("writes the map that in-graph peak picking compares with its own MaxPool (Equal): on 8-bit codes "
               "a peak's neighbours tie with it and are kept too")
# why a MatMul whose output holds a quotient's numerators and denominator stays float
# (``onnx_rewrite.placement.normalisers``)
NORMALISER_REASON = ("writes both the numerators and the denominator of a Div (linear attention's normaliser in "
                     "the same tensor: one 8-bit range over both rounds the small denominators away)")


@dataclass(frozen=True)
class QuantConfig:
    """What to quantize and how: bit widths, symmetry, per-channel weights, scope."""

    weight_bits: int = 8
    activation_bits: int = 8
    symmetric: bool = False
    per_channel: bool = True
    scope: str | None = None
    exclude: frozenset[str] = frozenset()
    # weights on a symmetric grid (zero point 0): TFLite's int8 spec for per-channel weights, and what
    # onnxruntime's integer kernels need to be fast (asymmetric per-channel weight zero points send
    # QLinearConv to a reference path: 10x slower than float on an EfficientNet, docs/rewrite-eval.md)
    symmetric_weights: bool = True
    # LSTMs stay float (else onnxruntime's DynamicQuantizeLSTM runs them with int8 weights)
    float_rnn: bool = False
    # how the training graph's FakeQuant and the offline weight codes round (activations in an eval
    # graph are QuantizeLinear's: half to even whatever is asked)
    round_mode: str = "half_up"
    # the deployed model holds standard ONNX ops only (no com.microsoft DynamicQuantizeLSTM or Gelu), for
    # runtimes other than onnxruntime; deployment only: a training graph does not depend on it
    standard_ops: bool = False
    # 4-bit weights stored packed as int4 (opset 21) instead of in int8: half the size, but onnxruntime
    # has no integer kernel for int4 weights and runs those layers in float (2-3x slower than the float
    # model on CPU, docs/rewrite-eval.md); deployment only, as ``standard_ops``
    pack_int4: bool = False
    # activations stored as int8 (the unsigned grid shifted by 128: zero point 0 for symmetric ranges, as
    # TensorRT and TFLite's int8 spec want) instead of uint8; onnxruntime's x86 kernels fuse uint8
    # activations only and leave int8 Conv/MatMul in float (docs/rewrite-eval.md); deployment only
    int8_activations: bool = False
    # layers whose output in-graph peak picking compares (``placement.peaks``): found by the placement,
    # not an option; they stay float as if excluded, with their own reason
    peak_picked: frozenset[str] = frozenset()
    # MatMuls of two activations whose output holds both a quotient's numerators and its denominator
    # (``placement.normalisers``): found by the placement, not an option; float, with their own reason
    shared_normaliser: frozenset[str] = frozenset()

    def __post_init__(self):
        for label, bits in (("weight", self.weight_bits), ("activation", self.activation_bits)):
            if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16:
                raise QtoolError(f"{label} bits must be between 2 and 16, got {bits!r}")
        # normalized here once, whatever the caller passes (CLI flags, None, lists)
        object.__setattr__(self, "symmetric", bool(self.symmetric))
        object.__setattr__(self, "symmetric_weights", bool(self.symmetric_weights))
        object.__setattr__(self, "per_channel", bool(self.per_channel))
        object.__setattr__(self, "float_rnn", bool(self.float_rnn))
        object.__setattr__(self, "standard_ops", bool(self.standard_ops))
        object.__setattr__(self, "pack_int4", bool(self.pack_int4))
        object.__setattr__(self, "int8_activations", bool(self.int8_activations))
        object.__setattr__(self, "scope", self.scope or None)
        object.__setattr__(self, "exclude", frozenset(self.exclude or ()))
        if self.round_mode not in ROUND_MODES:
            raise QtoolError(f"round mode must be one of {', '.join(ROUND_MODES)}, got {self.round_mode!r}")

    @property
    def half_to_even(self) -> bool:
        return self.round_mode == "half_to_even"

    @property
    def weights_symmetric(self) -> bool:
        return self.symmetric or self.symmetric_weights

    def out_of_scope(self, node) -> str | None:
        """Why ``node`` is outside the rewrite's scope (None when inside)."""
        name = node.name or ""
        if name in self.exclude:
            return f"'{name}' is excluded (--exclude)"
        if name in self.peak_picked:
            return f"'{name}' {PEAK_REASON}"
        if name in self.shared_normaliser:
            return f"'{name}' {NORMALISER_REASON}"
        if self.scope and not name.startswith(self.scope):
            return f"'{name}' is outside --scope '{self.scope}'"
        return None

    def to_dict(self) -> dict:
        return {
            "weight_bits": self.weight_bits,
            "activation_bits": self.activation_bits,
            "symmetric": self.symmetric,
            "symmetric_weights": self.weights_symmetric,
            "per_channel": self.per_channel,
            "scope": self.scope,
            "exclude": sorted(self.exclude),
            "float_rnn": self.float_rnn,
            "round_mode": self.round_mode,
            "standard_ops": self.standard_ops,
            "pack_int4": self.pack_int4,
            "int8_activations": self.int8_activations,
        }


@dataclass(frozen=True)
class CalibrationConfig:
    """How activation ranges are observed (``docs/calibration.md``)."""

    method: str = "minmax"
    batch_size: int = 16
    percentile: float = 99.999
    num_bins: int = 2048
    ema_decay: float = 0.999

    def __post_init__(self):
        # the method and its option values are checked by the observer registry (qtool.calibrate),
        # which knows the registered methods and says which flag is wrong
        object.__setattr__(self, "method", str(self.method))
        object.__setattr__(self, "batch_size", _positive_int(self.batch_size, "batch size"))
        object.__setattr__(self, "num_bins", int(self.num_bins))
        object.__setattr__(self, "percentile", float(self.percentile))
        object.__setattr__(self, "ema_decay", float(self.ema_decay))

    @classmethod
    def from_options(cls, method: str = "minmax", batch_size: int = 16, options: dict | None = None):
        """From the legacy ``calibration_options`` dict (``percentile``, ``num_bins``, ``ema_decay``)."""
        options = dict(options or {})
        unknown = sorted(set(options) - {"percentile", "num_bins", "ema_decay", "num_bits", "symmetric"})
        if unknown:
            raise QtoolError(f"unknown calibration option(s): {', '.join(unknown)}")
        known = {k: options[k] for k in ("percentile", "num_bins", "ema_decay") if options.get(k) is not None}
        return cls(method=method, batch_size=batch_size, **known)

    def method_options(self, quant: QuantConfig) -> dict:
        """The options the method uses, as recorded in a ranges file and given to its observers.
        The histogram searches quantize with the activation bits and symmetry of ``quant``."""
        search = {"num_bins": self.num_bins, "num_bits": quant.activation_bits, "symmetric": quant.symmetric}
        table = {
            "minmax": {},
            "ema": {"ema_decay": self.ema_decay},
            "percentile": {"percentile": self.percentile, "num_bins": self.num_bins},
            "entropy": search,
            "mse": search,
            "auto": {"percentile": self.percentile, **search},  # every method's ranges from one histogram
        }
        # a registered method gets every option (its factory takes the ones it names)
        return table.get(self.method, {"percentile": self.percentile, "ema_decay": self.ema_decay, **search})

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrainSchedule:
    """The training graph's schedule (spec section 1): steps before quantization and BN freezing."""

    quant_delay: int = 0
    freeze_bn_delay: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "quant_delay", _delay(self.quant_delay if self.quant_delay is not None else 0,
                                                       "quant delay"))
        object.__setattr__(self, "freeze_bn_delay", _delay(self.freeze_bn_delay, "freeze_bn_delay"))
