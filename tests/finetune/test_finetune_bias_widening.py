"""A training graph that widens a weight range for its bias (a batch norm's dead channel, ``widen_weight`` in the
contract) runs in the JAX interpreter as in onnxruntime, keeps the weight quantizer's straight-through gradient,
trains, and deploys as trained (tests/onnx_rewrite/test_train_bias_widening.py for the rewrites)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from finetune_helpers import exact_report
from model_builders import DEAD_BIAS, DEAD_CHANNEL, dead_channel_model
from onnx import numpy_helper

import qtool
from qtool.api import finetune
from qtool.config import QuantConfig, TrainSchedule
from qtool.finetune.config import FinetuneConfig

GAMMA = np.array([1.1, -5e-5, 0.9, 1.2], np.float32)
VAR = np.array([1.5, 3e-11, 0.8, 2.0], np.float32)


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """The dead-channel model's training graph (half to even: the deployed model's rounding), its calibration
    inputs, and its folder."""
    folder = tmp_path_factory.mktemp("widening")
    proto, feeds = dead_channel_model()
    path = folder / "dead.qat.onnx"
    qtool.rewrite_train(proto, path, calibration_data=feeds, quant=QuantConfig(round_mode="half_to_even"),
                        schedule=TrainSchedule(freeze_bn_delay=0))
    contract = json.loads({p.key: p.value for p in onnx.load(str(path)).metadata_props}["qtool.training"])
    assert [q["layer"] for q in contract["bias_quantizers"] if q.get("widen_weight")] == ["c1"]
    np.savez(folder / "feeds.npz", **feeds, qtool_range_update=np.float32(0))
    return path, feeds, folder


def test_jax_runs_the_widening_as_onnxruntime(graph):
    path, _, folder = graph
    report = exact_report(path, folder / "feeds.npz", [0, 10])
    for step in ("0", "10"):
        assert report[step]["h"]["equal"] and report[step]["y"]["equal"], report[step]


def test_the_widened_weight_keeps_the_straight_through_gradient(graph):
    """d/dw of a loss on the weight FakeQuant's output is the STE's: the identity through the quantizer (every
    weight is inside its widened range) times the fold's gamma / sigma, for the dead channel as for the others; and
    the bias, which the widening reads, gets nothing from it (a weight range has no gradient)."""
    from qtool.finetune.train import _initial_values, _open_graph

    path, feeds, _ = graph
    g = _open_graph(path, FinetuneConfig(steps=1), [])
    params, state, _ = _initial_values(g)
    roles, interp = g.roles, g.interp
    contract = json.loads({p.key: p.value for p in onnx.load(str(path)).metadata_props}["qtool.training"])
    (fq_out,) = [q["output"] for q in contract["weight_quantizers"] if q["layers"] == ["c1"]]
    weights = tuple(p + "/" for p in roles.weight_prefixes)
    r = jnp.asarray(np.random.default_rng(2).standard_normal((4, 3, 3, 3)).astype(np.float32))

    def loss(p):
        out = interp.run({**state, **p, "x": jnp.asarray(feeds["x"]), roles.step_input: jnp.int32(10)},
                         range_grad=lambda n: not n.startswith(weights), outputs=[fq_out])
        return jnp.sum(out[fq_out] * r)

    grads = jax.jit(jax.grad(loss))({k: params[k] for k in ("c1.weight", "bn1.bias", "bn1.weight")})
    ste = np.asarray(r) * (GAMMA / np.sqrt(VAR + np.float32(1e-3)))[:, None, None, None]
    np.testing.assert_allclose(np.asarray(grads["c1.weight"]), ste, rtol=1e-5)
    assert np.all(np.asarray(grads["c1.weight"])[DEAD_CHANNEL] != 0)
    np.testing.assert_array_equal(np.asarray(grads["bn1.bias"]), 0)


def test_a_finetuned_widened_graph_deploys_as_trained(graph):
    """finetune trains the graph (2 steps) and writes it back; rewrite-eval of the tuned file widens from the tuned
    values: the tuned graph with its ranges held computes the deployed model's outputs bit for bit, and the dead
    channel keeps its bias."""
    path, feeds, folder = graph
    tuned, deployed = folder / "tuned.onnx", folder / "tuned.qdq.onnx"
    np.savez(folder / "data.npz", **feeds)
    result = finetune(str(path), str(folder / "data.npz"), str(tuned),
                            FinetuneConfig(steps=2, batch_size=4, learning_rate=1e-3, keep_best=False))
    assert result.steps_run == 2
    before = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tuned)).graph.initializer}
    assert not np.array_equal(before["bn1.bias"], after["bn1.bias"])  # it trained
    qtool.rewrite_eval(str(tuned), str(deployed))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    held = ort.InferenceSession(str(tuned), options, providers=["CPUExecutionProvider"]).run(
        ["h", "y"], {**feeds, "qtool_step": np.array(10, np.int64), "qtool_range_update": np.array(0, np.float32)})
    out = ort.InferenceSession(str(deployed), options, providers=["CPUExecutionProvider"]).run(["h", "y"], feeds)
    for t, d in zip(held, out):
        assert np.array_equal(t.view(np.uint32), d.view(np.uint32))
    np.testing.assert_allclose(out[0][:, DEAD_CHANNEL], DEAD_BIAS, atol=0.05)
