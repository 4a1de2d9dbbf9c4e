"""TensorFlow's FakeQuant in JAX, with TensorFlow's straight-through gradients.

The forward pass is the ``qtool::FakeQuant`` function body
(``qtool/onnx_rewrite/fake_quant_function.py``) operation by operation, which
is ``spec/kernels.md`` section 1 in float32, so it agrees bit for bit with
qtool's numba kernels and with onnxruntime running the training graph:

- a rank-0 range is ``fake_quant_with_min_max_vars`` (divides by the scale);
- a range of rank >= 1 broadcasts against ``x`` (``[C, 1, 1, 1]`` for a Conv
  weight) and is ``..._per_channel`` (multiplies by ``inv_scale``);
- ``min == max == 0`` gives zeros, and so does a range too small for a normal
  float32 scale (TF's arithmetic gives NaN there; the kernels and the graph's
  function do the same as here);
- ``half_to_even`` (the node attribute of ``--round-mode half_to_even``) is
  QuantizeLinear's level on the same grid, ``round(clamp(x / scale, qmin - zp,
  qmax - zp)) * scale``; the gradients are the same as for TF's rounding.

``lax.optimization_barrier`` keeps XLA from changing the last bit: every
divisor goes through one, broadcast to the dividend's shape first (XLA
rewrites ``a / constant`` into ``a * (1 / constant)``, and ``a /
broadcast(b)`` into ``a * broadcast(1 / b)``), and so does every product
that an addition reads (``-nudged_min * inv_scale + 0.5``, ``shifted *
inv_scale - quant_zero``), so LLVM cannot contract the pair into a fused
multiply-add on CPUs that have one. The FakeQuant alone is then exact
without capping XLA's ISA; whole graphs are checked with
``XLA_FLAGS=--xla_cpu_max_isa=AVX`` (no FMA in the other ops either).

Gradients (``kernels.md`` 1.3, TF's ``FakeQuantWithMinMaxVarsGradient``), all
masks on the *nudged* range::

    d_x   = g * float32(nudged_min <= x <= nudged_max)
    d_min = sum(g where x < nudged_min)     # summed over the axes min broadcasts along
    d_max = sum(g where x > nudged_max)

and for a degenerate range (``min == max == 0``) ``d_x = g``, ``d_min = d_max = 0``.
``range_grad=False`` returns zero range gradients: TF's last-value weight
ranges (recomputed from the weight every step) are not trained.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

F32 = jnp.float32


def _barrier(v):
    return lax.optimization_barrier(v)


def grid(num_bits: int, narrow_range: bool) -> tuple[np.float32, np.float32]:
    """``(qminf, qmaxf)``: the unsigned grid of ``kernels.md`` 1.1."""
    return np.float32(1.0 if narrow_range else 0.0), np.float32((1 << int(num_bits)) - 1)


def nudge(mn, mx, num_bits: int, narrow_range: bool):
    """The nudged range, as the function body computes it.

    Returns ``(nudged_min, nudged_max, scale, inv_scale, quant_zero, scale_raw, degenerate, zero_point)``
    where ``scale``, ``inv_scale``, ``quant_zero`` and the nudged range are 0 for a
    degenerate range and ``scale_raw`` is the scale before that substitution.
    """
    qminf, qmaxf = grid(num_bits, narrow_range)
    mn = jnp.asarray(mn, F32)
    mx = jnp.asarray(mx, F32)
    zero = F32(0.0)
    half = F32(0.5)
    one = F32(1.0)
    qrange = _barrier(jnp.asarray(qmaxf - qminf, F32))  # a constant divisor: keep it a division
    rng = mx - mn
    scale_raw = rng / _barrier(jnp.broadcast_to(qrange, rng.shape))  # A / broadcast(b) stays a division
    inv_scale_raw = qrange / _barrier(rng)
    zp_from_min = qminf - mn / _barrier(scale_raw)
    zp_floor = jnp.floor(zp_from_min)
    zp_frac = zp_from_min - zp_floor
    nonneg = zp_from_min >= zero
    up = (nonneg & (zp_frac >= half)) | (~nonneg & (zp_frac > half))
    zp_rounded = jnp.where(up, zp_floor + one, zp_floor)
    zp_upper = jnp.where(zp_from_min > qmaxf, qmaxf, zp_rounded)
    zero_point = jnp.where(zp_from_min < qminf, qminf, zp_upper)
    nudged_min_raw = (qminf - zero_point) * scale_raw
    nudged_max_raw = (qmaxf - zero_point) * scale_raw
    quant_zero_raw = jnp.floor(_barrier(-nudged_min_raw * inv_scale_raw) + half)  # no FMA: round, then add
    # min == max == 0, or a scale too small to be a normal float32 (inv_scale would overflow): zeros
    degenerate = ((mn == zero) & (mx == zero)) | (scale_raw < F32(np.finfo(np.float32).tiny))
    nudged_min = jnp.where(degenerate, zero, nudged_min_raw)
    nudged_max = jnp.where(degenerate, zero, nudged_max_raw)
    scale = jnp.where(degenerate, zero, scale_raw)
    inv_scale = jnp.where(degenerate, zero, inv_scale_raw)
    quant_zero = jnp.where(degenerate, zero, quant_zero_raw)
    return nudged_min, nudged_max, scale, inv_scale, quant_zero, scale_raw, degenerate, zero_point


def _clamp(v, lo, hi):
    """``std::max(std::min(v, hi), lo)``: a NaN ``v`` propagates."""
    clamped_hi = jnp.where(hi < v, hi, v)
    return jnp.where(clamped_hi < lo, lo, clamped_hi)


def _level_half_to_even(x, num_bits, narrow_range, scale_raw, degenerate, zero_point):
    """QuantizeLinear's level ``round(clamp(x / scale, qmin - zp, qmax - zp))`` (the function body's
    ``half_to_even`` branch): divisor 1 and bounds 0 for a degenerate range."""
    qminf, qmaxf = grid(num_bits, narrow_range)
    zero = F32(0.0)
    divisor = jnp.where(degenerate, F32(1.0), scale_raw)
    divisor = _barrier(jnp.broadcast_to(divisor, jnp.broadcast_shapes(jnp.shape(x), divisor.shape)))
    lo = jnp.where(degenerate, zero, qminf - zero_point)
    hi = jnp.where(degenerate, zero, qmaxf - zero_point)
    level = jnp.round(_clamp(x / divisor, lo, hi))
    return jnp.where(level == zero, zero, level)  # +0.0 (DequantizeLinear's) where Round gives -0.0


def _forward(x, mn, mx, num_bits, narrow_range, half_to_even=False):
    mn = jnp.asarray(mn, F32)
    (nudged_min, nudged_max, scale, inv_scale, quant_zero, scale_raw, degenerate,
     zero_point) = nudge(mn, mx, num_bits, narrow_range)
    if half_to_even:
        level = _level_half_to_even(x, num_bits, narrow_range, scale_raw, degenerate, zero_point)
        return level * scale, (nudged_min, nudged_max, degenerate)
    shifted = _clamp(x, nudged_min, nudged_max) - nudged_min
    if mn.ndim == 0:  # fake_quant_with_min_max_vars: divide by the scale
        # the divisor broadcast first, then hidden: XLA rewrites A / broadcast(b) into A * broadcast(1 / b)
        divisor = _barrier(jnp.broadcast_to(scale_raw, shifted.shape))
        scaled = jnp.where(degenerate, shifted * inv_scale, shifted / divisor)
    else:  # per_channel: multiply by inv_scale
        scaled = _barrier(shifted * inv_scale)  # no FMA with the subtraction below
    level = jnp.floor((scaled - quant_zero) + F32(0.5))
    return level * scale, (nudged_min, nudged_max, degenerate)


def _sum_to(g, shape):
    """Sum a broadcast result back to ``shape`` (the gradient of broadcasting)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra:
        g = jnp.sum(g, axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(shape, g.shape)) if a == 1 and b != 1)
    if axes:
        g = jnp.sum(g, axis=axes, keepdims=True)
    return g


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def fake_quant(x, mn, mx, num_bits: int = 8, narrow_range: bool = False, range_grad: bool = True,
               half_to_even: bool = False):
    """``qtool::FakeQuant(x, min, max)``: TF's FakeQuant with min/max broadcasting against ``x``
    (``half_to_even``: QuantizeLinear's rounding on the same grid)."""
    return _forward(x, mn, mx, num_bits, narrow_range, half_to_even)[0]


def _fq_fwd(x, mn, mx, num_bits, narrow_range, range_grad, half_to_even):
    y, (nudged_min, nudged_max, degenerate) = _forward(x, mn, mx, num_bits, narrow_range, half_to_even)
    return y, (x, jnp.asarray(mn, F32), jnp.asarray(mx, F32), nudged_min, nudged_max, degenerate)


def _fq_bwd(num_bits, narrow_range, range_grad, half_to_even, res, g):
    x, mn, mx, nudged_min, nudged_max, degenerate = res
    inside = (nudged_min <= x) & (x <= nudged_max)
    mask = jnp.where(degenerate | inside, F32(1.0), F32(0.0))
    d_x = _sum_to(g * mask, x.shape)  # a real multiply: a masked negative g gives -0.0
    if not range_grad:
        return d_x, jnp.zeros_like(mn), jnp.zeros_like(mx)
    zero = F32(0.0)
    below = jnp.where((x < nudged_min) & ~degenerate, g, zero)
    above = jnp.where((x > nudged_max) & ~degenerate, g, zero)
    return d_x, _sum_to(below, mn.shape), _sum_to(above, mx.shape)


fake_quant.defvjp(_fq_fwd, _fq_bwd)


# --- qtool::FakeQuantBias: the deployed int32 bias -------------------------------------------------------------
_INT32_BOUND = np.float32(np.iinfo(np.int32).max)  # 2**31 as float32


def _bias_forward(b, scale, saturate: bool):
    b = jnp.asarray(b, F32)
    scale = jnp.asarray(scale, F32)
    shape = jnp.broadcast_shapes(b.shape, scale.shape)
    divisor = _barrier(jnp.broadcast_to(scale, shape))  # a division, not b * (1 / scale)
    levels = jnp.round(b / divisor)  # half to even, as ONNX Round and np.rint
    # level 0 is +0.0 (an int32 0 read back; onnxruntime's Round gives +0.0 for -0.4 too)
    levels = jnp.where(levels == F32(0.0), F32(0.0), levels)
    if saturate:
        levels = jnp.clip(levels, -_INT32_BOUND, _INT32_BOUND)
    quantized = levels * scale
    usable = jnp.all((scale > F32(0.0)) & (scale < F32(np.inf)))
    return jnp.where(usable, quantized, b)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def fake_quant_bias(b, scale, saturate: bool = True):
    """``qtool::FakeQuantBias(b, scale)``: the bias the deployed model adds, ``round_half_even(b / scale)
    * scale`` (int32-saturated when ``saturate``), ``b`` when a scale is 0 or not finite. The gradient is
    the straight-through estimator: the identity for ``b``, zero for ``scale``."""
    return _bias_forward(b, scale, saturate)


def _fqb_fwd(b, scale, saturate):
    y = _bias_forward(b, scale, saturate)
    return y, (jnp.shape(b), jnp.asarray(scale, F32))


def _fqb_bwd(saturate, res, g):
    b_shape, scale = res
    return _sum_to(g, b_shape), jnp.zeros_like(scale)


fake_quant_bias.defvjp(_fqb_fwd, _fqb_bwd)
