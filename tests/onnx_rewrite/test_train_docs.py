"""docs/training.md's example loop runs as written (forward passes, state written back, eval graph)."""

import os
import re

import numpy as np
import onnx
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_training_docs_example_runs(tmp_path, monkeypatch):
    text = open(os.path.join(ROOT, "docs", "training.md"), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1
    os.symlink(os.path.join(ROOT, "samples"), tmp_path / "samples")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], "docs/training.md", "exec"), namespace)
    assert namespace["step"] == 19
    model = onnx.load("digits.qdq.onnx")
    assert any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    ev = np.load(os.path.join(ROOT, "samples", "eval.npz"))
    logits = ort.InferenceSession("digits.qdq.onnx", options, providers=["CPUExecutionProvider"]).run(
        None, {"input": ev["input"]})[0]
    assert np.mean(np.argmax(logits, 1) == ev["labels"]) >= 0.98
