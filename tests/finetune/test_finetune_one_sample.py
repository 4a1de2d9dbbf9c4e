"""A model whose input declares a free batch axis but whose graph runs one sample (khmersm's transformer, a
PyTorch export with a Reshape to a batch of 1): ``finetune --batch-size 1`` trains and validates it one sample
at a time, and a larger batch is a one-line error that says so (it was a Reshape failure deep in the
interpreter, and no batch size worked: validation ran in batches of up to 256 whatever the training batch; it now
runs in batches of at most the training batch size, here 6 samples as 2 x 3)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qtool.api import finetune, rewrite_train
from qtool.config import CalibrationConfig, TrainSchedule
from qtool.errors import QtoolError
from qtool.finetune.config import FinetuneConfig


def _one_sample_model():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, 2, 4], np.int64), "heads"),
             numpy_helper.from_array(np.array([1, 8], np.int64), "flat")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "heads"], ["r"]),
             helper.make_node("Softmax", ["r"], ["s"], axis=-1), helper.make_node("Reshape", ["s", "flat"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def one_sample(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one-sample")
    data = {"x": np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)}
    rewrite_train(_one_sample_model(), str(folder / "q.onnx"), calibration_data=data,
                  calibration=CalibrationConfig(batch_size=1), schedule=TrainSchedule(freeze_bn_delay=0))
    return folder, data


def test_a_batch_is_a_one_line_error_naming_batch_size_1(one_sample):
    folder, data = one_sample
    with pytest.raises(QtoolError, match=r"runs on one sample but fails on a batch of 3 .*--batch-size 1"):
        finetune(str(folder / "q.onnx"), data, None, FinetuneConfig(steps=1, batch_size=4))


def test_batch_size_1_trains_and_validates_one_sample_at_a_time(one_sample):
    folder, data = one_sample
    result = finetune(str(folder / "q.onnx"), data, str(folder / "t.onnx"), FinetuneConfig(steps=2, batch_size=1))
    assert result.end_step == 2 and np.isfinite(result.after)
