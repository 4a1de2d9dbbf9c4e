"""``qtool finetune`` on the command line: help, a short run with --json that deploys, no JAX."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from click.testing import CliRunner
from finetune_helpers import CALIB, EVAL
from onnx import TensorProto, helper, numpy_helper

from qtool.cli import main

ROOT = Path(__file__).resolve().parents[2]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_help_lists_the_options():
    result = invoke("finetune", "--help")
    assert result.exit_code == 0
    for option in ("--data", "--output", "--steps", "--batch-size", "--learning-rate", "--labels", "--resume",
                   "--validation-data", "--seed", "--json", "--distillation"):
        assert option in result.output
    assert "finetune" in invoke("--help").output


def test_short_run_with_labels_json_and_the_deployed_model_agrees(graphs, tmp_path):
    """8-bit sample, cross-entropy on the labelled split plus distillation, --json; then
    rewrite-eval deploys the tuned file and onnxruntime's int8 model computes what the tuned
    training graph computes (quantization on, batch norms frozen)."""
    out = tmp_path / "tuned.onnx"
    result = invoke("finetune", graphs["w8a8"], "--data", EVAL, "--labels", "labels", "-o", out, "--steps", 12,
                    "--batch-size", 50, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["metric_name"] == "accuracy" and summary["metric_source"] == "training data"
    assert summary["end_step"] == 12 and summary["output"] == str(out)
    assert summary["after"] >= summary["before"] - 0.002  # keep-best: never worse than the input
    assert "step 1/12" not in result.stderr  # no progress lines with --json

    deployed = tmp_path / "deploy.onnx"
    result = invoke("rewrite-eval", out, "-o", deployed)
    assert result.exit_code == 0, result.output
    data = np.load(EVAL)["input"]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    train = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"]).run(
        ["logits"], {"input": data, "qtool_step": np.array(10**6, np.int64)})[0].astype(np.float64)
    int8 = ort.InferenceSession(str(deployed), options, providers=["CPUExecutionProvider"]).run(
        None, {"input": data})[0].astype(np.float64)
    agreement = np.mean(train.argmax(1) == int8.argmax(1))
    noise = np.sum((train - int8) ** 2)  # 0 where the deployed model is the tuned graph bit for bit
    sqnr = np.inf if noise == 0 else 10 * np.log10(np.sum(train ** 2) / noise)
    assert agreement >= 0.995 and sqnr >= 35, (agreement, sqnr)


def test_progress_lines_and_a_one_line_error(graphs, tmp_path):
    result = invoke("finetune", graphs["w8a8"], "--data", CALIB, "-o", tmp_path / "t.onnx", "--steps", 0)
    assert result.exit_code == 2 and "--steps" in result.output
    result = invoke("finetune", ROOT / "samples" / "digits_cnn.onnx", "--data", CALIB, "-o", tmp_path / "t.onnx")
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "not a qtool training graph" in result.stderr


def test_an_attribute_the_interpreter_does_not_implement_is_one_line_and_exit_2(tmp_path):
    """A LayerNormalization with ``stash_type=0`` (statistics in another precision than float32): refused
    before any training, naming the node and the attribute."""
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("LayerNormalization", ["h", "s", "b"], ["y"], name="ln", stash_type=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.ones(8, np.float32), "s"),
         numpy_helper.from_array(np.zeros(8, np.float32), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=w)
    assert invoke("rewrite-train", tmp_path / "m.onnx", "-o", tmp_path / "m.qat.onnx").exit_code == 0
    result = invoke("finetune", tmp_path / "m.qat.onnx", "--data", tmp_path / "d.npz", "-o", tmp_path / "t.onnx")
    assert result.exit_code == 2 and result.stderr.strip().count("\n") == 0
    assert "node 'ln' (LayerNormalization): attribute stash_type=0 is not supported" in result.stderr


def test_without_jax_the_command_says_which_extra_to_install(graphs, tmp_path):
    """``import jax`` fails (a None entry in sys.modules makes the import raise ImportError)."""
    code = ("import sys; sys.modules['jax'] = None; sys.modules['optax'] = None\n"
            "from qtool.cli import main\n"
            f"main(['finetune', {str(graphs['w8a8'])!r}, '--data', {str(CALIB)!r}, '-o', "
            f"{str(tmp_path / 'o.onnx')!r}])\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "qtool: error: qtool finetune needs the train extra: pip install 'qtool[train]'"
    assert not (tmp_path / "o.onnx").exists()
