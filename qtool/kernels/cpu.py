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
order, so results do not depend on the number of threads. Every parallel kernel
has a one-thread twin in :data:`SERIAL` (the same code, ``prange`` run as
``range``: the same results), which ``qtool.kernels.api`` runs below
:data:`PARALLEL_MIN` values. Min/max ignore NaN
and, where -0.0 and 0.0 tie, keep the last in memory order (what TensorFlow's
scalar reduction does).
"""

from __future__ import annotations

import types

import numpy as np
from numba import njit, prange

from qtool.kernels import _scalar
from qtool.kernels._targets import build

from qtool.kernels._cache import drop_stale_cache

drop_stale_cache("cpu", ("_scalar.py", "_targets.py"))

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
ql_level = _S.ql_level
masked = _S.masked
qdq_scale = _S.qdq_scale
qdq_clamped = _S.qdq_clamped
qdq_free = _S.qdq_free
qdq_masked = _S.qdq_masked

F32_HALF = _scalar.F32_HALF

# Elements per parallel chunk of the reductions (small enough that a second
# pass over a chunk's inputs hits the cache).
CHUNK = 1 << 14


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


@njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def _grad_run_fast(gs, xs, os, lo, hi):
    """Masked gradient into ``os`` and the sums of ``gs`` where ``xs < lo`` / ``xs > hi``.

    The only kernel code with a fast-math flag: ``reassoc`` lets LLVM split the
    two float64 sums into SIMD lanes (the spec leaves the order of a sum free).
    The masked gradient is one multiply per element, which reassociation
    cannot change (the tests compare its bits). Multiplying by 0/1 instead of
    selecting turns an infinite or NaN gradient inside the range into NaN; the
    caller then recomputes the sums with ``_outside_sums_exact``.
    """
    a = 0.0
    b = 0.0
    for i in range(xs.size):
        v = xs[i]
        g = gs[i]
        os[i] = masked(g, v, lo, hi)
        gd = np.float64(g)
        a += gd * np.float64(v < lo)
        b += gd * np.float64(v > hi)
    return a, b


@njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def _grad_rows_fast(gs, xs, os, depth, lo, hi, pmin, pmax):
    """Rows ``[rows, depth]`` of a last-axis per-channel gradient (see ``_grad_run_fast``).

    Adds into the per-channel sums ``pmin``/``pmax``; returns False when a sum
    is no longer finite (the caller then redoes the sums by selection).
    """
    rows = xs.size // depth
    for r in range(rows):
        xr = xs[r * depth : (r + 1) * depth]
        gr = gs[r * depth : (r + 1) * depth]
        orow = os[r * depth : (r + 1) * depth]
        for c in range(depth):
            v = xr[c]
            g = gr[c]
            orow[c] = masked(g, v, lo[c], hi[c])
            gd = np.float64(g)
            pmin[c] += gd * np.float64(v < lo[c])
            pmax[c] += gd * np.float64(v > hi[c])
    total = 0.0
    for c in range(depth):
        total += pmin[c] + pmax[c]
    return np.isfinite(total)


@njit(cache=True, error_model="numpy")
def _outside_sums_exact(gs, xs, lo, hi):
    a = 0.0
    b = 0.0
    for i in range(xs.size):
        v = xs[i]
        if v < lo:
            a += gs[i]
        elif v > hi:
            b += gs[i]
    return a, b


@njit(cache=True, error_model="numpy")
def _grad_run(gs, xs, os, lo, hi):
    """Masked gradient of one contiguous run into ``os``; returns the float64 sums of
    ``gs`` where ``xs < lo`` and where ``xs > hi`` (TF selects, then sums)."""
    a, b = _grad_run_fast(gs, xs, os, lo, hi)
    if not (np.isfinite(a) and np.isfinite(b)):
        a, b = _outside_sums_exact(gs, xs, lo, hi)
    return a, b


@njit(parallel=True, cache=True, error_model="numpy")
def fq_tensor_grad(g, x, out, lo, hi):
    """d_inputs into ``out``; returns (d_min, d_max) summed in float64."""
    n = x.size
    nchunks = (n + CHUNK - 1) // CHUNK
    part = np.zeros((nchunks, 2), np.float64)
    for k in prange(nchunks):
        part[k, 0], part[k, 1] = _grad_run(
            g[k * CHUNK : (k + 1) * CHUNK], x[k * CHUNK : (k + 1) * CHUNK], out[k * CHUNK : (k + 1) * CHUNK], lo, hi
        )
    return part[:, 0].sum(), part[:, 1].sum()


# --- FakeQuant, per axis ([outer, depth, inner]) ----------------------------------
# Loops index slices from 0 rather than the flat array from an offset: numba
# then knows the indices are non-negative and LLVM vectorises the loop.
@njit(parallel=True, cache=True, error_model="numpy")
def fq_axis_mul(x, out, depth, inner, nmin, nmax, scale, inv_scale, quant_zero):
    if inner == 1:
        for r in prange(x.size // depth):
            xs = x[r * depth : (r + 1) * depth]
            os = out[r * depth : (r + 1) * depth]
            for c in range(depth):
                os[c] = fq_mul(xs[c], nmin[c], nmax[c], scale[c], inv_scale[c], quant_zero[c])
    else:
        for b in prange(x.size // inner):
            c = b % depth
            p0, p1, p2, p3, p4 = nmin[c], nmax[c], scale[c], inv_scale[c], quant_zero[c]
            xs = x[b * inner : (b + 1) * inner]
            os = out[b * inner : (b + 1) * inner]
            for j in range(inner):
                os[j] = fq_mul(xs[j], p0, p1, p2, p3, p4)


@njit(parallel=True, cache=True, error_model="numpy")
def fq_axis_levels(x, out, depth, inner, nmin, nmax, inv_scale, quant_zero, zp):
    """Integer codes (level + zero point) of the per-channel forward, as int32."""
    for b in prange(x.size // inner):
        c = b % depth
        p0, p1, p2, p3, p4 = nmin[c], nmax[c], inv_scale[c], quant_zero[c], zp[c]
        xs = x[b * inner : (b + 1) * inner]
        os = out[b * inner : (b + 1) * inner]
        for j in range(inner):
            os[j] = np.int32(fq_level_mul(xs[j], p0, p1, p2, p3) + p4)


@njit(parallel=True, cache=True, error_model="numpy")
def ql_axis_levels(x, out, depth, inner, scale, lo, hi, zp):
    """Integer codes of QuantizeLinear (``ql_level`` + zero point), per channel, as int32; one
    range for the whole tensor is ``depth == inner == 1``."""
    for b in prange(x.size // inner):
        c = b % depth
        p0, p1, p2, p3 = scale[c], lo[c], hi[c], zp[c]
        xs = x[b * inner : (b + 1) * inner]
        os = out[b * inner : (b + 1) * inner]
        for j in range(inner):
            os[j] = np.int32(ql_level(xs[j], p0, p1, p2) + p3)


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
        exact = False
        r0 = k * rows_per_chunk
        r1 = min((k + 1) * rows_per_chunk, rows)
        if inner == 1:
            s = slice(r0 * depth, r1 * depth)
            exact = not _grad_rows_fast(g[s], x[s], out[s], depth, lo, hi, pmin, pmax)
        else:
            for r in range(r0, r1):
                for c in range(depth):
                    base = (r * depth + c) * inner
                    smin, smax = _grad_run(
                        g[base : base + inner], x[base : base + inner], out[base : base + inner], lo[c], hi[c]
                    )
                    pmin[c] += smin
                    pmax[c] += smax
        if exact:  # an infinite or NaN gradient inside the range: redo this chunk's sums by selection
            pmin[:] = 0.0
            pmax[:] = 0.0
            for r in range(r0, r1):
                for c in range(depth):
                    i = r * depth + c
                    if x[i] < lo[c]:
                        pmin[c] += g[i]
                    elif x[i] > hi[c]:
                        pmax[c] += g[i]
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
            xs = x[r * depth : (r + 1) * depth]
            os = out[r * depth : (r + 1) * depth]
            if clamp:
                for c in range(depth):
                    os[c] = qdq_clamped(xs[c], lo[c], hi[c], scale[c], inv[c], half_up, half)
            else:
                for c in range(depth):
                    os[c] = qdq_free(xs[c], scale[c], inv[c], half_up, half)
    else:
        for b in prange(x.size // inner):
            c = b % depth
            a0, a1, a2, a3 = lo[c], hi[c], scale[c], inv[c]
            xs = x[b * inner : (b + 1) * inner]
            os = out[b * inner : (b + 1) * inner]
            if clamp:
                for j in range(inner):
                    os[j] = qdq_clamped(xs[j], a0, a1, a2, a3, half_up, half)
            else:
                for j in range(inner):
                    os[j] = qdq_free(xs[j], a2, a3, half_up, half)


@njit(parallel=True, cache=True, error_model="numpy")
def qdq_tensor_grad(g, x, out, lo, hi, one, zero):
    for i in prange(x.size):
        out[i] = qdq_masked(g[i], x[i], lo, hi, one, zero)


@njit(parallel=True, cache=True, error_model="numpy")
def qdq_axis_grad(g, x, out, depth, inner, lo, hi, one, zero):
    if inner == 1:
        for r in prange(x.size // depth):
            xs = x[r * depth : (r + 1) * depth]
            gs = g[r * depth : (r + 1) * depth]
            os = out[r * depth : (r + 1) * depth]
            for c in range(depth):
                os[c] = qdq_masked(gs[c], xs[c], lo[c], hi[c], one, zero)
    else:
        for b in prange(x.size // inner):
            c = b % depth
            a0, a1 = lo[c], hi[c]
            xs = x[b * inner : (b + 1) * inner]
            gs = g[b * inner : (b + 1) * inner]
            os = out[b * inner : (b + 1) * inner]
            for j in range(inner):
                os[j] = qdq_masked(gs[j], xs[j], a0, a1, one, zero)


# --- reductions -------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def _last_zero(xs, fallback):
    """The last element of ``xs`` equal to zero (keeping its sign), else ``fallback``."""
    for i in range(xs.size - 1, -1, -1):
        if xs[i] == 0:
            return xs[i]
    return fallback


@njit(cache=True, error_model="numpy")
def _minmax_run(x, start, stop, lo, hi):
    """Fold ``x[start:stop]`` into the running ``(lo, hi)``, ignoring NaN.

    Four lanes of compare-and-select (NaN compares false, so it is skipped).
    Equal values differ only in the sign of zero; where an end is zero it is
    taken from the last zero in memory order, as a sequential scan would.
    """
    xs = x[start:stop]
    n = xs.size
    m = n - n % 4
    lo0 = lo1 = lo2 = lo3 = lo
    hi0 = hi1 = hi2 = hi3 = hi
    for i in range(0, m, 4):
        v0, v1, v2, v3 = xs[i], xs[i + 1], xs[i + 2], xs[i + 3]
        lo0 = v0 if v0 < lo0 else lo0
        lo1 = v1 if v1 < lo1 else lo1
        lo2 = v2 if v2 < lo2 else lo2
        lo3 = v3 if v3 < lo3 else lo3
        hi0 = v0 if v0 > hi0 else hi0
        hi1 = v1 if v1 > hi1 else hi1
        hi2 = v2 if v2 > hi2 else hi2
        hi3 = v3 if v3 > hi3 else hi3
    for i in range(m, n):
        v = xs[i]
        lo0 = v if v < lo0 else lo0
        hi0 = v if v > hi0 else hi0
    new_lo = min(min(lo0, lo1), min(lo2, lo3))
    new_hi = max(max(hi0, hi1), max(hi2, hi3))
    if new_lo == 0:
        new_lo = _last_zero(xs, lo)
    if new_hi == 0:
        new_hi = _last_zero(xs, hi)
    return new_lo, new_hi


@njit(cache=True, error_model="numpy")
def _minmax_chunk(x, k, pmin, pmax):
    n = x.size
    pmin[k], pmax[k] = _minmax_run(x, k * CHUNK, min(k * CHUNK + CHUNK, n), x.dtype.type(np.inf), x.dtype.type(-np.inf))


@njit(cache=True, error_model="numpy")
def _minmax_chunks(pmin, pmax):
    return _minmax_run(pmin, 0, pmin.size, pmin.dtype.type(np.inf), pmin.dtype.type(-np.inf))[0], _minmax_run(
        pmax, 0, pmax.size, pmax.dtype.type(np.inf), pmax.dtype.type(-np.inf)
    )[1]


@njit(parallel=True, cache=True, error_model="numpy")
def minmax_tensor(x):
    """(min, max) of a flat array, ignoring NaN; (inf, -inf) when there is no number."""
    nchunks = (x.size + CHUNK - 1) // CHUNK
    pmin = np.empty(nchunks, x.dtype)
    pmax = np.empty(nchunks, x.dtype)
    for k in prange(nchunks):
        _minmax_chunk(x, k, pmin, pmax)
    return _minmax_chunks(pmin, pmax)


@njit(cache=True, error_model="numpy")
def minmax_tensor_serial(x):
    """``minmax_tensor`` on one thread: the same chunks reduced the same way, so the same result
    (signed zeros included), without waking the thread pool (for small arrays)."""
    nchunks = (x.size + CHUNK - 1) // CHUNK
    pmin = np.empty(nchunks, x.dtype)
    pmax = np.empty(nchunks, x.dtype)
    for k in range(nchunks):
        _minmax_chunk(x, k, pmin, pmax)
    return _minmax_chunks(pmin, pmax)


# Below this many values ``minmax`` runs on one thread (waking numba's pool costs more than
# it saves, far more on a loaded machine where a parallel region waits for a descheduled thread).
PARALLEL_MIN = 1 << 20


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
                xs = x[r * depth : (r + 1) * depth]
                lo_k = pmin[k]
                hi_k = pmax[k]
                for c in range(depth):
                    v = xs[c]
                    lo_k[c] = v if v <= lo_k[c] else lo_k[c]
                    hi_k[c] = v if v >= hi_k[c] else hi_k[c]
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


# --- one-thread twins --------------------------------------------------------------
def _serial_twin(kernel):
    """``kernel`` compiled without ``parallel`` (its ``prange`` loops run as ``range``, the chunks in
    order: the same results). Its own name, so numba's cache keeps it apart from the parallel one."""
    fn = kernel.py_func
    name = f"{fn.__name__}_serial"
    code = fn.__code__.replace(co_name=name)
    if hasattr(code, "co_qualname"):  # Python >= 3.11
        code = code.replace(co_qualname=name)
    twin = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    twin.__qualname__, twin.__doc__ = name, fn.__doc__
    return njit(cache=True, error_model="numpy")(twin)


# Waking numba's thread pool costs more than a small array's work, and on a loaded machine a parallel
# region waits for a descheduled thread (a model's 288 small weights took 7 ms each to quantize, 4 s in
# all, while another process ran): below PARALLEL_MIN values the api runs these.
SERIAL = {kernel.py_func.__name__: _serial_twin(kernel) for kernel in (
    fq_tensor_mul, fq_tensor_div, fq_tensor_levels, fq_tensor_grad, fq_axis_mul, fq_axis_levels, ql_axis_levels,
    fq_axis_grad, qdq_tensor, qdq_axis, qdq_tensor_grad, qdq_axis_grad, minmax_axis)}
SERIAL["minmax_tensor"] = minmax_tensor_serial


def sized(name: str, size: int):
    """The kernel ``name`` for an array of ``size`` values: parallel from PARALLEL_MIN on, else its twin."""
    return globals()[name] if size >= PARALLEL_MIN or name not in SERIAL else SERIAL[name]
