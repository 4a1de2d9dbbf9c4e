"""numba-cuda kernels, bit-identical to the CPU kernels of ``cpu``.

Imported lazily by ``qtool.kernels.api`` on the first CUDA request only; this
module needs the ``cuda`` extra (``pip install 'qtool[cuda]'``).

Arithmetic: the scalar math of ``_scalar`` is compiled twice with
``_targets.build``: for float32 from libdevice's correctly rounded
``fmul_rn``/``fdiv_rn``/``fadd_rn``/``fsub_rn``/``floorf``/``rintf``, for
float64 from ``dmul_rn``/``ddiv_rn``/``dadd_rn``/``floor``/``rint`` (there is
no ``dsub_rn``: ``a - b`` is ``dadd_rn(a, -b)``, the same IEEE operation).
NVVM never contracts the ``_rn`` intrinsics into a fused multiply-add, so the
PTX has ``mul.rn``/``add.rn``/``sub.rn``/``div.rn`` and no ``fma``
(``tests/kernels/test_cuda_ptx.py`` compiles every kernel and checks).
Device functions are ``inline="always"``, which also lets ``compile_ptx``
work on a machine without a GPU.

Under the numba CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) libdevice is only
stubs: there the primitives are Python operators on numpy scalars
(``np.float32 * np.float32`` is one IEEE float32 multiply), so the simulator
runs these kernels with the same arithmetic.

The launchers at the end have the names and argument order of ``cpu``'s
kernels; they take contiguous 1-D device arrays, the parameters as numpy
scalars of the tensor's dtype or per-channel arrays (on the host: copied,
they are a handful of values; or on the device), and launch on the default
stream without synchronising. Elementwise kernels are grid-stride loops.
Per-axis kernels see the tensor as ``[outer, depth, inner]`` (the quantized
axis in the middle) and step each thread's channel incrementally (no integer
division per element). Reductions (gradient sums, min/max) give every thread
one column of a ``[rows, cols2]`` view, hence one channel, reduce in shared
memory per block, and combine blocks with atomics.
"""

from __future__ import annotations

import importlib.util
import math
import warnings

import numpy as np

MISSING_EXTRA = "CUDA kernels need the numba-cuda package, which is not installed: pip install 'qtool[cuda]'"


def _have_numba_cuda() -> bool:
    try:
        return importlib.util.find_spec("numba_cuda") is not None
    except (ImportError, ValueError):
        return False


if not _have_numba_cuda():  # numba's own (deprecated) numba.cuda is not enough
    raise ImportError(MISSING_EXTRA)

import numba  # noqa: E402
from numba import cuda, float64, int64  # noqa: E402

try:  # numba-cuda's own warning class (not numba.core's)
    from numba.cuda.core.errors import NumbaPerformanceWarning
except ImportError:  # pragma: no cover - other numba-cuda layouts
    from numba.core.errors import NumbaPerformanceWarning

from qtool.kernels import _scalar  # noqa: E402
from qtool.kernels._targets import build  # noqa: E402

try:  # the flag numba.cuda itself reads to pick the simulator
    from numba.cuda.core import config as _cuda_config

    SIM = bool(_cuda_config.ENABLE_CUDASIM)
except ImportError:  # pragma: no cover - other numba-cuda layouts
    SIM = bool(numba.config.ENABLE_CUDASIM)


# --- arithmetic primitives ---------------------------------------------------------------
if SIM:
    # The simulator runs kernels as Python: numpy scalar operators are exact
    # IEEE operations in the operands' dtype, so the primitives are _scalar's own
    # plain ones. Device functions stay plain Python functions (the simulator's
    # device-function wrapper only adds a context switch per call).
    _P32 = _P64 = {name: getattr(_scalar, name) for name in _scalar.PRIMITIVES}

    def _device(fn):
        return fn

else:
    from numba.cuda import libdevice

    _device = cuda.jit(device=True, inline="always")

    @_device
    def _dsub_rn(a, b):
        return libdevice.dadd_rn(a, -b)

    _P32 = {
        "mul": libdevice.fmul_rn,
        "div": libdevice.fdiv_rn,
        "add": libdevice.fadd_rn,
        "sub": libdevice.fsub_rn,
        "floor": libdevice.floorf,
        "rint": libdevice.rintf,
    }
    _P64 = {
        "mul": libdevice.dmul_rn,
        "div": libdevice.ddiv_rn,
        "add": libdevice.dadd_rn,
        "sub": _dsub_rn,
        "floor": libdevice.floor,
        "rint": libdevice.rint,
    }

S32 = build(_P32, _device)
"""The shared scalar math compiled for float32 (FakeQuant, float32 quantize-dequantize)."""
S64 = build(_P64, _device)
"""The shared scalar math compiled for float64 (float64 quantize-dequantize)."""


# --- launch configuration ------------------------------------------------------------------
if SIM:
    # The simulator runs one Python thread per CUDA thread, one block at a
    # time: tiny blocks, but several, so the grid-stride loops, the channel
    # stepping and the cross-block atomics all run.
    TPB = 4
    RED_BX, RED_BY = 4, 2
else:
    TPB = 256
    RED_BX, RED_BY = 32, 8
RED_THREADS = RED_BX * RED_BY  # the shared arrays of the reductions hold one value per thread

_max_blocks_cache: list[int] = []


def _max_blocks() -> int:
    """Blocks of a grid-stride launch: enough to fill the GPU a few times over."""
    if not _max_blocks_cache:
        if SIM:
            _max_blocks_cache.append(2)
        else:
            sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
            _max_blocks_cache.append(sms * (2048 // TPB) * 4)
    return _max_blocks_cache[0]


def _grid(n: int) -> int:
    return max(1, min((n + TPB - 1) // TPB, _max_blocks()))


def _axis_steps(n: int, depth: int, inner: int):
    """Grid size and how far one grid stride moves the channel: ``(blocks, dc, dj)``."""
    blocks = _grid(n)
    stride = blocks * TPB
    return blocks, (stride // inner) % depth, stride % inner


def _reduce_config(n: int, cols: int):
    """Launch shape of the column reductions over a flat tensor of ``n`` elements.

    The tensor is seen as rows of ``cols2`` columns, ``cols2`` the least
    multiple of ``cols`` (= depth * inner, one period of the channel index)
    that fills whole column tiles of ``bx``: every column, hence every
    thread, stays in one channel. Blocks are ``bx`` columns by ``by`` rows;
    with fewer rows than ``by`` a block is one row of ``bx * by`` columns.
    """
    bx, by = RED_BX, RED_BY
    cols2 = cols * (bx // math.gcd(cols, bx))
    rows2 = (n + cols2 - 1) // cols2
    if rows2 < by:
        bx, by = bx * by, 1
        cols2 = cols * (bx // math.gcd(cols, bx))
        rows2 = (n + cols2 - 1) // cols2
    gx = (min(cols2, n) + bx - 1) // bx  # columns at or past n hold no element
    target = _max_blocks() if SIM else _max_blocks() // 4
    gy = max(1, min((rows2 + by - 1) // by, max(1, target // gx), 65535))
    return (gx, gy), (bx, by), cols2


# --- kernels -----------------------------------------------------------------------------------
@cuda.jit(device=True, inline=True)
def _next_channel(j, c, dj, dc, inner, depth):
    """The inner index and channel of the element one grid stride on (``_axis_steps``'s ``dc``, ``dj``)."""
    j += dj
    c += dc
    if j >= inner:
        j -= inner
        c += 1
    if c >= depth:
        c -= depth
    return j, c


@cuda.jit(device=True, inline=True)
def _reduced_range(x, acc_lo, acc_hi, zidx, c):
    """Channel ``c``'s min and max from ``minmax_reduce``'s accumulators: a zero takes the sign of the channel's
    last zero (``x[zidx[c]]``), as on the CPU."""
    a = acc_lo[c]
    b = acc_hi[c]
    if a == 0:
        a = x[zidx[c]]
    if b == 0:
        b = x[zidx[c]]
    return a, b


@cuda.jit(device=True, inline=True)
def _outside_sums(g, x, lo, hi, s_min, s_max):
    """A gradient into the running float64 sums of the gradients below ``lo`` / above ``hi``."""
    if x < lo:
        s_min += g
    elif x > hi:
        s_max += g
    return s_min, s_max


@cuda.jit(device=True, inline=True)
def _minmax_take(v, i, lo, hi, z):
    """One element into a thread's running (min, max, last zero index); NaN is skipped."""
    if v == v:
        if v < lo:
            lo = v
        if v > hi:
            hi = v
        if v == 0:
            z = i  # i increases: this thread's last zero
    return lo, hi, z


def _fq_kernels(S, P):
    """FakeQuant kernels (float32 only): ``S`` the float32 scalar math, ``P`` its primitives."""
    fq_mul = S.fq_mul
    fq_div = S.fq_div
    fq_level_mul = S.fq_level_mul
    fq_level_div = S.fq_level_div
    ql_level = S.ql_level
    masked = S.masked
    add = P["add"]

    @cuda.jit
    def fq_tensor_mul(x, out, nmin, nmax, scale, inv_scale, quant_zero):
        i = np.int64(cuda.grid(1))
        stride = cuda.gridsize(1)
        while i < x.size:
            out[i] = fq_mul(x[i], nmin, nmax, scale, inv_scale, quant_zero)
            i += stride

    @cuda.jit
    def fq_tensor_div(x, out, nmin, nmax, scale, quant_zero):
        i = np.int64(cuda.grid(1))
        stride = cuda.gridsize(1)
        while i < x.size:
            out[i] = fq_div(x[i], nmin, nmax, scale, quant_zero)
            i += stride

    @cuda.jit
    def fq_tensor_levels(x, out, nmin, nmax, scale, quant_zero, zp):
        i = np.int64(cuda.grid(1))
        stride = cuda.gridsize(1)
        while i < x.size:
            out[i] = np.int32(add(fq_level_div(x[i], nmin, nmax, scale, quant_zero), zp))
            i += stride

    @cuda.jit
    def fq_axis_mul(x, out, depth, inner, dc, dj, nmin, nmax, scale, inv_scale, quant_zero):
        i = np.int64(cuda.grid(1))
        stride = cuda.gridsize(1)
        c = (i // inner) % depth
        j = i % inner
        while i < x.size:
            out[i] = fq_mul(x[i], nmin[c], nmax[c], scale[c], inv_scale[c], quant_zero[c])
            i += stride
            j, c = _next_channel(j, c, dj, dc, inner, depth)

    @cuda.jit
    def fq_axis_levels(x, out, depth, inner, dc, dj, nmin, nmax, inv_scale, quant_zero, zp):
        i = np.int64(cuda.grid(1))
        stride = cuda.gridsize(1)
        c = (i // inner) % depth
        j = i % inner
        while i < x.size:
            out[i] = np.int32(add(fq_level_mul(x[i], nmin[c], nmax[c], inv_scale[c], quant_zero[c]), zp[c]))
            i += stride
            j, c = _next_channel(j, c, dj, dc, inner, depth)

    @cuda.jit
    def ql_axis_levels(x, out, depth, inner, dc, dj, scale, lo, hi, zp):
        i = np.int64(cuda.grid(1))
        stride = cuda.gridsize(1)
        c = (i // inner) % depth
        j = i % inner
        while i < x.size:
            out[i] = np.int32(add(ql_level(x[i], scale[c], lo[c], hi[c]), zp[c]))
            i += stride
            j, c = _next_channel(j, c, dj, dc, inner, depth)

    @cuda.jit
    def fq_grad_reduce(g, x, out, lo, hi, acc_min, acc_max, cols, cols2, inner, depth):
        """d_inputs into ``out``; float64 sums of g below lo / above hi per channel added to ``acc_*``.

        One thread per column of the [rows, cols2] view (one channel per
        thread), rows in a grid-stride loop, a shared-memory reduction per
        block, then float64 atomics: one per block where the block's columns
        share a channel, one per column otherwise.
        """
        sh_min = cuda.shared.array(RED_THREADS, float64)
        sh_max = cuda.shared.array(RED_THREADS, float64)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        bx = cuda.blockDim.x
        by = cuda.blockDim.y
        n = x.size
        q0 = np.int64(cuda.blockIdx.x) * bx
        q = q0 + tx
        s_min = 0.0
        s_max = 0.0
        if q < cols2:
            c = (q // inner) % depth
            lo_c = lo[c]
            hi_c = hi[c]
            i = (np.int64(cuda.blockIdx.y) * by + ty) * cols2 + q
            step = np.int64(cuda.gridDim.y) * by * cols2
            while i + step < n:  # two rows' loads in flight per thread, then added in row order
                x0 = x[i]
                g0 = g[i]
                x1 = x[i + step]
                g1 = g[i + step]
                out[i] = masked(g0, x0, lo_c, hi_c)
                out[i + step] = masked(g1, x1, lo_c, hi_c)
                s_min, s_max = _outside_sums(g0, x0, lo_c, hi_c, s_min, s_max)
                s_min, s_max = _outside_sums(g1, x1, lo_c, hi_c, s_min, s_max)
                i += 2 * step
            if i < n:
                xi = x[i]
                gi = g[i]
                out[i] = masked(gi, xi, lo_c, hi_c)
                s_min, s_max = _outside_sums(gi, xi, lo_c, hi_c, s_min, s_max)
        k = ty * bx + tx
        sh_min[k] = s_min
        sh_max[k] = s_max
        cuda.syncthreads()
        s = by // 2
        while s > 0:
            if ty < s:
                sh_min[k] += sh_min[k + s * bx]
                sh_max[k] += sh_max[k + s * bx]
            cuda.syncthreads()
            s //= 2
        q_last = min(q0 + bx, cols2) - 1
        if q0 // inner == q_last // inner:  # one channel for the whole block (block-uniform branch)
            s = bx // 2
            while s > 0:
                if ty == 0 and tx < s:
                    sh_min[tx] += sh_min[tx + s]
                    sh_max[tx] += sh_max[tx + s]
                cuda.syncthreads()
                s //= 2
            if ty == 0 and tx == 0:
                c0 = (q0 // inner) % depth
                cuda.atomic.add(acc_min, c0, sh_min[0])
                cuda.atomic.add(acc_max, c0, sh_max[0])
        elif ty == 0 and q < cols2:
            c1 = (q // inner) % depth
            cuda.atomic.add(acc_min, c1, sh_min[tx])
            cuda.atomic.add(acc_max, c1, sh_max[tx])

    return {
        "fq_tensor_mul": fq_tensor_mul,
        "fq_tensor_div": fq_tensor_div,
        "fq_tensor_levels": fq_tensor_levels,
        "fq_axis_mul": fq_axis_mul,
        "fq_axis_levels": fq_axis_levels,
        "ql_axis_levels": ql_axis_levels,
        "fq_grad_reduce": fq_grad_reduce,
    }


def _qdq_kernels(S):
    """Quantize-dequantize kernels for one float dtype (``S``: that dtype's scalar math)."""
    qdq_clamped = S.qdq_clamped
    qdq_free = S.qdq_free
    qdq_masked = S.qdq_masked
    qdq_scale = S.qdq_scale

    @cuda.jit
    def qdq_tensor(x, out, lo, hi, scale, inv, clamp, half_up, half):
        i = np.int64(cuda.grid(1))
        stride = cuda.gridsize(1)
        if clamp:
            while i < x.size:
                out[i] = qdq_clamped(x[i], lo, hi, scale, inv, half_up, half)
                i += stride
        else:
            while i < x.size:
                out[i] = qdq_free(x[i], scale, inv, half_up, half)
                i += stride

    @cuda.jit
    def qdq_axis(x, out, depth, inner, dc, dj, lo, hi, scale, inv, clamp, half_up, half):
        i = np.int64(cuda.grid(1))
        stride = cuda.gridsize(1)
        c = (i // inner) % depth
        j = i % inner
        while i < x.size:
            if clamp:
                out[i] = qdq_clamped(x[i], lo[c], hi[c], scale[c], inv[c], half_up, half)
            else:
                out[i] = qdq_free(x[i], scale[c], inv[c], half_up, half)
            i += stride
            j, c = _next_channel(j, c, dj, dc, inner, depth)

    @cuda.jit
    def qdq_tensor_grad(g, x, out, lo, hi, one, zero):
        i = np.int64(cuda.grid(1))
        stride = cuda.gridsize(1)
        while i < x.size:
            out[i] = qdq_masked(g[i], x[i], lo, hi, one, zero)
            i += stride

    @cuda.jit
    def qdq_axis_grad(g, x, out, depth, inner, dc, dj, lo, hi, one, zero):
        i = np.int64(cuda.grid(1))
        stride = cuda.gridsize(1)
        c = (i // inner) % depth
        j = i % inner
        while i < x.size:
            out[i] = qdq_masked(g[i], x[i], lo[c], hi[c], one, zero)
            i += stride
            j, c = _next_channel(j, c, dj, dc, inner, depth)

    @cuda.jit
    def qdq_params_from_minmax(x, acc_lo, acc_hi, zidx, mins, maxs, scale, inv, lo, hi, min_q, max_q, big, zero):
        """Range (``range_given=False``) and scale of every slice, on the device.

        Finishes ``minmax_reduce`` (a zero min/max takes the sign of the
        slice's last zero, as on the CPU), gives an empty or all-NaN slice
        the range [0, 0] and runs the shared scale choice.
        """
        c = cuda.grid(1)
        stride = cuda.gridsize(1)
        while c < mins.size:
            mins[c], maxs[c] = _reduced_range(x, acc_lo, acc_hi, zidx, c)
            mn = mins[c]  # the tensor's dtype from here on
            mx = maxs[c]
            if mn > mx:
                mn = zero
                mx = zero
            scale[c], inv[c], lo[c], hi[c] = qdq_scale(mn, mx, min_q, max_q, big)
            c += stride

    return {
        "qdq_tensor": qdq_tensor,
        "qdq_axis": qdq_axis,
        "qdq_tensor_grad": qdq_tensor_grad,
        "qdq_axis_grad": qdq_axis_grad,
        "qdq_params_from_minmax": qdq_params_from_minmax,
    }


@cuda.jit
def minmax_reduce(x, acc_lo, acc_hi, zidx, cols, cols2, inner, depth):
    """Per-channel min/max ignoring NaN (float64 accumulators), and the flat index of each channel's last zero.

    The column scheme of ``fq_grad_reduce``; min, max and last zero combine
    across blocks with atomics, so the order of the combination does not
    matter: equal values are equal, except for the sign of zero. Where -0.0
    and 0.0 tie, the CPU kernels keep the last in memory order (TensorFlow's
    scalar reduction); a min or max of zero is such a tie, so the finishing
    kernels take its sign from the channel's last zero.
    """
    sh_lo = cuda.shared.array(RED_THREADS, float64)
    sh_hi = cuda.shared.array(RED_THREADS, float64)
    sh_z = cuda.shared.array(RED_THREADS, int64)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    bx = cuda.blockDim.x
    by = cuda.blockDim.y
    n = x.size
    q0 = np.int64(cuda.blockIdx.x) * bx
    q = q0 + tx
    lo = np.inf
    hi = -np.inf
    z = np.int64(-1)
    if q < cols2:
        i = (np.int64(cuda.blockIdx.y) * by + ty) * cols2 + q
        step = np.int64(cuda.gridDim.y) * by * cols2
        while i + 3 * step < n:  # four loads in flight per thread: a reduction is bound by memory latency
            v0 = x[i]
            v1 = x[i + step]
            v2 = x[i + 2 * step]
            v3 = x[i + 3 * step]
            lo, hi, z = _minmax_take(v0, i, lo, hi, z)
            lo, hi, z = _minmax_take(v1, i + step, lo, hi, z)
            lo, hi, z = _minmax_take(v2, i + 2 * step, lo, hi, z)
            lo, hi, z = _minmax_take(v3, i + 3 * step, lo, hi, z)
            i += 4 * step
        while i < n:
            lo, hi, z = _minmax_take(x[i], i, lo, hi, z)
            i += step
    k = ty * bx + tx
    sh_lo[k] = lo
    sh_hi[k] = hi
    sh_z[k] = z
    cuda.syncthreads()
    s = by // 2
    while s > 0:
        if ty < s:
            sh_lo[k] = min(sh_lo[k], sh_lo[k + s * bx])
            sh_hi[k] = max(sh_hi[k], sh_hi[k + s * bx])
            sh_z[k] = max(sh_z[k], sh_z[k + s * bx])
        cuda.syncthreads()
        s //= 2
    q_last = min(q0 + bx, cols2) - 1
    if q0 // inner == q_last // inner:
        s = bx // 2
        while s > 0:
            if ty == 0 and tx < s:
                sh_lo[tx] = min(sh_lo[tx], sh_lo[tx + s])
                sh_hi[tx] = max(sh_hi[tx], sh_hi[tx + s])
                sh_z[tx] = max(sh_z[tx], sh_z[tx + s])
            cuda.syncthreads()
            s //= 2
        if ty == 0 and tx == 0:
            c0 = (q0 // inner) % depth
            if sh_lo[0] <= sh_hi[0]:  # the block saw a number of this channel
                cuda.atomic.min(acc_lo, c0, sh_lo[0])
                cuda.atomic.max(acc_hi, c0, sh_hi[0])
                if sh_z[0] >= 0:
                    cuda.atomic.max(zidx, c0, sh_z[0])
    elif ty == 0 and q < cols2:
        c1 = (q // inner) % depth
        if sh_lo[tx] <= sh_hi[tx]:
            cuda.atomic.min(acc_lo, c1, sh_lo[tx])
            cuda.atomic.max(acc_hi, c1, sh_hi[tx])
            if sh_z[tx] >= 0:
                cuda.atomic.max(zidx, c1, sh_z[tx])


@cuda.jit
def minmax_fix(x, acc_lo, acc_hi, zidx, lo, hi):
    """Per-channel results of ``minmax_reduce`` into ``lo``/``hi`` (a zero takes the sign of the last zero)."""
    c = cuda.grid(1)
    stride = cuda.gridsize(1)
    while c < lo.size:
        lo[c], hi[c] = _reduced_range(x, acc_lo, acc_hi, zidx, c)
        c += stride


@cuda.jit
def minmax_fix_scalar(x, acc_lo, acc_hi, zidx, lo, hi):
    """``minmax_fix`` of a single channel into 0-d arrays."""
    if cuda.grid(1) == 0:
        lo[()], hi[()] = _reduced_range(x, acc_lo, acc_hi, zidx, 0)


@cuda.jit
def sums_to_f32(acc_min, acc_max, dmin, dmax):
    """float64 gradient sums into float32 arrays (one value per channel)."""
    c = cuda.grid(1)
    stride = cuda.gridsize(1)
    while c < dmin.size:
        dmin[c] = acc_min[c]
        dmax[c] = acc_max[c]
        c += stride


@cuda.jit
def sums_to_f32_scalar(acc_min, acc_max, dmin, dmax):
    """float64 gradient sums into float32 0-d arrays."""
    if cuda.grid(1) == 0:
        dmin[()] = acc_min[0]
        dmax[()] = acc_max[0]


@cuda.jit
def fill(out, value):
    i = np.int64(cuda.grid(1))
    stride = cuda.gridsize(1)
    while i < out.size:
        out[i] = value
        i += stride


@cuda.jit
def init_minmax(acc_lo, acc_hi, zidx):
    c = cuda.grid(1)
    stride = cuda.gridsize(1)
    while c < acc_lo.size:
        acc_lo[c] = np.inf
        acc_hi[c] = -np.inf
        zidx[c] = -1
        c += stride


@cuda.jit
def zero_f64(a, b):
    c = cuda.grid(1)
    stride = cuda.gridsize(1)
    while c < a.size:
        a[c] = 0.0
        b[c] = 0.0
        c += stride


_FQ = _fq_kernels(S32, _P32)
_QDQ = {np.dtype(np.float32): _qdq_kernels(S32), np.dtype(np.float64): _qdq_kernels(S64)}


def kernels():
    """Every CUDA kernel as ``(name, dispatcher)``; the quantize-dequantize ones once per dtype, suffixed."""
    out = list(_FQ.items())
    for dt, ks in _QDQ.items():
        out += [(f"{name}_{dt.name}", k) for name, k in ks.items()]
    out += [
        ("minmax_reduce", minmax_reduce),
        ("minmax_fix", minmax_fix),
        ("minmax_fix_scalar", minmax_fix_scalar),
        ("sums_to_f32", sums_to_f32),
        ("sums_to_f32_scalar", sums_to_f32_scalar),
        ("fill", fill),
        ("init_minmax", init_minmax),
        ("zero_f64", zero_f64),
    ]
    return out


# --- device arrays -------------------------------------------------------------------------------
def available() -> tuple[bool, str]:
    """Whether kernels can run, and if not why."""
    try:
        if cuda.is_available():
            return True, ""
    except Exception as exc:  # noqa: BLE001 - a broken driver is "not available" with its reason
        return False, str(exc)
    reason = ""
    try:
        reason = cuda.cuda_error() or ""
    except Exception:  # noqa: BLE001
        pass
    return False, " ".join(str(reason).split()) or "numba.cuda.is_available() is False"


def is_device_array(obj) -> bool:
    """A numba device array (or the simulator's), or any object with ``__cuda_array_interface__``."""
    return getattr(obj, "__cuda_ndarray__", False) is True or hasattr(obj, "__cuda_array_interface__")


if SIM:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray as _FakeCUDAArray

    class _InterfaceView:
        """In the simulator, device memory is host memory: read a CUDA array interface as an array interface."""

        def __init__(self, desc, owner):
            self.__array_interface__ = {
                "shape": tuple(desc["shape"]),
                "typestr": desc["typestr"],
                "data": tuple(desc["data"]),
                "strides": desc.get("strides"),
                "version": 3,
            }
            self._owner = owner

    def _from_interface(obj):
        desc = obj.__cuda_array_interface__
        if desc.get("mask") is not None:
            raise ValueError("masked CUDA arrays are not supported")
        return _FakeCUDAArray(np.asarray(_InterfaceView(desc, obj)))

else:

    def _from_interface(obj):
        return cuda.as_cuda_array(obj)


def as_device_array(obj):
    """A numba device array viewing ``obj`` (a numba device array, or an object with ``__cuda_array_interface__``); no copy."""
    if getattr(obj, "__cuda_ndarray__", False) is True:
        return obj
    return _from_interface(obj)


def is_read_only(obj) -> bool:
    desc = getattr(obj, "__cuda_array_interface__", None)
    return bool(desc is not None and desc["data"][1])


def contiguous(a):
    """``a`` when it is C-contiguous, else a C-contiguous copy made on the device."""
    if a.is_c_contiguous():
        return a
    res = cuda.device_array(a.shape, a.dtype)
    copy_into(res, a)
    return res


def copy_into(dst, src):
    """Device-to-device copy of ``src`` into the (possibly strided) device array ``dst`` of the same shape."""
    if dst.size == 0:
        return
    if dst.ndim == 0:
        dst[()] = src
    else:
        dst[:] = src  # numba's assignment kernel: any strides, no trip through the host


def to_device(a: np.ndarray):
    return cuda.to_device(a)


def to_host(obj) -> np.ndarray:
    return as_device_array(obj).copy_to_host()


def empty(shape, dtype):
    return cuda.device_array(tuple(int(s) for s in shape), np.dtype(dtype))


def _dev(a, dtype):
    """Per-channel parameters on the device (a host array is copied: a handful of values)."""
    if isinstance(a, np.ndarray):
        return cuda.to_device(np.ascontiguousarray(a, dtype=dtype))
    return a


def _small_grid(d: int) -> int:
    return max(1, min((d + TPB - 1) // TPB, _max_blocks()))


_small_launches: dict = {}


def _launch(kernel, grid, block):
    """``kernel[grid, block]``, without numba's low-occupancy warning for grids under 128 blocks.

    Small tensors (and the one-thread finishing kernels) legitimately launch
    small grids; numba would warn on every such call. The configured launch
    is cached per shape (at most a few hundred), so the warning filter is
    touched only the first time.
    """
    if SIM:  # the simulator configures the kernel object itself: nothing to cache, no warning
        return kernel[grid, block]
    g = grid if isinstance(grid, tuple) else (grid,)
    if math.prod(g) >= 128:
        return kernel[grid, block]
    key = (id(kernel), grid, block)
    cfg = _small_launches.get(key)
    if cfg is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NumbaPerformanceWarning)
            cfg = kernel[grid, block]
        _small_launches[key] = cfg
    return cfg


# --- launchers: ``cpu``'s names and arguments --------------------------------------------------------
def fq_tensor_mul(x, out, nmin, nmax, scale, inv_scale, quant_zero):
    if x.size:
        _launch(_FQ["fq_tensor_mul"], _grid(x.size), TPB)(x, out, nmin, nmax, scale, inv_scale, quant_zero)


def fq_tensor_div(x, out, nmin, nmax, scale, quant_zero):
    if x.size:
        _launch(_FQ["fq_tensor_div"], _grid(x.size), TPB)(x, out, nmin, nmax, scale, quant_zero)


def fq_tensor_levels(x, out, nmin, nmax, scale, quant_zero, zp):
    if x.size:
        _launch(_FQ["fq_tensor_levels"], _grid(x.size), TPB)(x, out, nmin, nmax, scale, quant_zero, zp)


def fq_tensor_grad(g, x, out, lo, hi):
    """d_inputs into ``out``; returns (d_min, d_max) as float32 0-d device arrays."""
    lo_a = cuda.to_device(np.array([lo], np.float32))
    hi_a = cuda.to_device(np.array([hi], np.float32))
    acc_min, acc_max = _grad_sums(g, x, out, lo_a, hi_a, 1, 1)
    dmin = empty((), np.float32)
    dmax = empty((), np.float32)
    _launch(sums_to_f32_scalar, 1, 1)(acc_min, acc_max, dmin, dmax)
    return dmin, dmax


def fq_axis_mul(x, out, depth, inner, nmin, nmax, scale, inv_scale, quant_zero):
    if x.size:
        blocks, dc, dj = _axis_steps(x.size, depth, inner)
        f = np.float32
        _launch(_FQ["fq_axis_mul"], blocks, TPB)(
            x, out, depth, inner, dc, dj, _dev(nmin, f), _dev(nmax, f), _dev(scale, f), _dev(inv_scale, f), _dev(quant_zero, f)
        )


def fq_axis_levels(x, out, depth, inner, nmin, nmax, inv_scale, quant_zero, zp):
    if x.size:
        blocks, dc, dj = _axis_steps(x.size, depth, inner)
        f = np.float32
        _launch(_FQ["fq_axis_levels"], blocks, TPB)(
            x, out, depth, inner, dc, dj, _dev(nmin, f), _dev(nmax, f), _dev(inv_scale, f), _dev(quant_zero, f), _dev(zp, f)
        )


def ql_axis_levels(x, out, depth, inner, scale, lo, hi, zp):
    if x.size:
        blocks, dc, dj = _axis_steps(x.size, depth, inner)
        f = np.float32
        _launch(_FQ["ql_axis_levels"], blocks, TPB)(
            x, out, depth, inner, dc, dj, _dev(scale, f), _dev(lo, f), _dev(hi, f), _dev(zp, f)
        )


def fq_axis_grad(g, x, out, depth, inner, lo, hi):
    """Per-channel d_inputs into ``out``; returns (d_min, d_max) as float32 device arrays of length ``depth``."""
    acc_min, acc_max = _grad_sums(g, x, out, _dev(lo, np.float32), _dev(hi, np.float32), depth, inner)
    dmin = empty((depth,), np.float32)
    dmax = empty((depth,), np.float32)
    if depth:
        _launch(sums_to_f32, _small_grid(depth), TPB)(acc_min, acc_max, dmin, dmax)
    return dmin, dmax


def _grad_sums(g, x, out, lo, hi, depth, inner):
    acc_min = empty((depth,), np.float64)
    acc_max = empty((depth,), np.float64)
    if depth:
        _launch(zero_f64, _small_grid(depth), TPB)(acc_min, acc_max)
    if x.size:
        grid, block, cols2 = _reduce_config(x.size, depth * inner)
        _launch(_FQ["fq_grad_reduce"], grid, block)(g, x, out, lo, hi, acc_min, acc_max, depth * inner, cols2, inner, depth)
    return acc_min, acc_max


def qdq_tensor(x, out, lo, hi, scale, inv, clamp, half_up, half):
    if x.size:
        _launch(_QDQ[x.dtype]["qdq_tensor"], _grid(x.size), TPB)(x, out, lo, hi, scale, inv, clamp, half_up, half)


def qdq_axis(x, out, depth, inner, lo, hi, scale, inv, clamp, half_up, half):
    if x.size:
        blocks, dc, dj = _axis_steps(x.size, depth, inner)
        t = x.dtype
        _launch(_QDQ[t]["qdq_axis"], blocks, TPB)(
            x, out, depth, inner, dc, dj, _dev(lo, t), _dev(hi, t), _dev(scale, t), _dev(inv, t), clamp, half_up, half
        )


def qdq_tensor_grad(g, x, out, lo, hi, one, zero):
    if x.size:
        _launch(_QDQ[x.dtype]["qdq_tensor_grad"], _grid(x.size), TPB)(g, x, out, lo, hi, one, zero)


def qdq_axis_grad(g, x, out, depth, inner, lo, hi, one, zero):
    if x.size:
        blocks, dc, dj = _axis_steps(x.size, depth, inner)
        t = x.dtype
        _launch(_QDQ[t]["qdq_axis_grad"], blocks, TPB)(g, x, out, depth, inner, dc, dj, _dev(lo, t), _dev(hi, t), one, zero)


def qdq_params_from_minmax(x, depth, inner, min_q, max_q, big):
    """Per-slice ``(scale, inverse_scale, lo, hi)`` from the data's own min/max (``range_given=False``), on the device.

    Device arrays of length ``depth`` in ``x``'s dtype, ready for ``qdq_axis``.
    """
    t = x.dtype
    acc_lo, acc_hi, zidx = _minmax_acc(x, depth, inner)
    mins, maxs, scale, inv, lo, hi = (empty((depth,), t) for _ in range(6))
    if x.size and depth:
        _launch(_QDQ[t]["qdq_params_from_minmax"], _small_grid(depth), TPB)(
            x, acc_lo, acc_hi, zidx, mins, maxs, scale, inv, lo, hi, min_q, max_q, big, t.type(0)
        )
    return scale, inv, lo, hi


def _minmax_acc(x, depth, inner):
    acc_lo = empty((depth,), np.float64)
    acc_hi = empty((depth,), np.float64)
    zidx = empty((depth,), np.int64)
    if depth:
        _launch(init_minmax, _small_grid(depth), TPB)(acc_lo, acc_hi, zidx)
    if x.size:
        grid, block, cols2 = _reduce_config(x.size, depth * inner)
        _launch(minmax_reduce, grid, block)(x, acc_lo, acc_hi, zidx, depth * inner, cols2, inner, depth)
    return acc_lo, acc_hi, zidx


def minmax_tensor(x, dtype=None):
    """(min, max) of a flat device array ignoring NaN, as 0-d device arrays of ``dtype`` (default ``x.dtype``).

    (inf, -inf) when there is no number. The CPU kernel returns two scalars.
    """
    dtype = x.dtype if dtype is None else np.dtype(dtype)
    acc_lo, acc_hi, zidx = _minmax_acc(x, 1, 1)
    lo = empty((), dtype)
    hi = empty((), dtype)
    if x.size == 0:
        x = empty((1,), x.dtype)  # never read: there is no zero
    _launch(minmax_fix_scalar, 1, 1)(x, acc_lo, acc_hi, zidx, lo, hi)
    return lo, hi


def minmax_axis(x, depth, inner, dtype=None):
    """Per-slice (min, max) along the middle axis of [outer, depth, inner] ignoring NaN, as device arrays."""
    dtype = x.dtype if dtype is None else np.dtype(dtype)
    acc_lo, acc_hi, zidx = _minmax_acc(x, depth, inner)
    lo = empty((depth,), dtype)
    hi = empty((depth,), dtype)
    if depth:
        if x.size == 0:
            x = empty((1,), x.dtype)
        _launch(minmax_fix, _small_grid(depth), TPB)(x, acc_lo, acc_hi, zidx, lo, hi)
    return lo, hi


def fill_int32(out, value):
    """``out[:] = value`` for a flat int32 device array."""
    if out.size:
        _launch(fill, _grid(out.size), TPB)(out, np.int32(value))


F32_HALF = _scalar.F32_HALF
