"""Numba CPU kernels.

Each kernel is ``@njit(parallel=True, cache=True, error_model="numpy")`` over ``prange`` and calls
the shared scalar math of ``_scalar`` (compiled for the CPU here). The
kernels take C-contiguous arrays and precomputed per-tensor or per-channel
parameters; ``qtool.kernels.api`` does validation, layout and dispatch.

Per-axis kernels see the tensor as ``[outer, depth, inner]`` (the quantized
axis in the middle). With ``inner == 1`` (the last axis) they run over rows of
``depth`` values, the parameters indexed by the inner loop; otherwise over
runs of ``inner`` values that share one channel's parameters. Either way the
innermost loop is contiguous and free of divisions, so LLVM vectorises it.

Reductions run over fixed chunks (``CHUNK`` elements) combined in chunk
order, so results do not depend on the number of threads. Min/max ignore NaN
and, where -0.0 and 0.0 tie, keep the last in memory order (what TensorFlow's
scalar reduction does).
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
def fq_tensor_levels(x, out, nmin, nmax, scale, quant_zero, zp):
    """Integer codes (level + zero point) of the ``vars`` forward, as int32."""
    for i in prange(x.size):
        out[i] = np.int32(fq_level_div(x[i], nmin, nmax, scale, quant_zero) + zp)


@njit(parallel=True, cache=True, error_model="numpy")
def fq_tensor_grad(g, x, out, lo, hi):
    """d_inputs into ``out``; returns (d_min, d_max) summed in float64."""
    n = x.size
    nchunks = (n + CHUNK - 1) // CHUNK
    part = np.zeros((nchunks, 2), np.float64)
    for k in prange(nchunks):
        start = k * CHUNK
        stop = min(start + CHUNK, n)
        smin = 0.0
        smax = 0.0
        for i in range(start, stop):
            xi = x[i]
            gi = g[i]
            out[i] = masked(gi, xi, lo, hi)
            smin += np.float64(gi) if xi < lo else 0.0
            smax += np.float64(gi) if xi > hi else 0.0
        part[k, 0] = smin
        part[k, 1] = smax
    return part[:, 0].sum(), part[:, 1].sum()


# --- FakeQuant, per axis ([outer, depth, inner]) ----------------------------------
@njit(parallel=True, cache=True, error_model="numpy")
def fq_axis_mul(x, out, depth, inner, nmin, nmax, scale, inv_scale, quant_zero):
    if inner == 1:
        for r in prange(x.size // depth):
            base = r * depth
            for c in range(depth):
                out[base + c] = fq_mul(x[base + c], nmin[c], nmax[c], scale[c], inv_scale[c], quant_zero[c])
    else:
        for b in prange(x.size // inner):
            c = b % depth
            p0, p1, p2, p3, p4 = nmin[c], nmax[c], scale[c], inv_scale[c], quant_zero[c]
            base = b * inner
            for j in range(base, base + inner):
                out[j] = fq_mul(x[j], p0, p1, p2, p3, p4)


@njit(parallel=True, cache=True, error_model="numpy")
def fq_axis_levels(x, out, depth, inner, nmin, nmax, inv_scale, quant_zero, zp):
    """Integer codes (level + zero point) of the per-channel forward, as int32."""
    for b in prange(x.size // inner):
        c = b % depth
        base = b * inner
        for j in range(base, base + inner):
            out[j] = np.int32(fq_level_mul(x[j], nmin[c], nmax[c], inv_scale[c], quant_zero[c]) + zp[c])


@njit(parallel=True, cache=True, error_model="numpy")
def fq_axis_grad(g, x, out, depth, inner, lo, hi):
    """Per-channel d_inputs into ``out``; returns (d_min, d_max) as float64 arrays.

    Rows of ``depth * inner`` values are split into chunks; each chunk keeps
    per-channel partial sums, combined in chunk order.
    """
    row = depth * inner
    rows = x.size // row
    rows_per_chunk = max(1, CHUNK // row)
    nchunks = (rows + rows_per_chunk - 1) // rows_per_chunk
    part_min = np.zeros((nchunks, depth), np.float64)
    part_max = np.zeros((nchunks, depth), np.float64)
    for k in prange(nchunks):
        pmin = part_min[k]
        pmax = part_max[k]
        for r in range(k * rows_per_chunk, min((k + 1) * rows_per_chunk, rows)):
            if inner == 1:
                base = r * depth
                for c in range(depth):
                    xi = x[base + c]
                    gi = g[base + c]
                    out[base + c] = masked(gi, xi, lo[c], hi[c])
                    pmin[c] += np.float64(gi) if xi < lo[c] else 0.0
                    pmax[c] += np.float64(gi) if xi > hi[c] else 0.0
            else:
                for c in range(depth):
                    base = (r * depth + c) * inner
                    a = lo[c]
                    b = hi[c]
                    smin = 0.0
                    smax = 0.0
                    for j in range(base, base + inner):
                        xi = x[j]
                        gi = g[j]
                        out[j] = masked(gi, xi, a, b)
                        smin += np.float64(gi) if xi < a else 0.0
                        smax += np.float64(gi) if xi > b else 0.0
                    pmin[c] += smin
                    pmax[c] += smax
    dmin = np.zeros(depth, np.float64)
    dmax = np.zeros(depth, np.float64)
    for k in range(nchunks):
        for c in range(depth):
            dmin[c] += part_min[k, c]
            dmax[c] += part_max[k, c]
    return dmin, dmax


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
    if inner == 1:
        for r in prange(x.size // depth):
            base = r * depth
            for c in range(depth):
                if clamp:
                    out[base + c] = qdq_clamped(x[base + c], lo[c], hi[c], scale[c], inv[c], half_up, half)
                else:
                    out[base + c] = qdq_free(x[base + c], scale[c], inv[c], half_up, half)
    else:
        for b in prange(x.size // inner):
            c = b % depth
            a0, a1, a2, a3 = lo[c], hi[c], scale[c], inv[c]
            base = b * inner
            if clamp:
                for j in range(base, base + inner):
                    out[j] = qdq_clamped(x[j], a0, a1, a2, a3, half_up, half)
            else:
                for j in range(base, base + inner):
                    out[j] = qdq_free(x[j], a2, a3, half_up, half)


@njit(parallel=True, cache=True, error_model="numpy")
def qdq_tensor_grad(g, x, out, lo, hi, one, zero):
    for i in prange(x.size):
        out[i] = qdq_masked(g[i], x[i], lo, hi, one, zero)


@njit(parallel=True, cache=True, error_model="numpy")
def qdq_axis_grad(g, x, out, depth, inner, lo, hi, one, zero):
    if inner == 1:
        for r in prange(x.size // depth):
            base = r * depth
            for c in range(depth):
                out[base + c] = qdq_masked(g[base + c], x[base + c], lo[c], hi[c], one, zero)
    else:
        for b in prange(x.size // inner):
            c = b % depth
            a0, a1 = lo[c], hi[c]
            base = b * inner
            for j in range(base, base + inner):
                out[j] = qdq_masked(g[j], x[j], a0, a1, one, zero)


# --- reductions -------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def _minmax_run(x, start, stop, lo, hi):
    for i in range(start, stop):
        v = x[i]
        lo = v if v <= lo else lo  # NaN compares false: ignored; ties keep the last
        hi = v if v >= hi else hi
    return lo, hi


@njit(parallel=True, cache=True, error_model="numpy")
def minmax_tensor(x):
    """(min, max) of a flat array, ignoring NaN; (inf, -inf) when there is no number."""
    n = x.size
    nchunks = (n + CHUNK - 1) // CHUNK
    pmin = np.empty(nchunks, x.dtype)
    pmax = np.empty(nchunks, x.dtype)
    for k in prange(nchunks):
        pmin[k], pmax[k] = _minmax_run(x, k * CHUNK, min(k * CHUNK + CHUNK, n), x.dtype.type(np.inf), x.dtype.type(-np.inf))
    return _minmax_run(pmin, 0, nchunks, x.dtype.type(np.inf), x.dtype.type(-np.inf))[0], _minmax_run(
        pmax, 0, nchunks, x.dtype.type(np.inf), x.dtype.type(-np.inf)
    )[1]


@njit(parallel=True, cache=True, error_model="numpy")
def minmax_axis(x, depth, inner):
    """Per-slice (min, max) along the middle axis of [outer, depth, inner], ignoring NaN."""
    row = depth * inner
    rows = x.size // row
    rows_per_chunk = max(1, CHUNK // row)
    nchunks = (rows + rows_per_chunk - 1) // rows_per_chunk
    pmin = np.full((nchunks, depth), np.inf, dtype=x.dtype)
    pmax = np.full((nchunks, depth), -np.inf, dtype=x.dtype)
    for k in prange(nchunks):
        for r in range(k * rows_per_chunk, min((k + 1) * rows_per_chunk, rows)):
            if inner == 1:
                base = r * depth
                for c in range(depth):
                    v = x[base + c]
                    pmin[k, c] = v if v <= pmin[k, c] else pmin[k, c]
                    pmax[k, c] = v if v >= pmax[k, c] else pmax[k, c]
            else:
                for c in range(depth):
                    base = (r * depth + c) * inner
                    pmin[k, c], pmax[k, c] = _minmax_run(x, base, base + inner, pmin[k, c], pmax[k, c])
    lo = np.full(depth, np.inf, dtype=x.dtype)
    hi = np.full(depth, -np.inf, dtype=x.dtype)
    for k in range(nchunks):
        for c in range(depth):
            v = pmin[k, c]
            lo[c] = v if v <= lo[c] else lo[c]
            v = pmax[k, c]
            hi[c] = v if v >= hi[c] else hi[c]
    return lo, hi
