"""A weight channel whose range is tiny or denormal: zeros, not NaN, in the kernels, the training
graph's FakeQuant function (onnxruntime) and JAX alike (issue 13: the PP-OCR recognizer's training
graph output NaN). TF's arithmetic overflows inv_scale there (NaN): qtool treats such a range like
min == max == 0 (zeros, gradient passed through)."""

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort

import qtool
from qtool.finetune.fake_quant import fake_quant
from qtool.onnx_rewrite.fake_quant_function import fake_quant_model


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def _ftz(a):
    return np.where(np.abs(a) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), a), a).astype(np.float32)


def test_tiny_and_denormal_channels_give_zeros_everywhere():
    rng = np.random.default_rng(0)
    c, n = 6, 50
    lo = -np.abs(rng.standard_normal(c)).astype(np.float32)
    hi = np.abs(rng.standard_normal(c)).astype(np.float32)
    x = (rng.standard_normal((n, c)) * 1.2).astype(np.float32)
    lo[1], hi[1] = np.float32(-1e-39), np.float32(2e-39)  # denormal range
    lo[4], hi[4] = np.float32(0.0), np.float32(1e-37)  # normal, but (qmax - qmin) / range overflows
    x[:, 1] *= np.float32(1e-39)
    x[:, 4] *= np.float32(1e-37)
    for bits, narrow in ((8, True), (3, True), (4, False)):
        kernel = qtool.fake_quant_with_min_max_vars_per_channel(x, lo, hi, bits, narrow)
        assert np.all(np.isfinite(kernel))
        assert np.all(kernel[:, 1] == 0)
        if bits == 8:  # 1e-37 / 254 is below FLT_MIN; at 3-4 bits the scale is still a normal float
            assert np.all(kernel[:, 4] == 0)
        # the other channels are what they are alone
        for ch in (0, 2, 3, 5):
            alone = qtool.fake_quant_with_min_max_vars(x[:, ch], lo[ch], hi[ch], bits, narrow)
            assert np.all(np.isfinite(alone))
        # the graph's function in onnxruntime: channels on axis 0, range [C, 1]
        model = fake_quant_model([c, n], [c, 1], num_bits=bits, narrow_range=narrow)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        graph = session.run(None, {"x": x.T.copy(), "min": lo[:, None], "max": hi[:, None]})[0]
        np.testing.assert_array_equal(_bits(graph.T), _bits(kernel))
        # JAX in the same form; XLA's CPU flushes denormals to zero (inputs near 1e-38 * N(0, 1),
        # results of a level times a scale near FLT_MIN), so compare with the kernel on flushed values
        got = jax.jit(lambda x, a, b: fake_quant(x, a, b, bits, narrow))(
            jnp.asarray(x.T), jnp.asarray(lo[:, None]), jnp.asarray(hi[:, None]))
        flushed = _ftz(qtool.fake_quant_with_min_max_vars_per_channel(_ftz(x), lo, hi, bits, narrow))
        np.testing.assert_array_equal(_bits(np.asarray(got).T), _bits(flushed))


def test_tiny_channel_gradient_passes_through():
    rng = np.random.default_rng(1)
    lo = np.float32([-1.0, 0.0])
    hi = np.float32([1.0, 1e-38])
    x = rng.standard_normal((20, 2)).astype(np.float32)
    g = rng.standard_normal((20, 2)).astype(np.float32)
    d_x, d_min, d_max = qtool.fake_quant_with_min_max_vars_per_channel_gradient(g, x, lo, hi, 8, True)
    np.testing.assert_array_equal(d_x[:, 1], g[:, 1])
    assert d_min[1] == 0 and d_max[1] == 0
    _, vjp = jax.vjp(lambda x, a, b: fake_quant(x, a, b, 8, True), jnp.asarray(x), jnp.asarray(lo[None]),
                     jnp.asarray(hi[None]))
    gx, gmin, gmax = vjp(jnp.asarray(g))
    np.testing.assert_array_equal(_bits(gx), _bits(d_x))
    assert float(gmin[0, 1]) == 0 and float(gmax[0, 1]) == 0


def test_a_tiny_per_tensor_range_gives_zeros_not_nan():
    x = np.linspace(-1e-38, 1e-38, 11).astype(np.float32)
    out = qtool.fake_quant_with_min_max_vars(x, np.float32(-1e-38), np.float32(1e-38), 8, False)
    assert np.all(out == 0)
    model = fake_quant_model([11], [], num_bits=8, narrow_range=False)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    graph = session.run(None, {"x": x, "min": np.array(-1e-38, np.float32), "max": np.array(1e-38, np.float32)})[0]
    np.testing.assert_array_equal(_bits(graph), _bits(out))
