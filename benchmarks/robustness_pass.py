"""Robustness pass: real models through qtool's commands, each run a success or ONE clear line, never a traceback.

For every model, four runs of ``python -m qtool`` (this checkout's qtool), one at a time, each with a timeout:

    train      qtool rewrite-train M -o t.onnx
    eval       qtool rewrite-eval M -o e.onnx                      (no data)
    eval-data  qtool rewrite-eval M -o e2.onnx --data feeds.npz    (random feeds that fit M's inputs)
    deploy     qtool rewrite-eval t.onnx -o e3.onnx               (the training graph deployed; skipped when
                                                                    train wrote no t.onnx)

``feeds.npz`` is built from the inputs as qtool reads them (``qtool.data.input_specs``): ``--samples`` samples on
each input's samples axis, every other dynamic dimension ``--dim``; floats standard normal, integers in [0, 10),
uint8 in [0, 256), booleans random (seeded per model). A model qtool cannot load gets an empty ``feeds.npz``
(the run then fails as the load does).

Each run is judged: ``ok`` (exit 0, the output written, it loads in onnxruntime; the deployed models (``eval``,
``eval-data``, ``deploy``) also run on the first sample of the feeds where the float model does, with outputs
of the float model's shapes, finite where float's are), ``refused`` (exit 2, one ``qtool...error`` line,
no traceback), or a problem: ``TRACEBACK``, ``INTERNAL`` (exit 1, qtool's internal-error line), ``TIMEOUT``,
``BAD-EXIT`` (another code, or exit 2 without one clear line), ``NO-OUTPUT`` / ``BAD-OUTPUT`` (exit 0 but
the file is missing, does not load or run, or differs from float in shape or finiteness), ``INPUT-CHANGED``
(the model file's bytes changed). Python warnings and onnxruntime log lines printed by the run are counted in the log.

The log is a TSV, one row per run: model, command, verdict, rc, seconds, traceback (yes/no), warnings, message
(exit 0: the check's note; otherwise the error line, with this run's work folder written ``<work>``).
``--compare OLD_LOG`` prints what changed against an older log (verdict, return code, message; new tracebacks;
models or runs only in one log). Exit status: 1 if any run is a problem (or, with ``--compare``, a run got
worse), else 0.

    python benchmarks/robustness_pass.py benchmarks/robustness_models.txt --root /tmp --log /tmp/realset/base.log
    python benchmarks/robustness_pass.py model.onnx other.onnx --log run.log
    python benchmarks/robustness_pass.py --root /tmp/real --glob 'wheels/**/*.onnx' --log wheels.log
    python benchmarks/robustness_pass.py benchmarks/robustness_models.txt --log new.log --compare /tmp/realset/base.log
    python benchmarks/robustness_pass.py --log new.log --compare old.log     # compare two logs, run nothing

A models list (``robustness_models.txt``) holds one path a line, relative to ``--root`` (``#`` comments).
Runs are sequential (one qtool process at a time) to leave the machine's other cores to others.
"""

from __future__ import annotations

import argparse
import csv
import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's qtool

from qtool.data import input_specs  # noqa: E402
from qtool.errors import QtoolError  # noqa: E402
from qtool.model.io import load_model  # noqa: E402

COMMANDS = ("train", "eval", "eval-data", "deploy")
FIELDS = ("model", "command", "verdict", "rc", "seconds", "traceback", "warnings", "message")
GOOD = ("ok", "refused", "skipped")
ERROR_LINE = re.compile(r"^qtool[\w -]*: (internal )?error: ")
WARNING_LINE = re.compile(r"\b\w*Warning: |\[[EW]:onnxruntime")  # Python's warnings, onnxruntime's log


# --- which models -----------------------------------------------------------------------------------------
def model_paths(args) -> list[str]:
    """The models named on the command line (files, or .txt lists relative to --root) and by --glob."""
    paths = []
    for item in args.models:
        if item.endswith(".txt"):
            for line in Path(item).read_text().splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    paths.append(os.path.join(args.root, line))
        else:
            paths.append(item)
    if args.glob:
        paths += sorted(glob.glob(os.path.join(args.root, args.glob), recursive=True))
    return paths


def model_label(path: str, root: str) -> str:
    absolute = os.path.abspath(path)
    inside = os.path.commonpath([absolute, os.path.abspath(root)]) == os.path.abspath(root)
    return os.path.relpath(absolute, root) if inside else absolute


# --- random feeds -----------------------------------------------------------------------------------------
def random_feeds(path: str, samples: int, dim: int, seed: int) -> dict[str, np.ndarray]:
    """Arrays that fit the model's inputs as qtool stores them (samples first); {} if qtool cannot load it."""
    try:
        specs = input_specs(load_model(path).model)
    except QtoolError:
        return {}
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        stored = spec.stored_shape()  # None: unknown rank (one axis of samples)
        dims = [d if isinstance(d, int) and d > 0 else dim for d in (stored if stored is not None else (None,))]
        if spec.batch_axis is not None and dims and (stored is None or not isinstance(stored[0], int)):
            dims[0] = samples  # a dynamic samples axis; a static one keeps its size
        dtype = spec.dtype or np.dtype(np.float32)
        if dtype == np.bool_:
            feeds[spec.name] = rng.random(dims) < 0.5
        elif dtype == np.uint8:
            feeds[spec.name] = rng.integers(0, 256, dims).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            feeds[spec.name] = rng.integers(0, 10, dims).astype(dtype)
        else:
            feeds[spec.name] = rng.standard_normal(dims).astype(dtype)
    return feeds


def first_sample(model_path: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """One sample of the feeds as the model takes it (qtool's own batching: the data reader's first batch)."""
    from qtool.data import load_calibration_data

    try:
        specs = input_specs(load_model(model_path).model)
        data = load_calibration_data(dict(feeds), specs)
        return next(iter(data.batches(1)))
    except (QtoolError, StopIteration):
        return None


# --- running and judging ----------------------------------------------------------------------------------
def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_qtool(argv: list[str], cwd: str, timeout: float) -> tuple[int | None, str, float]:
    """(return code or None on timeout, stdout + stderr, seconds); a timed-out run's process group is killed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "qtool", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, time.perf_counter() - start
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out, time.perf_counter() - start


def check_output(path: str, float_path: str, sample: dict | None, deployed: bool) -> str | None:
    """None if the written model is sound, else what is wrong with it."""
    import onnxruntime as ort

    if not os.path.exists(path):
        return "no output file"
    ort.set_default_logger_severity(3)  # the process-wide logger prints Resize's deprecation warnings otherwise
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any failure to load is the finding
        return f"does not load in onnxruntime: {str(exc).splitlines()[0][:200]}"
    if not deployed or sample is None:
        return None
    try:
        quiet = ort.RunOptions()
        quiet.log_severity_level = 4  # a float model failing on random inputs is no news here
        ref = ort.InferenceSession(float_path, options, providers=["CPUExecutionProvider"]).run(None, sample, quiet)
    except Exception:  # noqa: BLE001 - the float model does not run on random inputs: nothing to compare
        return None
    try:
        got = sess.run(None, sample, quiet)
    except Exception as exc:  # noqa: BLE001
        return f"does not run where float does: {str(exc).splitlines()[0][:200]}"
    if len(got) != len(ref):
        return f"{len(got)} outputs, float has {len(ref)}"
    for k, (a, b) in enumerate(zip(ref, got)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return f"output {k} has shape {b.shape}, float's {a.shape}"
        if a.dtype.kind == "f" and b.dtype.kind == "f" and not np.all(np.isfinite(b[np.isfinite(a)])):
            return f"output {k} is not finite where float's is"
    return None


def judge(rc: int | None, output: str, work: str) -> tuple[str, bool, int, str]:
    """(verdict, traceback, warning lines, message) of a finished run, before the output check."""
    lines = [line.rstrip() for line in output.replace(work, "<work>").splitlines() if line.strip()]
    traceback = any(line.startswith("Traceback (most recent call last)") for line in lines)
    warnings = sum(bool(WARNING_LINE.search(line)) for line in lines)
    errors = [line for line in lines if ERROR_LINE.match(line)]
    message = errors[0] if errors else (lines[-1] if lines else "")
    message = message.replace("\t", " ")[:400]
    if rc is None:
        return "TIMEOUT", traceback, warnings, message
    if traceback:
        return "TRACEBACK", traceback, warnings, message
    if rc == 0:
        return "ok", traceback, warnings, ""
    if rc == 1 and errors and "internal error" in errors[0]:
        return "INTERNAL", traceback, warnings, message
    if rc == 2 and len(errors) == 1:
        return "refused", traceback, warnings, message
    return "BAD-EXIT", traceback, warnings, message


def run_model(path: str, label: str, args, seed: int) -> list[dict]:
    work = tempfile.mkdtemp(prefix="robust-", dir=args.work)
    rows = []
    try:
        before = sha256(path)
        feeds = random_feeds(path, args.samples, args.dim, seed)
        np.savez(os.path.join(work, "feeds.npz"), **feeds)
        sample = first_sample(path, feeds) if feeds else None
        plans = {"train": ([path, "-o", "t.onnx"], "t.onnx", False),
                 "eval": ([path, "-o", "e.onnx"], "e.onnx", True),
                 "eval-data": ([path, "-o", "e2.onnx", "--data", "feeds.npz"], "e2.onnx", True),
                 "deploy": (["t.onnx", "-o", "e3.onnx"], "e3.onnx", True)}
        for command in args.commands:
            argv, out, deployed = plans[command]
            row = {"model": label, "command": command, "rc": "", "seconds": "0.0", "traceback": "no",
                   "warnings": "0"}
            if command == "deploy" and not os.path.exists(os.path.join(work, "t.onnx")):
                rows.append({**row, "verdict": "skipped", "message": "train wrote no t.onnx"})
                continue
            verb = "rewrite-train" if command == "train" else "rewrite-eval"
            rc, output, seconds = run_qtool([verb, *argv], work, args.timeout)
            verdict, traceback, warnings, message = judge(rc, output, work)
            if verdict == "ok":
                problem = check_output(os.path.join(work, out), path, sample, deployed)
                if problem:
                    verdict, message = ("NO-OUTPUT" if problem == "no output file" else "BAD-OUTPUT"), problem
            if sha256(path) != before:
                verdict, message = "INPUT-CHANGED", f"the model file changed ({message})"
            rows.append({**row, "verdict": verdict, "rc": "timeout" if rc is None else str(rc),
                         "seconds": f"{seconds:.1f}", "traceback": "yes" if traceback else "no",
                         "warnings": str(warnings), "message": message})
            print(f"  {command:9s} {verdict:9s} rc={rows[-1]['rc']:7s} {seconds:6.1f} s  {message[:150]}",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


# --- logs -------------------------------------------------------------------------------------------------
def write_log(path: str, rows: list[dict]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE,
                                escapechar="\\")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def read_log(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\"))


def summary(rows: list[dict]) -> str:
    verdicts, rcs = {}, {}
    for row in rows:
        verdicts[row["verdict"]] = verdicts.get(row["verdict"], 0) + 1
        rcs[row["rc"] or "-"] = rcs.get(row["rc"] or "-", 0) + 1
    models = len({row["model"] for row in rows})
    tracebacks = sum(row["traceback"] == "yes" for row in rows)
    return (f"{models} models, {len(rows)} runs; verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items()))
            + "; rc: " + ", ".join(f"{k} {v}" for k, v in sorted(rcs.items())) + f"; tracebacks: {tracebacks}")


def compare(old: list[dict], new: list[dict]) -> int:
    """Print the differences; return how many runs got worse (a good verdict became a problem, a new traceback)."""
    before = {(r["model"], r["command"]): r for r in old}
    after = {(r["model"], r["command"]): r for r in new}
    worse = 0
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key), after.get(key)
        name = f"{key[0]} [{key[1]}]"
        if a is None or b is None:
            print(f"{name}: only in the {'new' if a is None else 'old'} log")
            continue
        changes = [f"{field} {a[field]!r} -> {b[field]!r}" for field in ("verdict", "rc", "message")
                   if a[field] != b[field]]
        if a["traceback"] == "no" and b["traceback"] == "yes":
            changes.append("NEW TRACEBACK")
        if changes:
            got_worse = (a["verdict"] in GOOD and b["verdict"] not in GOOD) or "NEW TRACEBACK" in changes
            worse += got_worse
            print(f"{name}: " + "; ".join(changes) + ("  <- WORSE" if got_worse else ""))
    print(f"compared {len(before)} old runs with {len(after)} new: {worse} worse")
    return worse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("models", nargs="*", help="model files, or .txt lists of paths relative to --root")
    parser.add_argument("--root", default="/tmp", help="what list entries and --glob are relative to (/tmp)")
    parser.add_argument("--glob", help="model files under --root, e.g. 'real/**/*.onnx'")
    parser.add_argument("--log", required=True, help="the TSV log to write (read, when no models are given)")
    parser.add_argument("--compare", metavar="OLD_LOG", help="print the differences against an older log")
    parser.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated subset of " +
                        ", ".join(COMMANDS))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run (600)")
    parser.add_argument("--samples", type=int, default=8, help="samples in the random feeds (8)")
    parser.add_argument("--dim", type=int, default=32, help="size of the other dynamic dimensions (32)")
    parser.add_argument("--work", default=None, help="folder for the runs' outputs (a temporary folder)")
    args = parser.parse_args()
    args.commands = [c for c in args.commands.split(",") if c]
    if unknown := set(args.commands) - set(COMMANDS):
        parser.error(f"unknown commands: {', '.join(sorted(unknown))}")

    paths = model_paths(args)
    if paths:
        rows = []
        for k, path in enumerate(paths):
            label = model_label(path, args.root)
            print(f"[{k + 1}/{len(paths)}] {label}", flush=True)
            if not os.path.isfile(path):
                rows += [{"model": label, "command": c, "verdict": "MISSING", "rc": "", "seconds": "0.0",
                          "traceback": "no", "warnings": "0", "message": "no such file"} for c in args.commands]
                continue
            rows += run_model(path, label, args, seed=k)
            write_log(args.log, rows)  # after every model: a long pass can be read while it runs
        write_log(args.log, rows)
    elif args.compare:
        rows = read_log(args.log)
    else:
        parser.error("no models: give model files, a .txt list or --glob (or --compare to compare two logs)")
    print(summary(rows))
    problems = [r for r in rows if r["verdict"] not in GOOD]
    for row in problems:
        print(f"PROBLEM {row['model']} [{row['command']}] {row['verdict']}: {row['message']}")
    worse = compare(read_log(args.compare), rows) if args.compare else 0
    return 1 if problems or worse else 0


if __name__ == "__main__":
    sys.exit(main())
