"""The training step compiled in segments (qtool.finetune.segmented), with Adam over the parameters raveled into
one vector, trains as the step compiled as one program with Adam per tensor (as it was): the same losses and,
after a few steps, the same parameters and state (up to the order of float sums and XLA's fused multiply-adds)."""

import numpy as np
import optax
import pytest
from onnx import TensorProto, helper, numpy_helper

from qtool.api import rewrite_train
from qtool.config import TrainSchedule
from qtool.finetune import segmented
from qtool.finetune import train as T
from qtool.finetune.config import FinetuneConfig

STEPS = 4


def _model():
    """x -> the same square weight twice (a weight read by two segments) -> MatMul."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), n)
             for n, s in (("sq", (8, 8)), ("w", (8, 4)))]
    nodes = [helper.make_node("MatMul", ["x", "sq"], ["a"]), helper.make_node("Relu", ["a"], ["h"]),
             helper.make_node("MatMul", ["h", "sq"], ["b"]), helper.make_node("Relu", ["b"], ["h2"]),
             helper.make_node("MatMul", ["h2", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    path = tmp_path_factory.mktemp("segmented") / "q.onnx"
    x = np.random.default_rng(1).standard_normal((32, 8)).astype(np.float32)
    rewrite_train(_model(), str(path), calibration_data={"x": x}, schedule=TrainSchedule(freeze_bn_delay=0))
    return str(path), {"x": x}


def _per_tensor_adam():
    return optax.apply_if_finite(optax.scale_by_adam(), max_consecutive_errors=T.MAX_SKIPPED)


def _trained(training, segment_nodes, monkeypatch):
    monkeypatch.setattr(segmented, "SEGMENT_NODES", segment_nodes)
    model, data = training
    config = FinetuneConfig(steps=STEPS, batch_size=8).normalized()
    graph = T._open_graph(model, config, [])
    train, _, _ = T._open_data(data, config, graph)
    run = T._build_run(graph, config, 0, train.fixed)
    batches = T._Batches(train, 8, np.random.default_rng(0))
    hyper = T._schedule(1e-2, STEPS, 0, "cosine")
    params, state, opt_state, losses = run.params0, run.state0, run.opt_state, []
    for step in range(STEPS):
        params, state, opt_state, loss = T._step(run, params, state, opt_state, batches, step, hyper)
        losses.append(float(loss))
    return len(segmented.split(graph.interp.nodes)), losses, T._host(params), T._host(state), T._host(run.params0)


def test_the_segmented_step_trains_as_one_program(training, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(T, "_optimizer", _per_tensor_adam)
        one, losses, params, state, start = _trained(training, 0, monkeypatch)
    many, seg_losses, seg_params, seg_state, _ = _trained(training, 20, monkeypatch)
    assert one == 1 and many >= 3
    np.testing.assert_allclose(seg_losses, losses, rtol=1e-6)
    assert params.keys() == seg_params.keys() and state.keys() == seg_state.keys()
    for name, value in {**params, **state}.items():
        got = {**seg_params, **seg_state}[name]
        np.testing.assert_allclose(got, value, rtol=0, atol=1e-6 * max(1.0, float(np.max(np.abs(value)))),
                                   err_msg=name)
    assert all(not np.array_equal(params[n], start[n]) for n in ("sq", "w"))  # it trained


def _validator(model, data, batch_size, segment_nodes, monkeypatch):
    monkeypatch.setattr(segmented, "SEGMENT_NODES", segment_nodes)
    config = FinetuneConfig(steps=STEPS, batch_size=batch_size).normalized()
    graph = T._open_graph(model, config, [])
    train, val, _ = T._open_data(data, config, graph)
    run = T._build_run(graph, config, 0, train.fixed)
    return T._build_validator(run, val, batch_size), run, len(segmented.split(graph.interp.nodes))


def test_the_segmented_teacher_and_validation_compute_as_one_program(training, monkeypatch):
    """The teacher's outputs and the validation's quantized outputs and metric, run in segments (forward only),
    equal one program's."""
    one, run, n_one = _validator(*training, 8, 0, monkeypatch)
    many, _, n_many = _validator(*training, 8, 20, monkeypatch)
    assert n_one == 1 and n_many >= 3 and one.eval_batch == many.eval_batch == 8
    for t_one, t_many in zip(one.teacher_cache, many.teacher_cache, strict=True):
        np.testing.assert_allclose(t_many, t_one, rtol=1e-6, atol=1e-7)
    params = {n: v * 1.01 for n, v in run.params0.items()}  # not the teacher's: a finite SQNR
    for (_, batch), _ in zip(one.batches(), range(2)):
        np.testing.assert_allclose(many.eval_outputs(params, run.state0, batch),
                                   one.eval_outputs(params, run.state0, batch), rtol=1e-6, atol=1e-7)
    assert np.isfinite(one.metric(params, run.state0))
    np.testing.assert_allclose(many.metric(params, run.state0), one.metric(params, run.state0), rtol=1e-6)


def _conv_bn_model():
    """x -> Conv -> BatchNormalization -> Relu -> MatMul: a layer whose batch norm training folds."""
    rng = np.random.default_rng(2)
    arrays = {"w": rng.standard_normal((4, 1, 3, 3)) * 0.5, "gamma": rng.uniform(0.5, 1.5, 4),
              "beta": rng.standard_normal(4) * 0.1, "mean": rng.standard_normal(4) * 0.1,
              "var": rng.uniform(0.5, 1.5, 4), "fc": rng.standard_normal((64, 3)) * 0.2,
              "shape": np.array([0, -1])}
    inits = [numpy_helper.from_array(v.astype(np.int64 if n == "shape" else np.float32), n) for n, v in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["b"]),
             helper.make_node("Relu", ["b"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("freeze_bn_delay", [0, None])
def test_validation_runs_in_training_batches_its_metric_unchanged_where_batch_norms_are_frozen(
        freeze_bn_delay, tmp_path, monkeypatch):
    """Validation runs in batches of at most the training batch size (its memory a training batch's). Where the
    batch norms are frozen each sample is computed alone: the metric is the one of a single batch of every sample
    (as validation ran before). Where they never freeze, the validation normalizes over batches of the training
    batch size, as training does: the metric depends on that batch."""
    path = str(tmp_path / "bn.qat.onnx")
    x = np.random.default_rng(3).standard_normal((40, 1, 4, 4)).astype(np.float32)
    rewrite_train(_conv_bn_model(), path, calibration_data={"x": x},
                  schedule=TrainSchedule(freeze_bn_delay=freeze_bn_delay))
    small, run, _ = _validator(path, {"x": x}, 4, 0, monkeypatch)
    whole, _, _ = _validator(path, {"x": x}, 40, 0, monkeypatch)
    assert (small.eval_batch, whole.eval_batch) == (4, 40)
    params = {n: v * 1.01 for n, v in run.params0.items()}
    metrics = small.metric(params, run.state0), whole.metric(params, run.state0)
    if freeze_bn_delay is None:
        assert abs(metrics[0] - metrics[1]) > 0.1, metrics
    else:
        np.testing.assert_allclose(*metrics, rtol=1e-6)
