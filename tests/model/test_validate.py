"""Input models: unusual but valid ones work, broken ones are refused with what is wrong."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from fuzz_cases import with_initializers
from model_files import SAMPLE_CALIB, SAMPLE_MODEL
from onnx import helper, numpy_helper

from qtool.api import rewrite_eval, rewrite_train
from qtool.errors import QtoolError
from qtool.model.io import load_model


BASE = with_initializers(onnx.load(SAMPLE_MODEL))


def init(m, name):
    return next(t for t in m.graph.initializer if t.name == name)


def set_array(m, name, change):
    t = init(m, name)
    array = numpy_helper.to_array(t).copy()
    change(array)
    t.CopyFrom(numpy_helper.from_array(array, name))


def save(tmp_path, m, name="m.onnx"):
    path = tmp_path / name
    onnx.save(m, path)
    return path


def refused(tmp_path, m, pattern):
    path = save(tmp_path, m)
    with pytest.raises(QtoolError, match=pattern) as info:
        load_model(path)
    assert "\n" not in str(info.value)
    for run in (lambda: rewrite_eval(str(path), str(tmp_path / "o.onnx"), calibration_data=str(SAMPLE_CALIB)),
                lambda: rewrite_train(str(path), str(tmp_path / "t.onnx"))):
        with pytest.raises(QtoolError, match=pattern):
            run()
    assert not (tmp_path / "o.onnx").exists() and not (tmp_path / "t.onnx").exists()


def test_the_base_model_is_accepted(tmp_path):
    load_model(save(tmp_path, BASE))


def test_duplicate_initializer_names(tmp_path):
    m = copy.deepcopy(BASE)
    twin = numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init(m, "conv1.weight"))), "conv1.weight")
    m.graph.initializer.append(twin)
    refused(tmp_path, m, "initializer name 'conv1.weight' appears 2 times")


def test_repeated_node_names_are_made_unique(tmp_path):
    """onnx.checker and onnxruntime accept them, and exporters write them (spox: many Constant nodes
    named 'F0::anon', silero-vad's OpenVINO export): the first keeps the name, the others get a suffix."""
    m = copy.deepcopy(BASE)
    for node in m.graph.node[1:3]:
        node.name = m.graph.node[0].name
    path = save(tmp_path, m)
    rewrite_eval(str(path), str(tmp_path / "o.onnx"), calibration_data=str(SAMPLE_CALIB))
    rewrite_train(str(path), str(tmp_path / "t.onnx"))
    for out in ("o.onnx", "t.onnx"):
        names = [n.name for n in onnx.load(tmp_path / out).graph.node]
        assert len(set(names)) == len(names) and {"Conv_0", "Conv_0_2"} <= set(names)  # Conv_0_1: a folded BN


def test_duplicate_value_names(tmp_path):
    m = copy.deepcopy(BASE)
    m.graph.node[3].output[0] = m.graph.node[0].output[0]
    refused(tmp_path, m, "tensor '/conv1/Conv_output_0' is written by node 'Conv_3' and by node 'Conv_0'")


def test_a_node_output_named_like_an_initializer(tmp_path):
    m = copy.deepcopy(BASE)
    m.graph.node[2].output[0] = "conv2.weight"
    m.graph.node[3].input[0] = "conv2.weight"
    refused(tmp_path, m, "tensor 'conv2.weight' is written by node 'Relu_2' and by a graph input or initializer")


def test_dangling_input(tmp_path):
    m = copy.deepcopy(BASE)
    m.graph.node[3].input[0] = "nowhere"
    refused(tmp_path, m, "tensor 'nowhere' read by node 'Conv_3' is not defined")


def test_cycle(tmp_path):
    m = copy.deepcopy(BASE)
    m.graph.node[0].input[0] = m.graph.node[3].output[0]
    refused(tmp_path, m, "has a cycle through node\\(s\\) 'Conv_0', 'BatchNormalization_1'")


def test_undefined_attribute_type(tmp_path):
    m = copy.deepcopy(BASE)
    m.graph.node[0].attribute[0].type = onnx.AttributeProto.UNDEFINED
    refused(tmp_path, m, "attribute 'dilations' of node 'Conv_0' has no type \\(UNDEFINED\\)")


def test_tensor_attribute_without_a_tensor(tmp_path):
    m = copy.deepcopy(BASE)
    m.graph.node[0].attribute[0].type = onnx.AttributeProto.TENSOR
    refused(tmp_path, m, "tensor attribute 'dilations' of node 'Conv_0' has no data type \\(UNDEFINED\\)")


def test_attribute_type_mismatch_is_reported_by_the_checker(tmp_path):
    m = copy.deepcopy(BASE)
    m.graph.node[0].attribute[0].type = onnx.AttributeProto.FLOAT
    refused(tmp_path, m, "not a valid ONNX model: Mismatched attribute type in .Conv_0 : dilations.. Expected: .INTS., actual: .FLOAT.")


@pytest.mark.parametrize("name,what,op", [
    ("bn1.running_mean", "running mean", "BatchNormalization 'BatchNormalization_1'"),
    ("bn2.running_var", "running variance", "BatchNormalization 'BatchNormalization_4'"),
    ("bn1.weight", "scale", "BatchNormalization 'BatchNormalization_1'"),
    ("conv2.weight", "weight", "Conv 'Conv_3'"),
    ("fc.bias", "bias", "Gemm 'Gemm_16'"),
])
@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_non_finite_parameters(tmp_path, name, what, op, value):
    m = copy.deepcopy(BASE)
    set_array(m, name, lambda a: a.flat.__setitem__(-1, value))
    shown = "inf" if np.isinf(value) else "nan"
    refused(tmp_path, m, f"the {what} '{name}' of {op} contains 1 non-finite value\\(s\\) \\(first: {shown} at index")


def test_negative_running_variance(tmp_path):
    m = copy.deepcopy(BASE)
    set_array(m, "bn2.running_var", lambda a: a.__setitem__(3, -0.5))
    refused(tmp_path, m, "the running variance 'bn2.running_var' of BatchNormalization 'BatchNormalization_4' "
                         "has 1 negative value\\(s\\) \\(first: -0.5 at index \\(3,\\)\\)")


def test_non_finite_values_elsewhere_are_allowed(tmp_path):
    """An inf in a tensor that is no layer parameter (a mask, a clip bound) is legitimate."""
    m = copy.deepcopy(BASE)
    relu = next(n for n in m.graph.node if n.op_type == "Relu")
    out = relu.output[0]
    relu.output[0] = out + "_pre"
    m.graph.initializer.append(numpy_helper.from_array(np.array(np.inf, np.float32), "upper"))
    m.graph.node.insert(list(m.graph.node).index(relu) + 1, helper.make_node("Min", [out + "_pre", "upper"], [out],
                                                                          name="clip_inf"))
    load_model(save(tmp_path, m))


def test_sparse_initializers_are_densified(tmp_path):
    m = copy.deepcopy(BASE)
    t = init(m, "fc.weight")
    dense = numpy_helper.to_array(t)
    flat = dense.reshape(-1)
    flat_idx = np.nonzero(np.abs(flat) > 0.05)[0]
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(flat[flat_idx], "fc.weight"),
                                       numpy_helper.from_array(flat_idx.astype(np.int64), ""), list(dense.shape))
    m.graph.initializer.remove(t)
    m.graph.sparse_initializer.append(sparse)
    loaded = load_model(save(tmp_path, m)).model
    expected = np.where(np.abs(dense) > 0.05, dense, 0)
    np.testing.assert_array_equal(loaded.graph.initializers["fc.weight"].const_value.numpy(), expected)
    # coordinate indices [NNZ, rank] too, and through the rewrite
    coords = np.stack(np.unravel_index(flat_idx, dense.shape), axis=1).astype(np.int64)
    sparse.indices.CopyFrom(numpy_helper.from_array(coords, ""))
    path = save(tmp_path, m, "coords.onnx")
    np.testing.assert_array_equal(load_model(path).model.graph.initializers["fc.weight"].const_value.numpy(),
                                  expected)
    rewrite_eval(str(path), str(tmp_path / "q.onnx"), calibration_data=str(SAMPLE_CALIB))
    load_model(tmp_path / "q.onnx")


def test_malformed_sparse_initializer(tmp_path):
    m = copy.deepcopy(BASE)
    t = init(m, "fc.weight")
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.ones(3, np.float32), "fc.weight"),
                                       numpy_helper.from_array(np.array([0, 1, 10**9], np.int64), ""), list(t.dims))
    m.graph.initializer.remove(t)
    m.graph.sparse_initializer.append(sparse)
    refused(tmp_path, m, "sparse initializer 'fc.weight' is malformed \\(an index is outside the tensor")


def test_unsorted_graphs_are_sorted(tmp_path):
    m = copy.deepcopy(BASE)
    m.graph.node.reverse()
    path = save(tmp_path, m)
    for name, run in (("e.onnx", lambda out: rewrite_eval(str(path), str(out), calibration_data=str(SAMPLE_CALIB))),
                      ("t.onnx", lambda out: rewrite_train(str(path), str(out)))):
        run(tmp_path / name)
        onnx.checker.check_model(str(tmp_path / name))  # in topological order, as ONNX requires


def test_a_model_proto_given_to_the_api_is_validated_and_not_modified():
    m = copy.deepcopy(BASE)
    m.graph.initializer.append(copy.deepcopy(init(m, "conv1.weight")))
    with pytest.raises(QtoolError, match="initializer name 'conv1.weight' appears 2 times"):
        rewrite_eval(m)
    good = copy.deepcopy(BASE)
    t = init(good, "fc.weight")
    dense = numpy_helper.to_array(t).reshape(-1)
    idx = np.arange(dense.size, dtype=np.int64)
    good.graph.initializer.remove(t)
    good.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(dense, "fc.weight"), numpy_helper.from_array(idx, ""), list(t.dims)))
    before = good.SerializeToString()
    rewrite_eval(good)
    assert good.SerializeToString() == before


def test_constant_nodes_with_external_data_work_from_any_folder(tmp_path, monkeypatch):
    """Exports with convert_attribute=True keep Constant values in the data file: they become
    initializers when read, so calibration, the opset converter and the rewrites find them."""
    import onnxruntime as ort

    models = tmp_path / "models"
    models.mkdir()
    onnx.save(onnx.load(SAMPLE_MODEL), models / "ext.onnx", save_as_external_data=True, location="weights.bin",
              size_threshold=0, convert_attribute=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for name, run in (("e.onnx", rewrite_eval), ("t.onnx", rewrite_train)):
        run(str(models / "ext.onnx"), str(models / name), calibration_data=str(SAMPLE_CALIB))
        run(str(SAMPLE_MODEL), str(tmp_path / name), calibration_data=str(SAMPLE_CALIB))
    x = np.load(SAMPLE_CALIB)["input"][:8]
    got = ort.InferenceSession(str(models / "e.onnx")).run(None, {"input": x})[0]
    want = ort.InferenceSession(str(tmp_path / "e.onnx")).run(None, {"input": x})[0]
    np.testing.assert_array_equal(got, want)
