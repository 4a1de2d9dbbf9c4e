"""Below ``PARALLEL_MIN`` values the CPU kernels run on one thread (their ``SERIAL`` twins, the same code
with ``prange`` as ``range``): every public kernel gives the same bits either way, on awkward data
(NaN, infinities, signed zeros, values on the rounding ties, several chunks, per-channel layouts)."""

import numpy as np
import pytest

import qtool
from qtool.kernels import cpu


def awkward(shape, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    flat[:: 97] = np.round(flat[:: 97] * 2) / 2  # ties of a 0.5 grid
    flat[1], flat[-2] = -0.0, 0.0
    flat[3], flat[-4], flat[5] = np.inf, -np.inf, 1e30
    return x


SHAPES = [((9,), None), ((3 * cpu.CHUNK + 5,), None), ((33, 16), 1), ((8, 6, 5, 3), 1), ((300, 130), 1),
          ((130, 300), 0)]


def calls(x, axis):
    """The public kernels on ``x`` (NaN only where the kernel takes it), as lists of arrays."""
    g = np.cos(np.where(np.isfinite(x), x, 1)).astype(np.float32)
    finite = np.where(np.isfinite(x), x, np.float32(7.5))
    out = [qtool.minmax(x, axis), qtool.minmax(np.where(np.arange(x.size).reshape(x.shape) % 5 == 0, np.nan, x), axis),
           qtool.fake_quant_with_min_max_args(x, -2.0, 5.0, 8),
           qtool.fake_quant_with_min_max_args_gradient(g, x, -2.0, 5.0, 4),
           qtool.fake_quant_with_min_max_vars(x, -2.5, 4.0, 7, True),
           qtool.fake_quant_with_min_max_vars_gradient(g, x, -2.5, 4.0, 8),
           qtool.quantize_codes(finite, -2.0, 6.0, 8), qtool.quantize_codes(finite, -2.0, 6.0, 8, round_mode="HALF_TO_EVEN"),
           qtool.quantize_and_dequantize_v2(x, -3.0, 3.0, range_given=True),
           qtool.quantize_and_dequantize_v2(finite, 0.0, 0.0),
           qtool.quantize_and_dequantize_v2_gradient(g, x, -3.0, 3.0)]
    if axis is not None:
        depth = x.shape[axis]
        lo = np.linspace(-4, -0.5, depth).astype(np.float32)
        hi = np.linspace(0.5, 6, depth).astype(np.float32)
        last = np.moveaxis(x, axis, -1)
        out += [qtool.fake_quant_with_min_max_vars_per_channel(last, lo, hi, 8),
                qtool.fake_quant_with_min_max_vars_per_channel_gradient(np.moveaxis(g, axis, -1), last, lo, hi, 6),
                qtool.quantize_codes(finite, lo, hi, 8, axis=axis),
                qtool.quantize_codes(finite, lo, hi, 4, True, axis=axis, round_mode="HALF_TO_EVEN"),
                qtool.quantize_and_dequantize_v2(finite, np.zeros(depth, np.float32), np.zeros(depth, np.float32),
                                                 axis=axis)]
    return [np.asarray(a) for result in out for a in (result if isinstance(result, tuple) else (result,))]


@pytest.mark.parametrize("shape, axis", SHAPES)
def test_one_thread_and_parallel_kernels_give_the_same_bits(shape, axis, monkeypatch):
    x = awkward(shape, seed=len(shape) * 100 + shape[0])
    monkeypatch.setattr(cpu, "PARALLEL_MIN", 1 << 62)  # every kernel on one thread
    serial = calls(x, axis)
    monkeypatch.setattr(cpu, "PARALLEL_MIN", 0)  # every kernel parallel
    parallel = calls(x, axis)
    assert len(serial) == len(parallel) > 10
    for i, (a, b) in enumerate(zip(serial, parallel)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert a.tobytes() == b.tobytes(), f"call {i} differs"  # bits: -0.0 and NaN payloads included


def test_small_arrays_take_the_twins_and_large_ones_the_parallel_kernels():
    assert cpu.sized("minmax_axis", cpu.PARALLEL_MIN - 1) is cpu.SERIAL["minmax_axis"]
    assert cpu.sized("minmax_axis", cpu.PARALLEL_MIN) is cpu.minmax_axis
    assert cpu.sized("fq_axis_levels", 10).py_func.__name__ == "fq_axis_levels_serial"
    assert not cpu.SERIAL["fq_axis_levels"].targetoptions.get("parallel")
    assert cpu.minmax_axis.targetoptions.get("parallel")
