"""qtool::FakeQuantBias in JAX: bit for bit the ONNX function (run by onnxruntime) and the eval graph's
int32 bias; straight-through gradient (identity for the bias, zero for the scale)."""

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from qtool.finetune.fake_quant import fake_quant_bias
from qtool.onnx_rewrite.fake_quant_function import BIAS_NAME, DOMAIN, DOMAIN_VERSION, bias_function_proto


def _ort_bias(b: np.ndarray, scale: np.ndarray, saturate: bool) -> np.ndarray:
    f = TensorProto.FLOAT
    node = helper.make_node(BIAS_NAME, ["b", "scale"], ["y"], domain=DOMAIN, saturate=int(saturate))
    graph = helper.make_graph([node], "bias", [helper.make_tensor_value_info("b", f, list(b.shape)),
                                              helper.make_tensor_value_info("scale", f, list(scale.shape))],
                              [helper.make_tensor_value_info("y", f, list(b.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
                              functions=[bias_function_proto(13)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"b": b, "scale": scale})[0]


def _case(rng, n=2000):
    scale = (rng.uniform(0.5, 2.0, n) * 10.0 ** rng.integers(-9, 0, n)).astype(np.float32)
    b = (rng.normal(0, 1, n) * 10.0 ** rng.integers(-4, 2, n)).astype(np.float32)
    # exact ties (k + 0.5) * scale where float32 holds them, and values beyond int32 at tiny scales
    k = rng.integers(-40, 40, n // 4).astype(np.float32)
    b[: n // 4] = ((k + np.float32(0.5)) * np.float32(0.25)).astype(np.float32)
    scale[: n // 4] = np.float32(0.25)
    b[-10:] = np.float32(5.0)
    scale[-10:] = np.float32(1e-9)  # 5e9 levels: saturated to 2**31 when asked
    return b, scale


@pytest.mark.parametrize("saturate", [True, False])
def test_forward_is_the_onnx_function_and_the_int32_encoding_bit_for_bit(saturate):
    rng = np.random.default_rng(13)
    b, scale = _case(rng)
    ours = np.asarray(jax.jit(lambda b, s: fake_quant_bias(b, s, saturate))(jnp.asarray(b), jnp.asarray(scale)))
    ref = _ort_bias(b, scale, saturate)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
    # the eval graph's encoding: int32 q = rint(float32(b / scale)), read back as float32(q) * scale
    q = np.rint(b / scale).astype(np.float64)
    if saturate:
        q = np.clip(q, -np.iinfo(np.int32).max, np.iinfo(np.int32).max)
        deployed = (q.astype(np.int32).astype(np.float32) * scale).astype(np.float32)
        assert np.array_equal(ours.view(np.uint32), deployed.view(np.uint32))
        assert np.all(ours[-10:] == np.float32(2.0**31) * np.float32(1e-9))
    ties = slice(0, 500)
    assert np.all(np.abs(ours[ties] / np.float32(0.25)) % 2 == 0)  # half to even on exact ties


def test_a_zero_or_infinite_scale_leaves_the_whole_bias_in_float():
    b = np.float32([0.3, -1.7, 2.26])
    for bad in (0.0, np.inf, np.nan):
        scale = np.float32([0.5, bad, 0.5])
        out = np.asarray(fake_quant_bias(jnp.asarray(b), jnp.asarray(scale), True))
        assert np.array_equal(out, b)
        assert np.array_equal(_ort_bias(b, scale, True), b)
    per_tensor = np.asarray(fake_quant_bias(jnp.asarray(b), jnp.float32(0.5), True))
    assert np.array_equal(per_tensor, np.float32([0.5, -1.5, 2.5]))


def test_gradient_is_straight_through():
    b = jnp.asarray(np.float32([0.3, -1.7, 2.26, 0.01]))
    scale = jnp.asarray(np.float32([0.5, 0.25, 0.1, 1.0]))
    g = jnp.asarray(np.float32([1.0, -2.0, 3.0, 0.5]))
    db, ds = jax.grad(lambda b, s: jnp.sum(fake_quant_bias(b, s, True) * g), argnums=(0, 1))(b, scale)
    assert np.array_equal(np.asarray(db), np.asarray(g))
    assert np.array_equal(np.asarray(ds), np.zeros(4, np.float32))
    # a per-tensor scale broadcast against the bias: its gradient keeps its shape
    db, ds = jax.grad(lambda b, s: jnp.sum(fake_quant_bias(b, s, True) * g), argnums=(0, 1))(b, jnp.float32(0.5))
    assert np.array_equal(np.asarray(db), np.asarray(g)) and np.shape(ds) == ()
