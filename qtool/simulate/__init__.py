"""Accuracy and error reports: what quantization costs, and where.

- ``core``: :func:`simulate`, the pass over the data (float and quantized
  models in onnxruntime, streaming metric kernels);
- ``graph``: reading a QDQ model against its float model (quantizers, float
  counterparts, single-layer models for ``--sensitivity``);
- ``report``: the report as text for the terminal and as JSON;
- ``html``: the self-contained HTML page (plots with matplotlib, the
  ``qtool[report]`` extra).

``qtool.simulate(model, data, ...)`` returns a
:class:`~qtool.simulate.core.SimulateResult`. Heavy imports happen inside
the functions.
"""

from __future__ import annotations

import sys
import types

__all__ = ["simulate", "SimulateResult"]


def simulate(*args, **kwargs):
    from qtool.simulate.core import simulate as _simulate

    return _simulate(*args, **kwargs)


simulate.__doc__ = "Compare a float model with quantized versions of it on data (see qtool.simulate.core.simulate)."


def __getattr__(name):
    if name == "SimulateResult":
        from qtool.simulate.core import SimulateResult

        return SimulateResult
    raise AttributeError(f"module 'qtool.simulate' has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """``qtool.simulate`` is both this package and the function of the same name.

    Once a submodule is imported Python may bind the package (not the
    function) to ``qtool.simulate``; calling the package calls the function.
    """

    def __call__(self, *args, **kwargs):
        return simulate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
