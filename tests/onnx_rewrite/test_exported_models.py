"""The rewrites on models as real exporters write them (tests/data/exported, made by make_exported.py).

torch's legacy TorchScript exporter at opsets 11/13/17 (batch norms kept, some
with Constant-node weights and unnamed nodes, no value_info), torch's dynamo
exporter at opset 18 (batch norms folded by torch, ReduceMean, Reshape),
weights reached through Transpose/Reshape/Cast, shared weights, dynamic batch
and spatial dimensions, and a Keras model through tf2onnx (NHWC, Transposes,
batch norm as Mul/Add). The .onnx files are committed: no torch or TensorFlow
is needed here.
"""

import json
import os
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from qtool.api import calibrate
from qtool.api import rewrite_eval
from qtool.api import rewrite_train
from qtool.api import simulate
from qtool.config import CalibrationConfig, QuantConfig, TrainSchedule
from qtool.simulate.config import SimulateConfig

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.path.dirname(HERE), "data", "exported")

# every committed model: a missing file fails (no skip)
MODELS = [
    "legacy11_ResBlock", "legacy11_MobileBlock", "legacy11_MLP", "legacy11_MLP3d", "legacy11_Decoder",
    "legacy11_Shared", "legacy11_Indirect", "legacy11_fold_ResBlock",
    "legacy13_ResBlock", "legacy13_MLP", "legacy17_MobileBlock", "legacy17_Decoder",
    "dynamo18_ResBlock", "dynamo18_MobileBlock", "dynamo18_MLP", "dynamo18_Decoder", "dynamo18_Shared",
    "dynamo18_Indirect", "dynamo18_const_MobileBlock", "dynamo_SEBlock", "legacy17_SEBlock",
    "dynamo_PostNormBlock", "dynamo_seq_PostNormBlock", "legacy17_PostNormBlock",
    "dynamo_AffineBlock", "legacy17_AffineBlock", "dynamo_MultiplierBlock", "legacy17_MultiplierBlock",
    "dynamo_LinearAttention", "legacy17_LinearAttention",
    "tf2onnx13_KerasCNN",
]


def paths(name):
    model, data = os.path.join(DATA, name + ".onnx"), os.path.join(DATA, name + ".npz")
    assert os.path.isfile(model) and os.path.isfile(data), f"{name}: run tests/data/exported/make_exported.py"
    return model, data


def session(model):
    data = model if isinstance(model, str) else model.SerializeToString()
    options = ort.SessionOptions()  # default options: graph optimizations (QDQ fusion) on
    options.log_severity_level = 3
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def run(model, feeds):
    return session(model).run(None, feeds)[0]


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def sqnr(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(10 * np.log10((a @ a) / max(((a - b) ** 2).sum(), 1e-30)))


def check_written(path):
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    graph_outputs = {o.name for o in proto.graph.output}
    used = {i for n in proto.graph.node for i in n.input} | graph_outputs
    for node in proto.graph.node:  # no dead nodes left behind (a weight's Reshape shape, a Transpose)
        assert any(o in used for o in node.output), f"dead node {node.op_type} '{node.name}'"
    used_inits = {i for n in proto.graph.node for i in n.input}
    for init in proto.graph.initializer:
        assert init.name in used_inits or init.name in graph_outputs, f"unused initializer '{init.name}'"
    return proto


def source_ops(path):
    return [n.op_type for n in onnx.load(path).graph.node]


def test_every_model_is_committed():
    on_disk = sorted(f[:-5] for f in os.listdir(DATA) if f.endswith(".onnx"))
    assert on_disk == sorted(MODELS)
    for name in MODELS:
        assert os.path.getsize(paths(name)[0]) < 200_000


@pytest.mark.parametrize("name", MODELS)
def test_rewrite_eval(name, tmp_path):
    model, data = paths(name)
    feeds = dict(np.load(data))
    ref = run(model, feeds)
    n_bn = source_ops(model).count("BatchNormalization")
    for wb, ab, per_channel, symmetric, min_cos in [
        (8, 8, True, False, 0.999), (8, 8, False, True, 0.995), (4, 4, False, False, 0.95),
    ]:
        out = str(tmp_path / f"{name}.w{wb}a{ab}.onnx")
        result = rewrite_eval(model, out, calibration_data=data, quant=QuantConfig(weight_bits=wb, activation_bits=ab, per_channel=per_channel, symmetric=symmetric))
        proto = check_written(out)
        s = result.summary
        # every batch norm of these models sits after a layer and folds, whatever the options
        assert len(s["batch_norms_folded"]) == n_bn, s["left_in_float"]
        assert "BatchNormalization" not in [n.op_type for n in proto.graph.node]
        assert s["weights"], "no weight quantized"
        assert len(s["weights"]) == source_weights(name), [w["tensor"] for w in s["weights"]]
        for entry in s["left_in_float"]:
            assert entry["node"] and entry["op"] and entry["reason"]
        # ops that only compute constants (a weight's Transpose/Cast, Clip bounds) or shapes (the TorchScript
        # exporter's F.pad pads and attention scale from the input's shape: Shape -> Gather -> Div -> Cast) are
        # not float work
        assert not [e for e in s["float_ops"] if e["op"] in ("Cast", "Shape")], s["float_ops"]
        # every layer gets quantized inputs (through pools, ReduceMean, Flatten...): onnxruntime runs it in
        # int8; only after an activation TF's rules leave unquantized (LeakyRelu: the chain ends before it)
        producers = {o: n.op_type for n in onnx.load(model).graph.node for o in n.output}
        for note in s["notes"]:
            m = re.search(r"its input '(.*)' is not quantized", note)
            assert m is None or producers.get(m.group(1)) in ("LeakyRelu", "HardSigmoid", "Sigmoid"), note
        y = run(out, feeds)
        assert y.shape == ref.shape and np.isfinite(y).all()
        assert cosine(ref, y) > min_cos, (wb, ab, cosine(ref, y))
        if (wb, ab) == (8, 8):
            assert sqnr(ref, y) > 25, sqnr(ref, y)


def source_weights(name):
    """Layer weights each model has (a shared weight counts once)."""
    base = name.split("_")[-1]
    return {"ResBlock": 5, "MobileBlock": 4, "MLP": 3, "MLP3d": 2, "Decoder": 4, "Shared": 4, "Indirect": 3, "SEBlock": 6, "PostNormBlock": 5,
            "AffineBlock": 3, "MultiplierBlock": 4, "LinearAttention": 3, "KerasCNN": 4}[base]


def test_dynamic_dims_are_kept(tmp_path):
    """Dynamic batch and spatial dims: the QDQ model runs at other sizes than the export's."""
    model, data = paths("legacy11_ResBlock")
    out = str(tmp_path / "r.onnx")
    rewrite_eval(model, out, calibration_data=data)
    x = np.random.default_rng(1).normal(size=(3, 3, 20, 12)).astype(np.float32)
    ref, y = run(model, {"input": x}), run(out, {"input": x})
    assert cosine(ref, y) > 0.999


@pytest.mark.parametrize("name", ["legacy11_MLP", "legacy13_MLP"])
def test_matmul_batch_norm_folds_without_value_info(name):
    """The legacy exporter writes no value_info: the MatMul input rank comes from shape inference, so
    the fold does not depend on whether the opset was converted (it did: 8-bit per-tensor at
    opset 11/13 left the MatMul's BatchNormalization in float, per-channel folded it)."""
    model, data = paths(name)
    for per_channel in (True, False):
        s = rewrite_eval(model, calibration_data=data, quant=QuantConfig(per_channel=per_channel)).summary
        assert s["counts"]["batch_norms_not_folded"] == 0, s["left_in_float"]
        assert len(s["batch_norms_folded"]) == 2


@pytest.mark.parametrize("name", ["legacy11_MLP", "legacy11_Indirect", "tf2onnx13_KerasCNN"])
def test_calibrate_then_ranges(name, tmp_path):
    """`calibrate` and `rewrite-eval --ranges` plan the same tensors (the MLP's differed: the fold did)."""
    model, data = paths(name)
    ranges = calibrate(model, data, calibration=CalibrationConfig(method="entropy"))
    ranges_dict = ranges.ranges if hasattr(ranges, "ranges") else ranges
    out = str(tmp_path / "r.onnx")
    rewrite_eval(model, out, ranges=ranges_dict)
    check_written(out)
    feeds = dict(np.load(data))
    assert cosine(run(model, feeds), run(out, feeds)) > 0.99


@pytest.mark.parametrize("name", ["legacy11_ResBlock", "legacy11_MobileBlock", "legacy11_MLP", "legacy11_Decoder",
                                  "legacy11_Indirect", "dynamo18_Shared", "tf2onnx13_KerasCNN"])
def test_rewrite_train_runs_around_the_delays(name, tmp_path):
    model, data = paths(name)
    feeds = dict(np.load(data))
    ref = run(model, feeds)
    path = str(tmp_path / "qat.onnx")
    rewrite_train(model, path, calibration_data=data, schedule=TrainSchedule(quant_delay=2, freeze_bn_delay=0))
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    contract = json.loads({p.key: p.value for p in proto.metadata_props}["qtool.training"])
    state = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer if t.name in contract["state"]}
    sess = session(path)
    names = [o.name for o in sess.get_outputs()]
    for step in range(4):  # before, at and after quant_delay
        results = dict(zip(names, sess.run(None, {**feeds, contract["step_input"]: np.array(step, np.int64),
                                                  **state})))
        y = results[names[0]]
        assert np.isfinite(y).all()
        # moving statistics frozen from step 0: the forward pass is the eval fold (float before the delay)
        assert cosine(ref, y) > (0.99999 if step < 2 else 0.999), (step, cosine(ref, y))
        state = {k: results[v] for k, v in contract["state"].items()}
    for t in proto.graph.initializer:
        if t.name in state:
            t.CopyFrom(numpy_helper.from_array(state[t.name], t.name))
    onnx.save(proto, path)
    out = str(tmp_path / "qdq.onnx")
    rewrite_eval(path, out)
    check_written(out)
    assert cosine(ref, run(out, feeds)) > 0.999


@pytest.mark.parametrize("name", ["legacy11_Decoder", "dynamo18_MobileBlock"])
def test_simulate_quantized(name, tmp_path):
    model, data = paths(name)
    out = str(tmp_path / "q.onnx")
    rewrite_eval(model, out, calibration_data=data)
    result = simulate(model, data, SimulateConfig(quantized=[out]))
    assert result is not None


@pytest.mark.parametrize("name", ["legacy11_Shared", "dynamo18_Shared"])
def test_simulate_sensitivity_with_shared_weights(name):
    """One conv (and one Linear) used twice share a weight quantizer: quantizing one layer at a time
    gave each reader of the shared DequantizeLinear the float copy, and the second copy failed
    ("Initializer ... is already registered")."""
    model, data = paths(name)
    result = simulate(model, data, SimulateConfig(calibration_data=data, sensitivity=True))
    text = json.dumps(result.to_dict() if hasattr(result, "to_dict") else result.summary, default=str)
    assert "sensitivity" in text


def test_keras_nhwc_input_and_unfolded_batch_norm_are_quantized():
    """tf2onnx: the graph input reaches the first Conv through a Transpose (NHWC -> NCHW), and the batch
    norm after the depthwise conv stays as Mul -> Add -> Relu6 (Clip). The input was left unquantized
    (only direct readers counted) and so was the Relu6 output (the Add deferred to the Clip, which
    nobody quantized): the first Conv and the Dense ran with float inputs."""
    model, data = paths("tf2onnx13_KerasCNN")
    s = rewrite_eval(model, calibration_data=data).summary
    quantized = {a["tensor"] for a in s["activations"]}
    assert "input" in quantized
    assert "functional_1/re_lu_1_2/Relu6:0" in quantized
    assert len(s["propagated_inputs"]) == 2
    assert "Clip" not in s["other_float_ops"]
    assert not [n for n in s["notes"] if "is not quantized" in n], s["notes"]
