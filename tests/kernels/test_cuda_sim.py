"""CUDA kernels against the CPU kernels, bit for bit, in the numba CUDA simulator.

Runs only with ``NUMBA_ENABLE_CUDASIM=1``: ``test_cuda.py`` runs it (with the
rest of ``tests/kernels``) in a subprocess on every test run. By hand::

    NUMBA_ENABLE_CUDASIM=1 pytest tests/kernels/test_cuda_sim.py

Outputs must equal the CPU kernels' bit for bit (the sign of zero included;
NaN compares as NaN: a GPU's NaN payload is not x86's); gradient sums within
a tolerance (the spec leaves the order of a sum free).
"""

import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("runs in the CUDA simulator pass (see tests/kernels/test_cuda.py)", allow_module_level=True)

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from numba import cuda  # noqa: E402

import qtool  # noqa: E402
from qtool.kernels import api  # noqa: E402
from qtool.kernels import cuda as qcuda  # noqa: E402

f32, f64 = np.float32, np.float64
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


# --- helpers ----------------------------------------------------------------------------------
def is_dev(a) -> bool:
    return getattr(a, "__cuda_ndarray__", False) is True


def host(a):
    return a.copy_to_host() if is_dev(a) else np.asarray(a)


def bits(a):
    return a.view({4: np.int32, 8: np.int64}[a.dtype.itemsize]) if a.dtype.kind == "f" else a


def assert_bits(got, want):
    got, want = host(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype.kind == "f":
        nan_g, nan_w = np.isnan(got), np.isnan(want)
        np.testing.assert_array_equal(nan_g, nan_w)
        bad = ~nan_g & (bits(got) != bits(want))
    else:
        bad = got != want
    assert not bad.any(), f"{int(bad.sum())} of {bad.size} differ: got {got[bad][:5]!r} want {want[bad][:5]!r}"


def assert_close(got, want):
    got = host(got)
    want = np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a).reshape(np.shape(a)))


def specials(dtype, *extra):
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, *extra], dtype)


# --- strategies -----------------------------------------------------------------------------------
@st.composite
def fq_case(draw):
    nb = draw(st.integers(2, 16))
    narrow = draw(st.booleans())
    mn = draw(st.floats(-50, 5))
    mx = mn + draw(st.floats(0.01, 60))
    mn, mx = f32(mn), f32(mx)
    if not mn < mx:
        mx = np.nextafter(mn, f32(np.inf))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    nmin, nmax, scale, _ = qtool.nudged_range(mn, mx, nb, narrow)
    n = draw(st.integers(1, 24))
    width = float(nmax - nmin)
    x = rng.uniform(float(nmin) - 0.2 * width, float(nmax) + 0.2 * width, n).astype(f32)
    levels = rng.integers(0, 2**nb - 1, n).astype(f32)
    ties = (nmin + (levels + f32(0.5)) * scale).astype(f32)
    x = np.concatenate([x, ties, specials(f32, nmin, nmax, mn, mx)])
    rng.shuffle(x)
    return nb, narrow, mn, mx, x, rng


@st.composite
def qdq_case(draw):
    dtype = draw(st.sampled_from([f32, f64]))
    signed = draw(st.booleans())
    nb = draw(st.integers(2, 16))
    narrow = draw(st.booleans())
    mode = draw(st.sampled_from(["HALF_TO_EVEN", "HALF_UP"]))
    range_given = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    lo = -draw(st.floats(0, 100)) if draw(st.booleans()) else draw(st.floats(0, 10))
    hi = lo + draw(st.floats(1e-3, 100))
    n = draw(st.integers(1, 30))
    x = rng.uniform(lo - 1, hi + 1, n).astype(dtype)
    unit = dtype(max(abs(lo), abs(hi)) / (2 ** (nb - 1) - 1))
    steps = rng.integers(-(2 ** (nb - 1)), 2 ** (nb - 1), n).astype(dtype)
    x = np.concatenate([x, (steps + dtype(0.5)) * unit, specials(dtype)])
    rng.shuffle(x)
    kw = dict(signed_input=signed, num_bits=nb, range_given=range_given, round_mode=mode, narrow_range=narrow)
    return dtype, dtype(lo), dtype(hi), x, kw, rng


# --- every public function: CUDA == CPU ----------------------------------------------------------
@SETTINGS
@given(fq_case())
def test_fake_quant_per_tensor_matches_cpu(case):
    nb, narrow, mn, mx, x, rng = case
    g = rng.normal(size=x.shape).astype(f32)
    kw = dict(num_bits=nb, narrow_range=narrow)
    dx, dg = dev(x), dev(g)
    assert_bits(
        qtool.fake_quant_with_min_max_args(dx, float(mn), float(mx), **kw, device="cuda"),
        qtool.fake_quant_with_min_max_args(x, float(mn), float(mx), **kw, device="cpu"),
    )
    assert_bits(
        qtool.fake_quant_with_min_max_args_gradient(dg, dx, float(mn), float(mx), **kw, device="cuda"),
        qtool.fake_quant_with_min_max_args_gradient(g, x, float(mn), float(mx), **kw, device="cpu"),
    )
    assert_bits(
        qtool.fake_quant_with_min_max_vars(dx, mn, mx, **kw, device="cuda"),
        qtool.fake_quant_with_min_max_vars(x, mn, mx, **kw, device="cpu"),
    )
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_gradient(dg, dx, mn, mx, **kw, device="cuda")
    wd, wmin, wmax = qtool.fake_quant_with_min_max_vars_gradient(g, x, mn, mx, **kw, device="cpu")
    assert_bits(d, wd)
    assert_close(dmin, wmin)
    assert_close(dmax, wmax)
    finite = x[np.isfinite(x)]
    for mode in ("HALF_UP", "HALF_TO_EVEN"):
        assert_bits(qtool.quantize_codes(dev(finite), mn, mx, nb, narrow, round_mode=mode, device="cuda"),
                    qtool.quantize_codes(finite, mn, mx, nb, narrow, round_mode=mode, device="cpu"))


@SETTINGS
@given(fq_case(), st.integers(1, 7), st.integers(0, 2))
def test_fake_quant_per_channel_matches_cpu(case, depth, lead_rank):
    nb, narrow, mn, mx, x, rng = case
    mins = (mn * rng.uniform(0.5, 1.5, depth)).astype(f32)
    maxs = (mx * rng.uniform(0.5, 1.5, depth)).astype(f32)
    swap = mins >= maxs
    mins[swap], maxs[swap] = mn, mx
    if depth > 2:
        mins[1] = maxs[1] = 0  # a min == max == 0 channel
    lead = list(rng.integers(1, 4, lead_rank))
    xs = np.resize(x, int(np.prod(lead, dtype=int)) * depth).reshape(lead + [depth])
    g = rng.normal(size=xs.shape).astype(f32)
    kw = dict(num_bits=nb, narrow_range=narrow)
    assert_bits(
        qtool.fake_quant_with_min_max_vars_per_channel(dev(xs), mins, maxs, **kw, device="cuda"),
        qtool.fake_quant_with_min_max_vars_per_channel(xs, mins, maxs, **kw, device="cpu"),
    )
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_per_channel_gradient(dev(g), dev(xs), mins, maxs, **kw, device="cuda")
    wd, wmin, wmax = qtool.fake_quant_with_min_max_vars_per_channel_gradient(g, xs, mins, maxs, **kw, device="cpu")
    assert_bits(d, wd)
    assert_close(dmin, wmin)
    assert_close(dmax, wmax)
    fin = np.where(np.isfinite(xs), xs, 0).astype(f32)
    axis = int(rng.integers(0, fin.ndim))
    cm, cx = np.resize(mins, fin.shape[axis]), np.resize(maxs, fin.shape[axis])
    for mode in ("HALF_UP", "HALF_TO_EVEN"):
        assert_bits(
            qtool.quantize_codes(dev(fin), cm, cx, nb, narrow, axis=axis, round_mode=mode, device="cuda"),
            qtool.quantize_codes(fin, cm, cx, nb, narrow, axis=axis, round_mode=mode, device="cpu"),
        )


@SETTINGS
@given(qdq_case())
def test_quantize_and_dequantize_per_tensor_matches_cpu(case):
    dtype, lo, hi, x, kw, rng = case
    assert_bits(
        qtool.quantize_and_dequantize_v2(dev(x), lo, hi, **kw, device="cuda"),
        qtool.quantize_and_dequantize_v2(x, lo, hi, **kw, device="cpu"),
    )
    g = rng.normal(size=x.shape).astype(dtype)
    assert_bits(
        qtool.quantize_and_dequantize_v2_gradient(dev(g), dev(x), lo, hi, device="cuda"),
        qtool.quantize_and_dequantize_v2_gradient(g, x, lo, hi, device="cpu"),
    )


@SETTINGS
@given(qdq_case(), st.sampled_from([(2, 3, 4), (5, 1), (1, 7), (3, 2, 2, 2), (9,)]), st.data())
def test_quantize_and_dequantize_per_axis_matches_cpu(case, shape, data):
    dtype, lo, hi, x, kw, rng = case
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    xs = np.resize(x, int(np.prod(shape))).reshape(shape).astype(dtype)
    depth = shape[axis]
    mins = np.array([lo - i for i in range(depth)], dtype)
    maxs = np.array([hi + i for i in range(depth)], dtype)
    assert_bits(
        qtool.quantize_and_dequantize_v2(dev(xs), mins, maxs, **kw, axis=axis, device="cuda"),
        qtool.quantize_and_dequantize_v2(xs, mins, maxs, **kw, axis=axis, device="cpu"),
    )
    g = rng.normal(size=xs.shape).astype(dtype)
    assert_bits(
        qtool.quantize_and_dequantize_v2_gradient(dev(g), dev(xs), mins, maxs, axis=axis, device="cuda"),
        qtool.quantize_and_dequantize_v2_gradient(g, xs, mins, maxs, axis=axis, device="cpu"),
    )
    for ax in (None, axis):
        for got, want in zip(qtool.minmax(dev(xs), axis=ax, device="cuda"), qtool.minmax(xs, axis=ax, device="cpu")):
            assert_bits(got, want)


# --- inputs on which a fused multiply-add changes the result --------------------------------------
def _fma32(a, b, c):
    """float32 fma(a, b, c), exactly: the float64 product of two float32 values is exact and
    adding these c (integers or 0.5 of magnitude < 2**17) stays within float64's 53 bits."""
    return f32(np.float64(a) * np.float64(b) + np.float64(c))


def _contracted_fake_quant(x, nmin, nmax, scale, inv, qz):
    """The args/per-channel forward as NVVM would compile ``shifted * inv_scale - quant_zero`` by default."""
    shifted = f32(np.clip(x, nmin, nmax)) - nmin
    return f32(np.floor(_fma32(shifted, inv, -qz) + f32(0.5))) * scale


def test_fake_quant_on_inputs_where_contraction_changes_the_result():
    found = []
    for mn, mx, nb in [(-10.0, 1.0, 8), (-100.0, 3.0, 8), (-7.3, 0.2, 4), (-1000.0, 17.0, 16), (-5.0, 0.7, 12)]:
        mn, mx = f32(mn), f32(mx)
        nmin, nmax, scale, zp = qtool.nudged_range(mn, mx, nb)
        inv = f32(2**nb - 1) / (mx - mn)
        qz = np.floor(-nmin * inv + f32(0.5))
        k = np.arange(0, 2**nb - 1, max(1, (2**nb - 1) // 400), dtype=f32)
        ties = (nmin + (k + f32(0.5)) * scale).astype(f32)
        cand = np.concatenate([ties + d * np.spacing(ties) for d in range(-3, 4)]).astype(f32)
        want = qtool.fake_quant_with_min_max_args(cand, float(mn), float(mx), nb, device="cpu")
        fused = np.array([_contracted_fake_quant(v, nmin, nmax, scale, inv, qz) for v in cand], f32)
        sensitive = bits(want) != bits(fused)
        found.append((mn, mx, nb, cand[sensitive]))
    total = sum(len(c) for *_, c in found)
    assert total >= 10, "the search must find inputs on which contraction matters"
    for mn, mx, nb, x in found:
        if x.size:
            assert_bits(
                qtool.fake_quant_with_min_max_args(dev(x), float(mn), float(mx), nb, device="cuda"),
                qtool.fake_quant_with_min_max_args(x, float(mn), float(mx), nb, device="cpu"),
            )
            xs = x.reshape(-1, 1)
            assert_bits(
                qtool.fake_quant_with_min_max_vars_per_channel(dev(xs), [mn], [mx], nb, device="cuda"),
                qtool.fake_quant_with_min_max_vars_per_channel(xs, [mn], [mx], nb, device="cpu"),
            )


def test_quantize_and_dequantize_half_up_on_inputs_where_contraction_changes_the_result():
    # HALF_UP is floor(x * scale + 0.5): fma(x, scale, 0.5) rounds once where the spec rounds
    # twice; it shows where x * scale + 0.5 falls into a finer binade than x * scale (small levels)
    found = []
    for hi in np.linspace(0.25, 20, 80).astype(f32):
        scale = f32(127) / hi
        inv = hi / f32(127)
        k = np.arange(-4, 4, dtype=f32)
        ties = ((k + f32(0.5)) / scale).astype(f32)
        cand = np.concatenate([ties + d * np.spacing(ties) for d in range(-6, 7)]).astype(f32)
        want = qtool.quantize_and_dequantize_v2(cand, -hi, hi, range_given=True, round_mode="HALF_UP", device="cpu")
        fused = np.array([f32(np.floor(_fma32(v, scale, 0.5))) * inv for v in cand], f32)
        sensitive = cand[bits(want) != bits(fused)]
        if sensitive.size:
            found.append((hi, sensitive))
    assert sum(s.size for _, s in found) >= 10, "the search must find inputs on which contraction matters"
    for hi, x in found[:12]:
        assert_bits(
            qtool.quantize_and_dequantize_v2(dev(x), -hi, hi, range_given=True, round_mode="HALF_UP", device="cuda"),
            qtool.quantize_and_dequantize_v2(x, -hi, hi, range_given=True, round_mode="HALF_UP", device="cpu"),
        )


def test_simulator_arithmetic_is_float32():
    # the simulator's primitives must not widen to Python floats (float64)
    r = qcuda.S32.fq_mul(f32(0.3), f32(-1), f32(1), f32(2 / 255), f32(127.5), f32(127))
    assert type(r) is f32
    r = qcuda.S32.qdq_free(f32(0.3), f32(255), f32(1 / 255), True, f32(0.5))
    assert type(r) is f32


# --- signs of zero and the reductions' layouts ------------------------------------------------------
@pytest.mark.parametrize(
    "x",
    [
        [0.0, -0.0],
        [-0.0, 0.0],
        [-0.0, 0.0, -0.0],
        [0.0, 0.0, -0.0, 1.0],
        [-0.0, np.nan, 0.0, -1.0],
        [np.nan, np.nan],
        [-0.0] * 5 + [0.0] * 4,
    ],
)
def test_zero_sign_ties_follow_the_cpu(x):
    for dtype in (f32, f64):
        a = np.array(x, dtype)
        for got, want in zip(qtool.minmax(dev(a), device="cuda"), qtool.minmax(a, device="cpu")):
            assert_bits(got, want)
        assert_bits(qtool.quantize_and_dequantize_v2(dev(a), 0, 0, device="cuda"), qtool.quantize_and_dequantize_v2(a, 0, 0, device="cpu"))
        a2 = np.resize(a, (3, a.size)) * np.array([[1], [-1], [1]], dtype)
        for axis in (0, 1):
            for got, want in zip(qtool.minmax(dev(a2), axis=axis, device="cuda"), qtool.minmax(a2, axis=axis, device="cpu")):
                assert_bits(got, want)
            zs = np.zeros(a2.shape[axis], dtype)
            assert_bits(
                qtool.quantize_and_dequantize_v2(dev(a2), zs, zs, axis=axis, device="cuda"),
                qtool.quantize_and_dequantize_v2(a2, zs, zs, axis=axis, device="cpu"),
            )


@pytest.mark.parametrize("shape", [(40, 3), (3, 40), (1, 97), (2, 5, 13), (7, 2, 9)])
def test_reduction_layouts(shape):
    # columns per channel, blocks spanning one or several channels, fewer rows than a block
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(size=shape).astype(f32)
    x.flat[:: max(1, x.size // 7)] = 0.0
    x.flat[1 :: max(1, x.size // 5)] = -0.0
    g = rng.normal(size=shape).astype(f32)
    for axis in range(len(shape)):
        for got, want in zip(qtool.minmax(dev(x), axis=axis, device="cuda"), qtool.minmax(x, axis=axis, device="cpu")):
            assert_bits(got, want)
    d = shape[-1]
    mins, maxs = np.full(d, -0.7, f32), np.full(d, 0.9, f32)
    got = qtool.fake_quant_with_min_max_vars_per_channel_gradient(dev(g), dev(x), mins, maxs, device="cuda")
    want = qtool.fake_quant_with_min_max_vars_per_channel_gradient(g, x, mins, maxs, device="cpu")
    assert_bits(got[0], want[0])
    assert_close(got[1], want[1])
    assert_close(got[2], want[2])


def test_minmax_of_integer_bool_and_half_arrays():
    for a in (
        np.array([[3, -7, 2], [9, 0, -1]], np.int16),
        np.array([[5, 1], [2**40, -(2**41)]], np.int64),
        np.array([True, False]),
        np.array([[-0.0, 0.5], [0.0, np.nan]], np.float16),
    ):
        for axis in (None, 0):
            for got, want in zip(qtool.minmax(dev(a), axis=axis, device="cuda"), qtool.minmax(a, axis=axis, device="cpu")):
                assert_bits(got, np.asarray(want))


# --- the device-array interface -----------------------------------------------------------------------
X = np.array([[-7.0, -1.3, 0.0], [0.4, 2.5, 9.0]], f32)


def test_device_arrays_in_give_device_arrays_out():
    out = qtool.fake_quant_with_min_max_vars(dev(X), -2.0, 2.0)  # device=None: where the data lives
    assert is_dev(out) and out.shape == X.shape and out.dtype == f32
    assert_bits(out, qtool.fake_quant_with_min_max_vars(X, -2.0, 2.0, device="cpu"))
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_gradient(dev(X), dev(X), -2.0, 2.0)
    assert is_dev(d) and is_dev(dmin) and is_dev(dmax) and dmin.shape == () and dmin.dtype == f32
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_per_channel_gradient(dev(X), dev(X), [-1.0] * 3, [1.0] * 3)
    assert is_dev(dmin) and dmin.shape == (3,) and dmin.dtype == f32
    lo, hi = qtool.minmax(dev(X))
    assert is_dev(lo) and lo.shape == () and host(lo) == f32(-7) and host(hi) == f32(9)
    lo, hi = qtool.minmax(dev(X), axis=1)
    assert is_dev(lo) and lo.shape == (3,)
    q = qtool.quantize_codes(dev(X), -2.0, 2.0)
    assert is_dev(q) and q.dtype == np.int32


def test_out_on_the_device_contiguous_and_strided():
    want = qtool.fake_quant_with_min_max_vars(X, -2.0, 2.0, device="cpu")
    out = cuda.device_array(X.shape, f32)
    assert qtool.fake_quant_with_min_max_vars(dev(X), -2.0, 2.0, out=out) is out
    assert_bits(out, want)
    big = dev(np.full((2, 6), 5.0, f32))
    view = big[:, ::2]
    assert not view.is_c_contiguous()
    assert qtool.fake_quant_with_min_max_vars(dev(X), -2.0, 2.0, out=view) is view
    got = host(big)
    assert_bits(got[:, ::2], want)
    np.testing.assert_array_equal(got[:, 1::2], 5.0)


def test_strided_device_inputs():
    big = dev(np.concatenate([X, X * 3], axis=1))
    view = big[:, :3]
    assert not view.is_c_contiguous()
    assert_bits(qtool.fake_quant_with_min_max_vars(view, -2.0, 2.0), qtool.fake_quant_with_min_max_vars(X, -2.0, 2.0, device="cpu"))
    t = dev(np.ascontiguousarray(X.T)).T  # Fortran order
    assert_bits(qtool.quantize_and_dequantize_v2(t, 0.0, 0.0), qtool.quantize_and_dequantize_v2(X, 0.0, 0.0, device="cpu"))


def test_cuda_array_interface_objects(cuda_array_interface):
    x_obj = cuda_array_interface(dev(X))
    want = qtool.fake_quant_with_min_max_vars(X, -2.0, 2.0, device="cpu")
    got = qtool.fake_quant_with_min_max_vars(x_obj, -2.0, 2.0)
    assert is_dev(got)
    assert_bits(got, want)
    target = dev(np.zeros(X.shape, f32))
    out_obj = cuda_array_interface(target)
    assert qtool.fake_quant_with_min_max_vars(x_obj, -2.0, 2.0, out=out_obj) is out_obj
    assert_bits(target, want)
    with pytest.raises(ValueError, match="out is read-only"):
        qtool.fake_quant_with_min_max_vars(x_obj, -2.0, 2.0, out=cuda_array_interface(dev(X), read_only=True))
    g_obj = cuda_array_interface(dev(X))
    d = qtool.quantize_and_dequantize_v2_gradient(g_obj, x_obj, -1.0, 1.0)
    assert_bits(d, qtool.quantize_and_dequantize_v2_gradient(X, X, -1.0, 1.0, device="cpu"))
    # ranges on the device: copied to the host (a handful of values)
    mins, maxs = cuda_array_interface(dev(np.full(3, -1.0, f32))), dev(np.full(3, 1.5, f32))
    assert_bits(
        qtool.fake_quant_with_min_max_vars_per_channel(x_obj, mins, maxs),
        qtool.fake_quant_with_min_max_vars_per_channel(X, [-1.0] * 3, [1.5] * 3, device="cpu"),
    )
    nmin, nmax, scale, zp = qtool.nudged_range(mins, maxs)
    assert isinstance(nmin, np.ndarray) and nmin.shape == (3,)


def test_explicit_device_copies_both_ways():
    want = qtool.quantize_and_dequantize_v2(X, -1.0, 1.0, range_given=True, device="cpu")
    got = qtool.quantize_and_dequantize_v2(X, -1.0, 1.0, range_given=True, device="cuda")
    assert is_dev(got)
    assert_bits(got, want)
    back = qtool.quantize_and_dequantize_v2(dev(X), -1.0, 1.0, range_given=True, device="cpu")
    assert isinstance(back, np.ndarray)
    assert_bits(back, want)
    for a in ([[1, 5], [-2, 3]], np.array([[1, 5], [2, 3]], np.uint8)):  # converted on the host, as on the CPU
        for got, want in zip(qtool.minmax(a, device="cuda"), qtool.minmax(a, device="cpu")):
            assert is_dev(got)
            assert_bits(got, np.asarray(want))


def test_device_errors_and_messages():
    with pytest.raises(ValueError, match=r"gradients is on the GPU but inputs on the host"):
        qtool.fake_quant_with_min_max_vars_gradient(dev(X), X, -1.0, 1.0)
    with pytest.raises(ValueError, match=r"out must be a GPU array .* got ndarray"):
        qtool.fake_quant_with_min_max_args(dev(X), out=np.empty_like(X))
    with pytest.raises(ValueError, match=r"out must have shape \(2, 3\) and dtype float32, got \(6,\) and float32"):
        qtool.fake_quant_with_min_max_args(dev(X), out=cuda.device_array(6, f32))
    with pytest.raises(ValueError, match=r"inputs must be float32, got float64 \(cast it"):
        qtool.fake_quant_with_min_max_vars(dev(X.astype(f64)), -1.0, 1.0)
    with pytest.raises(ValueError, match="input must be float32 or float64, got int64"):
        qtool.quantize_and_dequantize_v2(dev(np.arange(3)), 0.0, 1.0)
    with pytest.raises(ValueError, match=r"gradients and inputs must have the same shape"):
        qtool.fake_quant_with_min_max_vars_gradient(dev(X[0]), dev(X), -1.0, 1.0)
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or None"):
        qtool.minmax(dev(X), device="gpu")
    with pytest.raises(ValueError, match="Invalid range"):
        qtool.quantize_and_dequantize_v2(dev(X), 1.0, 0.0, range_given=True)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0)])
def test_empty_device_arrays(shape):
    x = dev(np.zeros(shape, f32))
    depth = shape[-1]
    assert qtool.fake_quant_with_min_max_args(x).shape == shape
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_gradient(x, x, -1.0, 1.0)
    assert d.shape == shape and host(dmin) == 0 and host(dmax) == 0
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_per_channel_gradient(x, x, [-1.0] * depth, [1.0] * depth)
    assert d.shape == shape and dmin.shape == (depth,) and not host(dmin).any()
    assert qtool.quantize_and_dequantize_v2(x, 0.0, 0.0).shape == shape
    lo, hi = qtool.minmax(x)
    assert host(lo) == np.inf and host(hi) == -np.inf


def test_zero_range_and_codes_fill_on_the_device():
    want = qtool.quantize_codes(X, 0.0, 0.0, 8, True, device="cpu")
    assert_bits(qtool.quantize_codes(dev(X), 0.0, 0.0, 8, True), want)
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_gradient(dev(X), dev(X), 0.0, 0.0)
    assert_bits(d, X)


def test_api_reports_cuda_module():
    assert qcuda.SIM
    assert api._load_cuda() is qcuda
