"""The scalar arithmetic of every qtool kernel, written once.

These are plain Python functions. ``qtool.kernels._targets.build`` compiles
them for a target (the CPU through ``numba.njit``, CUDA through numba-cuda
device functions) after swapping the arithmetic primitives below
(``mul``/``div``/``add``/``sub``/``floor``/``rint``) for that target's
correctly rounded operations. On CUDA those are the libdevice ``_rn``
intrinsics, which NVVM never contracts into a fused multiply-add; on the CPU
numba emits plain IEEE operations (no fastmath, no contraction). Every
operation is written out in the order of ``spec/kernels.md``: do not
"simplify" ``sub(mul(a, b), c)`` into anything else, the last bit depends on it.

FakeQuant math is float32 only. The quantize-dequantize math is generic in the
floating type: constants it needs (``half``, the largest finite value) are
passed in with the input's dtype.
"""

import numpy as np

F32_ZERO = np.float32(0.0)
F32_HALF = np.float32(0.5)
F32_ONE = np.float32(1.0)


# --- arithmetic primitives (replaced per target) -----------------------------
def mul(a, b):
    return a * b


def div(a, b):
    return a / b


def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def floor(a):
    return np.floor(a)


def rint(a):
    return np.rint(a)


# --- comparisons with Eigen's (std::min / std::max) NaN behaviour -------------
def fmin(a, b):
    """``std::min(a, b)``: returns ``a`` unless ``b < a`` (a NaN ``a`` propagates)."""
    return b if b < a else a


def fmax(a, b):
    """``std::max(a, b)``: returns ``a`` unless ``a < b`` (a NaN ``a`` propagates)."""
    return b if a < b else a


# --- FakeQuant (kernels.md section 1) ----------------------------------------
def round_half_away(v):
    """``std::round``: nearest integer, halves away from zero, exact, sign of zero kept."""
    a = -v if v < F32_ZERO else v
    r = floor(a)
    if sub(a, r) >= F32_HALF:  # exact: a and floor(a) share the exponent range
        r = add(r, F32_ONE)
    return -r if v < F32_ZERO else r


def nudge(min_, max_, qminf, qmaxf):
    """Nudged range of section 1.1.

    Returns ``(nudged_min, nudged_max, scale, inv_scale, zero_point, quant_zero)``;
    ``zero_point`` is on the unsigned grid [qminf, qmaxf] (a float holding an
    integer) and ``quant_zero`` is the forward pass's ``floor(-nudged_min *
    inv_scale + 0.5)``.
    """
    scale = div(sub(max_, min_), sub(qmaxf, qminf))
    inv_scale = div(sub(qmaxf, qminf), sub(max_, min_))
    zp_from_min = sub(qminf, div(min_, scale))
    if zp_from_min < qminf:
        zp = qminf
    elif zp_from_min > qmaxf:
        zp = qmaxf
    else:
        zp = round_half_away(zp_from_min)
    nudged_min = mul(sub(qminf, zp), scale)
    nudged_max = mul(sub(qmaxf, zp), scale)
    quant_zero = floor(add(mul(-nudged_min, inv_scale), F32_HALF))
    return nudged_min, nudged_max, scale, inv_scale, zp, quant_zero


def fq_level_mul(x, nmin, nmax, inv_scale, quant_zero):
    """Signed quantization level of ``x`` (args / per_channel: multiply by inv_scale)."""
    shifted = sub(fmax(fmin(x, nmax), nmin), nmin)
    return floor(add(sub(mul(shifted, inv_scale), quant_zero), F32_HALF))


def fq_level_div(x, nmin, nmax, scale, quant_zero):
    """Signed quantization level of ``x`` (vars: divide by scale)."""
    shifted = sub(fmax(fmin(x, nmax), nmin), nmin)
    return floor(add(sub(div(shifted, scale), quant_zero), F32_HALF))


def fq_mul(x, nmin, nmax, scale, inv_scale, quant_zero):
    """FakeQuant forward, ``args`` and ``per_channel`` variant."""
    return mul(fq_level_mul(x, nmin, nmax, inv_scale, quant_zero), scale)


def fq_div(x, nmin, nmax, scale, quant_zero):
    """FakeQuant forward, ``vars`` variant (divides by the scale)."""
    return mul(fq_level_div(x, nmin, nmax, scale, quant_zero), scale)


def ql_level(x, scale, lo, hi):
    """QuantizeLinear's signed level ``rint(clamp(x / scale, qmin - zp, qmax - zp))``: the
    ``half_to_even`` round mode of ``quantize_codes`` and of the training graph's FakeQuant."""
    return rint(fmax(fmin(div(x, scale), hi), lo))


def masked(g, x, lo, hi):
    """``g * float(lo <= x <= hi)``: a real multiply, so a masked negative g gives -0.0."""
    return mul(g, F32_ONE if (lo <= x and x <= hi) else F32_ZERO)


# --- QuantizeAndDequantize (kernels.md section 2), generic float type ---------
def qdq_scale(min_range, max_range, min_q, max_q, big):
    """Scale choice of section 2.2.

    Returns ``(scale, inverse_scale, min_range, max_range)`` with the side that
    did not set the scale adjusted.
    """
    sf_min = div(min_q, min_range) if mul(min_q, min_range) > 0 else big
    sf_max = div(max_q, max_range) if mul(max_q, max_range) > 0 else big
    if sf_min < sf_max:
        scale = sf_min
        inverse_scale = div(min_range, min_q)
        max_range = mul(max_q, inverse_scale)
    else:
        scale = sf_max
        inverse_scale = div(max_range, max_q)
        min_range = mul(min_q, inverse_scale)
    return scale, inverse_scale, min_range, max_range


def qdq_round(v, half_up, half):
    """HALF_UP is ``floor(v + 0.5)`` (toward +inf); HALF_TO_EVEN is ``rint``."""
    if half_up:
        return floor(add(v, half))
    return rint(v)


def qdq_clamped(x, lo, hi, scale, inverse_scale, half_up, half):
    """Forward with ``range_given``: clamp to the adjusted range first."""
    return mul(qdq_round(mul(fmax(fmin(x, hi), lo), scale), half_up, half), inverse_scale)


def qdq_free(x, scale, inverse_scale, half_up, half):
    """Forward without ``range_given``: no clamp."""
    return mul(qdq_round(mul(x, scale), half_up, half), inverse_scale)


def qdq_masked(g, x, lo, hi, one, zero):
    """Quantize-dequantize gradient: ``g * float(lo <= x <= hi)`` in the input's dtype."""
    return mul(g, one if (lo <= x and x <= hi) else zero)


# Names compiled by _targets.build, callees before callers.
PRIMITIVES = ("mul", "div", "add", "sub", "floor", "rint")
FUNCTIONS = (
    "fmin",
    "fmax",
    "round_half_away",
    "nudge",
    "fq_level_mul",
    "fq_level_div",
    "fq_mul",
    "fq_div",
    "ql_level",
    "masked",
    "qdq_scale",
    "qdq_round",
    "qdq_clamped",
    "qdq_free",
    "qdq_masked",
)
