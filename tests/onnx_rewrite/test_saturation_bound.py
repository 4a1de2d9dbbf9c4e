"""A quantizer whose only readers saturate (HardSwish below -3, HardSigmoid outside [-b/a, (1-b)/a]) has its
range clipped there: in the eval graph (PTQ) and in the training graph (initial range and every EMA update)."""

import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from model_builders import Builder
from onnx import numpy_helper

import qtool
from qtool.config import QuantConfig, TrainSchedule

SCALE = 20.0  # inputs scaled up: conv1's outputs reach far below HardSwish's -3


def model(act: str, also_add: bool = False):
    b = Builder(opset=17, named=True)
    x = b.input("x", ["N", 4, 6, 6])
    y = b.conv(x, 4, 4, name="conv1")
    z = b.node("HardSwish", [y]) if act == "hardswish" else b.node("HardSigmoid", [y], alpha=1 / 6, beta=0.5)
    if also_add:  # a second reader that does not saturate: no bound
        z = b.node("Add", [z, y])
    x_feed = SCALE * np.random.default_rng(0).standard_normal((16, 4, 6, 6)).astype(np.float32)
    return b.proto([b.conv(z, 4, 4, name="conv2")]), {"x": x_feed}


def eval_range(proto, feeds) -> tuple[float, float]:
    """The range of the quantizer on conv1's output (the activation function's input)."""
    result = qtool.rewrite_eval(proto, calibration_data=feeds, quant=QuantConfig())
    m = ir.serde.serialize_model(result.model)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    conv1_out = next(n.output[0] for n in m.graph.node if n.op_type == "Conv")
    for node in m.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] == conv1_out:
            scale, zero = float(inits[node.input[1]]), int(inits[node.input[2]])
            qmin = -128 if inits[node.input[2]].dtype == np.int8 else 0
            return (qmin - zero) * scale, (qmin + 255 - zero) * scale
    raise AssertionError("no quantizer on conv1's output")


def near(value: float, target: float, lo: float, hi: float) -> bool:
    """Within half a grid step: TF's nudging moves the range so that 0 is on the grid."""
    return abs(value - target) <= (hi - lo) / 255 / 2 + 1e-6


def just_beyond(value: float, bound: float, lo: float, hi: float) -> bool:
    """Beyond ``bound`` (away from 0) by at most one and a half steps: the clipped end is one step past the
    bound, so that TF's nudging (half a step at most) keeps it where the readers saturate."""
    step = (hi - lo) / 255
    return 0 < (value - bound) * np.sign(bound) <= 1.5 * step + 1e-6


def conv1_min(proto, feeds) -> float:
    """The float model's smallest conv1 output on ``feeds``."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    conv1_out = next(n.output[0] for n in probe.graph.node if n.op_type == "Conv")
    probe.graph.output.append(onnx.helper.make_tensor_value_info(conv1_out, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    return float(session.run([conv1_out], feeds)[0].min())


def test_hardswish_input_range_stops_at_minus_three():
    proto, feeds = model("hardswish")
    lo, hi = eval_range(proto, feeds)
    assert conv1_min(proto, feeds) < -10  # the calibrated minimum, far below -3
    assert just_beyond(lo, -3.0, lo, hi) and hi > 10
    proto, feeds = model("hardswish", also_add=True)  # read by an Add too: no bound
    lo, hi = eval_range(proto, feeds)
    assert near(lo, conv1_min(proto, feeds), lo, hi)


def test_hardsigmoid_input_range_is_its_linear_part():
    lo, hi = eval_range(*model("hardsigmoid"))
    assert just_beyond(lo, -3.0, lo, hi) and just_beyond(hi, 3.0, lo, hi)


def test_training_graph_keeps_the_bound(tmp_path):
    proto, feeds = model("hardswish")
    path = str(tmp_path / "train.onnx")
    qtool.rewrite_train(proto, path, calibration_data=feeds, schedule=TrainSchedule(freeze_bn_delay=0))
    m = onnx.load(path)
    contract = json.loads({p.key: p.value for p in m.metadata_props}["qtool.training"])
    (entry,) = [a for a in contract["activation_quantizers"] if "bound" in a]
    lo0, hi0 = entry["initial_range"]
    assert entry["bound"] == [-3.0, None] and -3.0 - 1.5 * (hi0 - lo0) / 255 < lo0 < -3.0
    # the EMA update with a batch reaching far below -3 moves the minimum toward the bound, not below it
    updated = entry["min"] + ":updated"
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {"x": feeds["x"], contract["step_input"]: np.array(0, np.int64)}
    (new_min,) = session.run([updated], feed)
    assert conv1_min(proto, feeds) < -10 and lo0 <= float(new_min) <= -3.0


def test_finetune_keeps_trained_ranges_within_the_bound(tmp_path):
    """Adam at a large rate moves every range; a bounded minimum stays within a step of -3 (where it
    started), so the deployed model (which clips to the bound) uses the range that was trained."""
    from qtool.finetune.train import FinetuneConfig, finetune

    proto, feeds = model("hardswish")
    path, tuned = str(tmp_path / "train.onnx"), str(tmp_path / "tuned.onnx")
    qtool.rewrite_train(proto, path, calibration_data=feeds, schedule=TrainSchedule(freeze_bn_delay=0))
    finetune(path, feeds, tuned, FinetuneConfig(steps=4, batch_size=8, learning_rate=0.5, keep_best=False))
    m = onnx.load(tuned)
    contract = json.loads({p.key: p.value for p in m.metadata_props}["qtool.training"])
    (entry,) = [a for a in contract["activation_quantizers"] if "bound" in a]
    inits = {i.name: float(numpy_helper.to_array(i)) for i in m.graph.initializer if i.name == entry["min"]}
    assert inits[entry["min"]] >= entry["initial_range"][0]  # one grid step beyond -3 at most
