"""Compile the scalar math of ``_scalar`` for one target.

``build(primitives, jit)`` copies every function of ``_scalar`` with a new
globals dictionary in which the arithmetic primitives are the target's and
the other scalar functions are their compiled versions for that target, then
applies ``jit`` to each. One definition of the arithmetic, any number of
targets: the CPU kernels use ``build(CPU_PRIMITIVES, njit)``; the CUDA kernels
build float32 and float64 variants from libdevice's correctly rounded
intrinsics.
"""

from __future__ import annotations

import types

from qtool.kernels import _scalar


def build(primitives: dict, jit) -> types.SimpleNamespace:
    missing = set(_scalar.PRIMITIVES) - set(primitives)
    if missing:
        raise ValueError(f"target is missing primitives {sorted(missing)}")
    namespace = dict(vars(_scalar))
    namespace.update(primitives)
    compiled = {}
    for name in _scalar.FUNCTIONS:
        src = getattr(_scalar, name)
        fn = types.FunctionType(src.__code__, namespace, name, src.__defaults__, src.__closure__)
        fn.__qualname__ = src.__qualname__
        fn.__module__ = src.__module__
        fn.__doc__ = src.__doc__
        compiled[name] = jit(fn)
        namespace[name] = compiled[name]
    return types.SimpleNamespace(**compiled)
