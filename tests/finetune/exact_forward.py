"""Run a training graph with JAX and with onnxruntime; print how they compare, as JSON.

Run as a script by ``test_finetune_interpreter.py`` in a subprocess with
``XLA_FLAGS=--xla_cpu_max_isa=AVX``: XLA reads its flags when the backend
starts, so the cap (no FMA instructions on the CPU) must be set before JAX
runs anything in the process.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort

from qtool.finetune.interpreter import Interpreter


def main(paths: str, data: str, steps: list[int]) -> None:
    """``paths``: training graphs separated by commas (one process, one JAX start, for all of them);
    ``data``: one ``.npz`` of feeds (by input name) for all, or one per graph, separated by commas."""
    paths, datas = paths.split(","), data.split(",")
    datas = datas * len(paths) if len(datas) == 1 else datas
    print(json.dumps({path: compare(path, d, steps) for path, d in zip(paths, datas)}))


def compare(path: str, data: str, steps: list[int]) -> dict:
    interp = Interpreter(onnx.load(path))
    arrays = np.load(data)
    feeds = {name: arrays[name] for name in arrays.files if name in interp.input_names}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    fn = jax.jit(lambda feeds: interp.run(feeds))
    report = {}
    for step in steps:
        ref = dict(zip(interp.output_names, session.run(None, {**feeds, "qtool_step": np.array(step, np.int64)})))
        out = fn({**{k: jnp.asarray(v) for k, v in feeds.items()}, "qtool_step": jnp.int32(step)})
        report[str(step)] = {
            name: {"equal": bool(np.array_equal(np.asarray(out[name]).view(np.uint32), ref[name].view(np.uint32))),
                   "max_abs_diff": float(np.max(np.abs(np.asarray(out[name]) - ref[name]))),
                   "max_abs": float(np.max(np.abs(ref[name]))),
                   "close_fraction": float(np.mean(np.abs(np.asarray(out[name]) - ref[name])
                                                   <= 1e-5 * np.max(np.abs(ref[name]))))}
            for name in interp.output_names
        }
    return report


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]])
