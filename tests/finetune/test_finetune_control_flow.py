"""Control flow in the JAX interpreter (``If``, ``Loop``, ``Scan``): each form against onnxruntime, gradients
against central differences, the refusals in one line; and ``finetune`` on a training graph whose ``If`` reads
an input fed whole with every batch (Silero VAD's sample rate)."""

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qtool.api import finetune, rewrite_train
from qtool.errors import QtoolError
from qtool.finetune.config import FinetuneConfig
from qtool.finetune.interpreter import Interpreter

RNG = np.random.default_rng(3)
F = TensorProto.FLOAT


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _v(name, dtype=F, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name + "_v"))


def _graph(name, nodes, inputs=(), outputs=(), inits=()):
    return helper.make_graph(nodes, name, list(inputs), [_v(o) if isinstance(o, str) else o for o in outputs],
                             [numpy_helper.from_array(v, k) for k, v in dict(inits).items()])


def _model(nodes, inputs, outputs, inits, opset=17):
    model = helper.make_model(_graph("g", nodes, inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _agrees(model, feeds, tol=1e-5, jit=True):
    """The interpreter (jitted: every feed traced) equals onnxruntime on every output."""
    interp = Interpreter(model)
    ours = jax.jit(interp.run)(feeds) if jit else interp.run(feeds)
    for name, want in _ort(model, feeds).items():
        np.testing.assert_allclose(np.asarray(ours[name]), want, rtol=tol, atol=tol, err_msg=name)
    return interp


def _gradient_agrees(interp, feeds, wrt, output):
    """``jax.grad`` of a weighted sum of ``output`` with respect to the feeds ``wrt`` equals central differences
    along two random directions."""
    weights = _r(*np.shape(interp.run(feeds)[output]))

    def loss(moved):
        return jnp.sum(interp.run({**feeds, **moved}, trainable=frozenset(wrt))[output] * weights)

    at = {k: feeds[k] for k in wrt}
    fn = jax.jit(loss)
    grad = jax.jit(jax.grad(loss))(at)
    eps = np.float32(1e-3)
    for _ in range(2):
        d = {k: _r(*v.shape) for k, v in at.items()}
        fd = (float(fn({k: at[k] + eps * d[k] for k in at})) - float(fn({k: at[k] - eps * d[k] for k in at}))) / (2 * eps)
        ad = sum(float(np.sum(np.asarray(grad[k], np.float64) * d[k])) for k in at)
        np.testing.assert_allclose(fd, ad, rtol=2e-2, atol=2e-2)


# --- If -----------------------------------------------------------------------------------------------------------
def _shape_if_model():
    """PyTorch's shape check: ``x.squeeze(1) if x.shape[1] == 1 else x``, the squeezed branch scaled by the outer
    weight ``w`` (its own Constant node gives the axes); the branches give different ranks."""
    then = _graph("then", [_const("axes", [1]), helper.make_node("Squeeze", ["x", "axes"], ["sq"]),
                           helper.make_node("Mul", ["sq", "w"], ["t_out"])], outputs=["t_out"])
    other = _graph("else", [helper.make_node("Identity", ["x"], ["e_out"])], outputs=["e_out"])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), _const("one", np.int64(1)),
             helper.make_node("Gather", ["shape", "one"], ["dim"]), helper.make_node("Equal", ["dim", "one"], ["is1"]),
             helper.make_node("If", ["is1"], ["y"], then_branch=then, else_branch=other)]
    return _model(nodes, [_v("x", F, ["n", "c", 4]), _v("w", F, [4])], ["y"], {"w": _r(4)})


def test_if_on_a_shape_runs_only_the_taken_branch():
    model = _shape_if_model()
    feeds = {"x": _r(3, 1, 4), "w": _r(4)}
    interp = _agrees(model, feeds)
    _gradient_agrees(interp, feeds, ["w", "x"], "y")  # the outer weight read inside the branch is trained
    _agrees(model, {"x": _r(3, 2, 4), "w": feeds["w"]})  # the other branch, another rank


def _data_if_model():
    """A condition computed from data (``sum(x) > 0``): the then branch ``x @ w + b`` (its own initializer b),
    the else branch a nested If on ``max(x) > 1``: ``relu(x @ w)`` or ``x * c`` (a Constant node)."""
    inner_then = _graph("inner_then", [helper.make_node("MatMul", ["x", "w"], ["m2"]),
                                       helper.make_node("Relu", ["m2"], ["it_out"])], outputs=["it_out"])
    inner_else = _graph("inner_else", [_const("c", np.float32(-0.5)), helper.make_node("Mul", ["x", "c"], ["ie_out"])],
                        outputs=["ie_out"])
    then = _graph("then", [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["t_out"])],
                  outputs=["t_out"], inits={"b": _r(4)})
    other = _graph("else", [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0), _const("lim", np.float32(1)),
                            helper.make_node("Greater", ["mx", "lim"], ["big"]),
                            helper.make_node("If", ["big"], ["e_out"], then_branch=inner_then, else_branch=inner_else)],
                   outputs=["e_out"])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), _const("zero", np.float32(0)),
             helper.make_node("Greater", ["s", "zero"], ["pos"]),
             helper.make_node("If", ["pos"], ["y"], then_branch=then, else_branch=other)]
    return _model(nodes, [_v("x", F, [2, 4]), _v("w", F, [4, 4])], ["y"], {"w": _r(4, 4)})


@pytest.mark.parametrize("shift", [3.0, -3.0, -0.1])
def test_if_on_data_is_a_cond_with_nested_branches(shift):
    model = _data_if_model()
    x = _r(2, 4) * 0.3 + np.float32(shift / 8)
    feeds = {"x": x, "w": _r(4, 4)}
    if shift == -0.1:
        feeds["x"] = np.full((2, 4), -0.05, np.float32) + np.eye(2, 4, dtype=np.float32) * 0.01  # max < 1
    interp = _agrees(model, feeds)
    _gradient_agrees(interp, feeds, ["w", "x"], "y")


def test_if_on_data_with_branches_of_other_shapes_is_one_line():
    model = _shape_if_model()
    nodes = list(model.graph.node)
    nodes[-1].input[0] = "pos"
    model.graph.node.insert(0, helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0))
    model.graph.node.insert(1, _const("zero", np.float32(0)))
    model.graph.node.insert(2, helper.make_node("Greater", ["s", "zero"], ["pos"]))
    with pytest.raises(QtoolError) as info:
        jax.jit(Interpreter(model).run)({"x": _r(3, 1, 4), "w": _r(4)})
    message = str(info.value)
    assert "\n" not in message
    assert "its condition is computed from data and its branches give different shapes or types" in message


# --- Scan -----------------------------------------------------------------------------------------------------
def _scan_model(in_axis, in_dir, out_axis, out_dir):
    """``s = s * a + x_t``, ``y_t = tanh(s)`` over x's axis ``in_axis`` (a: an outer weight)."""
    body = _graph("body", [helper.make_node("Mul", ["s_in", "a"], ["sa"]), helper.make_node("Add", ["sa", "x_t"], ["s_out"]),
                           helper.make_node("Tanh", ["s_out"], ["y_t"])],
                  inputs=[_v("s_in", F, [2, 3]), _v("x_t", F, [2, 3])], outputs=["s_out", "y_t"])
    node = helper.make_node("Scan", ["s0", "x"], ["s_last", "y"], body=body, num_scan_inputs=1,
                            scan_input_axes=[in_axis], scan_input_directions=[in_dir], scan_output_axes=[out_axis],
                            scan_output_directions=[out_dir])
    return _model([node], [_v("s0", F, [2, 3]), _v("x", F, None), _v("a", F, [3])], ["s_last", "y"], {"a": _r(3)})


@pytest.mark.parametrize("in_axis,in_dir,out_axis,out_dir", [(0, 0, 0, 0), (1, 1, -1, 1), (-2, 0, 1, 1)])
def test_scan_axes_and_directions(in_axis, in_dir, out_axis, out_dir):
    x = _r(5, 2, 3)
    x = np.moveaxis(x, 0, in_axis if in_axis >= 0 else 3 + in_axis)
    feeds = {"s0": _r(2, 3), "x": np.ascontiguousarray(x), "a": _r(3) * 0.5}
    interp = _agrees(_scan_model(in_axis, in_dir, out_axis, out_dir), feeds)
    if in_dir:
        _gradient_agrees(interp, feeds, ["a", "x", "s0"], "y")


def test_scan_of_constants_runs_on_the_host():
    model = _scan_model(0, 0, 0, 0)
    inits = {"s0": _r(2, 3), "x": _r(4, 2, 3), "a": _r(3)}
    model.graph.ClearField("input")
    model.graph.initializer.extend([numpy_helper.from_array(v, k) for k, v in inits.items() if k != "a"])
    out = Interpreter(model).run({})
    assert all(isinstance(v, np.ndarray) for v in out.values())  # a constant: static inside jit
    ref = _ort(model, {})
    for k, v in ref.items():
        np.testing.assert_allclose(out[k], v, rtol=1e-6, atol=1e-6)


# --- Loop -----------------------------------------------------------------------------------------------------
def _loop_model(trips, cond, body_cond, scan_output=True, trip_input=False):
    """``h = tanh(h @ W + i)`` (W: an outer weight, i the iteration number) with ``h`` as a scan output too.
    ``trips``: the trip count constant (None: none); ``cond``: the initial condition constant (None: none,
    "data": ``sum(x) > -100``); ``body_cond``: "same" (the condition passed on), "data" (``sum(h) < 1.5``)."""
    b_nodes = [helper.make_node("MatMul", ["h_in", "W"], ["hw"]), helper.make_node("Cast", ["i"], ["fi"], to=F),
               helper.make_node("Add", ["hw", "fi"], ["pre"]), helper.make_node("Tanh", ["pre"], ["h_out"])]
    if body_cond == "data":
        b_nodes += [helper.make_node("ReduceSum", ["h_out"], ["hs"], keepdims=0), _const("lim", np.float32(1.5)),
                    helper.make_node("Less", ["hs", "lim"], ["c_out"])]
    else:
        b_nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    outs = [_v("c_out", TensorProto.BOOL, []), "h_out"] + (["y_t"] if scan_output else [])
    if scan_output:
        b_nodes.append(helper.make_node("Identity", ["h_out"], ["y_t"]))
    body = _graph("body", b_nodes, inputs=[_v("i", TensorProto.INT64, []), _v("c_in", TensorProto.BOOL, []),
                                           _v("h_in", F, [2, 3])], outputs=outs)
    nodes = []
    if trips is not None and not trip_input:
        nodes.append(_const("M", np.int64(trips)))
    if trip_input:  # the trip count computed from data: round(sum(x)) clipped to 1..6
        nodes += [helper.make_node("ReduceSum", ["x"], ["xs"], keepdims=0), _const("lo", np.float32(1)),
                  _const("hi", np.float32(6)), helper.make_node("Clip", ["xs", "lo", "hi"], ["xc"]),
                  helper.make_node("Round", ["xc"], ["xr"]), helper.make_node("Cast", ["xr"], ["M"], to=TensorProto.INT64)]
    if cond == "data":
        nodes += [helper.make_node("ReduceSum", ["x"], ["xs2"], keepdims=0), _const("neg", np.float32(-100)),
                  helper.make_node("Greater", ["xs2", "neg"], ["C"])]
    elif cond is not None:
        nodes.append(_const("C", np.bool_(cond)))
    nodes.append(helper.make_node("Loop", ["M" if trips is not None or trip_input else "", "C" if cond is not None else "",
                                           "x"], ["h_last"] + (["y"] if scan_output else []), body=body))
    return _model(nodes, [_v("x", F, [2, 3]), _v("W", F, [3, 3])], ["h_last"] + (["y"] if scan_output else []),
                  {"W": _r(3, 3)})


@pytest.mark.parametrize("cond", [None, True])
def test_loop_with_a_static_trip_count_is_a_scan(cond):
    feeds = {"x": _r(2, 3), "W": _r(3, 3) * 0.5}
    interp = _agrees(_loop_model(4, cond, "same"), feeds)
    _gradient_agrees(interp, feeds, ["W", "x"], "y")


@pytest.mark.parametrize("cond", [True, "data"])
def test_loop_with_a_data_condition_masks_its_last_iterations(cond):
    model = _loop_model(6, cond, "data", scan_output=False)
    for x in (np.full((2, 3), -0.6, np.float32), np.full((2, 3), 0.05, np.float32)):  # stops early / runs all
        feeds = {"x": x, "W": np.eye(3, dtype=np.float32) * 0.3}
        interp = _agrees(model, feeds)
    _gradient_agrees(interp, feeds, ["W", "x"], "h_last")


def test_loop_with_a_data_condition_and_scan_outputs_is_one_line():
    with pytest.raises(QtoolError) as info:
        jax.jit(Interpreter(_loop_model(6, True, "data")).run)({"x": _r(2, 3), "W": _r(3, 3)})
    assert "\n" not in str(info.value)
    assert "a Loop whose condition is computed from data has scan outputs" in str(info.value)


def test_while_loop_runs_forward_and_refuses_training_through_it():
    model = _loop_model(None, None, "data", scan_output=False, trip_input=True)
    feeds = {"x": np.full((2, 3), 0.5, np.float32), "W": np.eye(3, dtype=np.float32) * 0.3}
    _agrees(model, feeds)
    interp = Interpreter(model)
    with pytest.raises(QtoolError) as info:
        jax.jit(lambda f: interp.run(f, trainable=frozenset({"W"})))(feeds)
    message = str(info.value)
    assert "\n" not in message
    assert "a Loop whose trip count is computed from data (a while loop) reads 'W'" in message


def _counter_loop_model(trips_from_data=False):
    """paddle's decoder loop: a step counter ``c`` carried (from 0), the body slicing ``x`` at it (``x[c:c+1]``,
    a Slice whose start must be a constant), its square summed into ``acc`` and a scan output; it stops when ``c + 1``
    reaches 4 (the trip count, 10, is larger; ``trips_from_data``: at least 5, computed from x, and no scan
    output)."""
    i64 = TensorProto.INT64
    b_nodes = [_const("one", np.array([1], np.int64)), _const("zero", np.array([0], np.int64)),
               helper.make_node("Add", ["c_in", "one"], ["c_out"]),
               helper.make_node("Slice", ["x", "c_in", "c_out", "zero"], ["row"]),
               helper.make_node("Mul", ["row", "row"], ["sq"]), helper.make_node("Add", ["acc_in", "sq"], ["acc_out"]),
               helper.make_node("Identity", ["sq"], ["y_t"]), _const("four", np.array([4], np.int64)),
               helper.make_node("Less", ["c_out", "four"], ["lt"]), helper.make_node("Squeeze", ["lt", "zero"], ["go"])]
    body = _graph("body", b_nodes, inputs=[_v("i", i64, []), _v("c_in_cond", TensorProto.BOOL, []),
                                           _v("c_in", i64, [1]), _v("acc_in", F, [1, 3])],
                  outputs=[_v("go", TensorProto.BOOL, []), _v("c_out", i64, [1]), "acc_out"] + ([] if trips_from_data else ["y_t"]))
    nodes = [_const("c0", np.array([0], np.int64)), _const("acc0", np.zeros((1, 3), np.float32)), _const("T", np.bool_(True))]
    if trips_from_data:
        nodes += [helper.make_node("ReduceMax", ["x"], ["xm"], keepdims=0), _const("lo", np.float32(5)),
                  helper.make_node("Max", ["xm", "lo"], ["xc"]), helper.make_node("Cast", ["xc"], ["M"], to=i64)]
    else:
        nodes.append(_const("M", np.int64(10)))
    outs = ["c_last", "acc"] + ([] if trips_from_data else ["y"])
    nodes.append(helper.make_node("Loop", ["M", "T", "c0", "acc0"], outs, body=body))
    return _model(nodes, [_v("x", F, [6, 3])], [_v("c_last", i64, [1])] + outs[1:], {})


def test_loop_whose_body_needs_its_counter_as_a_constant_unrolls():
    feeds = {"x": _r(6, 3)}
    interp = _agrees(_counter_loop_model(), feeds)
    assert interp.run(feeds)["y"].shape == (4, 1, 3)
    _gradient_agrees(interp, feeds, ["x"], "acc")
    with pytest.raises(QtoolError) as info:
        jax.jit(Interpreter(_counter_loop_model(trips_from_data=True)).run)(feeds)
    assert "\n" not in str(info.value)
    assert "in the body of a Loop whose trip count or condition is computed from data, which the interpreter " \
           "cannot unroll" in str(info.value)


def test_loop_whose_condition_is_false_at_the_start_runs_no_iteration():
    model = _loop_model(5, False, "same")
    feeds = {"x": _r(2, 3), "W": _r(3, 3)}
    interp = _agrees(model, feeds)
    assert interp.run(feeds)["y"].shape == (0, 2, 3)


def test_loop_of_constants_runs_on_the_host_and_stops_at_its_condition():
    model = _loop_model(2**62, True, "data", scan_output=True)  # a while loop (PyTorch's huge trip count)
    model.graph.ClearField("input")
    model.graph.initializer.extend([numpy_helper.from_array(np.full((2, 3), -0.2, np.float32), "x")])
    out = Interpreter(model).run({})
    assert all(isinstance(v, np.ndarray) for v in out.values())
    ref = _ort(model, {})
    assert ref["y"].shape[0] > 1
    for k, v in ref.items():
        np.testing.assert_allclose(out[k], v, rtol=1e-6, atol=1e-6)


# --- finetune ---------------------------------------------------------------------------------------------------
def _rate_if_model():
    """Silero VAD's shape: every layer inside one If on the sample rate ``sr`` (a scalar input); the 16 kHz
    branch a MatMul by an outer weight, the 8 kHz one by another, into a narrower output (so only a
    condition known at trace time can run it: the branches differ in shape)."""
    def branch(name, weight):
        return _graph(name, [helper.make_node("MatMul", ["h", weight], [f"{name}_y"])], outputs=[_v(f"{name}_y", F, None)])

    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), _const("rate", np.int64(16000)),
             helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], name="/decoder/If", then_branch=branch("then", "w16"),
                              else_branch=branch("else", "w8"))]
    inits = {"w": np.eye(4, dtype=np.float32) + _r(4, 4) * 0.1, "w16": _r(4, 4), "w8": _r(4, 2)}
    return _model(nodes, [_v("x", F, ["n", 4]), _v("sr", TensorProto.INT64, [])], [_v("y", F, None)], inits)


@pytest.mark.parametrize("rate", [16000, 8000])
def test_finetune_trains_a_model_with_an_if_on_its_sample_rate(tmp_path, rate):
    """The sample rate has no batch axis (fed whole with every batch, the same for the whole dataset): the
    compiled step holds it as a constant and runs only the taken branch (a traced rate would be refused: the
    branches differ in shape)."""
    data = {"x": _r(16, 4), "sr": np.array(rate, np.int64)}
    rewrite_train(_rate_if_model(), str(tmp_path / "q.onnx"), calibration_data=data)
    result = finetune(str(tmp_path / "q.onnx"), data, str(tmp_path / "tuned.onnx"),
                      FinetuneConfig(steps=3, batch_size=8, learning_rate=1e-3, keep_best=False))
    assert result.steps_run == 3 and np.isfinite(result.loss_last)
    weights = [{t.name: numpy_helper.to_array(t) for t in onnx.load(str(p)).graph.initializer}["w"]
               for p in (tmp_path / "q.onnx", tmp_path / "tuned.onnx")]
    assert not np.array_equal(*weights)  # trained
    tuned = _ort(onnx.load(str(tmp_path / "tuned.onnx")), {**data, "qtool_step": np.array(10**6, np.int64)})
    assert tuned["y"].shape == (16, 4 if rate == 16000 else 2)


def _while_after_a_layer_model():
    """A quantized layer (``h = x @ w``), then a while loop over ``h`` (a trip count computed from the data):
    training would need the gradient through the loop to reach ``w``."""
    body = _graph("body", [helper.make_node("Tanh", ["h_in"], ["h_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
                  inputs=[_v("i", TensorProto.INT64, []), _v("c_in", TensorProto.BOOL, []), _v("h_in", F, ["n", 4])],
                  outputs=[_v("c_out", TensorProto.BOOL, []), "h_out"])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("ReduceMax", ["x"], ["xm"], keepdims=0),
             _const("lo", np.float32(1)), _const("hi", np.float32(4)), helper.make_node("Clip", ["xm", "lo", "hi"], ["xc"]),
             helper.make_node("Cast", ["xc"], ["M"], to=TensorProto.INT64),
             helper.make_node("Loop", ["M", "", "h"], ["y"], name="/decode/Loop", body=body)]
    return _model(nodes, [_v("x", F, ["n", 4])], [_v("y", F, ["n", 4])], {"w": _r(4, 4)})


def test_finetune_cli_refuses_training_through_a_while_loop_in_one_line(tmp_path):
    from click.testing import CliRunner

    from qtool.cli import main

    data = tmp_path / "data.npz"
    np.savez(data, x=_r(8, 4) + 2)
    rewrite_train(_while_after_a_layer_model(), str(tmp_path / "q.onnx"), calibration_data=str(data))
    result = CliRunner().invoke(main, ["finetune", str(tmp_path / "q.onnx"), "--data", str(data), "-o",
                                       str(tmp_path / "t.onnx"), "--steps", "2", "--quiet"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output
    assert "node '/decode/Loop' (Loop): a Loop whose trip count is computed from data (a while loop) reads 'h'" in lines[0]
    assert "JAX cannot differentiate a while loop in reverse mode" in lines[0]


def _branch_ops(path) -> dict:
    counts = {}
    for node in onnx.load(str(path)).graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                counts[attr.name] = sorted(n.op_type for n in attr.g.node)
    return counts


def test_an_if_branch_quantized_for_training_trains_and_deploys_as_trained(tmp_path):
    """rewrite-train quantizes the branch the data takes (its state in the enclosing graph, returned through
    the If); the interpreter runs the training graph as onnxruntime does (either rate: the other branch passes
    the state through); finetune trains the branch's weight and ranges; rewrite-eval deploys the branch with
    the trained ranges, bit for bit the tuned training graph."""
    from qtool.api import rewrite_eval
    from qtool.finetune.train import _moving_average_inputs, _open_graph
    from qtool.onnx_rewrite.train_graph import training_contract

    data = {"x": _r(16, 4), "sr": np.array(16000, np.int64)}
    q, tuned, deployed = tmp_path / "q.onnx", tmp_path / "t.onnx", tmp_path / "d.onnx"
    rewrite_train(_rate_if_model(), str(q), calibration_data=data)
    contract = training_contract(str(q))
    assert "w16" in contract["parameters"] and "MatMul_2/act_quant/min" in contract["state"]
    model = onnx.load(str(q))
    for rate in (16000, 8000):
        feeds = {"x": data["x"], "sr": np.array(rate, np.int64), "qtool_step": np.array(0, np.int64)}
        ours = Interpreter(model).run(feeds)
        for name, want in _ort(model, feeds).items():
            np.testing.assert_allclose(np.asarray(ours[name]), want, rtol=1e-6, atol=1e-6, err_msg=f"{rate} {name}")
    graph = _open_graph(str(q), FinetuneConfig(steps=1), [])  # the gradient stops at the branch's batch ranges too
    assert len(_moving_average_inputs(graph.interp, graph.roles)) == 2 * len(set(graph.roles.ranges)) == 8
    finetune(str(q), data, str(tuned), FinetuneConfig(steps=4, batch_size=8, learning_rate=1e-2, keep_best=False))
    before, after = ({t.name: numpy_helper.to_array(t) for t in onnx.load(str(p)).graph.initializer} for p in (q, tuned))
    assert not np.array_equal(before["w16"], after["w16"])
    assert before["MatMul_2/act_quant/max"] != after["MatMul_2/act_quant/max"]
    rewrite_eval(str(tuned), str(deployed))
    assert "QuantizeLinear" in _branch_ops(deployed)["then_branch"]
    assert "QuantizeLinear" not in _branch_ops(deployed)["else_branch"]
    held = _ort(onnx.load(str(tuned)), {**data, "qtool_step": np.array(10**6, np.int64)})["y"]
    np.testing.assert_array_equal(_ort(onnx.load(str(deployed)), data)["y"], held)


def test_nested_if_branches_quantized_for_training_train_and_deploy_as_trained(tmp_path):
    """Silero's default export: every layer in an If inside an If branch. rewrite-train quantizes the inner
    branches the data takes too (their state hoisted through both Ifs to the graph, their records nested in
    the outer branch's); the interpreter runs it as onnxruntime does; finetune trains the inner branch's weight
    (a Constant node there: a parameter of the graph now) and ranges; rewrite-eval deploys it bit for bit."""
    from onnx_rewrite.test_if_branches import data as silero_data
    from onnx_rewrite.test_if_branches import silero_like

    from qtool.api import rewrite_eval
    from qtool.onnx_rewrite.train_graph import training_contract

    data = silero_data()
    q, tuned, deployed = tmp_path / "q.onnx", tmp_path / "t.onnx", tmp_path / "d.onnx"
    result = rewrite_train(silero_like(17, constant_weights=True, nested=True), str(q), calibration_data=data)
    assert not [w for w in result.warnings if "holds If branches of its own" in w]
    (outer,) = training_contract(str(q))["branches"]
    inner = outer["branches"][0]  # (the inner branches the data takes: the weights are random)
    assert (outer["if"], outer["branch"], inner["if"]) == ("by_rate", "then_branch", "t_inner")
    weight = inner["parameters"][0]
    model = onnx.load(str(q))
    feeds = {**silero_data(n=4), "qtool_step": np.array(0, np.int64)}
    ours = Interpreter(model).run(feeds)
    for name, want in _ort(model, feeds).items():  # the output and every state update, the inner ones included
        np.testing.assert_allclose(np.asarray(ours[name]), want, rtol=1e-6, atol=1e-6, err_msg=name)
    finetune(str(q), data, str(tuned), FinetuneConfig(steps=4, batch_size=8, learning_rate=1e-2, keep_best=False))
    before, after = ({t.name: numpy_helper.to_array(t) for t in onnx.load(str(p)).graph.initializer} for p in (q, tuned))
    assert not np.array_equal(before[weight], after[weight])
    inner_max = inner["activation_quantizers"][0]["max"]
    assert before[inner_max] != after[inner_max]
    rewrite_eval(str(tuned), str(deployed))
    (by_rate,) = [n for n in onnx.load(str(deployed)).graph.node if n.op_type == "If"]
    then = next(a.g for a in by_rate.attribute if a.name == "then_branch")
    inner_ops = {a.name: {n.op_type for n in a.g.node} for n in then.node if n.op_type == "If" for a in n.attribute}
    assert "QuantizeLinear" in inner_ops[inner["branch"]]
    held = _ort(onnx.load(str(tuned)), {**data, "qtool_step": np.array(10**6, np.int64)})["y"]
    np.testing.assert_array_equal(_ort(onnx.load(str(deployed)), data)["y"], held)
