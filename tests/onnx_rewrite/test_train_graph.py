"""The training graph (spec/rewrites.md sections 3-5) on small exporter-style models."""

import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from model_builders import Builder, run, x_data
from onnx import helper

from qtool.errors import QtoolError
from qtool.kernels import fake_quant_with_min_max_vars, fake_quant_with_min_max_vars_per_channel
from qtool.api import rewrite_eval
from qtool.onnx_rewrite.fake_quant_function import DOMAIN, NAME
from qtool.api import rewrite_train
from qtool.config import QuantConfig, TrainSchedule

F32 = np.float32


def proto(result) -> onnx.ModelProto:
    return ir.serde.serialize_model(result.model)


def contract_of(model: onnx.ModelProto) -> dict:
    return json.loads({p.key: p.value for p in model.metadata_props}["qtool.training"])


def session(model: onnx.ModelProto):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def initial_state(model: onnx.ModelProto) -> dict:
    names = set(contract_of(model)["state"])
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name in names}


def run_step(sess, model, feeds, step, state=None) -> dict:
    state = initial_state(model) if state is None else state
    names = [o.name for o in sess.get_outputs()]
    out = sess.run(None, {**feeds, "qtool_step": np.array(step, np.int64), **state})
    return dict(zip(names, out))


def next_state(model, results) -> dict:
    return {k: results[v] for k, v in contract_of(model)["state"].items()}


def fake_quant_off(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph with qtool::FakeQuant as the identity."""
    off = onnx.ModelProto()
    off.CopyFrom(model)
    for fn in off.functions:
        if fn.domain == DOMAIN and fn.name == NAME:
            del fn.node[:]
            fn.node.append(helper.make_node("Identity", ["x"], ["y"]))
    return off


def conv2d(x, w, b=None, pad=1):
    """float64 NCHW convolution, stride 1."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k = w.shape[-1]
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))  # N,C,H,W,k,k
    y = np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64))
    if b is not None:
        y = y + b.astype(np.float64)[None, :, None, None]
    return y


def conv_bn_model(bias=True, relu=False):
    b = Builder(opset=13, constants=True)
    x = b.input("x", ["N", 3, 6, 6])
    y = b.conv(x, 3, 4, name="/c/Conv", bias=bias)
    y = b.bn(y, 4, name="/bn/BatchNormalization")
    if relu:
        y = b.node("Relu", [y])
    return b.proto([y])


def bn_params(model: onnx.ModelProto):
    """w, b, gamma, beta, mean, var of the first Conv+BN, from Constant nodes."""
    consts = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node if n.op_type == "Constant"}
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    w = consts[conv.input[1]]
    b = consts[conv.input[2]] if len(conv.input) > 2 else np.zeros(w.shape[0], F32)
    gamma, beta, mean, var = (consts[i] for i in bn.input[1:5])
    return w, b, gamma, beta, mean, var


# --- quant delay -------------------------------------------------------------------------------------------
def test_quant_delay_before_equals_fake_quant_off_after_differs_by_quantization_noise():
    model = conv_bn_model(relu=True)
    x = {"x": x_data(8, 3, 6, 6)}
    # calibrated initial ranges: the difference is rounding, not clipping at TF's default (0, 6)
    train = proto(rewrite_train(model, calibration_data=x, schedule=TrainSchedule(quant_delay=10, freeze_bn_delay=3)))
    on, off = session(train), session(fake_quant_off(train))
    for step in (0, 9):  # both sides of freeze_bn_delay, before quant_delay: identical, bit for bit
        a, b = run_step(on, train, x, step), run_step(off, train, x, step)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"step {step} output {name}")
    for step in (10, 50):
        a, b = run_step(on, train, x, step), run_step(off, train, x, step)
        y_q, y_f = a[train.graph.output[0].name], b[train.graph.output[0].name]
        assert not np.array_equal(y_q, y_f)
        step_size = (y_f.max() - min(y_f.min(), 0)) / 255
        assert np.max(np.abs(y_q - y_f)) < 6 * step_size  # weight + activation rounding, a few steps at most


def test_without_batch_norm_the_graph_before_quant_delay_is_the_float_model():
    b = Builder(opset=13)
    x = b.input("x", ["N", 6])
    h = b.node("Relu", [b.gemm(x, 6, 8, name="fc1")])
    y = b.gemm(h, 8, 3, trans_b=0, name="fc2")
    model = b.proto([y])
    train = proto(rewrite_train(model, schedule=TrainSchedule(quant_delay=4)))
    feeds = {"x": x_data(5, 6)}
    ref = session(model).run(None, feeds)[0]
    out = run_step(session(train), train, feeds, 3)[y]
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    assert not np.allclose(run_step(session(train), train, feeds, 4)[y], ref, rtol=1e-6, atol=1e-6)


# --- exact encoding: input, weight and output quantizers with the EMA ----------------------------------------
def act_range(t, symmetric, bits=8):
    """TF's MovingAvgQuantize batch range: widened to 0, or symmetric (no narrow range)."""
    lo, hi = F32(t.min()), F32(t.max())
    if symmetric:
        r = F32(-((2**bits) - 2) / 2**bits)
        return F32(min(lo, F32(hi / r))), F32(max(hi, F32(lo * r)))
    return F32(min(lo, F32(0))), F32(max(hi, F32(0)))


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("per_channel", [True, False])
def test_gemm_graph_equals_the_kernels_step_by_step(symmetric, per_channel):
    b = Builder(opset=13)
    x = b.input("x", ["N", 6])
    y = b.gemm(x, 6, 5, trans_b=1, name="fc")
    model = b.proto([y])
    train_ir = rewrite_train(model, quant=QuantConfig(symmetric=symmetric, per_channel=per_channel, weight_bits=4,
                                                      symmetric_weights=symmetric)).model
    contract = json.loads(train_ir.metadata_props["qtool.training"])
    wq = contract["weight_quantizers"][0]
    # expose the quantized weight for the check
    value = next(o for n in train_ir.graph for o in n.outputs if o.name == wq["output"])
    value.shape = ir.Shape([5, 6])
    train_ir.graph.outputs.append(value)
    train = ir.serde.serialize_model(train_ir)
    sess = session(train)
    w = onnx.numpy_helper.to_array(next(t for t in train.graph.initializer if t.name == wq["input"]))
    bias = onnx.numpy_helper.to_array(next(t for t in train.graph.initializer if t.name != wq["input"]
                                          and t.dims == [5]))
    state = initial_state(train)
    decay = F32(1.0 - 0.999)
    acts = {a["kind"]: a for a in contract["activation_quantizers"]}
    assert set(acts) == {"input_quant", "act_quant"}
    xin = acts["input_quant"]
    for step in range(3):
        feeds = {"x": x_data(7, 6) * F32(3 + step)}
        res = run_step(sess, train, feeds, step, state)
        # input range: EMA of the batch range widened to 0, exactly TF's assign_moving_average
        lo, hi = act_range(feeds["x"], symmetric)
        m0, M0 = state[xin["min"]], state[xin["max"]]
        new_lo = F32(m0 - F32(F32(m0 - lo) * decay))
        new_hi = F32(M0 - F32(F32(M0 - hi) * decay))
        assert res[xin["min"] + ":updated"].tobytes() == np.asarray(new_lo, F32).tobytes()
        assert res[xin["max"] + ":updated"].tobytes() == np.asarray(new_hi, F32).tobytes()
        # weights: last-value range, narrow, symmetric or widened to 0
        axis = 1 if per_channel else None
        wlo = w.min(axis=axis) if axis else F32(w.min())
        whi = w.max(axis=axis) if axis else F32(w.max())
        if symmetric:
            wlo, whi = np.minimum(wlo, whi / F32(-1)), np.maximum(whi, wlo * F32(-1))
        else:
            wlo, whi = np.minimum(wlo, F32(0)), np.maximum(whi, F32(0))
        if per_channel:
            w_ref = fake_quant_with_min_max_vars_per_channel(np.ascontiguousarray(w.T), wlo, whi, 4, True).T
        else:
            w_ref = fake_quant_with_min_max_vars(w, wlo, whi, 4, True)
        np.testing.assert_array_equal(res[wq["output"]].view(np.uint32), w_ref.view(np.uint32))
        x_ref = fake_quant_with_min_max_vars(feeds["x"], new_lo, new_hi, 8, False)
        y_float = (x_ref @ w_ref.T + bias).astype(F32)
        out = acts["act_quant"]
        b_lo, b_hi = act_range(y_float, symmetric)
        o_lo = F32(state[out["min"]] - F32(F32(state[out["min"]] - b_lo) * decay))
        o_hi = F32(state[out["max"]] - F32(F32(state[out["max"]] - b_hi) * decay))
        np.testing.assert_allclose(res[out["min"] + ":updated"], o_lo, rtol=1e-6)
        np.testing.assert_allclose(res[out["max"] + ":updated"], o_hi, rtol=1e-6)
        y_ref = fake_quant_with_min_max_vars(y_float, o_lo, o_hi, 8, False)
        # the matmul's float rounding may move a value across a rounding boundary: one step at most
        assert np.max(np.abs(res[y] - y_ref)) <= (o_hi - o_lo) / 255 * 1.01
        state = next_state(train, res)


# --- batch norm folding for training ---------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_bn_before_freeze_uses_batch_statistics_and_updates_moving_statistics(bias):
    model = conv_bn_model(bias=bias)
    w, b, gamma, beta, mean, var = bn_params(model)
    train = proto(rewrite_train(model, schedule=TrainSchedule(quant_delay=1000, freeze_bn_delay=5)))
    contract = contract_of(train)
    bnc = contract["batch_norms"][0]
    sess = session(train)
    x = x_data(6, 3, 6, 6)
    res = run_step(sess, train, {"x": x}, 0)
    # numpy reference: Conv + BatchNormalization in training mode (population variance)
    y = conv2d(x, w, b)
    mu = y.mean(axis=(0, 2, 3))
    vb = y.var(axis=(0, 2, 3))
    ref = gamma[None, :, None, None] * (y - mu[None, :, None, None]) / np.sqrt(vb + 1e-5)[None, :, None, None] \
        + beta[None, :, None, None]
    out = res[train.graph.output[0].name]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(res[bnc["moving_mean"] + ":updated"], 0.9 * mean + 0.1 * mu, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res[bnc["moving_variance"] + ":updated"], 0.9 * var + 0.1 * vb, rtol=1e-5, atol=1e-5)
    # the next step starts from the updated statistics
    state = next_state(train, res)
    res2 = run_step(sess, train, {"x": x}, 1, state)
    np.testing.assert_allclose(res2[bnc["moving_mean"] + ":updated"], 0.9 * (0.9 * mean + 0.1 * mu) + 0.1 * mu,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_bn_after_freeze_equals_the_eval_fold_and_statistics_stay_fixed(bias):
    model = conv_bn_model(bias=bias)
    w, b, gamma, beta, mean, var = bn_params(model)
    train = proto(rewrite_train(model, schedule=TrainSchedule(quant_delay=1000, freeze_bn_delay=5)))
    bnc = contract_of(train)["batch_norms"][0]
    sess = session(train)
    x = x_data(6, 3, 6, 6)
    state = initial_state(train)
    state[bnc["moving_mean"]] = (mean + F32(0.05)).astype(F32)  # trained statistics
    state[bnc["moving_variance"]] = (var * F32(1.3)).astype(F32)
    res = run_step(sess, train, {"x": x}, 5, state)
    s = gamma.astype(np.float64) / np.sqrt(state[bnc["moving_variance"]].astype(np.float64) + np.float64(F32(1e-5)))
    ref = conv2d(x, w * s[:, None, None, None], (b - state[bnc["moving_mean"]]) * s + beta)
    np.testing.assert_allclose(res[train.graph.output[0].name], ref, rtol=1e-4, atol=1e-4)
    for key in ("moving_mean", "moving_variance"):
        assert res[bnc[key] + ":updated"].tobytes() == state[bnc[key]].tobytes()
    # and rewrite-eval of that graph is the eval fold of the trained statistics
    trained = onnx.ModelProto()
    trained.CopyFrom(train)
    for t in trained.graph.initializer:
        if t.name in state:
            t.CopyFrom(onnx.numpy_helper.from_array(state[t.name], t.name))
    eval_model = rewrite_eval(trained, quant=QuantConfig(weight_bits=16, activation_bits=16)).model
    assert not any(n.domain == DOMAIN for n in eval_model.graph)
    folded = [n for n in eval_model.graph if n.op_type == "BatchNormalization"]
    assert folded == []


@pytest.mark.parametrize("kind", ["gemm", "matmul_add"])
def test_bn_training_fold_for_dense_layers(kind):
    b = Builder(opset=13)
    x = b.input("x", ["N", 6])
    if kind == "gemm":
        y = b.gemm(x, 6, 4, name="fc")
    else:
        y = b.matmul(x, 6, 4, bias=True, name="fc")
    y = b.bn(y, 4, name="bn")
    model = b.proto([y])
    train = proto(rewrite_train(model, schedule=TrainSchedule(quant_delay=1000, freeze_bn_delay=2)))
    onnx.checker.check_model(train, full_check=True)
    xs = x_data(9, 6)
    float_ref = session(model).run(None, {"x": xs})[0]  # inference BN: moving statistics
    sess = session(train)
    frozen = run_step(sess, train, {"x": xs}, 2)[y]
    np.testing.assert_allclose(frozen, float_ref, rtol=1e-4, atol=1e-4)
    batch = run_step(sess, train, {"x": xs}, 0)[y]
    # batch statistics: every channel of the output has mean beta and (population) std ~gamma
    bnode = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    gamma, beta = inits[bnode.input[1]], inits[bnode.input[2]]
    np.testing.assert_allclose(batch.mean(axis=0), beta, atol=1e-4)
    np.testing.assert_allclose(batch.std(axis=0), np.abs(gamma), rtol=1e-3)


# --- the graph is valid for every layer kind and runs on both sides of both delays -------------------------
def layer_zoo():
    b = Builder(opset=11, constants=True, named=False)
    x = b.input("x", ["N", 4, 6, 6])
    y = b.node("Relu", [b.bn(b.conv(x, 4, 4, group=4), 4)])              # depthwise + BN
    y2 = b.bn(b.conv(y, 4, 6, bias=False), 6)                              # conv + BN, no bias
    y3 = b.node("Relu", [b.node("Add", [y2, b.conv(y, 4, 6)])])             # bypass
    y4 = b.conv_transpose(y3, 6, 4)                                         # ConvTranspose
    y5 = b.bn(y4, 4)
    p = b.node("GlobalAveragePool", [y5])
    f = b.node("Flatten", [p])
    out = b.matmul(b.node("Relu", [b.gemm(f, 4, 8, trans_b=0)]), 8, 3, bias=True)
    return b.proto([out]), out


@pytest.mark.parametrize("options", [
    {},
    {"per_channel": False, "symmetric": True},
    {"weight_bits": 4, "activation_bits": 16},
])
def test_training_graph_passes_the_checker_and_runs_across_both_delays(options):
    model, out = layer_zoo()
    result = rewrite_train(model, quant=QuantConfig(**options), schedule=TrainSchedule(quant_delay=3, freeze_bn_delay=6))
    train = proto(result)
    onnx.checker.check_model(train, full_check=True)
    assert result.summary["counts"]["batch_norms_folded"] == 3
    assert result.summary["counts"]["layers_quantized"] == 6
    sess = session(train)
    state = initial_state(train)
    xs = x_data(4, 4, 6, 6)
    seen = {}
    for step in (0, 3, 6, 9):
        res = run_step(sess, train, {"x": xs}, step, state)
        assert np.all(np.isfinite(res[out])) and res[out].shape == (4, 3)
        seen[step] = res
        state = next_state(train, res)
    mm = [k for k in contract_of(train)["state"] if k.endswith("moving_mean")]
    assert not np.array_equal(seen[0][mm[0] + ":updated"], initial_state(train)[mm[0]])
    assert seen[9][mm[0] + ":updated"].tobytes() == seen[6][mm[0] + ":updated"].tobytes()


def test_per_channel_weight_ranges_broadcast_along_the_output_channel_axis():
    model, _ = layer_zoo()
    train = proto(rewrite_train(model))
    inferred = onnx.shape_inference.infer_shapes(train)
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in inferred.graph.value_info}
    weights = contract_of(train)["weight_quantizers"]
    fq = {n.output[0]: n for n in train.graph.node if n.domain == DOMAIN}
    seen = {}
    for wq in weights:
        node = next(n for n in fq.values() if n.name == wq["quantizer"] + "/FakeQuant")
        seen[wq["op"], wq["axis"]] = dims[node.input[1]]
    assert seen[("Conv", 0)] in ([4, 1, 1, 1], [6, 1, 1, 1])
    assert seen[("ConvTranspose", 1)] == [1, 4, 1, 1]
    assert seen[("Gemm", 1)] == [1, 8]  # transB=0: [K, N]
    assert seen[("MatMul", 1)] == [1, 3]


# --- idempotence and foreign training state ----------------------------------------------------------------------
def test_rewriting_a_training_graph_again_changes_nothing(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(conv_bn_model(relu=True), str(src))
    first = rewrite_train(str(src), str(tmp_path / "a.onnx"), schedule=TrainSchedule(quant_delay=2))
    again = rewrite_train(str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx"), schedule=TrainSchedule(quant_delay=2))
    assert again.summary["already_training_graph"] and not again.summary["changed"]
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert "nothing to do" in again.format_text()
    other = rewrite_train(proto(first), quant=QuantConfig(weight_bits=4))
    assert any("other options" in n for n in other.summary["notes"])


def test_training_state_of_another_tool_is_an_error():
    model = conv_bn_model()
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    # training-mode batch norm (opset 14+)
    m1 = onnx.ModelProto(); m1.CopyFrom(model)
    m1.opset_import[0].version = 15
    next(n for n in m1.graph.node if n.op_type == "BatchNormalization").attribute.append(
        helper.make_attribute("training_mode", 1))
    with pytest.raises(QtoolError, match="training-only state from another tool.*training mode"):
        rewrite_train(m1)
    # another tool's fake quant
    m2 = onnx.ModelProto(); m2.CopyFrom(model)
    out = m2.graph.output[0].name
    m2.graph.node.append(helper.make_node("FakeQuant", [out], [out + "_fq"], domain="com.microsoft"))
    m2.graph.output[0].name = out + "_fq"
    m2.opset_import.append(helper.make_opsetid("com.microsoft", 1))  # a valid model otherwise
    with pytest.raises(QtoolError, match="fake-quant op of another tool"):
        rewrite_train(m2)
    # running statistics as graph outputs
    m3 = onnx.ModelProto(); m3.CopyFrom(model)
    b3 = next(n for n in m3.graph.node if n.op_type == "BatchNormalization")
    b3.output.extend(["rm", "rv", "saved_mean", "saved_var"])  # opset 9-13: 1 or 5 outputs
    m3.graph.output.append(helper.make_tensor_value_info("rm", onnx.TensorProto.FLOAT, [4]))
    with pytest.raises(QtoolError, match="running statistics"):
        rewrite_train(m3)
    assert bn.op_type == "BatchNormalization"


def test_fake_quant_nodes_without_the_contract_are_an_error_for_both_rewrites():
    train = proto(rewrite_train(conv_bn_model()))
    del train.metadata_props[:]
    with pytest.raises(QtoolError, match="no 'qtool.training' metadata"):
        rewrite_train(train)
    with pytest.raises(QtoolError, match="no 'qtool.training' metadata"):
        rewrite_eval(train)


def test_bad_delays_are_errors():
    with pytest.raises(QtoolError, match="quant delay"):
        rewrite_train(conv_bn_model(), schedule=TrainSchedule(quant_delay=-1))
    with pytest.raises(QtoolError, match="freeze_bn_delay"):
        rewrite_train(conv_bn_model(), schedule=TrainSchedule(freeze_bn_delay=1.5))


@pytest.mark.parametrize("opset", [18, 21])
def test_recent_opsets_reduce_with_axes_inputs_and_round_trip(opset):
    b = Builder(opset=opset)
    x = b.input("x", ["N", 3, 6, 6])
    y = b.node("Relu", [b.bn(b.conv(x, 3, 4), 4)])
    y = b.node("Relu", [b.bn(b.conv(y, 4, 4, group=4), 4)])
    result = rewrite_train(b.proto([y]), schedule=TrainSchedule(quant_delay=1, freeze_bn_delay=2))
    assert result.summary["opset"] == {"input": opset, "output": opset}
    train = proto(result)
    onnx.checker.check_model(train, full_check=True)
    sess = session(train)
    for step in (0, 1, 2):
        assert np.all(np.isfinite(run_step(sess, train, {"x": x_data(2, 3, 6, 6)}, step)[y]))
    evaluated = rewrite_eval(train)
    assert evaluated.summary["ranges_from"] == "the training graph's trained state"
    assert evaluated.summary["counts"]["batch_norms_folded"] == 2


def test_folded_output_read_by_a_folded_layer_and_a_residual_add_round_trips(tmp_path):
    """A folded Conv+BN whose output feeds another Conv->BN and a residual Add: rewrite-train, then
    rewrite-eval of the file, restores every batch norm (no training fold left behind) and runs."""
    b = Builder()
    x = b.input("x", ["N", 3, 8, 8])
    c1 = b.bn(b.conv(x, 3, 4, name="c1"), 4, name="bn1")
    c3 = b.bn(b.conv(c1, 4, 4, name="c3"), 4, name="bn3")
    y = b.node("Relu", [b.node("Add", [c1, c3], name="residual")])
    feeds = {"x": x_data(8, 3, 8, 8)}
    train = tmp_path / "train.onnx"
    rewrite_train(b.proto([y]), train, calibration_data=feeds)
    deploy = tmp_path / "deploy.onnx"
    result = rewrite_eval(str(train), deploy)
    counts = result.summary["counts"]
    assert counts["batch_norms_folded"] == 2 and counts["batch_norms_not_folded"] == 0
    assert not [x for x in result.summary["left_in_float"] if "BatchNorm_Fold" in x["node"]]
    model = onnx.load(str(deploy))
    assert not [n.name for n in model.graph.node if "BatchNorm_Fold" in n.name or n.op_type == "BatchNormalization"]
    (out,) = run(model, feeds)
    (ref,) = run(b.proto([y]), feeds)
    assert np.max(np.abs(out - ref)) < 0.1 * np.max(np.abs(ref))


def test_concat_group_whose_members_read_each_other_trains_without_a_cycle(tmp_path):
    """A C2f-style block (YOLO): a Conv output split in halves, a residual Add on one half, and a
    Concat of the halves and the Add: the Concat's inputs share one range, and some of them are
    computed from the others' quantized values. The training graph must stay acyclic and run."""
    b = Builder(opset=17)
    x = b.input("x", ["N", 4, 8, 8])
    y = b.node("Relu", [b.conv(x, 4, 8, name="cv1")])
    halves = b.node("Split", [y, b.const(np.array([4, 4], np.int64))], axis=1, outputs=["h0", "h1"])
    h1 = "h1"
    inner = b.node("Relu", [b.conv(h1, 4, 4, name="m")])
    res = b.node("Add", [h1, inner], name="res")
    out = b.conv(b.node("Concat", [halves, h1, res], axis=1, name="cat"), 12, 4, k=1, name="cv2")
    proto = b.proto([out])
    feeds = {"x": x_data(8, 4, 8, 8)}
    train = tmp_path / "train.onnx"
    result = rewrite_train(proto, train, calibration_data=feeds, schedule=TrainSchedule(freeze_bn_delay=0))
    kinds = {a["tensor"]: a["kind"] for a in result.summary["activations"]}
    assert res in kinds and "h0" in kinds  # the Concat group: its inputs share one range
    model = onnx.load(str(train))
    onnx.checker.check_model(model)
    contract = json.loads({p.key: p.value for p in model.metadata_props}["qtool.training"])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(None, {"x": feeds["x"], contract["step_input"]: np.array(3, np.int64)})
    assert np.all(np.isfinite(outs[0]))
    deployed = rewrite_eval(str(train), str(tmp_path / "deploy.onnx"))
    assert deployed.summary["counts"]["layers_quantized"] == 3
