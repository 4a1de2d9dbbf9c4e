"""FakeQuant in JAX: bit for bit qtool's kernels (kernels.md 1.1-1.2), TF's straight-through gradients (1.3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from finetune_helpers import CALIB

import qtool
from qtool.finetune.fake_quant import fake_quant
from qtool.finetune.interpreter import Interpreter

RANGES = [(8, False, -10.0, 53.75), (8, False, -0.1, 63.65), (8, True, -0.1275, 63.3725), (8, False, -63.65, 0.1),
          (8, False, -0.125, 63.625), (4, False, -6.0, 1.5), (4, False, -7.3, 0.2), (2, False, -0.1, 1.4),
          (2, True, -0.4, 0.6), (3, False, 0.0, 4.2404), (3, True, -0.73, 0.41), (16, False, -1.0, 1.0),
          (5, False, 0.5, 128.0), (7, True, -128.0, -0.5)]


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def _inputs(rng, lo, hi, bits, narrow, n=4000):
    """Random values over (and beyond) the range, plus exact ties of the grid (k + 0.5) * scale."""
    nmin, nmax, scale = (float(v) for v in qtool.nudged_range(lo, hi, bits, narrow)[:3]) \
        if hasattr(qtool, "nudged_range") else (lo, hi, (hi - lo) / (2**bits - 1))
    span = hi - lo
    x = rng.uniform(lo - 0.2 * span, hi + 0.2 * span, n).astype(np.float32)
    k = rng.integers(-2, 2**bits + 2, 200)
    ties = (np.float32(nmin) + (k + 0.5).astype(np.float32) * np.float32(scale)).astype(np.float32)
    return np.concatenate([x, ties, np.float32([0.0, -0.0, nmin, nmax, np.inf, -np.inf])]).astype(np.float32)


@pytest.mark.parametrize("bits, narrow, lo, hi", RANGES)
def test_per_tensor_forward_is_the_vars_kernel_bit_for_bit(bits, narrow, lo, hi):
    x = _inputs(np.random.default_rng(bits), lo, hi, bits, narrow)
    want = qtool.fake_quant_with_min_max_vars(x, lo, hi, bits, narrow)
    got = fake_quant(jnp.asarray(x), jnp.float32(lo), jnp.float32(hi), bits, narrow)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    jitted = jax.jit(lambda x, a, b: fake_quant(x, a, b, bits, narrow))(jnp.asarray(x), jnp.float32(lo), jnp.float32(hi))
    np.testing.assert_array_equal(_bits(jitted), _bits(want))


def test_per_channel_forward_is_the_per_channel_kernel_bit_for_bit():
    rng = np.random.default_rng(1)
    for bits, narrow in ((3, True), (8, True), (4, False)):
        lo = -np.abs(rng.standard_normal(16)).astype(np.float32)
        hi = np.abs(rng.standard_normal(16)).astype(np.float32)
        lo[3], hi[3] = 0.0, 0.0  # a degenerate channel gives zeros
        x = (rng.standard_normal((300, 16)) * 1.3).astype(np.float32)
        want = qtool.fake_quant_with_min_max_vars_per_channel(x, lo, hi, bits, narrow)
        # the graph's broadcasting form: [1, C] against [N, C] (a Conv weight uses [C, 1, 1, 1])
        got = jax.jit(lambda x, a, b: fake_quant(x, a, b, bits, narrow))(
            jnp.asarray(x), jnp.asarray(lo[None]), jnp.asarray(hi[None]))
        np.testing.assert_array_equal(_bits(got), _bits(want))
        assert np.all(np.asarray(got)[:, 3] == 0)


def test_the_constant_divisor_is_not_turned_into_a_multiplication():
    """Constant ranges inside jit: XLA would rewrite x / scale into x * (1/scale) without the barrier."""
    lo, hi, bits = -1.0, 1.0, 8
    x = _inputs(np.random.default_rng(5), lo, hi, bits, False, n=20000)
    want = qtool.fake_quant_with_min_max_vars(x, lo, hi, bits, False)
    got = jax.jit(lambda x: fake_quant(x, jnp.float32(lo), jnp.float32(hi), bits, False))(jnp.asarray(x))
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("bits, narrow, lo, hi", RANGES[:8])
def test_per_tensor_gradients_are_the_kernel_gradients(bits, narrow, lo, hi):
    rng = np.random.default_rng(7)
    x = _inputs(rng, lo, hi, bits, narrow)[:-2]
    g = rng.standard_normal(x.shape).astype(np.float32)
    d_x, d_min, d_max = qtool.fake_quant_with_min_max_vars_gradient(g, x, lo, hi, bits, narrow)
    _, vjp = jax.vjp(lambda x, a, b: fake_quant(x, a, b, bits, narrow), jnp.asarray(x), jnp.float32(lo), jnp.float32(hi))
    gx, gmin, gmax = vjp(jnp.asarray(g))
    np.testing.assert_array_equal(_bits(gx), _bits(d_x))  # masked negative g is -0.0 in both
    np.testing.assert_allclose(float(gmin), float(d_min), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(gmax), float(d_max), rtol=1e-5, atol=1e-5)


def _per_channel_case(seed: int):
    """Per-channel ranges for 8 channels (channel 2 is [0, 0]), inputs [200, 8] and an upstream gradient."""
    rng = np.random.default_rng(seed)
    lo = -np.abs(rng.standard_normal(8)).astype(np.float32)
    hi = np.abs(rng.standard_normal(8)).astype(np.float32)
    lo[2], hi[2] = 0.0, 0.0
    x = (rng.standard_normal((200, 8)) * 1.5).astype(np.float32)
    return lo, hi, x, rng.standard_normal(x.shape).astype(np.float32)


def test_per_channel_gradients_are_the_kernel_gradients():
    lo, hi, x, g = _per_channel_case(3)
    d_x, d_min, d_max = qtool.fake_quant_with_min_max_vars_per_channel_gradient(g, x, lo, hi, 4, True)
    _, vjp = jax.vjp(lambda x, a, b: fake_quant(x, a, b, 4, True), jnp.asarray(x), jnp.asarray(lo[None]),
                     jnp.asarray(hi[None]))
    gx, gmin, gmax = vjp(jnp.asarray(g))
    np.testing.assert_array_equal(_bits(gx), _bits(d_x))
    np.testing.assert_allclose(np.asarray(gmin)[0], d_min, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gmax)[0], d_max, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(gx)[:, 2], g[:, 2])  # degenerate channel: d_x = g
    assert np.asarray(gmin)[0, 2] == 0 and np.asarray(gmax)[0, 2] == 0


def _function(x, lo, hi, bits, narrow, half_to_even):
    """onnxruntime running the ``qtool::FakeQuant`` function body (the training graph's)."""
    import onnxruntime as ort

    from qtool.onnx_rewrite.fake_quant_function import fake_quant_model

    model = fake_quant_model([None] * x.ndim, list(np.shape(lo)), num_bits=bits, narrow_range=narrow,
                             half_to_even=half_to_even)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "min": np.asarray(lo, np.float32), "max": np.asarray(hi, np.float32)})[0]


@pytest.mark.parametrize("bits, narrow, lo, hi", RANGES)
def test_half_to_even_forward_is_the_function_body_bit_for_bit(bits, narrow, lo, hi):
    """--round-mode half_to_even (QuantizeLinear's level on TF's grid): JAX == onnxruntime on the ties of the
    grid x / scale = k + 0.5, which TF's FakeQuant rounds up, random values and special values."""
    rng = np.random.default_rng(bits + 17)
    scale = np.float32(qtool.nudged_range(lo, hi, bits, narrow)[2])
    ties = ((rng.integers(-(2**bits), 2**bits, 300) + np.float32(0.5)) * scale).astype(np.float32)
    x = np.concatenate([_inputs(rng, lo, hi, bits, narrow), ties, np.float32([np.nan])])
    got = jax.jit(lambda x, a, b: fake_quant(x, a, b, bits, narrow, True, True))(
        jnp.asarray(x), jnp.float32(lo), jnp.float32(hi))
    np.testing.assert_array_equal(_bits(got), _bits(_function(x, np.float32(lo), np.float32(hi), bits, narrow, True)))
    tf = qtool.fake_quant_with_min_max_vars(x, lo, hi, bits, narrow)
    assert np.count_nonzero(np.asarray(got) != tf) > 0  # the ties really round otherwise


def test_half_to_even_per_channel_forward_and_gradients():
    """Per channel ([1, C] ranges, a [0, 0] channel among them): the forward is the function body's; the
    gradients are TF's straight-through ones, identical to half up's (the mode changes the rounding only)."""
    lo, hi, x, g = _per_channel_case(4)
    args = (jnp.asarray(x), jnp.asarray(lo[None]), jnp.asarray(hi[None]))
    even, vjp_even = jax.vjp(lambda x, a, b: fake_quant(x, a, b, 4, True, True, True), *args)
    _, vjp_up = jax.vjp(lambda x, a, b: fake_quant(x, a, b, 4, True, True, False), *args)
    np.testing.assert_array_equal(_bits(even), _bits(_function(x, lo[None], hi[None], 4, True, True)))
    for a, b in zip(vjp_even(jnp.asarray(g)), vjp_up(jnp.asarray(g))):
        np.testing.assert_array_equal(_bits(a), _bits(b))


def test_range_grad_off_gives_zero_range_gradients():
    x = jnp.linspace(-3, 3, 50, dtype=jnp.float32)
    _, vjp = jax.vjp(lambda a, b: fake_quant(x, a, b, 4, False, False), jnp.float32(-1), jnp.float32(1))
    gmin, gmax = vjp(jnp.ones(50, jnp.float32))
    assert float(gmin) == 0 and float(gmax) == 0


def test_gradients_match_finite_differences_where_the_ste_is_the_identity(graphs):
    """With fake quantization off (every quantizer the identity, which is what the STE passes inside
    the range), directional derivatives of the sample training graph match central finite
    differences: the training batch-norm fold's output (frozen, batch statistics computed and
    cancelled) with respect to the conv weight, its bias, the BN scale and shift; the logits with
    respect to the classifier. (Between them a Relu and a MaxPool make finite differences noisy.)"""
    import onnx

    interp = Interpreter(onnx.load(graphs["w3a3"]))
    x = jnp.asarray(np.load(CALIB)["input"][:8])
    rng = np.random.default_rng(0)
    checks = [("/bn2/BatchNormalization_output_0", ["conv2.weight", "conv2.bias", "bn2.weight", "bn2.bias"]),
              ("logits", ["fc.weight", "fc.bias"])]
    for out_name, names in checks:
        params = {n: jnp.asarray(interp.initializers[n]) for n in names}
        probe = None

        def loss(params):
            out = interp.run({**params, "input": x, "qtool_step": jnp.int32(0)}, fake_quant=False,
                             outputs=[out_name])[out_name]
            return jnp.sum(out * probe)

        shape = jax.eval_shape(lambda x: interp.run({"input": x, "qtool_step": jnp.int32(0)}, outputs=[out_name])[out_name],
                               x).shape
        probe = jnp.asarray(rng.standard_normal(shape).astype(np.float32))
        grads = jax.jit(jax.grad(loss))(params)
        loss_at = jax.jit(loss)
        for name in names:
            d = jnp.asarray(rng.standard_normal(params[name].shape).astype(np.float32))
            analytic = float(jnp.sum(grads[name] * d))
            eps = 1e-2
            numeric = (float(loss_at({**params, name: params[name] + eps * d}))
                       - float(loss_at({**params, name: params[name] - eps * d}))) / (2 * eps)
            assert abs(numeric - analytic) <= 2e-3 * max(1.0, abs(analytic)), (out_name, name, numeric, analytic)


def test_a_trained_range_gives_the_activations_no_gradient_through_its_moving_average(tmp_path):
    """TF's moving-average range is an ``AssignSub`` to a variable (not differentiable): the activations get
    the straight-through gradient only. The graph computes ``min - (min - batch_min) * decay``, and JAX
    differentiated through ``batch_min`` into the activation; the gradient now stops at the batch range, so
    the input's gradient is the same whether the ranges are trained or not, while the trained ranges
    themselves still get theirs."""
    from model_builders import Builder, x_data

    from qtool.config import TrainSchedule
    from qtool.finetune.config import FinetuneConfig
    from qtool.finetune.train import _initial_values, _moving_average_inputs, _open_graph

    b = Builder(opset=13, constants=True, named=False)
    y = b.node("Relu", [b.conv(b.input("x", ["N", 3, 6, 6]), 3, 4)])
    path = tmp_path / "t.qat.onnx"
    qtool.rewrite_train(b.proto([b.conv(y, 4, 2)]), path, calibration_data={"x": x_data(8, 3, 6, 6)},
                        schedule=TrainSchedule(0, 0))
    graph = _open_graph(path, FinetuneConfig(steps=1), [])
    params, state, _ = _initial_values(graph)
    roles, interp = graph.roles, graph.interp
    (data_input,) = [n for n in interp.data_inputs if n not in (roles.step_input, roles.range_update)]
    stops = _moving_average_inputs(interp, roles)
    assert len(stops) == 2 * len(set(roles.ranges))  # one batch min and one batch max per quantizer
    weights = tuple(p + "/" for p in roles.weight_prefixes)
    moving = {} if roles.range_update is None else {roles.range_update: jnp.float32(1.0)}

    def loss(feed, x, ranges_trained, no_grad):
        run = interp.run({**state, **feed, **moving, data_input: x, roles.step_input: jnp.int32(100)},
                         range_grad=(lambda n: not n.startswith(weights)) if ranges_trained else (lambda n: False),
                         no_grad=no_grad)
        return jnp.sum(run[roles.data_outputs[0]] ** 2)

    x = jnp.asarray(x_data(4, 3, 6, 6) * 3)  # beyond the calibrated ranges: the ranges get a gradient
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=(2, 3))
    g_ranges, g_x = grad(params, x, True, stops)
    g_x_plain = grad(params, x, False, frozenset())[1]
    g_x_leaky = grad(params, x, True, frozenset())[1]
    np.testing.assert_array_equal(np.asarray(g_x), np.asarray(g_x_plain))
    assert not np.array_equal(np.asarray(g_x_leaky), np.asarray(g_x_plain))  # what the stop removes
    assert any(float(jnp.abs(g_ranges[lo]) + jnp.abs(g_ranges[hi])) > 0 for lo, hi in roles.ranges)
