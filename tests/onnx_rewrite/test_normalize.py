"""Both rewrites start with one list of normalising steps (qtool.onnx_rewrite.normalize), so that rewrite-eval and
rewrite-train plan on the same graph."""

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from qtool.config import QuantConfig
from qtool.model.io import model_from_proto
from qtool.onnx_rewrite import normalize as normalize_module
from qtool.onnx_rewrite.eval_rewrite import prepare_eval
from qtool.onnx_rewrite.train_rewrite import prepare_train

STEPS = ["name_unnamed_nodes", "float16_as_float32", "same_type_casts_as_identities", "remove_identities",
         "prelus_from_sums", "check_exclude", "fold_weight_expressions"]


def _model():
    """x -> Identity -> Cast(float) -> MatMul(Concat(Wa, Wb): a weight computed from constants) -> Relu (unnamed)."""
    rng = np.random.default_rng(0)
    wa, wb = (nh.from_array(rng.normal(0, 0.5, (4, 6)).astype(np.float32), n) for n in ("Wa", "Wb"))
    nodes = [h.make_node("Identity", ["x"], ["xi"], name="id"),
             h.make_node("Cast", ["xi"], ["xc"], to=TensorProto.FLOAT, name="cast"),
             h.make_node("Concat", ["Wa", "Wb"], ["W"], axis=0, name="wcat"),
             h.make_node("MatMul", ["xc", "W"], ["m"], name="fc"),
             h.make_node("Relu", ["m"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])], [wa, wb])
    proto = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    proto.ir_version = 8
    return model_from_proto(proto, "<test>")


@pytest.fixture
def calls(monkeypatch):
    """Every step of the normalisation, recorded by name as it runs."""
    seen = []
    for step in STEPS:
        real = getattr(normalize_module, step)

        def spy(*args, _real=real, _name=step, **kwargs):
            seen.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(normalize_module, step, spy)
    return seen


def test_both_rewrites_run_the_one_list(calls):
    prepare_eval(_model(), QuantConfig())
    eval_steps = list(calls)
    calls.clear()
    prepare_train(_model(), QuantConfig())
    assert eval_steps == STEPS  # the PRelus qtool wrote as sums are read back by the eval rewrite only
    assert calls == [s for s in STEPS if s != "prelus_from_sums"]


def test_both_rewrites_plan_on_the_same_normalized_graph():
    e = prepare_eval(_model(), QuantConfig())
    t = prepare_train(_model(), QuantConfig())
    for graph in (e.model.graph, t.planned.graph, t.model.graph):
        assert not any(n.op_type in ("Identity", "Cast", "Concat") for n in graph)  # gone, folded
        assert all(n.name for n in graph)
    assert e.tensors_to_calibrate() == t.tensors_to_calibrate()
    assert e.folds.weight_expressions == t.eval_folds.weight_expressions and e.folds.weight_expressions
