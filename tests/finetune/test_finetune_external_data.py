"""A model whose weights are in an external data file (khmersm's transformer: 7 MB written with external data,
and ``rewrite-train`` writes its training graph so too) runs in the JAX interpreter from any working directory:
the initializers are read next to the file, not in the current directory (``finetune`` failed there with
onnx's "should be stored in <name>.data, but it is not regular file" as an internal error)."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qtool.finetune.interpreter import Interpreter
from qtool.model.io import load_model


def _external_model(folder) -> str:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = str(folder / "model.onnx")
    onnx.save(model, path, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return path


def test_external_data_is_read_next_to_the_file_from_another_directory(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    (tmp_path / "elsewhere").mkdir()
    path = _external_model(tmp_path / "model")
    monkeypatch.chdir(tmp_path / "elsewhere")
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    got = Interpreter(load_model(path).model).run({"x": x})["y"]
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
