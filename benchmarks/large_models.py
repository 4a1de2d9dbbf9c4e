"""Benchmark: qtool's own time and memory on large models, against onnxruntime's ``quantize_static``.

Takes models that exist already (it builds nothing: export them with torch, or take them from a hub) and,
for each, calibration data (``MODEL.calib.npz`` next to it unless ``--data`` names one per model). Runs
as separate processes, one after the other, each phase of qtool:

- ``re``:   ``qtool rewrite-eval MODEL -o q.onnx --data DATA``
- ``rt``:   ``qtool rewrite-train MODEL -o t.onnx --data DATA``
- ``ret``:  ``qtool rewrite-eval t.onnx -o tq.onnx`` (the training graph's ranges, no data)
- ``cal``:  ``qtool calibrate MODEL --data DATA -o ranges.json``
- ``sim``:  ``qtool simulate MODEL --data DATA --weight-bits 4,8``
- ``ort``:  onnxruntime's ``quantize_static`` (QDQ, per-channel, MinMax, uint8 activations, int8 weights,
            batches of 16, external data for a model that has it), the peer of ``re``

and reports each one's wall and CPU seconds (user + sys: other work on a shared machine disturbs it less
than wall time) and peak resident memory (``ru_maxrss`` of the process, polled every 0.2 s and killed past
``--limit-gb``: onnxruntime's calibrator holds every tapped tensor of a batch in float and passes 12 GB on
ViT-B/16). ``--baseline DIR`` also runs the qtool of another checkout (e.g. ``git worktree add`` of the
previous commit) on the same files right after each phase, for before/after figures from the same run.
qtool runs a small warm-up first so that numba's on-disk cache is warm.

    python benchmarks/large_models.py bert.onnx vit.onnx big.onnx [--phases re ort cal] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

PHASES = ("re", "ort", "rt", "ret", "cal", "sim")

_ORT_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)

    model, calib, out, external = sys.argv[1:5]

    class Reader(CalibrationDataReader):
        def __init__(self):
            data = np.load(calib)
            arrays = {k: data[k] for k in data.files}
            n = len(next(iter(arrays.values())))
            self.batches = iter([{k: v[i:i + 16] for k, v in arrays.items()} for i in range(0, n, 16)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(model, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax, use_external_data_format=external == "1")
    """
)


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its children."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            total = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return total
    return total + sum(_tree_rss(c) for c in children)


_WRAPPER = textwrap.dedent(
    """
    import json, resource, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from large_models import _tree_rss
    limit = float(sys.argv[2]) * 2**30
    t = time.perf_counter()
    proc = subprocess.Popen(sys.argv[3:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed = False
    while proc.poll() is None:
        if _tree_rss(proc.pid) > limit:
            proc.kill()
            killed = True
        time.sleep(0.2)
    wall = time.perf_counter() - t
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"rc": proc.returncode, "killed": killed, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
                      "peak_gb": usage.ru_maxrss / 2**20, "stderr": proc.stderr.read()[-2000:]}))
    """
)


def run(cmd: list[str], limit_gb: float, src: str | None = None) -> dict:
    """``cmd`` in a process of its own (``src``: the qtool checkout it imports), measured."""
    env = dict(os.environ, PYTHONPATH=src) if src else None
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", _WRAPPER, here, str(limit_gb), *cmd], capture_output=True,
                         text=True, check=True, env=env)
    return json.loads(out.stdout)


def commands(phase: str, model: str, data: str, work: str, tag: str) -> list[str]:
    qtool = [sys.executable, "-m", "qtool"]
    name = os.path.splitext(os.path.basename(model))[0]
    out = os.path.join(work, f"{name}.{tag}")
    external = any(f.startswith(os.path.basename(model)) and f.endswith(".data")
                   for f in os.listdir(os.path.dirname(os.path.abspath(model))))
    return {
        "re": qtool + ["rewrite-eval", model, "-o", f"{out}.q.onnx", "--data", data],
        "rt": qtool + ["rewrite-train", model, "-o", f"{out}.t.onnx", "--data", data],
        "ret": qtool + ["rewrite-eval", f"{out}.t.onnx", "-o", f"{out}.tq.onnx"],
        "cal": qtool + ["calibrate", model, "--data", data, "-o", f"{out}.ranges.json"],
        "sim": qtool + ["simulate", model, "--data", data, "--weight-bits", "4,8"],
        "ort": [sys.executable, "-c", _ORT_SCRIPT, model, data, f"{out}.ort.onnx", "1" if external else "0"],
    }[phase]


def model_size(model: str) -> int:
    """Bytes of the model file and its external data files."""
    folder, base = os.path.split(os.path.abspath(model))
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
               if f == base or (f.startswith(base) and f.endswith(".data")))


def _cell(result: dict | None) -> str:
    if result is None:
        return ""
    if result["killed"]:
        return f"killed past the limit ({result['wall']:.0f} s)"
    if result["rc"] != 0:
        return f"failed (rc {result['rc']})"
    return f"{result['wall']:.1f} / {result['cpu']:.1f} s, {result['peak_gb']:.2f} GB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--data", nargs="*", default=None, help="calibration data per model (default MODEL.calib.npz)")
    parser.add_argument("--phases", nargs="*", default=list(PHASES), choices=PHASES)
    parser.add_argument("--baseline", default=None, metavar="DIR", help="also run the qtool of this checkout")
    parser.add_argument("--limit-gb", type=float, default=12.0, help="kill a process whose RSS passes this")
    parser.add_argument("--keep", default=None, help="write outputs into this folder and keep them")
    parser.add_argument("--json", default=None, help="also write the measurements to this file")
    args = parser.parse_args()
    if "ret" in args.phases and "rt" not in args.phases[:args.phases.index("ret")]:
        parser.error("the phase ret rewrites rt's training graph: give rt before it")
    data = args.data or [os.path.splitext(m)[0] + ".calib.npz" for m in args.models]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = args.keep or tempfile.mkdtemp(prefix="qtool-large-")
    os.makedirs(work, exist_ok=True)
    versions = {"qtool": here, **({"baseline": os.path.abspath(args.baseline)} if args.baseline else {})}
    for src in versions.values():  # numba's cache
        run([sys.executable, "-m", "qtool", "calibrate", args.models[0], "--data", data[0], "-o",
             os.path.join(work, "warmup.json")], args.limit_gb, src)
    rows = []
    print("| model | size GB | phase | " + " | ".join(versions) + " | (wall / CPU s, peak RSS) |")
    print("|---|---|---|" + "---|" * len(versions) + "---|")
    for model, calib in zip(args.models, data):
        size = model_size(model) / 1e9
        for phase in args.phases:
            results = {}
            for tag, src in versions.items():
                if phase == "ort" and tag != "qtool":
                    continue
                t = time.perf_counter()
                results[tag] = run(commands(phase, model, calib, work, tag), args.limit_gb, src)
                results[tag]["seconds_total"] = time.perf_counter() - t
            rows.append({"model": model, "size_gb": size, "phase": phase, **results})
            print(f"| {os.path.basename(model)} | {size:.2f} | {phase} | "
                  + " | ".join(_cell(results.get(tag)) for tag in versions) + " | |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
