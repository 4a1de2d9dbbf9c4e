"""rewrite-eval looks at the graph onnxruntime makes of what it wrote: every layer the summary counts as quantized
must run an integer kernel there (``RewriteResult.in_onnxruntime``, ``qtool.model.runtime_graph``)."""

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

import qtool
from qtool.config import QuantConfig
from qtool.model.runtime_graph import LayerKernels, layer_kernels
from tests.model_builders import Builder

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def _digits(**quant):
    return qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), calibration_data=str(SAMPLES / "calib.npz"),
                              quant=QuantConfig(**quant))


def test_every_layer_counted_as_quantized_runs_an_integer_kernel(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = _digits()
    runtime = result.to_dict()["in_onnxruntime"]
    assert runtime == {"integer_layers": result.counts()["layers_quantized"], "float_layers": [],
                       "float_layers_listed": 0}
    assert runtime["integer_layers"] == 5  # four Convs (QLinearConv) and the Gemm (QGemm)
    assert "  in onnxruntime         5 layer(s) in integer kernels, none in float" in result.format_text()
    assert not [w for w in result.warnings if "onnxruntime runs" in w]
    assert list(tmp_path.iterdir()) == []  # the optimized graph's folder is gone


def _static_mlp() -> onnx.ModelProto:
    """Two Linear layers on a static 2-D input, the second read by a Softmax only: onnxruntime's MatMulAddFusion
    turns each MatMul + bias Add into a Gemm, which its QDQ fusion takes without a QuantizeLinear after it only
    with an int32 bias (``placement.integer.becomes_gemm``)."""
    b = Builder(opset=17)
    x = b.input("x", [4, 16])
    h = b.node("Relu", [b.matmul(x, 16, 32, bias=True)])
    b.node("Softmax", [b.matmul(h, 32, 8, bias=True)], outputs=["y"], axis=-1)
    b.output("y", shape=[4, 8])
    return b.proto()


def test_a_layer_the_placement_wrongly_calls_quantized_is_a_warning(monkeypatch):
    """The safety net: with the prediction of onnxruntime's MatMulAddFusion broken (as a model onnxruntime treats in
    a way qtool's rules do not foresee would), the float bias Adds stay, onnxruntime makes float Gemms on dequantized
    weights, and the summary says so instead of counting them as quantized."""
    data = {"x": np.random.default_rng(0).normal(size=(128, 16)).astype(np.float32)}  # 32 batches of the fixed 4
    right = qtool.rewrite_eval(_static_mlp(), calibration_data=data, calibration=qtool.CalibrationConfig(batch_size=4))
    assert right.to_dict()["in_onnxruntime"]["float_layers"] == []
    assert right.to_dict()["in_onnxruntime"]["integer_layers"] == 2

    import qtool.onnx_rewrite.eval_graph as eval_graph

    monkeypatch.setattr(eval_graph, "becomes_gemm", lambda matmul: False)
    wrong = qtool.rewrite_eval(_static_mlp(), calibration_data=data, calibration=qtool.CalibrationConfig(batch_size=4))
    runtime = wrong.to_dict()["in_onnxruntime"]
    assert [x["op"] for x in runtime["float_layers"]] == ["Gemm"]  # the second Linear, a float Gemm
    assert runtime["integer_layers"] == 1 and runtime["float_layers_listed"] == 0
    (warning,) = [w for w in wrong.warnings if "onnxruntime runs" in w]
    floats = len(runtime["float_layers"])
    assert warning.startswith(f"onnxruntime runs {floats} more layer(s) of the written model in float than this "
                              f"summary lists ({floats} in its optimized graph, 0 listed")
    assert "qtool's placement missed an onnxruntime fusion on this model: please report it" in warning
    assert f"{floats} in float: {floats} more than listed above (see the warning)" in wrong.format_text()


def test_options_that_leave_layers_float_in_onnxruntime_say_so():
    (warning,) = [w for w in _digits(int8_activations=True).warnings if "onnxruntime runs" in w]
    assert "--int8-activations does this: onnxruntime's x86 integer kernels take uint8 activations" in warning
    (warning,) = [w for w in _digits(weight_bits=4, pack_int4=True).warnings if "onnxruntime runs" in w]
    assert warning.startswith("onnxruntime runs 5 more layer(s)")
    assert "--pack-int4 does this: onnxruntime has no integer kernel for int4 weights" in warning


def test_a_model_too_large_is_not_looked_at(monkeypatch):
    import qtool.model.runtime_graph

    monkeypatch.setattr(qtool.model.runtime_graph, "MAX_MODEL_BYTES", 0)
    result = _digits()
    assert "in_onnxruntime" not in result.to_dict() and "in onnxruntime" not in result.format_text()
    assert result.output_check is not None  # the outputs are still checked


def test_without_data_nothing_is_looked_at():
    result = qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"))
    assert "in_onnxruntime" not in result.to_dict()


def test_layer_kernels_walks_subgraphs(tmp_path):
    conv = helper.make_node("Conv", ["a", "w"], ["b"], name="inner_conv")
    branch = helper.make_graph([conv], "then", [], [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["c"])], "else", [],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("QLinearConv", list("xyzwvuts"), ["q"], name="qconv"),
             helper.make_node("FusedMatMul", ["p", "r"], ["m"], name="fmm", domain="com.microsoft"),
             helper.make_node("If", ["cond"], ["o"], name="if", then_branch=branch, else_branch=other)]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    path = tmp_path / "optimized.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert layer_kernels(str(path)) == LayerKernels([("fmm", "FusedMatMul"), ("inner_conv", "Conv")], 1)
    assert layer_kernels(str(tmp_path / "missing.onnx")) is None
    (tmp_path / "garbage.onnx").write_bytes(b"\x07not a model")
    assert layer_kernels(str(tmp_path / "garbage.onnx")) is None


def test_no_temporary_folder_costs_the_looks_not_the_command(monkeypatch):
    """Neither the optimized graph nor the profile gets its temporary folder: the model is written and checked all
    the same."""
    make = tempfile.mkdtemp

    def refuse(suffix=None, prefix=None, dir=None):
        if prefix in ("qtool-optimized-", "qtool-profile-"):
            raise PermissionError("no room")
        return make(suffix, prefix, dir)

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    result = qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), calibration_data=str(SAMPLES / "calib.npz"),
                                latency_rounds=2)
    report = result.to_dict()
    assert "in_onnxruntime" not in report and report["output_check"]["sqnr_db"]
    assert report["latency"]["by_op"] == {"float": [], "quantized": []} and report["latency"]["float_ms"] > 0


def test_an_excluded_layer_stays_float_in_onnxruntime(monkeypatch):
    """onnxruntime's WeightBiasQuantization quantizes a float Conv's weight itself (per tensor) when its input is a
    per-tensor DequantizeLinear and its output goes to a QuantizeLinear: ``--exclude`` would not keep it float. Its
    input is read through a per-channel DequantizeLinear of its own (the same values), which that rule leaves."""
    result = _digits(exclude=frozenset({"Conv_1"}))
    runtime = result.to_dict()["in_onnxruntime"]
    assert [x["op"] for x in runtime["float_layers"]] == ["Conv"] and runtime["float_layers_listed"] == 1
    assert runtime["integer_layers"] == 4 and result.counts()["float_layers_kept_float"] == 1
    assert not [w for w in result.warnings if "onnxruntime runs" in w]
    (conv,) = [n for n in result.model.graph if n.name == "Conv_1"]
    dq = conv.inputs[0].producer()
    assert dq.op_type == "DequantizeLinear" and dq.attributes.get_int("axis") == 1
    assert dq.inputs[1].const_value.numpy().shape == (conv.inputs[1].const_value.numpy().shape[1],)

    # --standard-ops (runtimes other than onnxruntime): no per-channel DequantizeLinear of an activation
    standard = _digits(exclude=frozenset({"Conv_1"}), standard_ops=True)
    assert standard.counts()["float_layers_kept_float"] == 0
    (warning,) = [w for w in standard.warnings if "onnxruntime runs" in w]
    assert "with --standard-ops qtool does not read such a layer's input through a per-channel" in warning
    assert all(n.attributes.get_int("axis", 1) == 1 and n.inputs[1].const_value.numpy().size == 1
               for n in standard.model.graph if n.op_type == "DequantizeLinear" and n.inputs[0].const_value is None)

    # without it, onnxruntime quantizes the excluded layer, and the summary says so
    import qtool.onnx_rewrite.eval_graph as eval_graph

    monkeypatch.setattr(eval_graph.EvalEncoder, "keep_float_layers_float", lambda self: None)
    bare = _digits(exclude=frozenset({"Conv_1"}))
    assert bare.to_dict()["in_onnxruntime"]["float_layers"] == []
    (warning,) = [w for w in bare.warnings if "onnxruntime runs" in w]
    assert warning.startswith("onnxruntime runs 1 layer(s) in integer kernels that this summary lists in float")
    assert "0 in float: 1 fewer than listed above (see the warning)" in bare.format_text()


def test_its_own_output_with_a_layer_kept_float_rewrites_to_the_same_bytes(tmp_path):
    """The per-channel DequantizeLinear of a float layer's input is qtool's own (``codec.QTOOL_QUANTIZER_MARKS``):
    a second rewrite-eval takes the model as already quantized by qtool, not as another tool's, and writes the
    same bytes."""
    first, second = tmp_path / "once.onnx", tmp_path / "twice.onnx"
    qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), str(first), calibration_data=str(SAMPLES / "calib.npz"),
                       quant=QuantConfig(exclude=frozenset({"Conv_1"})))
    again = qtool.rewrite_eval(str(first), str(second), quant=QuantConfig(exclude=frozenset({"Conv_1"})))
    assert again.counts()["float_layers_kept_float"] == 0  # already read through its own DequantizeLinear
    assert first.read_bytes() == second.read_bytes()
