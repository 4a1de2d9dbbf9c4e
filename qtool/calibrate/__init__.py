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

__all__ = ["calibrate"]


def calibrate(
    model,
    data,
    tensors=None,
    *,
    batch_size: int = 16,
    method: str = "minmax",
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
    return collect_ranges(ir_model, tensors, loaded, batch_size=batch_size, method=method, progress=progress)


class _CallableModule(types.ModuleType):
    """``qtool.calibrate`` is both this package and the function of the same name.

    Once ``qtool.calibrate.<submodule>`` is imported, Python binds the package
    (not the function) to ``qtool.calibrate``; calling the package calls the
    function, so ``qtool.calibrate(model, data)`` works either way.
    """

    def __call__(self, *args, **kwargs):
        return calibrate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
