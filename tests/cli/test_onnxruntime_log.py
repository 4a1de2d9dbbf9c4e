"""onnxruntime's own warnings stay off the CLI's stderr (one place: qtool.model.session), unless --debug.

A tf2onnx-style Resize with the deprecated ``tf_half_pixel_for_nn`` makes onnxruntime warn from its process-wide
default logger in every session that holds it: before, each command printed one such line per session. The
commands run in a fresh process: onnxruntime writes to the process's stderr itself, and its logger is global.
"""

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

WARNING = "tf_half_pixel_for_nn"


@pytest.fixture(scope="module")
def resize_model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resize")
    rng = np.random.default_rng(0)
    inits = [nh.from_array(np.array([], np.float32), "roi"),
             nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
             nh.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "W")]
    nodes = [h.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             h.make_node("Resize", ["c", "roi", "scales"], ["y"], mode="nearest",
                         coordinate_transformation_mode="tf_half_pixel_for_nn", name="up")]
    graph = h.make_graph(nodes, "resize", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 16, 16])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp / "resize.onnx"))
    np.savez(tmp / "data.npz", x=rng.normal(0, 1, (8, 3, 8, 8)).astype(np.float32))
    return tmp


def _qtool(*args):
    proc = subprocess.run([sys.executable, "-m", "qtool", *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("command", ["rewrite-eval", "rewrite-train", "calibrate", "simulate"])
def test_onnxruntime_warnings_stay_off_stderr(resize_model, command):
    model, data = resize_model / "resize.onnx", resize_model / "data.npz"
    out = ["-o", resize_model / f"{command}.out"] if command != "simulate" else []
    err = _qtool(command, model, "--data", data, *out)
    assert WARNING not in err and "onnxruntime" not in err, err
    assert f"qtool {command}" in err  # the progress lines are still there


def test_debug_shows_them(resize_model):
    err = _qtool("--debug", "simulate", resize_model / "resize.onnx", "--data", resize_model / "data.npz")
    assert WARNING in err  # the model does make onnxruntime warn


def test_a_program_calling_the_api_keeps_onnxruntime_s_process_log(resize_model):
    """onnxruntime's default logger is process-wide: qtool's API leaves it as the calling program has it (its own
    sessions warn as before), while qtool's sessions stay quiet on their own logger."""
    script = (
        "import sys, onnxruntime as ort, qtool.api as api\n"
        f"api.rewrite_eval({str(resize_model / 'resize.onnx')!r}, {str(resize_model / 'api.onnx')!r}, "
        f"calibration_data={str(resize_model / 'data.npz')!r})\n"
        "print('--- own session ---', file=sys.stderr, flush=True)\n"
        f"ort.InferenceSession({str(resize_model / 'resize.onnx')!r}, providers=['CPUExecutionProvider'])\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    own = proc.stderr.split("--- own session ---")[1]
    assert WARNING in own, proc.stderr
