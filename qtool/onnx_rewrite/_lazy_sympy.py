"""Defer sympy until something uses it (it costs ~0.4 s of every CLI run otherwise).

onnx_ir imports sympy at module level for symbolic-dimension arithmetic,
which qtool never does: names like ``N`` stay strings. Before onnx_ir is
first imported, :func:`defer_sympy` puts placeholder modules for ``sympy``
and ``onnx_ir._symbolic_shapes`` (which touches sympy when imported) in
``sys.modules``. The first attribute looked up on a placeholder imports the
real module, as usual, and forwards to it from then on. Nothing changes if
either is already imported or cannot be found; ``QTOOL_EAGER_SYMPY=1``
turns this off.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types


class _Deferred(types.ModuleType):
    """Stands in for a module until one of its attributes is needed."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__dict__["_qtool_real"] = None
        self.__dict__["__spec__"] = None  # the import system reads this without loading

    def _qtool_load(self):
        real = self.__dict__["_qtool_real"]
        if real is None:
            name = self.__name__
            if sys.modules.get(name) is self:
                del sys.modules[name]
            real = importlib.import_module(name)
            self.__dict__["_qtool_real"] = real
        return real

    def __getattr__(self, attr):
        return getattr(self._qtool_load(), attr)


def defer_sympy() -> None:
    if "sympy" in sys.modules or "onnx_ir" in sys.modules or os.environ.get("QTOOL_EAGER_SYMPY"):
        return
    try:
        if importlib.util.find_spec("sympy") is None or importlib.util.find_spec("onnx_ir") is None:
            return
    except (ImportError, ValueError):
        return
    sys.modules["sympy"] = _Deferred("sympy")
    sys.modules["onnx_ir._symbolic_shapes"] = _Deferred("onnx_ir._symbolic_shapes")
