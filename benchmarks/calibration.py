"""Benchmark: qtool's percentile and entropy calibration against onnxruntime's calibrators.

Builds the ResNet-50-shaped model of ``benchmarks/rewrite_eval.py`` (unfolded
batch norms, random weights, about 100 MB) and 16 and 64 random calibration
samples in a temporary folder, then runs as separate processes, in the same
run and alternating:

- qtool:        ``qtool calibrate model.onnx --data calib.npz -o ranges.json
                --method percentile|entropy --batch-size 1`` (streaming histograms)
- onnxruntime:  ``create_calibrator(..., CalibrationMethod.Percentile|Entropy)``,
                ``collect_data`` over the same batches of 1, ``compute_data``
                (its defaults: percentile 99.999 over 2048 bins; entropy with
                128 bins and 128 quantized bins)

Wall time (median of ``--repeats``) and peak resident memory (``ru_maxrss``
of each child process) are reported, with the ratios the issue sets as
goals: qtool's time <= 0.2x onnxruntime's for the same method and data;
qtool's peak memory at 64 samples <= 1.15x its own at 16 and below 1 GB.
qtool runs once per method before timing so that numba's on-disk cache is
warm, as for any second use of the CLI.

    python benchmarks/calibration.py [--repeats 3] [--samples 16 64] [--batch-size 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rewrite_eval import build_resnet50, measure  # noqa: E402  (one model builder for all benchmarks)

_ORT_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator

    model, calib, method, work, batch = sys.argv[1:6]
    batch = int(batch)

    class Reader(CalibrationDataReader):
        def __init__(self):
            data = np.load(calib)["input"]
            self.batches = iter([{"input": data[i : i + batch]} for i in range(0, len(data), batch)])

        def get_next(self):
            return next(self.batches, None)

    calibrator = create_calibrator(model, augmented_model_path=work + "/augmented_" + method + ".onnx",
                                   calibrate_method=getattr(CalibrationMethod, method))
    calibrator.collect_data(Reader())
    ranges = calibrator.compute_data()
    print(len(ranges.data), file=sys.stderr)
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--methods", nargs="+", default=["percentile", "entropy"])
    parser.add_argument("--batch-size", type=int, default=1,
                        help="samples per inference batch, for both tools (qtool's memory is one batch's activations)")
    parser.add_argument("--keep", default=None, help="work in this folder and keep the files")
    args = parser.parse_args()

    work = args.keep or tempfile.mkdtemp(prefix="qtool-bench-calib-")
    os.makedirs(work, exist_ok=True)
    try:
        model = os.path.join(work, "resnet50.onnx")
        t = time.perf_counter()
        size = build_resnet50(model)
        rng = np.random.default_rng(1)
        data = rng.standard_normal((max(args.samples), 3, 224, 224)).astype(np.float32)
        calib = {}
        for n in args.samples:
            calib[n] = os.path.join(work, f"calib{n}.npz")
            np.savez(calib[n], input=data[:n])
        print(f"model: {size / 1e6:.1f} MB; samples {args.samples} (built in {time.perf_counter() - t:.1f} s)")
        print(f"load average before: {', '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
        ort_script = os.path.join(work, "ort_calibrate.py")
        with open(ort_script, "w") as f:
            f.write(_ORT_SCRIPT)

        def qtool_cmd(method, n):
            return [sys.executable, "-m", "qtool", "calibrate", model, "--data", calib[n], "--method", method,
                    "-o", os.path.join(work, f"ranges_{method}_{n}.json"), "--batch-size", str(args.batch_size)]

        def ort_cmd(method, n):
            return [sys.executable, ort_script, model, calib[n], method.capitalize(), work, str(args.batch_size)]

        for method in args.methods:
            measure(qtool_cmd(method, min(args.samples)))  # warm numba's cache
        rows = []
        for method in args.methods:
            for n in args.samples:
                runs = {"qtool": [], "onnxruntime": []}
                for _ in range(args.repeats):
                    runs["qtool"].append(measure(qtool_cmd(method, n)))
                    runs["onnxruntime"].append(measure(ort_cmd(method, n)))
                row = {"method": method, "samples": n}
                for tool, rs in runs.items():
                    row[tool] = (statistics.median(r["wall"] for r in rs), max(r["rss_kib"] for r in rs) / 1024)
                rows.append(row)
                print(f"  {method:10} {n:3} samples: qtool {row['qtool'][0]:6.2f} s {row['qtool'][1]:6.0f} MiB | "
                      f"onnxruntime {row['onnxruntime'][0]:6.2f} s {row['onnxruntime'][1]:6.0f} MiB", flush=True)
        print(f"load average after: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
        print()
        print(f"{'method':11}{'samples':>8}{'qtool s':>9}{'qtool MiB':>11}{'ort s':>8}{'ort MiB':>9}"
              f"{'time ratio':>12}{'mem ratio':>11}")
        for r in rows:
            (qt, qm), (ot, om) = r["qtool"], r["onnxruntime"]
            print(f"{r['method']:11}{r['samples']:8}{qt:9.2f}{qm:11.0f}{ot:8.2f}{om:9.0f}{qt / ot:12.3f}{qm / om:11.3f}")
        print()
        for method in args.methods:
            mem = {r["samples"]: r["qtool"][1] for r in rows if r["method"] == method}
            lo, hi = min(mem), max(mem)
            if lo != hi:
                print(f"qtool {method}: peak memory at {hi} samples / at {lo} = {mem[hi] / mem[lo]:.3f} "
                      f"(goal <= 1.15), {mem[hi]:.0f} MiB (goal < 1024)")
        worst = max(r["qtool"][0] / r["onnxruntime"][0] for r in rows)
        print(f"worst time ratio qtool/onnxruntime: {worst:.3f} (goal <= 0.2)")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
