"""Paths the finetune tests share (a module of its own: ``conftest`` is not importable by name
when several test folders have one)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
MODEL = SAMPLES / "digits_cnn.onnx"
CALIB = SAMPLES / "calib.npz"
EVAL = SAMPLES / "eval.npz"
ROOT = SAMPLES.parent


def exact_reports(paths, data, steps) -> list[dict]:
    """JAX against onnxruntime on training graphs (``exact_forward.py`` in a subprocess with XLA's ISA capped):
    per graph, per step, per output, whether they are equal bit for bit. ``data``: one ``.npz`` of feeds for every
    graph, or a list of one per graph."""
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_max_isa=AVX", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("exact_forward.py")),
                           ",".join(str(p) for p in paths), ",".join(map(str, np.atleast_1d(data)))]
                          + [str(s) for s in steps],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    return [reports[str(p)] for p in paths]


def exact_report(path, data, steps) -> dict:
    return exact_reports([path], data, steps)[0]
