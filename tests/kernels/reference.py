"""Plain numpy float32 reference of spec/kernels.md, written from the spec alone.

Deliberately independent of qtool's implementation: vectorised numpy on
float32 arrays (IEEE, no fused multiply-add), in the spec's operation order.
"""

import math

import numpy as np

f32 = np.float32


def std_round(v: np.float32) -> np.float32:
    """std::round: halves away from zero (exact: float32 values are exact doubles)."""
    a = abs(float(v))
    r = math.floor(a)
    if a - r >= 0.5:
        r += 1
    return f32(math.copysign(r, float(v)))


def std_min(a, b):
    """std::min(a, b) as Eigen's cwiseMin uses it: b if b < a else a (NaN a propagates, -0.0 kept)."""
    return np.where(b < a, b, a)


def std_max(a, b):
    """std::max(a, b): b if a < b else a."""
    return np.where(a < b, b, a)


def nudge(mn, mx, num_bits, narrow):
    mn, mx = f32(mn), f32(mx)
    qmin = f32(1 if narrow else 0)
    qmax = f32(2**num_bits - 1)
    with np.errstate(all="ignore"):
        scale = (mx - mn) / (qmax - qmin)
        inv = (qmax - qmin) / (mx - mn)
        zfm = qmin - mn / scale
    if zfm < qmin:
        zp = qmin
    elif zfm > qmax:
        zp = qmax
    else:
        zp = std_round(zfm)
    nmin = (qmin - zp) * scale
    nmax = (qmax - zp) * scale
    return nmin, nmax, scale, inv, zp


def fake_quant(x, mn, mx, num_bits=8, narrow=False, variant="mul"):
    x = np.asarray(x, f32)
    if f32(mn) == 0 and f32(mx) == 0:
        with np.errstate(invalid="ignore"):
            return x * f32(0)
    nmin, nmax, scale, inv, _ = nudge(mn, mx, num_bits, narrow)
    qz = np.floor(-nmin * inv + f32(0.5))
    clamped = std_max(std_min(x, nmax), nmin)
    shifted = clamped - nmin
    with np.errstate(all="ignore"):
        t = shifted * inv if variant == "mul" else shifted / scale
    return np.floor((t - qz) + f32(0.5)) * scale


def fake_quant_grad(g, x, mn, mx, num_bits=8, narrow=False):
    g = np.asarray(g, f32)
    x = np.asarray(x, f32)
    if f32(mn) == 0 and f32(mx) == 0:
        return g.copy(), f32(0), f32(0)
    nmin, nmax, *_ = nudge(mn, mx, num_bits, narrow)
    mask = ((nmin <= x) & (x <= nmax)).astype(f32)
    d = g * mask
    dmin = g[x < nmin].astype(np.float64).sum()
    dmax = g[x > nmax].astype(np.float64).sum()
    return d, f32(dmin), f32(dmax)


def qdq(x, input_min, input_max, signed=True, num_bits=8, range_given=False, half_up=False, narrow=False):
    """Per-tensor quantize_and_dequantize_v2 (call per slice for axis)."""
    x = np.asarray(x)
    T = x.dtype.type
    if signed:
        min_q = T(-(2 ** (num_bits - 1)) + (1 if narrow else 0))
        max_q = T(2 ** (num_bits - 1) - 1)
    else:
        min_q, max_q = T(0), T(2**num_bits - 1)
    if range_given:
        lo, hi = T(input_min), T(input_max)
    else:
        finite = x[~np.isnan(x)]
        # the last occurrence of the extreme value decides the sign of a zero range end (TF's scalar reduction)
        rev = finite[::-1]
        lo, hi = (T(rev[np.argmin(rev)]), T(rev[np.argmax(rev)])) if finite.size else (T(0), T(0))
    big = T(np.finfo(x.dtype).max)
    with np.errstate(all="ignore"):
        sf_min = min_q / lo if min_q * lo > 0 else big
        sf_max = max_q / hi if max_q * hi > 0 else big
        if sf_min < sf_max:
            scale, inv = sf_min, lo / min_q
            hi = max_q * inv
        else:
            scale, inv = sf_max, hi / max_q
            lo = min_q * inv
        v = (std_max(std_min(x, hi), lo) if range_given else x) * scale
        r = np.floor(v + T(0.5)) if half_up else np.rint(v)
        return (r * inv).astype(x.dtype)
