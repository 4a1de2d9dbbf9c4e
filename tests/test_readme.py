"""The README's examples stay true."""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_fresh_machine_commands():
    block = re.search(r"```sh\n(.*?)```", README, re.S).group(1)
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert "pip install -e ." in commands[0] and "qtool rewrite-eval samples/digits_cnn.onnx" in commands[0]
    assert commands[1].endswith("python -m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install --quiet -e ".[test,cuda]"' in ci and "python -m pytest -q" in ci


def test_readme_python_tour_runs(tmp_path, monkeypatch):
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    (tmp_path / "samples").symlink_to(ROOT / "samples")
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
    assert os.path.exists("digits.qdq.onnx") and os.path.exists("digits.qat.onnx")
    assert len(namespace["result"].summary["batch_norms_folded"]) == 4
    assert namespace["codes"].dtype.name == "int32"
