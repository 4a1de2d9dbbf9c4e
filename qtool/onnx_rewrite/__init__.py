"""Graph rewrites on ONNX models (onnx-ir): batch-norm folding, placement, Q/DQ encoding.

One module per transformation:

- ``_io``: load (with clear errors) and atomic save, external data;
- ``constants``: weights as initializers, Constant nodes, or Identity/Reshape/
  Transpose/Cast of those;
- ``matcher`` / ``patterns``: declared forward chain patterns with reasons;
- ``fold_batch_norms``: the eval fold (spec section 3);
- ``placement``: TF's placement rules as a pure plan (spec section 2);
- ``ranges``: ranges, nudging and integer storage (spec sections 4 and 6);
- ``eval_graph``: the plan as QuantizeLinear/DequantizeLinear (spec section 6);
- ``opset``: raising the opset with onnx.version_converter;
- ``eval_rewrite``: ``rewrite_eval``, the pipeline over all of them;
- ``fake_quant_function``: ``qtool::FakeQuant``, TF's FakeQuant as a model-local ONNX function;
- ``fold_batch_norms_train``: the training fold (spec section 3, TF's correction scheme);
- ``train_graph``: the plan as FakeQuant nodes with state and the ``qtool.training`` contract
  (spec sections 4-5), and its removal for ``rewrite_eval``;
- ``train_rewrite``: ``rewrite_train``, the training-graph pipeline.

Public names load lazily, so importing this package costs nothing.
"""

from importlib import import_module as _import_module

from qtool.onnx_rewrite._lazy_sympy import defer_sympy as _defer_sympy

_defer_sympy()  # before anything imports onnx_ir

_LAZY = {
    "rewrite_eval": "qtool.onnx_rewrite.eval_rewrite",
    "RewriteEvalResult": "qtool.onnx_rewrite.eval_rewrite",
    "rewrite_train": "qtool.onnx_rewrite.train_rewrite",
    "RewriteTrainResult": "qtool.onnx_rewrite.train_rewrite",
    "training_contract": "qtool.onnx_rewrite.train_graph",
    "plan_quantization": "qtool.onnx_rewrite.placement",
    "QuantConfig": "qtool.onnx_rewrite.placement",
    "QuantPlan": "qtool.onnx_rewrite.placement",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qtool.onnx_rewrite' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
