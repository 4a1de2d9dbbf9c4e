"""Public kernel API with TensorFlow's names, argument names and defaults.

Validation, dtype and layout handling live here; the arithmetic lives in
``_scalar`` and runs in the jitted kernels of ``cpu`` (and ``cuda``).

Conventions:
- numpy arrays in, numpy arrays out: a new C-contiguous array, or ``out=``
  (same shape and dtype as the result) when given.
- GPU arrays in, GPU arrays out: numba device arrays and any object with
  ``__cuda_array_interface__`` (CuPy arrays, PyTorch CUDA tensors) run the
  CUDA kernels of ``cuda`` (bit-identical to the CPU kernels) and give numba
  device arrays, or write ``out=`` (a GPU array); nothing is copied to the
  host but a handful of parameters. The keyword ``device="cpu" | "cuda"``
  chooses explicitly (default ``None``: where the tensors live); tensors on
  the other side are then copied, and results stay where the kernel ran.
  GPU results that TF returns as scalars (``d_min``/``d_max`` of the vars
  gradient, ``minmax`` without axis) are 0-d device arrays. CUDA needs the
  ``cuda`` extra (``pip install 'qtool[cuda]'``) and a GPU; asking for it
  without them raises ``CudaUnavailableError`` (a ``RuntimeError``).
- Errors are ``ValueError`` with TensorFlow's message where TensorFlow has
  one; qtool also rejects inputs on which TensorFlow silently returns garbage.
- NaN inputs propagate to the outputs (the gradients mask them out); +-inf
  clamp to the range ends.
"""

from __future__ import annotations

import operator

import numpy as np

from qtool.errors import QtoolError
from qtool.kernels import cpu

__all__ = [
    "fake_quant_with_min_max_args",
    "fake_quant_with_min_max_args_gradient",
    "fake_quant_with_min_max_vars",
    "fake_quant_with_min_max_vars_gradient",
    "fake_quant_with_min_max_vars_per_channel",
    "fake_quant_with_min_max_vars_per_channel_gradient",
    "quantize_and_dequantize_v2",
    "quantize_and_dequantize_v2_gradient",
    "nudged_range",
    "quantize_codes",
    "minmax",
]


# --- devices ----------------------------------------------------------------------
class CudaUnavailableError(QtoolError, RuntimeError):
    """CUDA was asked for (``device="cuda"`` or GPU arrays) but cannot run here."""


_cuda_module = None


def _is_device_array(obj) -> bool:
    """A numba device array or any object with ``__cuda_array_interface__`` (CuPy, PyTorch CUDA tensors)."""
    if getattr(obj, "__cuda_ndarray__", False) is True:
        return True
    try:
        return hasattr(obj, "__cuda_array_interface__")
    except Exception:  # noqa: BLE001 - GPU data that refuses to export itself (a PyTorch tensor that
        return True  # requires grad): the CUDA path reports the library's own message


def _load_cuda():
    """``qtool.kernels.cuda``, imported on the first CUDA request only."""
    global _cuda_module
    if _cuda_module is None:
        try:
            from qtool.kernels import cuda as cu  # noqa: PLC0415
        except ImportError as exc:
            msg = str(exc) if "qtool[cuda]" in str(exc) else f"qtool's CUDA kernels could not be loaded: {exc}"
            raise CudaUnavailableError(msg) from None
        _cuda_module = cu
    return _cuda_module


def _param(v):
    """Range arguments (min/max) on the host: a GPU array is copied (a handful of values)."""
    return _load_cuda().to_host(v) if _is_device_array(v) else v


class _SizedKernels:
    """The CPU kernels, each run on one thread below ``cpu.PARALLEL_MIN`` values of its first array
    (``cpu.sized``: the same results either way)."""

    def __getattr__(self, name):
        kernel = getattr(cpu, name)
        if name not in cpu.SERIAL:
            return kernel
        return lambda x, *args: cpu.sized(name, x.size)(x, *args)


class _HostBackend:
    """numpy arrays and the CPU kernels (qtool's behaviour without CUDA)."""

    is_cuda = False
    kernels = _SizedKernels()

    @staticmethod
    def float32_tensor(x, name):
        return _float32_tensor(_param(x), name)

    @staticmethod
    def qdq_tensor(x, name):
        return _qdq_tensor(_param(x), name)

    @staticmethod
    def output(out, shape, dtype):
        return _output(out, shape, dtype)

    @staticmethod
    def finish(res, out):
        return _finish(res, out)

    @staticmethod
    def flat(a):
        return a.reshape(-1)

    @staticmethod
    def fill(a, value):
        a.fill(value)

    @staticmethod
    def copy(dst, src):
        np.copyto(dst, src)


class _CudaBackend:
    """Device arrays and the CUDA kernels. One instance per call (it remembers the ``out`` view)."""

    is_cuda = True

    def __init__(self, cu):
        self.kernels = cu
        self._out_view = None

    def _device(self, x, name, dtypes, message):
        cu = self.kernels
        d = cu.as_device_array(x)
        if d.dtype not in dtypes:
            raise ValueError(message.format(name=name, dtype=d.dtype))
        return cu.contiguous(d)

    def float32_tensor(self, x, name):
        if not _is_device_array(x):  # device="cuda" with host data: an explicit copy
            return self.kernels.to_device(_float32_tensor(x, name))
        return self._device(x, name, (np.float32,), "{name} must be float32, got {dtype} (cast it with .astype(np.float32))")

    def qdq_tensor(self, x, name):
        if not _is_device_array(x):
            return self.kernels.to_device(_qdq_tensor(x, name))
        return self._device(x, name, (np.float32, np.float64), "{name} must be float32 or float64, got {dtype}")

    def output(self, out, shape, dtype):
        cu = self.kernels
        if out is None:
            return cu.empty(shape, dtype)
        if not _is_device_array(out):
            raise ValueError(
                "out must be a GPU array (a numba device array or an object with __cuda_array_interface__) "
                f"when the kernel runs on CUDA, got {type(out).__name__}"
            )
        d = cu.as_device_array(out)
        if tuple(d.shape) != tuple(shape) or d.dtype != dtype:
            raise ValueError(f"out must have shape {tuple(shape)} and dtype {np.dtype(dtype)}, got {tuple(d.shape)} and {d.dtype}")
        if cu.is_read_only(out):
            raise ValueError("out is read-only")
        self._out_view = d
        if d.is_c_contiguous():
            return d
        return cu.empty(shape, dtype)

    def finish(self, res, out):
        if out is None:
            return res
        if res is not self._out_view:  # a strided out: device-to-device copy into it
            self.kernels.copy_into(self._out_view, res)
        return out

    @staticmethod
    def flat(a):
        return a.ravel()

    def fill(self, a, value):
        self.kernels.fill_int32(a.ravel(), value)

    def copy(self, dst, src):
        self.kernels.copy_into(dst, src)


_HOST = _HostBackend()


_cuda_ready = False


def _cuda_backend() -> _CudaBackend:
    global _cuda_ready
    cu = _load_cuda()
    if not _cuda_ready:  # checked until it succeeds once (a GPU does not go away)
        ok, why = cu.available()
        if not ok:
            raise CudaUnavailableError(f"CUDA was requested but no CUDA GPU is available: {why}")
        _cuda_ready = True
    return _CudaBackend(cu)


def _backend(device, **tensors):
    """The backend for a call: ``device`` if given, else where the tensors live (all on one side)."""
    if device is None:
        where = {name: _is_device_array(t) for name, t in tensors.items()}
        if not any(where.values()):
            return _HOST
        if not all(where.values()):
            gpu = [n for n, d in where.items() if d]
            host = [n for n, d in where.items() if not d]
            raise ValueError(
                f"{' and '.join(gpu)} {'is' if len(gpu) == 1 else 'are'} on the GPU but {' and '.join(host)} on the host: "
                "pass all tensors on one device, or device='cuda' / device='cpu' to copy explicitly"
            )
        return _cuda_backend()
    if isinstance(device, str) and device == "cpu":
        return _HOST
    if isinstance(device, str) and device == "cuda":
        return _cuda_backend()
    raise ValueError(f"device must be 'cpu', 'cuda' or None (where the data lives), got {device!r}")


# --- argument helpers -------------------------------------------------------------
def _contiguous(a: np.ndarray) -> np.ndarray:
    """C-contiguous with the same shape (np.ascontiguousarray turns 0-d into 1-d)."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)


def _float32_tensor(x, name: str) -> np.ndarray:
    """A C-contiguous float32 array. Non-arrays convert (as TF converts lists); arrays must be float32."""
    if isinstance(x, np.ndarray):
        if x.dtype != np.float32:
            raise ValueError(f"{name} must be float32, got {x.dtype} (cast it with .astype(np.float32))")
    else:
        try:
            x = np.asarray(x, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be a float32 array: {exc}") from None
    return _contiguous(x)


def _same_shape(a: np.ndarray, b: np.ndarray, a_name: str, b_name: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{a_name} and {b_name} must have the same shape: {a_name} has {a.shape}, {b_name} has {b.shape}")


def _num_bits_fq(num_bits) -> int:
    try:
        nb = operator.index(num_bits)
    except TypeError:
        raise ValueError(f"num_bits must be an integer, got {num_bits!r}") from None
    if isinstance(num_bits, bool) or not 2 <= nb <= 16:
        raise ValueError(f"num_bits must be between 2 and 16, inclusive (got {num_bits!r})")
    return nb


def _grid(num_bits: int, narrow_range: bool) -> tuple[np.float32, np.float32]:
    return np.float32(1 if narrow_range else 0), np.float32((1 << num_bits) - 1)


def _scalar_f32(v, name: str) -> np.float32:
    a = np.asarray(_param(v))
    if a.size != 1:
        raise ValueError(f"{name} must be a scalar, got shape {a.shape}")
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{name} must be a real number, got dtype {a.dtype}")
    return np.float32(a.reshape(()))


def _channel_f32(v, name: str, depth: int) -> np.ndarray:
    a = np.asarray(_param(v))
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{name} must be a real array, got dtype {a.dtype}")
    if a.shape != (depth,):
        raise ValueError(f"{name} must have shape ({depth},) (one value per channel of the last axis), got {a.shape}")
    return np.ascontiguousarray(a, dtype=np.float32)


def _check_range_values(mins: np.ndarray, maxs: np.ndarray, allow_zero: bool) -> np.ndarray:
    """Validate per-channel ranges; returns the mask of channels with min == max == 0."""
    if not (np.all(np.isfinite(mins)) and np.all(np.isfinite(maxs))):
        raise ValueError(f"min and max must be finite, got min={_show(mins)}, max={_show(maxs)}")
    zero = (mins == 0) & (maxs == 0) if allow_zero else np.zeros(mins.shape, bool)
    bad = (mins >= maxs) & ~zero
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        where = f" (channel {i})" if mins.size > 1 else ""
        raise ValueError(f"min has to be smaller than max, got min={mins.flat[i]!r} and max={maxs.flat[i]!r}{where}")
    return zero


def _show(a: np.ndarray):
    return a.item() if a.size == 1 else a


def _output(out, shape, dtype, name="out") -> np.ndarray:
    """The array a kernel writes into: ``out`` itself when it is contiguous, else a new array."""
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(out).__name__}")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"{name} must have shape {tuple(shape)} and dtype {np.dtype(dtype)}, got {out.shape} and {out.dtype}")
    if not out.flags.writeable:
        raise ValueError(f"{name} is read-only")
    if out.flags.c_contiguous:
        return out
    return np.empty(shape, dtype)


def _finish(result: np.ndarray, out):
    if out is not None and result is not out:
        out[...] = result
        return out
    return result


F32_TINY = np.float32(np.finfo(np.float32).tiny)  # the smallest normal float32


def _nudge_arrays(mins: np.ndarray, maxs: np.ndarray, num_bits: int, narrow_range: bool, zero: np.ndarray):
    qminf, qmaxf = _grid(num_bits, narrow_range)
    nmin, nmax, scale, inv, zp, qz = cpu.nudge_params(mins, maxs, qminf, qmaxf)
    # A range so small that the scale is not a normal float32 (max - min < (qmax - qmin) * FLT_MIN:
    # inv_scale overflows to inf, or a runtime that flushes denormals sees a zero scale) has no
    # defined TF result (NaN). It is treated like min == max == 0, here and in the training graph's
    # FakeQuant function. ``zero`` is updated in place: callers read it after this call.
    zero |= scale < F32_TINY
    if np.any(zero):
        # min == max == 0: the output is all zeros and the gradient passes through.
        for arr in (nmin, nmax, scale, inv, qz):
            arr[zero] = 0.0
        zp[zero] = qminf
    lo = np.where(zero, np.float32(-np.inf), nmin).astype(np.float32)
    hi = np.where(zero, np.float32(np.inf), nmax).astype(np.float32)
    return nmin, nmax, scale, inv, zp, qz, lo, hi


def _axis_layout(shape, axis: int):
    depth = shape[axis]
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    return depth, inner


# --- FakeQuant ----------------------------------------------------------------------
def nudged_range(min, max, num_bits=8, narrow_range=False):
    """TensorFlow's nudged quantization range (spec 1.1), per tensor or per channel.

    ``min``/``max`` are scalars or 1-D arrays. Returns ``(nudged_min, nudged_max,
    scale, zero_point)``: float32 values and an int64 zero point on TF's unsigned
    grid ``[narrow_range, 2**num_bits - 1]`` (the nudged range is
    ``(grid - zero_point) * scale``). Scalars in give scalars out.
    """
    nb = _num_bits_fq(num_bits)
    min, max = _param(min), _param(max)  # GPU arrays: copied, the result is parameters on the host
    scalar = np.ndim(min) == 0 and np.ndim(max) == 0
    mins = np.atleast_1d(np.asarray(min, dtype=np.float32)).ravel()
    maxs = np.atleast_1d(np.asarray(max, dtype=np.float32)).ravel()
    if mins.shape != maxs.shape:
        raise ValueError(f"min and max must have the same shape, got {np.shape(min)} and {np.shape(max)}")
    zero = _check_range_values(mins, maxs, allow_zero=True)
    nmin, nmax, scale, _, zp, _, _, _ = _nudge_arrays(mins, maxs, nb, bool(narrow_range), zero)
    zp = zp.astype(np.int64)
    if scalar:
        return nmin[0], nmax[0], scale[0], zp[0]
    return nmin, nmax, scale, zp


def fake_quant_with_min_max_args(inputs, min=-6.0, max=6.0, num_bits=8, narrow_range=False, *, out=None, device=None):
    """``tf.quantization.fake_quant_with_min_max_args``."""
    be = _backend(device, inputs=inputs)
    x = be.float32_tensor(inputs, "inputs")
    nb = _num_bits_fq(num_bits)
    lo_, hi_ = np.float32(min), np.float32(max)
    if not lo_ < hi_:
        raise ValueError(f"min has to be smaller than max, was: {float(min)} >= {float(max)}")
    _check_range_values(np.array([lo_]), np.array([hi_]), allow_zero=False)
    nmin, nmax, scale, inv, _, qz, _, _ = _nudge_arrays(np.array([lo_]), np.array([hi_]), nb, bool(narrow_range), np.zeros(1, bool))
    res = be.output(out, x.shape, np.float32)
    be.kernels.fq_tensor_mul(be.flat(x), be.flat(res), nmin[0], nmax[0], scale[0], inv[0], qz[0])
    return be.finish(res, out)


def fake_quant_with_min_max_args_gradient(
    gradients, inputs, min=-6.0, max=6.0, num_bits=8, narrow_range=False, *, out=None, device=None
):
    """``tf.quantization.fake_quant_with_min_max_args_gradient``: the d_inputs array."""
    be = _backend(device, gradients=gradients, inputs=inputs)
    g = be.float32_tensor(gradients, "gradients")
    x = be.float32_tensor(inputs, "inputs")
    _same_shape(g, x, "gradients", "inputs")
    nb = _num_bits_fq(num_bits)
    lo_, hi_ = np.float32(min), np.float32(max)
    if not lo_ < hi_:
        raise ValueError(f"min has to be smaller than max, was: {float(min)} >= {float(max)}")
    _check_range_values(np.array([lo_]), np.array([hi_]), allow_zero=False)
    _, _, _, _, _, _, lo, hi = _nudge_arrays(np.array([lo_]), np.array([hi_]), nb, bool(narrow_range), np.zeros(1, bool))
    res = be.output(out, x.shape, np.float32)
    # g * float(lo <= x <= hi): the same arithmetic as the quantize-dequantize gradient, no sums
    be.kernels.qdq_tensor_grad(be.flat(g), be.flat(x), be.flat(res), lo[0], hi[0], np.float32(1), np.float32(0))
    return be.finish(res, out)


def _vars_params(min, max, num_bits, narrow_range):
    nb = _num_bits_fq(num_bits)
    mins = np.array([_scalar_f32(min, "min")])
    maxs = np.array([_scalar_f32(max, "max")])
    zero = _check_range_values(mins, maxs, allow_zero=True)
    return _nudge_arrays(mins, maxs, nb, bool(narrow_range), zero), bool(zero[0])


def fake_quant_with_min_max_vars(inputs, min, max, num_bits=8, narrow_range=False, *, out=None, device=None):
    """``tf.quantization.fake_quant_with_min_max_vars`` (scalar ``min``/``max``)."""
    be = _backend(device, inputs=inputs)
    x = be.float32_tensor(inputs, "inputs")
    (nmin, nmax, scale, inv, _, qz, _, _), zero = _vars_params(min, max, num_bits, narrow_range)
    res = be.output(out, x.shape, np.float32)
    if zero:  # min == max == 0: zeros (the divide variant would compute 0/0)
        be.kernels.fq_tensor_mul(be.flat(x), be.flat(res), nmin[0], nmax[0], scale[0], inv[0], qz[0])
    else:
        be.kernels.fq_tensor_div(be.flat(x), be.flat(res), nmin[0], nmax[0], scale[0], qz[0])
    return be.finish(res, out)


def fake_quant_with_min_max_vars_gradient(gradients, inputs, min, max, num_bits=8, narrow_range=False, *, out=None, device=None):
    """``tf.quantization.fake_quant_with_min_max_vars_gradient``: ``(d_inputs, d_min, d_max)``.

    On CUDA ``d_min``/``d_max`` are float32 0-d device arrays.
    """
    be = _backend(device, gradients=gradients, inputs=inputs)
    g = be.float32_tensor(gradients, "gradients")
    x = be.float32_tensor(inputs, "inputs")
    _same_shape(g, x, "gradients", "inputs")
    (_, _, _, _, _, _, lo, hi), _ = _vars_params(min, max, num_bits, narrow_range)
    res = be.output(out, x.shape, np.float32)
    dmin, dmax = be.kernels.fq_tensor_grad(be.flat(g), be.flat(x), be.flat(res), lo[0], hi[0])
    if be.is_cuda:  # already float32 on the device
        return be.finish(res, out), dmin, dmax
    return be.finish(res, out), np.float32(dmin), np.float32(dmax)


def _per_channel_params(x, min, max, num_bits, narrow_range):
    if x.ndim < 1:
        raise ValueError(f"inputs must have rank >= 1 for per-channel quantization, got shape {x.shape}")
    nb = _num_bits_fq(num_bits)
    depth = x.shape[x.ndim - 1]  # (the simulator's device shapes refuse negative indices)
    mins = _channel_f32(min, "min", depth)
    maxs = _channel_f32(max, "max", depth)
    zero = _check_range_values(mins, maxs, allow_zero=True)
    return _nudge_arrays(mins, maxs, nb, bool(narrow_range), zero), depth


def fake_quant_with_min_max_vars_per_channel(inputs, min, max, num_bits=8, narrow_range=False, *, out=None, device=None):
    """``tf.quantization.fake_quant_with_min_max_vars_per_channel`` (channels on the last axis)."""
    be = _backend(device, inputs=inputs)
    x = be.float32_tensor(inputs, "inputs")
    (nmin, nmax, scale, inv, _, qz, _, _), depth = _per_channel_params(x, min, max, num_bits, narrow_range)
    res = be.output(out, x.shape, np.float32)
    if x.size:
        be.kernels.fq_axis_mul(be.flat(x), be.flat(res), depth, 1, nmin, nmax, scale, inv, qz)
    return be.finish(res, out)


def fake_quant_with_min_max_vars_per_channel_gradient(
    gradients, inputs, min, max, num_bits=8, narrow_range=False, *, out=None, device=None
):
    """``tf.quantization.fake_quant_with_min_max_vars_per_channel_gradient``: ``(d_inputs, d_min, d_max)``."""
    be = _backend(device, gradients=gradients, inputs=inputs)
    g = be.float32_tensor(gradients, "gradients")
    x = be.float32_tensor(inputs, "inputs")
    _same_shape(g, x, "gradients", "inputs")
    (_, _, _, _, _, _, lo, hi), depth = _per_channel_params(x, min, max, num_bits, narrow_range)
    res = be.output(out, x.shape, np.float32)
    if be.is_cuda:  # sums already float32 on the device (zeros for an empty tensor)
        dmin, dmax = be.kernels.fq_axis_grad(be.flat(g), be.flat(x), be.flat(res), depth, 1, lo, hi)
        return be.finish(res, out), dmin, dmax
    if x.size:
        dmin, dmax = cpu.sized("fq_axis_grad", x.size)(g.reshape(-1), x.reshape(-1), res.reshape(-1), depth, 1, lo, hi)
    else:
        dmin = dmax = np.zeros(depth)
    return _finish(res, out), dmin.astype(np.float32), dmax.astype(np.float32)


def quantize_codes(x, min, max, num_bits=8, narrow_range=False, axis=None, *, round_mode="HALF_UP", device=None):
    """Integer codes of TF's fake quantization, for storing quantized weights.

    Returns int32 codes ``q`` on TF's unsigned grid ``[narrow_range, 2**num_bits - 1]``
    such that ``(q - zero_point) * scale`` equals, bit for bit, the fake-quant
    output (``fake_quant_with_min_max_vars`` when ``axis`` is None,
    the per-channel kernel along ``axis`` otherwise; ``zero_point`` and
    ``scale`` from :func:`nudged_range`). ``round_mode="HALF_TO_EVEN"`` gives
    QuantizeLinear's codes on the same grid instead, ``rint(clamp(x / scale,
    qmin - zp, qmax - zp)) + zp`` (what a training graph written with
    ``--round-mode half_to_even`` computes). NaN has no code: a host array with
    NaN is an error (device arrays are not scanned for it).
    """
    be = _backend(device, x=x)
    x = be.float32_tensor(x, "x")
    nb = _num_bits_fq(num_bits)
    half_up = _half_up(round_mode)
    if isinstance(x, np.ndarray) and np.isnan(x).any():
        raise ValueError(f"x contains NaN at index {np.argwhere(np.isnan(x))[0].tolist()}: NaN has no integer code")
    res = be.output(None, x.shape, np.int32)
    if axis is None:
        (nmin, nmax, scale, inv, zp, qz, _, _), zero = _vars_params(min, max, nb, narrow_range)
        depth = inner = 1
    else:
        depth, inner = _axis_layout(x.shape, _norm_axis(axis, x.ndim))
        mins = _channel_f32(min, "min", depth)
        maxs = _channel_f32(max, "max", depth)
        nmin, nmax, scale, inv, zp, qz, _, _ = _nudge_arrays(
            mins, maxs, nb, bool(narrow_range), _check_range_values(mins, maxs, allow_zero=True))
    if not x.size:
        return res
    if not half_up:
        be.kernels.ql_axis_levels(be.flat(x), be.flat(res), depth, inner, *_ql_params(scale, zp, nb, narrow_range))
    elif axis is not None:
        be.kernels.fq_axis_levels(be.flat(x), be.flat(res), depth, inner, nmin, nmax, inv, qz, zp)
    elif zero:
        be.fill(res, int(zp[0]))
    else:
        be.kernels.fq_tensor_levels(be.flat(x), be.flat(res), nmin[0], nmax[0], scale[0], qz[0], zp[0])
    return res


def _ql_params(scale, zp, num_bits: int, narrow_range: bool):
    """QuantizeLinear's divisor, level bounds ``qmin - zp``, ``qmax - zp`` and zero point per channel;
    a degenerate channel (scale 0: min == max == 0) has level 0 only, as the FakeQuant gives zeros."""
    qminf, qmaxf = _grid(num_bits, bool(narrow_range))
    zero = scale == 0
    f32 = np.float32
    divisor = np.where(zero, f32(1.0), scale).astype(f32)
    lo = np.where(zero, f32(0.0), qminf - zp).astype(f32)
    hi = np.where(zero, f32(0.0), qmaxf - zp).astype(f32)
    return divisor, lo, hi, np.asarray(zp, f32)


def _norm_axis(axis, ndim: int) -> int:
    try:
        ax = operator.index(axis)
    except TypeError:
        raise ValueError(f"axis must be an integer or None, got {axis!r}") from None
    if not -ndim <= ax < ndim:
        raise ValueError(f"axis {axis} is out of range for an input of rank {ndim}")
    return ax % ndim


def minmax(x, axis=None, *, device=None):
    """Min and max of ``x`` ignoring NaN, with a parallel kernel.

    ``axis=None``: two scalars. ``axis=k``: two 1-D arrays of length
    ``x.shape[k]`` (the min/max of each slice). An empty (or all-NaN) tensor
    or slice gives ``(inf, -inf)``. Where -0.0 and 0.0 tie, the last in
    memory order wins (as in TensorFlow's scalar reduction), whatever the
    number of threads.

    On CUDA the results are device arrays (0-d without ``axis``).
    """
    be = _backend(device, x=x)
    if be.is_cuda:
        return _minmax_cuda(be.kernels, x, axis)
    a = np.asarray(_param(x))
    if a.dtype not in (np.float32, np.float64):
        if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating) or a.dtype == np.bool_):
            raise ValueError(f"minmax needs a real array, got dtype {a.dtype}")
        a = a.astype(np.float32 if a.dtype.itemsize <= 2 else np.float64)
    a = _contiguous(a)
    if axis is None:
        lo, hi = cpu.sized("minmax_tensor", a.size)(a.reshape(-1))
        return a.dtype.type(lo), a.dtype.type(hi)
    ax = _norm_axis(axis, a.ndim)
    depth, inner = _axis_layout(a.shape, ax)
    return cpu.sized("minmax_axis", a.size)(a.reshape(-1), depth, inner)


def _minmax_result_dtype(dtype: np.dtype) -> np.dtype:
    if dtype in (np.float32, np.float64):
        return dtype
    if not (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating) or dtype == np.bool_):
        raise ValueError(f"minmax needs a real array, got dtype {dtype}")
    return np.dtype(np.float32 if dtype.itemsize <= 2 else np.float64)


def _minmax_cuda(cu, x, axis):
    """``minmax`` on the GPU: reduces the tensor in its own dtype, results in the CPU path's float dtype."""
    if _is_device_array(x):
        d = cu.as_device_array(x)
        res_dtype = _minmax_result_dtype(d.dtype)  # any real dtype reduces exactly in float64
        d = cu.contiguous(d)
    else:  # device="cuda" with host data: convert as the CPU path does, then copy
        a = np.asarray(x)
        res_dtype = _minmax_result_dtype(a.dtype)
        d = cu.to_device(_contiguous(a.astype(res_dtype, copy=False)))
    if axis is None:
        return cu.minmax_tensor(d.ravel(), res_dtype)
    ax = _norm_axis(axis, d.ndim)
    depth, inner = _axis_layout(d.shape, ax)
    return cu.minmax_axis(d.ravel(), depth, inner, res_dtype)


# --- QuantizeAndDequantize ---------------------------------------------------------
_ROUND_MODES = ("HALF_TO_EVEN", "HALF_UP")


def _half_up(round_mode) -> bool:
    if round_mode not in _ROUND_MODES:
        raise ValueError(f"Round mode string must be 'HALF_UP' or 'HALF_TO_EVEN', is '{round_mode}'")
    return round_mode == "HALF_UP"


def _qdq_tensor(x, name: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        if x.dtype not in (np.float32, np.float64):
            raise ValueError(f"{name} must be float32 or float64, got {x.dtype}")
    else:
        try:
            x = np.asarray(x, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be a float array: {exc}") from None
    return _contiguous(x)


def _qdq_range_arg(v, name: str, dtype, depth) -> np.ndarray:
    a = np.asarray(_param(v))
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{name} must be a real number or array, got dtype {a.dtype}")
    if depth is None:
        if a.size != 1:
            raise ValueError(f"{name} must be a scalar when axis is None, got shape {a.shape}")
        return a.astype(dtype).reshape(1)
    if a.shape != (depth,):
        raise ValueError(f"{name} must have shape ({depth},) (one value per slice along axis), got {a.shape}")
    return np.ascontiguousarray(a, dtype=dtype)


def quantize_and_dequantize_v2(
    input,
    input_min,
    input_max,
    signed_input=True,
    num_bits=8,
    range_given=False,
    round_mode="HALF_TO_EVEN",
    narrow_range=False,
    axis=None,
    *,
    out=None,
    device=None,
):
    """``tf.quantization.quantize_and_dequantize_v2`` (TF's V4 kernel), float32 or float64.

    With ``axis``, ``input_min``/``input_max`` are 1-D (one value per slice) and
    every slice is quantized as if the per-tensor op ran on it alone, also
    with ``range_given=True`` (TF's documented behaviour).
    """
    be = _backend(device, input=input)
    x = be.qdq_tensor(input, "input")
    dtype = x.dtype.type
    try:
        nb = operator.index(num_bits)
    except TypeError:
        raise ValueError(f"num_bits must be an integer, got {num_bits!r}") from None
    signed = bool(signed_input)
    if isinstance(num_bits, bool) or nb < 1 or nb >= (62 if signed else 63) or (signed and nb == 1):
        raise ValueError(f"num_bits is out of range: {num_bits} with signed_input {signed}")
    half_up = _half_up(round_mode)
    if signed:
        min_q = -(1 << (nb - 1)) + (1 if narrow_range else 0)
        max_q = (1 << (nb - 1)) - 1
    else:
        min_q, max_q = 0, (1 << nb) - 1
    min_q, max_q = dtype(min_q), dtype(max_q)
    big = dtype(np.finfo(dtype).max)
    half = dtype(0.5)

    if axis is None:
        mins = _qdq_range_arg(input_min, "input_min", dtype, None)
        maxs = _qdq_range_arg(input_max, "input_max", dtype, None)
        depth, inner = 1, max(x.size, 1)
    else:
        ax = _norm_axis(axis, x.ndim)
        depth, inner = _axis_layout(x.shape, ax)
        mins = _qdq_range_arg(input_min, "input_min", dtype, depth)
        maxs = _qdq_range_arg(input_max, "input_max", dtype, depth)

    res = be.output(out, x.shape, x.dtype)
    if be.is_cuda and not range_given:
        # the data's own range, reduced and turned into scales on the device (no host round trip)
        if x.size:
            d, i = (1, 1) if axis is None else (depth, inner)
            scale, inv, lo, hi = be.kernels.qdq_params_from_minmax(be.flat(x), d, i, min_q, max_q, big)
            be.kernels.qdq_axis(be.flat(x), be.flat(res), d, i, lo, hi, scale, inv, False, half_up, half)
        return be.finish(res, out)
    if range_given:
        bad = mins > maxs
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            where = "" if axis is None else f" at index {i} of axis {axis}"
            raise ValueError(f"Invalid range: input_min {mins[i]} > input_max {maxs[i]}{where}")
        lo, hi = mins, maxs
    elif axis is None:
        a, b = cpu.sized("minmax_tensor", x.size)(x.reshape(-1))
        lo, hi = np.array([a], x.dtype), np.array([b], x.dtype)
    else:
        lo, hi = cpu.sized("minmax_axis", x.size)(x.reshape(-1), depth, inner)
    if not range_given:
        # an empty (or all-NaN) tensor or slice has no range: use [0, 0]
        empty = lo > hi
        lo = np.where(empty, 0, lo).astype(x.dtype)
        hi = np.where(empty, 0, hi).astype(x.dtype)
    scale, inv, lo, hi = cpu.qdq_params(np.ascontiguousarray(lo), np.ascontiguousarray(hi), min_q, max_q, big)
    if x.size:
        if axis is None:
            be.kernels.qdq_tensor(be.flat(x), be.flat(res), lo[0], hi[0], scale[0], inv[0], bool(range_given), half_up, half)
        else:
            be.kernels.qdq_axis(be.flat(x), be.flat(res), depth, inner, lo, hi, scale, inv, bool(range_given), half_up, half)
    return be.finish(res, out)


def quantize_and_dequantize_v2_gradient(
    gradients, input, input_min, input_max, axis=None, *, pass_through=False, out=None, device=None
):
    """Gradient of ``quantize_and_dequantize_v2`` with respect to ``input``.

    ``gradients * (input_min <= input <= input_max)`` with the raw range
    arguments (per slice with ``axis``), whether or not the forward pass used
    ``range_given``. The gradients with respect to the range are zero.

    ``pass_through=True`` gives the identity gradient of TF's V1-V3 ops
    (``tf.grad_pass_through``): ``gradients`` unchanged, bit for bit.
    """
    be = _backend(device, gradients=gradients, input=input)
    x = be.qdq_tensor(input, "input")
    g = be.qdq_tensor(gradients, "gradients")
    _same_shape(g, x, "gradients", "input")
    if g.dtype != x.dtype:
        raise ValueError(f"gradients and input must have the same dtype, got {g.dtype} and {x.dtype}")
    dtype = x.dtype.type
    res = be.output(out, x.shape, x.dtype)
    depth, inner = (None, None) if axis is None else _axis_layout(x.shape, _norm_axis(axis, x.ndim))
    lo = _qdq_range_arg(input_min, "input_min", dtype, depth)
    hi = _qdq_range_arg(input_max, "input_max", dtype, depth)
    if not x.size:
        pass
    elif pass_through:  # a copy, not g * 1: a GPU's arithmetic on a NaN returns the canonical NaN, not its payload
        be.copy(res, g)
    elif axis is None:
        be.kernels.qdq_tensor_grad(be.flat(g), be.flat(x), be.flat(res), lo[0], hi[0], dtype(1), dtype(0))
    else:
        be.kernels.qdq_axis_grad(be.flat(g), be.flat(x), be.flat(res), depth, inner, lo, hi, dtype(1), dtype(0))
    return be.finish(res, out)
