"""Calibration: run a model on data with onnxruntime, reduce activations to ranges.

- ``data``: read and check calibration data against the model's inputs;
- ``observers``: per-tensor streaming statistics (``minmax``; more methods
  register themselves by name);
- ``runner``: the onnxruntime loop that feeds batches and observers.

``qtool.calibrate(model, data)`` returns the ranges of the tensors that
``rewrite_eval`` would quantize. Heavy imports happen inside the functions.
"""

from __future__ import annotations

import sys
import types

__all__ = ["calibrate", "calibrate_to_file", "method_options"]


def calibrate(
    model,
    data,
    tensors=None,
    *,
    batch_size: int = 16,
    method: str = "minmax",
    percentile: float = 99.999,
    num_bins: int = 2048,
    ema_decay: float = 0.999,
    progress=None,
    weight_bits: int = 8,
    activation_bits: int = 8,
    symmetric: bool = False,
    per_channel: bool = True,
    scope: str | None = None,
    exclude=(),
):
    """Observe activation ranges of ``model`` on ``data``.

    ``model``: a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``.
    ``data``: a ``.npz``/``.npy`` path, an array, or a dict of arrays.
    ``tensors``: names of the tensors to observe in ``model`` as given. When
    None, the model's batch norms are folded (on a copy) and the tensors are
    the ones ``rewrite_eval`` would quantize with the given options, named as
    in the folded model.

    ``method``: ``minmax``, ``ema`` (``ema_decay``), ``percentile``
    (``percentile``, ``num_bins``), ``entropy`` or ``mse`` (``num_bins``); the
    histogram methods search for the quantizer of ``activation_bits`` bits
    (``symmetric`` or not). See ``docs/calibration.md``.

    Returns a :class:`~qtool.calibrate.runner.CalibrationResult` whose
    ``ranges`` map tensor names to ``(min, max)`` (None when only non-finite
    values were seen).
    """
    from qtool.calibrate.data import input_specs, load_calibration_data
    from qtool.calibrate.runner import collect_ranges

    if tensors is None:
        from qtool.onnx_rewrite.eval_rewrite import prepare_for_calibration

        ir_model, tensors = prepare_for_calibration(
            model,
            weight_bits=weight_bits,
            activation_bits=activation_bits,
            symmetric=symmetric,
            per_channel=per_channel,
            scope=scope,
            exclude=exclude,
        )
    else:
        from qtool.onnx_rewrite.eval_rewrite import as_ir_model

        ir_model = as_ir_model(model)
        tensors = list(tensors)
    loaded = load_calibration_data(data, input_specs(ir_model))
    options = method_options(method, percentile=percentile, num_bins=num_bins, ema_decay=ema_decay,
                             num_bits=activation_bits, symmetric=symmetric)
    return collect_ranges(ir_model, tensors, loaded, batch_size=batch_size, method=method, progress=progress,
                          options=options)


def calibrate_to_file(model, data, output, *, method: str = "minmax", batch_size: int = 16, progress=None,
                      weight_bits: int = 8, activation_bits: int = 8, symmetric: bool = False,
                      per_channel: bool = True, scope: str | None = None, exclude=(), **method_kwargs) -> dict:
    """Calibrate ``model`` on ``data`` and write the ranges file ``output`` (``docs/calibration.md``).

    ``method_kwargs``: ``percentile``, ``num_bins``, ``ema_decay``. Nothing is
    written unless calibration succeeds; the file is written atomically.
    Returns a summary dict (what ``qtool calibrate --json`` prints).
    """
    import os

    from qtool.calibrate.ranges_file import ranges_document, save_ranges
    from qtool.errors import QtoolError

    out = os.fspath(output)
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise QtoolError(f"output folder '{os.path.dirname(out) or folder}' does not exist")
    if os.path.isdir(out):
        raise QtoolError(f"output path '{out}' is a folder, not a file")
    if isinstance(model, (str, os.PathLike)) and os.path.exists(out) and os.path.exists(model) \
            and os.path.samefile(out, model):
        raise QtoolError(f"the output '{out}' is the input model")
    quantization = {"weight_bits": weight_bits, "activation_bits": activation_bits, "symmetric": bool(symmetric),
                    "per_channel": bool(per_channel), "scope": scope or None, "exclude": sorted(exclude or ())}
    result = calibrate(model, data, batch_size=batch_size, method=method, progress=progress,
                       **quantization, **method_kwargs)
    label = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    doc = ranges_document(result.ranges, model=label, method=method, options=result.options,
                          quantization=quantization, samples=result.num_samples, batches=result.num_batches,
                          batch_size=batch_size)
    save_ranges(out, doc)
    from qtool.calibrate.observers import data_warnings

    warnings = data_warnings(result.ranges, result.observers)
    if result.ignored_arrays:
        warnings.append(f"ignored array(s) not named like a model input: {', '.join(result.ignored_arrays)}")
    return {"model": label, "output": out, "method": method, "options": result.options, "tensors": len(result.ranges),
            "samples": result.num_samples, "batches": result.num_batches, "seconds": round(result.seconds, 3),
            "warnings": warnings}


def method_options(method: str, *, percentile=99.999, num_bins=2048, ema_decay=0.999, num_bits=8,
                   symmetric=False) -> dict:
    """The options ``method`` uses, as recorded in a ranges file and passed to its observers."""
    table = {
        "minmax": {},
        "ema": {"ema_decay": ema_decay},
        "percentile": {"percentile": percentile, "num_bins": num_bins},
        "entropy": {"num_bins": num_bins, "num_bits": num_bits, "symmetric": bool(symmetric)},
        "mse": {"num_bins": num_bins, "num_bits": num_bits, "symmetric": bool(symmetric)},
    }
    if method in table:
        return table[method]
    return {"percentile": percentile, "num_bins": num_bins, "ema_decay": ema_decay, "num_bits": num_bits,
            "symmetric": bool(symmetric)}


class _CallableModule(types.ModuleType):
    """``qtool.calibrate`` is both this package and the function of the same name.

    Once ``qtool.calibrate.<submodule>`` is imported, Python binds the package
    (not the function) to ``qtool.calibrate``; calling the package calls the
    function, so ``qtool.calibrate(model, data)`` works either way.
    """

    def __call__(self, *args, **kwargs):
        return calibrate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
