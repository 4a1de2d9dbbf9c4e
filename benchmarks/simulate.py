"""Benchmark: ``qtool.simulate`` against the bare onnxruntime runs it needs, in one run.

The bare runs are what a user would write to get the same model outputs:
an ``InferenceSession`` per model (default options, CPU) created from the
file, then every batch of the data through it (float model + quantized
model). ``simulate`` does that plus reading the intermediate tensors, the
metric kernels, the exactness check and the report. Both include session
creation; neither includes imports or numba compilation (a warm-up run
loads the cached kernels first). Runs alternate, and the median of
``--repeat`` runs is reported, with the machine's load average.

    python benchmarks/simulate.py [--repeat 7] [--batch-size 16] [--what-if]

Goal: simulate / bare <= 1.3 (``--quantized`` mode). ``--what-if`` also times
the in-memory mode (rewrite_eval + calibration per bit width pair) against
bare float + calibration + quantized runs, for information.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from qtool.simulate.config import SimulateConfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL = os.path.join(ROOT, "samples", "digits_cnn.onnx")
EVAL = os.path.join(ROOT, "samples", "eval.npz")
CALIB = os.path.join(ROOT, "samples", "calib.npz")


def bare_runs(paths, x, batch_size):
    import onnxruntime as ort

    outs = []
    for path in paths:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        name = session.get_outputs()[0].name
        res = [session.run([name], {"input": x[i : i + batch_size]})[0] for i in range(0, len(x), batch_size)]
        outs.append(np.concatenate(res))
    return outs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--what-if", action="store_true", help="also time the in-memory what-if mode")
    args = ap.parse_args(argv)

    import qtool

    x = np.load(EVAL)["input"]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="qtool-bench-") as tmp:
        qpath = os.path.join(tmp, "digits.qdq.onnx")
        qtool.rewrite_eval(MODEL, qpath, calibration_data=CALIB)
        # warm-up: imports, cached numba kernels, onnxruntime's first-session costs
        bare_runs([MODEL, qpath], x, args.batch_size)
        res = qtool.api.simulate(MODEL, EVAL, SimulateConfig(labels="labels", quantized=[qpath], batch_size=args.batch_size))

        t_bare, t_sim = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            bare_runs([MODEL, qpath], x, args.batch_size)
            t_bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            res = qtool.api.simulate(MODEL, EVAL, SimulateConfig(labels="labels", quantized=[qpath], batch_size=args.batch_size))
            t_sim.append(time.perf_counter() - t)
        bare, sim = statistics.median(t_bare), statistics.median(t_sim)
        print(f"samples: {len(x)}, batch size {args.batch_size}, {args.repeat} runs each (median)")
        print(f"bare onnxruntime (float + quantized): {bare * 1e3:8.1f} ms")
        print(f"qtool.simulate --quantized:           {sim * 1e3:8.1f} ms   ratio {sim / bare:.2f}x (goal <= 1.3x)")
        notes = res.report["notes"] + [n for mdl in res.report["models"] for n in mdl["notes"]]
        for n in notes:
            print(f"  note: {n}")

        if args.what_if:
            t_w_bare, t_w_sim = [], []
            for _ in range(args.repeat):
                t = time.perf_counter()
                qtool.api.calibrate(MODEL, CALIB)  # the calibration run rewrite-eval needs
                bare_runs([MODEL, qpath], x, args.batch_size)
                t_w_bare.append(time.perf_counter() - t)
                t = time.perf_counter()
                qtool.api.simulate(MODEL, EVAL, SimulateConfig(labels="labels", calibration_data=CALIB, batch_size=args.batch_size))
                t_w_sim.append(time.perf_counter() - t)
            wb, ws = statistics.median(t_w_bare), statistics.median(t_w_sim)
            print(f"bare calibration + float + quantized: {wb * 1e3:8.1f} ms")
            print(f"qtool.simulate (what-if W8A8):        {ws * 1e3:8.1f} ms   ratio {ws / wb:.2f}x")
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; "
          f"after: {', '.join(f'{v:.2f}' for v in load_after)}; cores: {os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
