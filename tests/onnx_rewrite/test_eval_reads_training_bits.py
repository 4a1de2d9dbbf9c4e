"""``rewrite-eval`` on a training graph deploys the options the graph was written (and trained) with."""

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from qtool.api import rewrite_eval
from qtool.api import rewrite_train
from qtool.config import QuantConfig, TrainSchedule

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def test_rewrite_eval_of_a_training_graph_uses_the_recorded_bits(tmp_path):
    qat = tmp_path / "w4a3.qat.onnx"
    rewrite_train(str(SAMPLES / "digits_cnn.onnx"), str(qat), calibration_data=str(SAMPLES / "calib.npz"), quant=QuantConfig(weight_bits=4, activation_bits=3), schedule=TrainSchedule(freeze_bn_delay=0))
    out = tmp_path / "w4a3.qdq.onnx"
    result = rewrite_eval(str(qat), str(out))  # no bits given: the contract's, not 8
    options = result.summary["options"]
    assert (options["weight_bits"], options["activation_bits"]) == (4, 3)
    model = onnx.load(out)
    inits = {t.name: numpy_helper.to_array(t).astype(np.int64) for t in model.graph.initializer}
    spans = []  # weight codes of a narrow 4-bit grid span 14 levels (8-bit would span 254)
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0].endswith("weights_quant/quantized"):
            q = inits[node.input[0]]
            spans.append(int(q.max() - q.min()))
    assert len(spans) == 5
    assert max(spans) == 14
    assert not result.summary["warnings"]
    # other bits asked for explicitly: as asked, with a warning
    other = rewrite_eval(str(qat), str(tmp_path / "other.onnx"), quant=QuantConfig(weight_bits=6))
    assert (other.summary["options"]["weight_bits"], other.summary["options"]["activation_bits"]) == (6, 3)
    assert any("written with weight_bits=4; deploying with weight_bits=6" in w for w in other.summary["warnings"])
