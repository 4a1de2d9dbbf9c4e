"""Numba CPU kernels.

Each kernel is ``@njit(parallel=True, cache=True, error_model="numpy")`` over ``prange`` and calls
the shared scalar math of ``_scalar`` (compiled for the CPU here). The
kernels take C-contiguous arrays and precomputed per-tensor or per-channel
parameters; ``qtool.kernels.api`` does validation, layout and dispatch.

Per-axis kernels see the tensor as ``[outer, depth, inner]`` (the quantized
axis in the middle) and walk contiguous chunks of the flat array, keeping the
channel index incrementally so that no division happens per element.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from qtool.kernels import _scalar
from qtool.kernels._targets import build

# error_model="numpy": IEEE results (inf, nan) instead of Python's ZeroDivisionError.
_jit = njit(error_model="numpy")
_PRIMS = {
    "mul": _jit(lambda a, b: a * b),
    "div": _jit(lambda a, b: a / b),
    "add": _jit(lambda a, b: a + b),
    "sub": _jit(lambda a, b: a - b),
    "floor": _jit(lambda a: np.floor(a)),
    "rint": _jit(lambda a: np.rint(a)),
}
_S = build(_PRIMS, _jit)

nudge = _S.nudge
fq_level_mul = _S.fq_level_mul
fq_level_div = _S.fq_level_div
fq_mul = _S.fq_mul
fq_div = _S.fq_div
masked = _S.masked
qdq_scale = _S.qdq_scale
qdq_clamped = _S.qdq_clamped
qdq_free = _S.qdq_free
qdq_masked = _S.qdq_masked

F32_HALF = _scalar.F32_HALF

# Elements per parallel chunk for per-axis kernels and reductions.
CHUNK = 1 << 16


# --- parameters ---------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def nudge_params(mins, maxs, qminf, qmaxf):
    """Per-channel nudging: arrays of nudged_min, nudged_max, scale, inv_scale, zp, quant_zero."""
    d = mins.size
    nmin = np.empty(d, np.float32)
    nmax = np.empty(d, np.float32)
    scale = np.empty(d, np.float32)
    inv = np.empty(d, np.float32)
    zp = np.empty(d, np.float32)
    qz = np.empty(d, np.float32)
    for c in range(d):
        nmin[c], nmax[c], scale[c], inv[c], zp[c], qz[c] = nudge(mins[c], maxs[c], qminf, qmaxf)
    return nmin, nmax, scale, inv, zp, qz


@njit(cache=True, error_model="numpy")
def qdq_params(min_range, max_range, min_q, max_q, big):
    """Per-slice scale choice: arrays of scale, inverse_scale, adjusted min, adjusted max."""
    d = min_range.size
    scale = np.empty_like(min_range)
    inv = np.empty_like(min_range)
    lo = np.empty_like(min_range)
    hi = np.empty_like(min_range)
    for c in range(d):
        scale[c], inv[c], lo[c], hi[c] = qdq_scale(min_range[c], max_range[c], min_q, max_q, big)
    return scale, inv, lo, hi


# --- FakeQuant, per tensor ------------------------------------------------------
@njit(parallel=True, cache=True, error_model="numpy")
def fq_tensor_mul(x, out, nmin, nmax, scale, inv_scale, quant_zero):
    for i in prange(x.size):
        out[i] = fq_mul(x[i], nmin, nmax, scale, inv_scale, quant_zero)


@njit(parallel=True, cache=True, error_model="numpy")
def fq_tensor_div(x, out, nmin, nmax, scale, quant_zero):
    for i in prange(x.size):
        out[i] = fq_div(x[i], nmin, nmax, scale, quant_zero)


@njit(parallel=True, cache=True, error_model="numpy")
def fq_tensor_grad(g, x, out, lo, hi):
    """d_inputs into ``out``; returns (d_min, d_max) summed in float64."""
    dmin = 0.0
    dmax = 0.0
    for i in prange(x.size):
        xi = x[i]
        gi = g[i]
        out[i] = masked(gi, xi, lo, hi)
        if xi < lo:
            dmin += np.float64(gi)
        elif xi > hi:
            dmax += np.float64(gi)
    return dmin, dmax


@njit(parallel=True, cache=True, error_model="numpy")
def fq_tensor_levels(x, out, nmin, nmax, scale, quant_zero, zp):
    """Integer codes (level + zero point) of the ``vars`` forward, as int32."""
    for i in prange(x.size):
        out[i] = np.int32(fq_level_div(x[i], nmin, nmax, scale, quant_zero) + zp)


# --- FakeQuant, per axis ([outer, depth, inner] walked in flat chunks) ----------
@njit(parallel=True, cache=True, error_model="numpy")
def fq_axis_mul(x, out, depth, inner, nmin, nmax, scale, inv_scale, quant_zero):
    n = x.size
    nchunks = (n + CHUNK - 1) // CHUNK
    for k in prange(nchunks):
        start = k * CHUNK
        stop = min(start + CHUNK, n)
        c = (start // inner) % depth
        j = start % inner
        for i in range(start, stop):
            out[i] = fq_mul(x[i], nmin[c], nmax[c], scale[c], inv_scale[c], quant_zero[c])
            j += 1
            if j == inner:
                j = 0
                c += 1
                if c == depth:
                    c = 0


@njit(parallel=True, cache=True, error_model="numpy")
def fq_axis_levels(x, out, depth, inner, nmin, nmax, inv_scale, quant_zero, zp):
    """Integer codes (level + zero point) of the per-channel forward, as int32."""
    n = x.size
    nchunks = (n + CHUNK - 1) // CHUNK
    for k in prange(nchunks):
        start = k * CHUNK
        stop = min(start + CHUNK, n)
        c = (start // inner) % depth
        j = start % inner
        for i in range(start, stop):
            out[i] = np.int32(fq_level_mul(x[i], nmin[c], nmax[c], inv_scale[c], quant_zero[c]) + zp[c])
            j += 1
            if j == inner:
                j = 0
                c += 1
                if c == depth:
                    c = 0


@njit(parallel=True, cache=True, error_model="numpy")
def fq_axis_grad(g, x, out, depth, inner, lo, hi):
    """Per-channel d_inputs into ``out``; returns (d_min, d_max) as float64 arrays."""
    n = x.size
    nchunks = (n + CHUNK - 1) // CHUNK
    part_min = np.zeros((nchunks, depth), np.float64)
    part_max = np.zeros((nchunks, depth), np.float64)
    for k in prange(nchunks):
        start = k * CHUNK
        stop = min(start + CHUNK, n)
        c = (start // inner) % depth
        j = start % inner
        for i in range(start, stop):
            xi = x[i]
            gi = g[i]
            out[i] = masked(gi, xi, lo[c], hi[c])
            if xi < lo[c]:
                part_min[k, c] += gi
            elif xi > hi[c]:
                part_max[k, c] += gi
            j += 1
            if j == inner:
                j = 0
                c += 1
                if c == depth:
                    c = 0
    return part_min.sum(axis=0), part_max.sum(axis=0)


# --- QuantizeAndDequantize --------------------------------------------------------
@njit(parallel=True, cache=True, error_model="numpy")
def qdq_tensor(x, out, lo, hi, scale, inv, clamp, half_up, half):
    if clamp:
        for i in prange(x.size):
            out[i] = qdq_clamped(x[i], lo, hi, scale, inv, half_up, half)
    else:
        for i in prange(x.size):
            out[i] = qdq_free(x[i], scale, inv, half_up, half)


@njit(parallel=True, cache=True, error_model="numpy")
def qdq_axis(x, out, depth, inner, lo, hi, scale, inv, clamp, half_up, half):
    n = x.size
    nchunks = (n + CHUNK - 1) // CHUNK
    for k in prange(nchunks):
        start = k * CHUNK
        stop = min(start + CHUNK, n)
        c = (start // inner) % depth
        j = start % inner
        for i in range(start, stop):
            if clamp:
                out[i] = qdq_clamped(x[i], lo[c], hi[c], scale[c], inv[c], half_up, half)
            else:
                out[i] = qdq_free(x[i], scale[c], inv[c], half_up, half)
            j += 1
            if j == inner:
                j = 0
                c += 1
                if c == depth:
                    c = 0


@njit(parallel=True, cache=True, error_model="numpy")
def qdq_tensor_grad(g, x, out, lo, hi, one, zero):
    for i in prange(x.size):
        out[i] = qdq_masked(g[i], x[i], lo, hi, one, zero)


@njit(parallel=True, cache=True, error_model="numpy")
def qdq_axis_grad(g, x, out, depth, inner, lo, hi, one, zero):
    n = x.size
    nchunks = (n + CHUNK - 1) // CHUNK
    for k in prange(nchunks):
        start = k * CHUNK
        stop = min(start + CHUNK, n)
        c = (start // inner) % depth
        j = start % inner
        for i in range(start, stop):
            out[i] = qdq_masked(g[i], x[i], lo[c], hi[c], one, zero)
            j += 1
            if j == inner:
                j = 0
                c += 1
                if c == depth:
                    c = 0


# --- reductions -------------------------------------------------------------------
@njit(parallel=True, cache=True, error_model="numpy")
def minmax_tensor(x):
    """(min, max, count of non-NaN values) of a flat array, ignoring NaN."""
    n = x.size
    nchunks = (n + CHUNK - 1) // CHUNK
    pmin = np.empty(nchunks, x.dtype)
    pmax = np.empty(nchunks, x.dtype)
    pcnt = np.zeros(nchunks, np.int64)
    for k in prange(nchunks):
        start = k * CHUNK
        stop = min(start + CHUNK, n)
        lo = np.inf
        hi = -np.inf
        cnt = 0
        for i in range(start, stop):
            v = x[i]
            if v == v:
                cnt += 1
                if v < lo:
                    lo = v
                if v > hi:
                    hi = v
        pmin[k] = lo
        pmax[k] = hi
        pcnt[k] = cnt
    lo = np.inf
    hi = -np.inf
    cnt = 0
    for k in range(nchunks):
        if pcnt[k] > 0:
            cnt += pcnt[k]
            if pmin[k] < lo:
                lo = pmin[k]
            if pmax[k] > hi:
                hi = pmax[k]
    return lo, hi, cnt


@njit(parallel=True, cache=True, error_model="numpy")
def minmax_axis(x, depth, inner):
    """Per-slice (min, max, count) along the middle axis of [outer, depth, inner], ignoring NaN."""
    n = x.size
    nchunks = (n + CHUNK - 1) // CHUNK
    pmin = np.full((nchunks, depth), np.inf, dtype=x.dtype)
    pmax = np.full((nchunks, depth), -np.inf, dtype=x.dtype)
    pcnt = np.zeros((nchunks, depth), np.int64)
    for k in prange(nchunks):
        start = k * CHUNK
        stop = min(start + CHUNK, n)
        c = (start // inner) % depth
        j = start % inner
        for i in range(start, stop):
            v = x[i]
            if v == v:
                pcnt[k, c] += 1
                if v < pmin[k, c]:
                    pmin[k, c] = v
                if v > pmax[k, c]:
                    pmax[k, c] = v
            j += 1
            if j == inner:
                j = 0
                c += 1
                if c == depth:
                    c = 0
    lo = np.full(depth, np.inf, dtype=x.dtype)
    hi = np.full(depth, -np.inf, dtype=x.dtype)
    cnt = np.zeros(depth, np.int64)
    for k in range(nchunks):
        for c in range(depth):
            cnt[c] += pcnt[k, c]
            if pmin[k, c] < lo[c]:
                lo[c] = pmin[k, c]
            if pmax[k, c] > hi[c]:
                hi[c] = pmax[k, c]
    return lo, hi, cnt
