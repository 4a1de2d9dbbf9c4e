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

Memory (``--memory-samples``, default 16 64 256; ``--memory-only`` skips the
timing above): peak RSS of ``qtool calibrate`` at each sample count, in one
run, at ``--memory-batch-size`` (16, the CLI's default) with
``--memory-method`` (minmax, the default), and the ratios to the smallest
count (goal: 64 vs 16 samples <= 1.15). ``--baseline REV`` also runs the
qtool of git revision REV (extracted with ``git archive``) on the same files,
for before/after figures from the same run. onnxruntime's calibrator for the
same method over the same batches is the reference (minmax, percentile,
entropy; none for the others). Its ``MinMaxCalibrater`` reduces each tensor
in the graph, but its histogram calibrators keep every batch's outputs until
``collect_data`` ends, so it is skipped at a count where a straight line
through its two smallest counts passes ``--ort-limit-gb`` (16).

    python benchmarks/calibration.py [--repeats 3] [--samples 16 64] [--batch-size 1] [--keep DIR]
    python benchmarks/calibration.py --memory-only [--memory-samples 16 64 256] [--baseline REV]
    python benchmarks/calibration.py --speed [MODEL DATA] [--baseline REV] [--methods ...] [--batch-size N]

Speed (``--speed``): ``qtool calibrate`` of this checkout against ``--baseline``
(default ``main``, extracted with ``git archive``), per method, alternating in
the same run, on the built ResNet-50 (``--samples``' smallest count) or on
MODEL and DATA; prints wall and CPU time, their ratios, and whether the two
wrote the same ranges bit for bit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
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


def _baseline_tree(rev: str, work: str) -> str:
    """A folder holding the ``qtool`` package of git revision ``rev`` (run with it as the working directory)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = os.path.join(work, "baseline")
    os.makedirs(folder, exist_ok=True)
    archive = subprocess.run(["git", "-C", repo, "archive", rev, "qtool"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    return folder


def memory(args, work: str, model: str, data: np.ndarray) -> None:
    """Peak RSS of qtool (and its baseline, and onnxruntime) at each of ``args.memory_samples``."""
    counts = sorted(set(args.memory_samples))
    calib = {}
    for n in counts:
        calib[n] = os.path.join(work, f"mem{n}.npz")
        np.savez(calib[n], input=data[:n])
    ort_script = os.path.join(work, "ort_calibrate.py")
    with open(ort_script, "w") as f:
        f.write(_ORT_SCRIPT)
    batch, method = args.memory_batch_size, args.memory_method
    ort_method = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}.get(method)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def qtool_cmd(folder, n):
        # run from ``folder`` so that its qtool package is the one imported
        return ["/bin/sh", "-c", 'cd "$0" && exec "$@"', folder, sys.executable, "-m", "qtool", "calibrate", model,
                "--data", calib[n], "--method", method, "--batch-size", str(batch),
                "-o", os.path.join(work, f"mem_ranges_{n}.json")]

    tools = {"qtool": repo}
    if args.baseline:
        tools[f"qtool {args.baseline}"] = _baseline_tree(args.baseline, work)
    for folder in tools.values():
        measure(qtool_cmd(folder, counts[0]))  # warm numba's cache for this copy
    print(f"\nmemory: {method}, batches of {batch}, samples {counts}; peak RSS of each process (MiB)", flush=True)
    peaks: dict[str, dict[int, float | None]] = {name: {} for name in [*tools, "onnxruntime"]}
    for n in counts:
        for name, folder in tools.items():
            peaks[name][n] = measure(qtool_cmd(folder, n))["rss_kib"] / 1024
        ort = peaks["onnxruntime"]
        done = sorted(k for k, v in ort.items() if v is not None)
        estimate = None
        if len(done) >= 2:
            (a, ma), (b, mb) = (done[0], ort[done[0]]), (done[1], ort[done[1]])
            estimate = mb + (mb - ma) * (n - b) / (b - a)
        if ort_method is None:
            ort[n] = None
        elif estimate is not None and estimate > args.ort_limit_gb * 1024:
            ort[n] = None
            print(f"  onnxruntime at {n} samples skipped: about {estimate / 1024:.1f} GB expected "
                  f"(a straight line through its smaller counts; limit {args.ort_limit_gb} GB)", flush=True)
        else:
            ort[n] = measure([sys.executable, ort_script, model, calib[n], ort_method, work, str(batch)])["rss_kib"] / 1024
        print("  " + f"{n:4} samples: " + " | ".join(
            f"{name} {peaks[name][n]:6.0f}" if peaks[name][n] is not None else f"{name} skipped" for name in peaks),
            flush=True)
    print()
    lo = counts[0]
    header = f"{'samples':>8}" + "".join(f"{name:>22}" for name in peaks)
    print(header)
    for n in counts:
        cells = []
        for name in peaks:
            v = peaks[name][n]
            base = peaks[name][lo]
            cells.append(f"{'-':>22}" if v is None else
                         f"{v:12.0f} MiB {v / base:5.2f}x" if base else f"{v:12.0f} MiB {'':6}")
        print(f"{n:8}" + "".join(cells))
    print(f"(ratios: peak at each count / peak at {lo} samples; goal for qtool: {64 if 64 in counts else counts[-1]} "
          f"vs {lo} <= 1.15)")


def speed(args, work: str, model: str, calib: str) -> None:
    """Time of ``qtool calibrate`` per method: this checkout against ``--baseline`` (default main), same run.

    Runs alternate (baseline, this checkout) ``--repeats`` times per method, after one warm-up run
    of each (numba's on-disk cache); medians of wall time and of CPU time (user + system of the
    process and its threads: on a shared machine the wall time includes waiting for a core). The
    ranges files of the two must hold the same ranges bit for bit (compared as JSON text).
    """
    import json

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rev = args.baseline or "main"
    tools = {f"qtool {rev}": _baseline_tree(rev, work), "qtool": repo}

    def cmd(name, method):
        out = os.path.join(work, f"speed_{method}_{name.replace(' ', '_')}.json")
        return out, [sys.executable, "-m", "qtool", "calibrate", model, "--data", calib, "--calibration-method", method,
                     "--batch-size", str(args.batch_size), "-o", out]

    print(f"\nspeed: {model}, {calib}, batches of {args.batch_size}; median of {args.repeats} (wall s / CPU s)",
          flush=True)
    rows = []
    for method in args.methods:
        files, runs = {}, {name: [] for name in tools}
        for name, folder in tools.items():
            files[name], c = cmd(name, method)
            measure(c, src=folder)  # warm numba's cache of this copy
        for _ in range(args.repeats):
            for name, folder in tools.items():
                runs[name].append(measure(cmd(name, method)[1], src=folder))
        same = len({json.dumps(json.load(open(f))["tensors"]) for f in files.values()}) == 1
        (b_wall, b_cpu), (n_wall, n_cpu) = ((statistics.median(r["wall"] for r in rs),
                                             statistics.median(r["cpu"] for r in rs)) for rs in runs.values())
        rows.append((method, b_wall, b_cpu, n_wall, n_cpu, same))
        print(f"  {method:10} {rev} {b_wall:7.2f} / {b_cpu:7.2f} | now {n_wall:7.2f} / {n_cpu:7.2f} | "
              f"ranges {'identical' if same else 'DIFFERENT'}", flush=True)
    print(f"\n{'method':11}{'base wall':>10}{'now wall':>10}{'ratio':>8}{'base CPU':>10}{'now CPU':>10}{'ratio':>8}"
          f"{'ranges':>11}")
    for method, bw, bc, nw, nc, same in rows:
        print(f"{method:11}{bw:10.2f}{nw:10.2f}{nw / bw:8.2f}{bc:10.2f}{nc:10.2f}{nc / bc:8.2f}"
              f"{'identical' if same else 'DIFFERENT':>11}")
    print(f"(ratio: this checkout / {rev}, below 1 is faster; load average now "
          f"{', '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} cores)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--methods", nargs="+", default=["percentile", "entropy"],
                        help="methods to time (--speed: e.g. minmax percentile entropy mse)")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="samples per inference batch, for both tools (qtool's memory is one batch's activations)")
    parser.add_argument("--keep", default=None, help="work in this folder and keep the files")
    parser.add_argument("--memory-samples", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--memory-batch-size", type=int, default=16)
    parser.add_argument("--memory-method", default="minmax")
    parser.add_argument("--memory-only", action="store_true", help="only the memory figures")
    parser.add_argument("--no-memory", action="store_true", help="only the timing figures")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also measure the memory of the qtool of this git revision, in the same run")
    parser.add_argument("--speed", nargs="*", metavar="MODEL_AND_DATA", default=None,
                        help="only the before/after timing of --methods against --baseline (default main); "
                             "optionally on a model and its .npz data instead of the built ResNet-50")
    parser.add_argument("--ort-limit-gb", type=float, default=16.0,
                        help="skip onnxruntime's calibrator where its peak memory would pass this")
    args = parser.parse_args()

    work = args.keep or tempfile.mkdtemp(prefix="qtool-bench-calib-")
    os.makedirs(work, exist_ok=True)
    try:
        if args.speed:
            if len(args.speed) != 2:
                parser.error("--speed takes a model and its data, or nothing")
            speed(args, work, *args.speed)
            return
        model = os.path.join(work, "resnet50.onnx")
        t = time.perf_counter()
        size = build_resnet50(model)
        rng = np.random.default_rng(1)
        data = rng.standard_normal((max(args.samples + args.memory_samples), 3, 224, 224)).astype(np.float32)
        if args.speed is not None:
            calib = os.path.join(work, f"speed{min(args.samples)}.npz")
            np.savez(calib, input=data[: min(args.samples)])
            speed(args, work, model, calib)
            return
        if args.memory_only:
            print(f"model: {size / 1e6:.1f} MB (built in {time.perf_counter() - t:.1f} s)")
            print(f"load average before: {', '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
            memory(args, work, model, data)
            return
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
        if not args.no_memory:
            memory(args, work, model, data)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
