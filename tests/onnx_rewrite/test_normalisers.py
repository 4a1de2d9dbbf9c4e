"""Linear attention's normaliser in the same tensor as its values (``onnx_rewrite/placement/normalisers.py``).

EfficientViT's ``LiteMLA`` computes ``kv = k^T [v, 1]`` (numerators, and the denominators ``sum(k)`` in the last
column), ``out = q kv``, then ``out[..., :-1] / (out[..., -1:] + eps)``. Quantized as the input of ``q kv``,
``kv`` had one range over numerators and denominators: EfficientViT-B0's int8 output SQNR was 0.5 dB. The MatMul
``q kv`` now stays float, with its reason."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from model_builders import Builder, run
from test_exported_models import paths
from test_placement_integer import optimized_ops

import qtool
import qtool.onnx_rewrite.placement as placement
from qtool.onnx_rewrite.placement.normalisers import shared_normaliser_layers


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    ref = ref.astype(np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2)))


@pytest.mark.parametrize("name", ["dynamo_LinearAttention", "legacy17_LinearAttention"])
def test_linear_attention_keeps_its_signal_in_int8(name, tmp_path, monkeypatch):
    """Both exporters' block: ``q kv`` is left in float with its reason, every other layer runs in integers in
    onnxruntime (``k^T [v, 1]`` as MatMulIntegerToFloat), and the int8 output is close to float's (28.7 dB); with
    ``kv`` quantized as before, 11.9 dB."""
    model, data = paths(name)
    feeds = dict(np.load(data))
    want = run(onnx.load(model), feeds)[0]
    result = qtool.rewrite_eval(model, calibration_data=feeds)
    left = result.summary["left_in_float"]
    assert len(left) == 1 and left[0]["op"] == "MatMul", left
    assert "numerators and the denominator of a Div" in left[0]["reason"]
    quantized = ir.serde.serialize_model(result.model)
    assert _sqnr(want, run(quantized, feeds)[0]) > 25
    ops = optimized_ops(quantized, tmp_path)
    assert ops["MatMul"] == 1 and ops["MatMulIntegerToFloat"] == 1 and ops["QLinearMatMul"] == 0, ops
    assert ops["QLinearConv"] == 3 and not ops["Conv"] and not ops["FusedConv"], ops
    train = qtool.rewrite_train(model, calibration_data=feeds)  # the training graph: the same tensors
    assert {a["tensor"] for a in train.summary["activations"]} == {a["tensor"] for a in result.summary["activations"]}
    assert [e["node"] for e in train.summary["left_in_float"]] == [left[0]["node"]]

    monkeypatch.setattr(placement, "shared_normaliser_layers", lambda graph: [])
    before = qtool.rewrite_eval(model, calibration_data=feeds)
    assert not before.summary["left_in_float"]
    assert _sqnr(want, run(ir.serde.serialize_model(before.model), feeds)[0]) < 15


def _attention(select: str = "slice", reciprocal: bool = False, weight: bool = False, other: bool = False):
    """``q @ kv`` then numerators / (denominator + eps), the two selected from ``out`` by ``select`` (slice, split,
    gather); ``reciprocal``: ``num * Reciprocal(den)``; ``weight``: ``kv`` a constant; ``other``: the denominator
    selected from another tensor."""
    b = Builder(opset=18)
    q = b.node("Relu", [b.input("q", ["N", 2, 6, 4])])
    kv = b.const(np.ones((2, 4, 5), np.float32)) if weight else b.input("kv", ["N", 2, 4, 5])
    out = b.node("MatMul", [q, kv], name="q_kv")
    source = b.node("MatMul", [q, b.input("kv2", ["N", 2, 4, 5])], name="other") if other else out
    if select == "split":
        num, den = b.node("Split", [out, b.const(np.array([4, 1], np.int64))], outputs=["num", "den"], axis=-1), "den"
    elif select == "gather":
        num = b.node("Slice", [out, b.const(np.array([0], np.int64)), b.const(np.array([-1], np.int64)),
                               b.const(np.array([-1], np.int64))])
        den = b.node("Unsqueeze", [b.node("Gather", [source, b.const(np.array(-1, np.int64))], axis=-1),
                                   b.const(np.array([-1], np.int64))])
    else:
        num = b.node("Slice", [out, b.const(np.array([0], np.int64)), b.const(np.array([-1], np.int64)),
                               b.const(np.array([-1], np.int64))])
        den = b.node("Slice", [source, b.const(np.array([-1], np.int64)), b.const(np.array([5], np.int64)),
                               b.const(np.array([-1], np.int64))])
    den = b.node("Add", [den, b.const(np.array(1e-5, np.float32))])
    y = b.node("Mul", [num, b.node("Reciprocal", [den])]) if reciprocal else b.node("Div", [num, den])
    return b.ir([y])


@pytest.mark.parametrize("select,reciprocal", [("slice", False), ("split", False), ("gather", False),
                                               ("slice", True)])
def test_found_through_any_selection(select, reciprocal):
    model = _attention(select, reciprocal)
    assert [n.name for n in shared_normaliser_layers(model.graph)] == ["q_kv"]


@pytest.mark.parametrize("kwargs", [{"weight": True}, {"other": True}, {"other": True, "select": "gather"}])
def test_not_found(kwargs):
    """A MatMul with a constant ``kv`` (per-column weight scales separate the denominator already), and a
    denominator selected from another tensor."""
    assert shared_normaliser_layers(_attention(**kwargs).graph) == []
