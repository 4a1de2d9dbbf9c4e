"""qtool: TensorFlow-exact quantization for ONNX models.

The public API is loaded lazily so that ``import qtool`` (and ``qtool --help``)
does not pay for numba, onnx or onnxruntime until a function is used. The
kernels and the two rewrites are here by name (``qtool.rewrite_eval``);
every command's function is in :mod:`qtool.api` (``qtool.api.calibrate``,
``qtool.api.simulate``, ``qtool.api.finetune``: ``qtool.calibrate`` and
``qtool.simulate`` are the packages).
"""

from importlib import import_module as _import_module

__version__ = "0.2.0"

# public name -> module that defines it
_LAZY = {
    "fake_quant_with_min_max_args": "qtool.kernels",
    "fake_quant_with_min_max_args_gradient": "qtool.kernels",
    "fake_quant_with_min_max_vars": "qtool.kernels",
    "fake_quant_with_min_max_vars_gradient": "qtool.kernels",
    "fake_quant_with_min_max_vars_per_channel": "qtool.kernels",
    "fake_quant_with_min_max_vars_per_channel_gradient": "qtool.kernels",
    "quantize_and_dequantize_v2": "qtool.kernels",
    "quantize_and_dequantize_v2_gradient": "qtool.kernels",
    "nudged_range": "qtool.kernels",
    "quantize_codes": "qtool.kernels",
    "minmax": "qtool.kernels",
    "rewrite_eval": "qtool.api",
    "rewrite_train": "qtool.api",
    "QuantConfig": "qtool.config",
    "CalibrationConfig": "qtool.config",
    "TrainSchedule": "qtool.config",
    "SimulateConfig": "qtool.simulate.config",
    "FinetuneConfig": "qtool.finetune.config",
}

__all__ = sorted(_LAZY) + ["QtoolError", "__version__"]

from qtool.errors import QtoolError  # noqa: E402  (cheap, no dependencies)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qtool' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
