"""Float vs qtool int8 vs onnxruntime int8 on real architectures exported by torch's dynamo exporter.

    python benchmarks/dynamo_deploy.py MODELS_DIR [--models bert,vit] [--rounds 30] [--keep DIR] [--json FILE]

``MODELS_DIR`` is what ``benchmarks/dynamo_exports.py`` writes (``<name>.onnx`` + ``.onnx.data``,
``<name>.calib.npz``, ``<name>.json``). Per model, in one run, as ``deploy.py`` does for the zoo
(its functions, imported): qtool's ``rewrite_eval`` and onnxruntime's ``quant_pre_process`` +
``quantize_static`` over the same calibration samples; the one-thread latency at batch 1 of the three
variants interleaved round-robin (median ``time.thread_time``); the float Conv/MatMul/Gemm layers left in
onnxruntime's optimized graph; and the SQNR of each int8 model's output against the float model's
(dB, over 8 held-out inputs drawn as the calibration ones were: random-normal images / features, uniform
token ids), since the weights are random and there is no task metric. ``--baseline REV`` also quantizes each
model with the qtool of git revision ``REV`` (``git archive``, run in a subprocess) as a fourth variant,
``baseline``, measured in the same run (before/after figures of a change).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import deploy  # noqa: E402


def eval_inputs(calib: dict[str, np.ndarray], n: int = 8) -> dict[str, np.ndarray]:
    """Held-out inputs like the calibration ones (another seed)."""
    rng = np.random.default_rng(1)
    out = {}
    for k, v in calib.items():
        if v.dtype == np.int64 and v.min() == v.max() == 1:  # attention mask
            out[k] = np.ones((n, *v.shape[1:]), np.int64)
        elif v.dtype == np.int64:
            out[k] = rng.integers(int(v.min()), int(v.max()) + 1, size=(n, *v.shape[1:])).astype(np.int64)
        else:
            out[k] = rng.standard_normal((n, *v.shape[1:])).astype(np.float32)
    return out


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    ref = ref.astype(np.float64)
    noise = np.sum((ref - got.astype(np.float64)) ** 2)
    return float(10 * np.log10(np.sum(ref ** 2) / noise)) if noise > 0 else float("inf")


def baseline_tree(rev: str, work: str) -> str:
    """A folder holding the ``qtool`` package of git revision ``rev`` (``benchmarks/calibration.py``'s way)."""
    repo = os.path.dirname(HERE)
    folder = os.path.join(work, "baseline_qtool")
    os.makedirs(folder, exist_ok=True)
    archive = subprocess.run(["git", "-C", repo, "archive", rev, "qtool"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    return folder


def quantize_baseline(tree: str, model: str, out: str, calib_path: str) -> str:
    """``qtool rewrite-eval`` of the qtool in ``tree`` (another revision), in a subprocess run there (``-m`` puts
    the working directory first on the path)."""
    paths = [os.path.abspath(p) for p in (model, out, calib_path)]
    done = subprocess.run([sys.executable, "-m", "qtool", "rewrite-eval", paths[0], "-o", paths[1], "--data", paths[2]],
                          capture_output=True, text=True, cwd=tree, env={**os.environ, "PYTHONPATH": tree})
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["qtool failed"])[-1])
    return f"qtool of {os.path.basename(os.path.dirname(tree)) or tree}"


def bench(models_dir: str, name: str, rounds: int, warmup: int, tmp: str, ort_samples: int | None = None,
          evals: dict[str, np.ndarray] | None = None, baseline: str | None = None) -> dict:
    """One model's row; ``evals``: the held-out inputs (default: ``eval_inputs`` of the calibration ones).
    A 2-D output (logits) also gets each int8 model's top-1 agreement with float (%), ``agree_top1``.
    ``baseline``: a folder holding another revision's ``qtool`` (:func:`baseline_tree`), a fourth variant."""
    model = os.path.join(models_dir, name + ".onnx")
    calib_path = os.path.join(models_dir, name + ".calib.npz")
    calib = dict(np.load(calib_path))
    if evals is None:
        evals = eval_inputs(calib)
    # onnxruntime's calibrator holds every intermediate tensor of every batch: SegFormer at 512 px with 32
    # samples is killed for memory on a 23 GB machine (--ort-samples 8 fits)
    ort_calib = {k: v[:ort_samples] for k, v in calib.items()}
    os.makedirs(tmp, exist_ok=True)
    paths = {"float": model, "qtool": os.path.join(tmp, name + ".qtool.onnx"),
             "ort": os.path.join(tmp, name + ".ort.onnx")}
    quantizers = [("qtool", lambda: deploy.quantize_qtool(model, paths["qtool"], calib_path)),
                  ("ort", lambda: deploy.quantize_ort(model, paths["ort"], ort_calib, tmp))]
    if baseline:
        paths["baseline"] = os.path.join(tmp, name + ".baseline.onnx")
        quantizers.append(("baseline", lambda: quantize_baseline(baseline, model, paths["baseline"], calib_path)))
    row = {"model": name, "variants": {"float": {}}}
    for variant, quantize in quantizers:
        t = time.perf_counter()
        try:
            note = quantize()
            row["variants"][variant] = {"quantize_s": round(time.perf_counter() - t, 1), "note": note}
        except Exception as e:  # a failing tool is a result
            row["variants"][variant] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            paths.pop(variant)
    sessions, outs = {}, {}
    for variant, path in paths.items():
        info = row["variants"][variant]
        opt = os.path.join(tmp, f"{name}.{variant}.optimized.onnx")
        try:
            ort.InferenceSession(path, deploy.session_options(opt), providers=["CPUExecutionProvider"])
            names = []
            ops = deploy.graph_ops(opt, names)
            info.update(deploy.layer_counts(ops))
            info["float_layer_nodes"] = names
            info["optimized_ops"] = dict(sorted(ops.items()))
            sess = ort.InferenceSession(path, deploy.session_options(), providers=["CPUExecutionProvider"])
            outs[variant] = deploy.run_all(sess, evals, chunk=4)
            sessions[variant] = sess
        except Exception as e:
            info["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    for variant in ("qtool", "ort", "baseline"):
        if variant in outs and "float" in outs:
            row["variants"][variant]["sqnr_db"] = sqnr_db(outs["float"], outs[variant])
            if outs["float"].ndim == 2:
                row["variants"][variant]["agree_top1"] = 100 * float(np.mean(
                    outs["float"].argmax(1) == outs[variant].argmax(1)))
    deploy.time_variants(row, sessions, {k: v[:1] for k, v in evals.items()}, rounds, warmup)
    return row


def cell(variants: dict, variant: str, key: str, fmt: str) -> str:
    """One table cell: ``variants[variant][key]`` formatted, "error" where that variant failed, "-" where absent."""
    x = variants.get(variant, {})
    return fmt.format(x[key]) if key in x else ("error" if "error" in x else "-")


def fmt_table(rows: list[dict]) -> str:
    lines = ["| model | float ms | qtool (x float) | ort (x float) | SQNR dB qtool / ort "
             "| float layers left: float / qtool / ort |", "|---|---|---|---|---|---|"]
    for row in rows:
        v = row["variants"]
        get = functools.partial(cell, v)

        lines.append(f"| {row['model']} | {get('float', 'latency_ms', '{:.1f}')} | {get('qtool', 'ratio', '{:.2f}x')} "
                     f"| {get('ort', 'ratio', '{:.2f}x')} | {get('qtool', 'sqnr_db', '{:.1f}')} / "
                     f"{get('ort', 'sqnr_db', '{:.1f}')} | " + " / ".join(get(n, "float_layers", "{}") for n in
                                                                            deploy.VARIANTS) + " |")
    errors = table_notes(rows)
    return "\n".join(lines + ([""] + errors if errors else []))


def table_notes(rows: list[dict]) -> list[str]:
    """The lines under a table: each variant's error, how onnxruntime's tool was run where not as usual, and the
    ``--baseline`` variant's figures (the same columns as qtool's)."""
    notes = [f"- {row['model']} {n}: {x['error']}" for row in rows for n, x in row["variants"].items() if "error" in x]
    notes += [f"- {row['model']} ort: {row['variants']['ort']['note']}" for row in rows
              if row["variants"].get("ort", {}).get("note", "quant_pre_process") != "quant_pre_process"]
    for row in rows:
        v = row["variants"]
        if "baseline" in v and "error" not in v["baseline"]:
            get = functools.partial(cell, v)

            def both(key, fmt):
                return f"{get('baseline', key, fmt)} (now {get('qtool', key, fmt)})"

            notes.append(f"- {row['model']} baseline ({v['baseline']['note']}): {both('ratio', '{:.2f}x')} float, "
                         f"SQNR {both('sqnr_db', '{:.1f}')} dB, top-1 agreement {both('agree_top1', '{:.0f}')} %, "
                         f"float layers {both('float_layers', '{}')}")
    return notes


def arguments(description: str, models_help: str) -> argparse.ArgumentParser:
    """The options this script and ``timm_deploy.py`` share."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models_dir")
    ap.add_argument("--models", help=models_help)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--keep", help="keep the quantized and optimized models in this folder")
    ap.add_argument("--json", help="also write all results to this JSON file")
    ap.add_argument("--baseline", metavar="REV", help="also quantize with the qtool of this git revision (a fourth "
                    "variant, 'baseline', measured in the same run: before/after figures)")
    return ap


def main(argv=None) -> int:
    ap = arguments(__doc__, "comma-separated subset (default: every <name>.json in MODELS_DIR)")
    ap.add_argument("--ort-samples", type=int, help="calibrate onnxruntime's quantize_static on the first N "
                    "samples only (its calibrator keeps every tensor of every batch in memory)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.models_dir):
        print(f"no such folder: {args.models_dir}", file=sys.stderr)
        return 2
    have = sorted(f[:-5] for f in os.listdir(args.models_dir) if f.endswith(".json"))
    return run_models(args, have, "dynamo_deploy_", fmt_table)


def run_models(args, have: list[str], prefix: str, table, evals_for=None) -> int:
    """The main loop of this script and of ``timm_deploy.py``: each model of ``args.models`` (default: all of
    ``have``) benched (:func:`bench`; ``evals_for(name)``: its held-out inputs), the rows written to ``args.json``
    as they come, the table (``table(rows)``) printed at the end."""
    chosen = args.models.split(",") if args.models else have
    missing = [m for m in chosen if m not in have]
    if missing:
        print(f"not in {args.models_dir}: {', '.join(missing)} (it has {', '.join(have)})", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        baseline = baseline_tree(args.baseline, os.path.join(scratch, args.baseline)) if args.baseline else None
        for name in chosen:
            t = time.perf_counter()
            rows.append(bench(args.models_dir, name, args.rounds, args.warmup, os.path.join(args.keep or scratch, name),
                              getattr(args, "ort_samples", None), evals_for(name) if evals_for else None, baseline))
            print(f"[{name}] done in {time.perf_counter() - t:.0f}s", file=sys.stderr, flush=True)
            if args.json:
                json.dump(rows, open(args.json, "w"), indent=1)
    print(table(rows))
    print(timing_footer(args.rounds, args.warmup))
    return 0


def timing_footer(rounds: int, warmup: int) -> str:
    """The line under a latency table: how it was timed."""
    return (f"onnxruntime {ort.__version__}; {rounds} rounds after {warmup} warm-up, batch 1, one thread, "
            "median of time.thread_time, variants interleaved")


if __name__ == "__main__":
    sys.exit(main())
