"""Benchmark: ``qtool finetune`` on the sample digits CNN at W3A3 (before/after, in one run).

For each data setup, in a temporary folder:

1. float: ``samples/digits_cnn.onnx`` in onnxruntime;
2. PTQ: ``rewrite_eval(model, calibration_data=calib.npz, weight_bits=3, activation_bits=3)``
   in onnxruntime (the int8-container QDQ model);
3. QAT: ``rewrite_train`` (W3A3, ranges calibrated on calib.npz, batch norms frozen from step 0)
   -> ``finetune`` (distillation from the float model, no labels) -> ``rewrite_eval`` of the
   tuned file (bits passed explicitly) -> onnxruntime.

It prints the accuracies on the held-out samples, the minutes fine-tuning took,
seconds per step (after the first, compiling step), the process's peak
resident memory, and how far the deployed model is from the tuned training
graph run by onnxruntime (quantization on, batch norms frozen): top-1
agreement and SQNR, with the training graph as it is (its activation ranges
updated with the evaluated batch, TF's ``assign`` outputs) and with its
ranges held (EMA decay 0: the stored ranges, which the deployed model uses).

Setups: ``calib``: train on the 100 calibration samples, evaluate on the 500
of eval.npz. ``split``: train on the calibration samples plus the first 250
inputs of eval.npz (labels unused), evaluate on the other 250.

    python benchmarks/finetune.py [--steps 300] [--learning-rate 1e-3] [--batch-size 32] [--setups calib split]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's qtool, before any import of it

from qtool.config import QuantConfig, TrainSchedule  # noqa: E402

SAMPLES = ROOT / "samples"


def _session(path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _logits(path, x, step=None):
    feeds = {"input": x}
    if step is not None:
        feeds["qtool_step"] = np.array(step, np.int64)
    return _session(path).run(["logits"], feeds)[0]


def _accuracy(logits, labels):
    return float(np.mean(logits.argmax(1) == labels))


def _held(path: Path, out: Path) -> Path:
    """The training graph with its activation ranges held (EMA decay 0): its FakeQuant nodes then use the
    stored ranges, which the deployed model was written with."""
    import onnx

    from qtool.onnx_rewrite.train_graph import held_ranges

    onnx.save(held_ranges(onnx.load(str(path))), str(out))
    return out


def _compare(reference, other) -> tuple[float, float]:
    """Top-1 agreement and SQNR (dB) of ``other`` against ``reference``."""
    agreement = float(np.mean(reference.argmax(1) == other.argmax(1)))
    noise = np.sum((reference - other) ** 2)
    sqnr = float("inf") if noise == 0 else float(10 * np.log10(np.sum(reference ** 2) / noise))
    return agreement, sqnr


def run_setup(name, train_x, eval_x, eval_y, args, folder: Path) -> dict:
    import qtool
    from qtool.finetune.train import FinetuneConfig, finetune

    folder.mkdir()
    np.savez(folder / "train.npz", input=train_x)
    np.savez(folder / "val.npz", input=eval_x, labels=eval_y)
    calib = SAMPLES / "calib.npz"
    float_acc = _accuracy(_logits(SAMPLES / "digits_cnn.onnx", eval_x), eval_y)

    ptq = folder / "ptq.qdq.onnx"
    qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), str(ptq), calibration_data=str(calib), quant=QuantConfig(weight_bits=args.bits, activation_bits=args.bits))
    ptq_acc = _accuracy(_logits(ptq, eval_x), eval_y)

    qat = folder / "qat.onnx"
    qtool.rewrite_train(str(SAMPLES / "digits_cnn.onnx"), str(qat), calibration_data=str(calib), quant=QuantConfig(weight_bits=args.bits, activation_bits=args.bits), schedule=TrainSchedule(freeze_bn_delay=0))
    # the training graph before fine-tuning, deployed: what QAT starts from
    qat_qdq = folder / "qat.qdq.onnx"
    qtool.rewrite_eval(str(qat), str(qat_qdq), quant=QuantConfig(weight_bits=args.bits, activation_bits=args.bits))
    start_acc = _accuracy(_logits(qat_qdq, eval_x), eval_y)

    tuned = folder / "tuned.onnx"
    config = FinetuneConfig(steps=args.steps, batch_size=args.batch_size, learning_rate=args.learning_rate,
                            distillation=args.distillation, validation_data=str(folder / "val.npz"),
                            validation_labels="labels", seed=0)
    t0 = time.perf_counter()
    result = finetune(str(qat), str(folder / "train.npz"), str(tuned), config)
    minutes = (time.perf_counter() - t0) / 60

    deployed = folder / "tuned.qdq.onnx"
    qtool.rewrite_eval(str(tuned), str(deployed), quant=QuantConfig(weight_bits=args.bits, activation_bits=args.bits))
    train_logits = _logits(tuned, eval_x, step=10**6).astype(np.float64)
    deploy_logits = _logits(deployed, eval_x).astype(np.float64)
    agreement, sqnr = _compare(train_logits, deploy_logits)
    held_logits = _logits(_held(tuned, folder / "tuned.held.onnx"), eval_x, step=10**6).astype(np.float64)
    held_agreement, held_sqnr = _compare(held_logits, deploy_logits)
    return {
        "setup": name,
        "train_samples": len(train_x),
        "eval_samples": len(eval_x),
        "float": float_acc,
        "ptq": ptq_acc,
        "qat_start_deployed": start_acc,
        "tuned_training_graph": _accuracy(train_logits, eval_y),
        "tuned_deployed": _accuracy(deploy_logits, eval_y),
        "agreement": agreement,
        "sqnr_db": sqnr,
        "held_agreement": held_agreement,
        "held_sqnr_db": held_sqnr,
        "minutes": minutes,
        "compile_seconds": result.compile_seconds,
        "seconds_per_step": result.seconds_per_step,
        "best_step": result.best_step,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--bits", type=int, default=3)
    parser.add_argument("--distillation", choices=("mse", "kl"), default="mse")
    parser.add_argument("--setups", nargs="+", choices=("calib", "split"), default=["calib", "split"])
    args = parser.parse_args()

    os.environ.setdefault("QTOOL_JAX_CACHE", "0")  # measure the compile time too
    calib = np.load(SAMPLES / "calib.npz")["input"]
    ev = np.load(SAMPLES / "eval.npz")
    x, y = ev["input"], ev["labels"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for setup in args.setups:
            if setup == "calib":
                rows.append(run_setup(setup, calib, x, y, args, Path(tmp) / setup))
            else:
                rows.append(run_setup(setup, np.concatenate([calib, x[:250]]), x[250:], y[250:], args,
                                      Path(tmp) / setup))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    import jax

    print(f"qtool finetune benchmark: sample digits CNN, W{args.bits}A{args.bits}, {args.steps} steps, "
          f"batch {args.batch_size}, Adam lr {args.learning_rate:g} cosine, {args.distillation} distillation "
          f"(no labels), jax {jax.__version__} on {jax.default_backend()}, {os.cpu_count()} CPU cores")
    header = (f"{'setup':<6} {'train':>5} {'eval':>4} {'float':>7} {'PTQ':>7} {'QAT@0':>7} {'tuned':>7} "
              f"{'deploy':>7} {'agree':>7} {'SQNR':>8} {'agree*':>7} {'SQNR*':>8} {'minutes':>7} {'s/step':>7} "
              f"{'compile':>7}")
    print(header)
    for r in rows:
        print(f"{r['setup']:<6} {r['train_samples']:>5} {r['eval_samples']:>4} {100 * r['float']:>6.1f}% "
              f"{100 * r['ptq']:>6.1f}% {100 * r['qat_start_deployed']:>6.1f}% {100 * r['tuned_training_graph']:>6.1f}% "
              f"{100 * r['tuned_deployed']:>6.1f}% {100 * r['agreement']:>6.1f}% {r['sqnr_db']:>6.1f}dB "
              f"{100 * r['held_agreement']:>6.1f}% {r['held_sqnr_db']:>6.1f}dB "
              f"{r['minutes']:>7.2f} {r['seconds_per_step']:>7.4f} {r['compile_seconds']:>6.1f}s")
    print(f"peak resident memory of the process: {peak:.0f} MB")
    print("PTQ: rewrite-eval of the float model; QAT@0: the training graph before fine-tuning, deployed; "
          "tuned: the tuned training graph in onnxruntime; deploy: rewrite-eval of the tuned file; "
          "agree/SQNR: deploy vs tuned (the training graph's ranges updated with the evaluated batch, as "
          "its FakeQuant uses them); agree*/SQNR*: deploy vs tuned with its ranges held (EMA decay 0; inf: "
          "bit for bit).")


if __name__ == "__main__":
    main()
