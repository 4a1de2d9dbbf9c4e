"""Shapes found in models committed to GitHub repositories (the fifth sweep of ``benchmarks/real_models.py``:
UltraFace, YuNet, SCRFD, Yolo-FastestV2, ESPCN), rebuilt small the way their exporters wrote them."""

import numpy as np
from model_builders import Builder, run, x_data

import qtool
from qtool.model.opset import convert_opset


def ultraface_head(opset: int):
    """UltraFace (PyTorch 1.2, opset 9): per level a Conv head, Transpose to NHWC, Reshape to [N, cells, 2]
    with the target computed at run time (``Concat(Unsqueeze(Gather(Shape(z), 0)), -1, 2)``, so the rank is
    unknown to shape inference); the levels concatenated and a Softmax over the last axis as the ``scores``
    output, declared [1, 320, 2]."""
    b = Builder(opset=opset)
    x = b.input("input", [1, 3, 16, 16])
    y = b.node("Relu", [b.conv(x, 3, 8)])
    levels = []
    unsqueeze = {"axes": [0]} if opset < 13 else {}
    for stride in (1, 2):
        z = b.conv(y if stride == 1 else b.node("Relu", [b.conv(y, 8, 8, strides=[2, 2])]), 8, 4)
        z = b.node("Transpose", [z], perm=[0, 2, 3, 1])
        batch = b.node("Gather", [b.node("Shape", [z]), b.const(np.array(0, np.int64))], axis=0)
        batch = b.node("Unsqueeze", [batch] + ([] if opset < 13 else [b.const(np.array([0], np.int64))]),
                       **unsqueeze)
        target = b.node("Concat", [batch, b.const(np.array([-1], np.int64)), b.const(np.array([2], np.int64))],
                        axis=0)
        levels.append(b.node("Reshape", [z, target]))
    b.node("Softmax", [b.node("Concat", levels, axis=1)], axis=2, outputs=["scores"])
    b.output("scores", shape=[1, 320, 2])
    return b.proto()


def test_a_softmax_over_the_last_axis_is_not_wrapped_when_the_opset_is_raised():
    """onnx's converter writes an opset-9 Softmax as Flatten -> Softmax(-1) -> Reshape(Shape(x)) at opset 13
    (the old 2-D meaning); over the last axis it is Softmax(x, axis) itself, which writes the model output
    directly (onnxruntime took twice the time for one between two arena tensors)."""
    import onnx_ir as ir

    proto = ultraface_head(9)
    model = convert_opset(ir.serde.deserialize_model(proto), 13, "a test")
    ops = [n.op_type for n in model.graph]
    assert "Flatten" not in ops and ops.count("Reshape") == 2 and "Shape" in ops
    softmax = next(n for n in model.graph if n.op_type == "Softmax")
    assert softmax.attributes.get_int("axis") == 2 and softmax.outputs[0].name == "scores"
    assert softmax.outputs[0].is_graph_output()
    feeds = {"input": x_data(1, 3, 16, 16)}
    np.testing.assert_allclose(run(ir.serde.serialize_model(model), feeds)[0], run(proto, feeds)[0], rtol=1e-6)


def test_the_converter_wrapping_stays_where_the_axis_is_not_the_last():
    """Softmax(axis=1) of a rank-3 tensor before opset 13 normalises over the last two axes together:
    the Flatten/Reshape wrapping is that meaning, and stays."""
    import onnx_ir as ir

    b = Builder(opset=11)
    x = b.input("x", [1, 4, 6])
    proto = b.proto([b.node("Softmax", [b.node("Relu", [x])], axis=1, outputs=["y"])])
    model = convert_opset(ir.serde.deserialize_model(proto), 13, "a test")
    assert [n.op_type for n in model.graph].count("Flatten") == 1
    feeds = {"x": x_data(1, 4, 6)}
    np.testing.assert_allclose(run(ir.serde.serialize_model(model), feeds)[0], run(proto, feeds)[0], rtol=1e-6)


def test_a_softmax_output_no_integer_op_reads_is_not_quantized():
    """UltraFace's class probabilities went through Softmax -> Q/DQ -> Reshape -> Q/DQ to the output: rounded
    to 1/255 for nothing (no integer op reads them). The Softmax writes the output in float; the heads,
    the Concat and the convolutions stay integer."""
    for opset in (9, 13):
        proto = ultraface_head(opset)
        feeds = {"input": x_data(8, 3, 16, 16)[:1]}
        result = qtool.rewrite_eval(proto, calibration_data={"input": x_data(8, 3, 16, 16)},
                                    calibration=qtool.CalibrationConfig(batch_size=1))
        graph = result.model.graph
        softmax = next(n for n in graph if n.op_type == "Softmax")
        assert softmax.outputs[0].name == "scores" and softmax.outputs[0].is_graph_output()
        assert not list(softmax.outputs[0].consumers())
        assert softmax.inputs[0].producer().op_type in ("Concat", "DequantizeLinear")
        assert sum(n.op_type == "QuantizeLinear" for n in graph) >= 4  # the convolutions' inputs
        got, want = run(result.model, feeds)[0], run(proto, feeds)[0]
        assert np.abs(got - want).mean() < 0.05 and len(np.unique(got)) > 256  # not on a 1/255 grid


def test_a_softmax_an_integer_op_reads_keeps_its_quantizer():
    """Attention: Softmax -> MatMul keeps the Softmax output quantized (the MatMul runs in integers)."""
    b = Builder(opset=13)
    x = b.input("x", ["N", 8, 16])
    q = b.matmul(x, 16, 16)
    k = b.node("Transpose", [b.matmul(x, 16, 16)], perm=[0, 2, 1])
    attn = b.node("Softmax", [b.node("MatMul", [q, k])], axis=-1)
    out = b.matmul(b.node("MatMul", [attn, b.matmul(x, 16, 16)]), 16, 16)
    result = qtool.rewrite_eval(b.proto([out]), calibration_data={"x": x_data(8, 8, 16)})
    softmax = next(n for n in result.model.graph if n.op_type == "Softmax")
    assert [c.op_type for c in softmax.outputs[0].consumers()] == ["QuantizeLinear"]


def yolo_fastest_head():
    """Yolo-FastestV2 (PyTorch 1.8, opset 11): per level, box and objectness Convs through Sigmoid and a class
    Conv through Softmax(axis=1), each Transposed to NHWC and Reshaped to [cells, k] (the target computed at
    run time: rank unknown to shape inference), Concat(axis=1) per level, Concat(axis=0) as the output."""
    b = Builder(opset=11)
    x = b.input("input.1", [1, 3, 16, 16])
    y = b.node("Relu", [b.conv(x, 3, 8)])
    levels = []
    for stride in (1, 2):
        f = y if stride == 1 else b.node("Relu", [b.conv(y, 8, 8, strides=[2, 2])])
        parts = []
        for k, act in ((4, "Sigmoid"), (1, "Sigmoid"), (5, "Softmax")):
            z = b.node("Transpose", [b.conv(f, 8, k, k=1)], perm=[0, 2, 3, 1])
            cells = b.node("Mul", [b.node("Gather", [b.node("Shape", [z]), b.const(np.array(1, np.int64))], axis=0),
                                   b.node("Gather", [b.node("Shape", [z]), b.const(np.array(2, np.int64))], axis=0)])
            target = b.node("Concat", [b.node("Unsqueeze", [cells], axes=[0]), b.const(np.array([k], np.int64))],
                            axis=0)
            z = b.node("Reshape", [z, target])
            parts.append(b.node(act, [z], **({"axis": 1} if act == "Softmax" else {})))
        levels.append(b.node("Concat", parts, axis=1))
    b.node("Concat", levels, axis=0, outputs=["out"])
    b.output("out", shape=[320, 10])
    return b.proto()


def test_probabilities_concatenated_into_the_output_keep_no_pairs():
    """Yolo-FastestV2's objectness and class scores went Sigmoid/Softmax -> Q/DQ -> Concat (float, the model
    output): once the Concat runs in float on its inputs' own grids (the YOLOv8 fix), those pairs only round
    the probabilities. They go, with the Softmax's carried ones; the converter's Flatten goes too (the
    Reshape target's length gives the rank)."""
    proto = yolo_fastest_head()
    result = qtool.rewrite_eval(proto, calibration_data={"input.1": x_data(4, 3, 16, 16)},
                                calibration=qtool.CalibrationConfig(batch_size=1))
    graph = result.model.graph
    assert not [n for n in graph if n.op_type == "Flatten"]
    for node in graph:
        if node.op_type in ("Sigmoid", "Softmax"):
            assert [c.op_type for c in node.outputs[0].consumers()] == ["Concat"], node.name
    assert sum(n.op_type == "QuantizeLinear" for n in graph) >= 6  # the convolutions stay integer
    feeds = {"input.1": x_data(4, 3, 16, 16)[:1]}
    got, want = run(result.model, feeds)[0], run(proto, feeds)[0]
    assert np.abs(got - want).mean() < 0.05


def test_a_sigmoid_model_output_is_not_rounded():
    """YuNet (PyTorch 1.7, opset 11) ends each head in Conv -> Transpose -> Reshape -> Sigmoid as a model output
    (cls_8, obj_8, ...): a pair there rounds the scores to 1/255 (obj_8: 9.9 dB SQNR against float) for no
    integer reader. The Sigmoid reads the dequantized head and writes the output in float."""
    b = Builder(opset=11)
    x = b.input("input", [1, 3, 16, 16])
    y = b.node("Relu", [b.conv(x, 3, 8)])
    outs = []
    for name in ("cls_8", "obj_8"):
        z = b.node("Transpose", [b.conv(y, 8, 1, k=1)], perm=[0, 2, 3, 1])
        z = b.node("Reshape", [z, b.const(np.array([1, -1, 1], np.int64))])
        outs.append(b.node("Sigmoid", [z], outputs=[name]))
    proto = b.proto(outs)
    result = qtool.rewrite_eval(proto, calibration_data={"input": x_data(4, 3, 16, 16)},
                                calibration=qtool.CalibrationConfig(batch_size=1))
    sigmoids = [n for n in result.model.graph if n.op_type == "Sigmoid"]
    assert [s.outputs[0].name for s in sigmoids] == ["cls_8", "obj_8"]
    assert all(not list(s.outputs[0].consumers()) and s.inputs[0].producer().op_type == "DequantizeLinear"
               for s in sigmoids)


def _optimized_ops(model, tmp_path) -> dict:
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ops: dict = {}
    for n in onnx.load(options.optimized_model_filepath).graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return ops


def keras_lstm_cell():
    """DTLN's second model (Keras, keras2onnx, opset 11, batch 1): an LSTM cell written out as
    ``Add(MatMul(x, W), MatMul(h, R)) -> Add(bias) -> Split -> Sigmoid/Tanh`` on static 2-D tensors."""
    b = Builder(opset=11)
    x, h = b.input("x", [1, 16]), b.input("h", [1, 8])
    gates = b.node("Add", [b.node("Add", [b.matmul(x, 16, 32), b.matmul(h, 8, 32)]),
                           b.const(np.linspace(-0.5, 0.5, 32).astype(np.float32))])
    i, f = b.node("Split", [gates], axis=1, outputs=["i", "f"])[0], "f"
    return b.proto([b.node("Mul", [b.node("Sigmoid", [i]), b.node("Tanh", [f])], outputs=["y"])])


def test_a_matmul_read_by_an_add_of_another_layer_runs_in_integers(tmp_path):
    """onnxruntime's MatMulAddFusion made one of the two MatMuls a Gemm with the other's output as its bias (a
    float C, which no QDQ fusion takes): it ran in float on a weight dequantized at every run (DTLN's second
    model 3x slower than float). Each MatMul's output keeps its pair, so both run in integers."""
    proto = keras_lstm_cell()
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((32, 16)).astype(np.float32), "h": rng.standard_normal((32, 8)).astype(np.float32)}
    import onnx_ir as ir

    result = qtool.rewrite_eval(proto, calibration_data=data, calibration=qtool.CalibrationConfig(batch_size=1))
    quantized = ir.serde.serialize_model(result.model)
    ops = _optimized_ops(quantized, tmp_path)
    assert ops.get("QLinearMatMul", 0) + ops.get("MatMulIntegerToFloat", 0) == 2, ops
    assert not {"Gemm", "MatMul"} & set(ops), ops
    feeds = {k: v[:1] for k, v in data.items()}
    np.testing.assert_allclose(run(quantized, feeds)[0], run(proto, feeds)[0], atol=0.05)
