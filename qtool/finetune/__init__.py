"""Quantization-aware fine-tuning of a qtool training graph with JAX (``qtool finetune``).

Needs the ``train`` extra (``pip install 'qtool[train]'``: jax, jaxlib, optax).
Nothing outside this package imports it except the ``finetune`` command, so
qtool works without JAX. See ``docs/finetune.md``.
"""

from importlib import import_module as _import_module

_LAZY = {
    "finetune": "qtool.finetune.train",
    "FinetuneConfig": "qtool.finetune.config",
    "FinetuneResult": "qtool.finetune.config",
    "FinetuneProgress": "qtool.finetune.config",
    "Interpreter": "qtool.finetune.interpreter",
    "fake_quant": "qtool.finetune.fake_quant",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qtool.finetune' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value
