"""Check ``simulate --sensitivity``'s single-layer models at their root: the model with *no* quantizer.

``single_layer_model`` keeps one layer's quantizers and undoes every other one (a float weight for each weight
quantizer, ``_bypass`` for each activation quantizer). Undoing all of them must give back the float model: its
output must match the float model's to float rounding (> 80 dB). A form of quantized graph that the bypass does
not undo (a Q/DQ pair that is not a plain rounding of its input, a weight read through other nodes, ...) shows up
here as a low SQNR, and would make every single-layer number of that model wrong.

For each model, through ``qtool.api.simulate`` itself (the same loading, naming, folding and float-weight mapping
as ``--sensitivity``; the layers' own single-layer models are replaced by the one with no quantizer):

- ``qtool``: the model rewrite-eval makes in memory (the what-if table, W8A8, calibrated on the data);
- ``ort``: onnxruntime's ``quantize_static`` QDQ model given with ``--quantized`` (``--ort``).

With ``--layers`` the real single-layer models run too: their SQNRs must be finite, and the report must render
as text, JSON and HTML.

    python benchmarks/sensitivity_check.py                      # the zoo and tests/data/exported
    python benchmarks/sensitivity_check.py --ort --layers m.onnx:data.npz ...
    python benchmarks/sensitivity_check.py --real benchmarks/robustness_models.txt --root /tmp/qatpass

Data: the zoo's ``<name>.calib.npz`` (first ``--samples`` samples), an exported model's ``<name>.npz``, random
feeds for a real model (``robustness_pass.random_feeds``).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # this checkout's qtool
sys.path.insert(0, HERE)

from qtool.simulate import compare  # noqa: E402
from qtool.simulate import graph as g  # noqa: E402

ZOO = os.path.join(HERE, "zoo", "models")
EXPORTED = os.path.join(ROOT, "tests", "data", "exported")
NONE = "<no quantizer>"


class _NoLayer:
    name = NONE
    op_type = "none"


def _nothing_quantized(q, qg, f_folded, float_arrays, output, notes):
    """In place of the layers' single-layer models: the one model with no quantizer."""
    if f_folded is None:
        notes.append("sensitivity: the float model could not be folded like the quantized one")
        return []
    single, why = g.single_layer_model(q.model.model, None, float_arrays, g.clamping_quantizers(qg))
    if single is None:
        notes.append(f"no-quantizer model: {why}")
        return []
    return [(_NoLayer(), compare.ModelAcc(NONE, compare.Runner(f"{q.name} {NONE}", output, single)))]


def check(model: str, data: str, quantized: str | None, layers: bool, tmp: str) -> dict:
    import qtool.api as api
    from qtool.simulate.config import SimulateConfig

    config = SimulateConfig(quantized=quantized or (), calibration_data=None if quantized else data,
                            sensitivity=True, batch_size=8)
    row = {"model": model, "kind": "ort" if quantized else "qtool"}
    real = compare._single_layer_models
    compare._single_layer_models = _nothing_quantized
    try:
        (m,) = api.simulate(model, data, config).report["models"]
    finally:
        compare._single_layer_models = real
    row["whole_db"] = m["output"]["sqnr_db"]
    sens = m.get("sensitivity") or []
    row["none_db"] = sens[0]["output"]["sqnr_db"] if sens else None
    row["notes"] = [n for n in m.get("notes", []) if "no-quantizer" in n or "could not be folded" in n]
    if layers:
        html, js = os.path.join(tmp, "r.html"), os.path.join(tmp, "r.json")
        result = api.simulate(model, data, config, json_path=js, html_path=html)
        (m,) = result.report["models"]
        alone = [s["output"]["sqnr_db"] for s in m.get("sensitivity") or []]
        row["layers"] = len(alone)
        row["layers_nonfinite"] = sum(1 for a in alone if a is None or not math.isfinite(a) and a != math.inf)
        row["layers_worst_db"] = min((a for a in alone if a is not None), default=None)
        row["skipped"] = [n for n in m.get("notes", []) if n.startswith("sensitivity")]
        text = result.format_text()
        with open(js) as f:
            json.load(f)
        row["rendered"] = bool(text) and os.path.getsize(html) > 0 and "sensitivity" in text
    return row


def ort_model(model: str, data: str, tmp: str) -> str:
    from deploy import quantize_ort

    out = os.path.join(tmp, os.path.basename(model)[:-5] + ".ort.onnx")
    quantize_ort(model, out, dict(np.load(data)), tmp)
    return out


def cases(args, tmp: str) -> list[tuple[str, str]]:
    """(model, data npz) pairs."""
    out = []
    for spec in args.models:
        model, _, data = spec.partition(":")
        out.append((model, data or model[:-5] + ".npz"))
    if args.zoo:
        for path in sorted(glob.glob(os.path.join(ZOO, "*.onnx"))):
            name = os.path.basename(path)[:-5]
            calib = np.load(os.path.join(ZOO, f"{name}.calib.npz"))
            data = os.path.join(tmp, f"{name}.data.npz")
            np.savez(data, **{k: v[: args.samples] for k, v in calib.items()})
            out.append((path, data))
    if args.exported:
        for path in sorted(glob.glob(os.path.join(EXPORTED, "*.onnx"))):
            if os.path.exists(path[:-5] + ".npz"):
                out.append((path, path[:-5] + ".npz"))
    if args.real:
        from robustness_pass import random_feeds

        with open(args.real) as f:
            paths = [line.strip() for line in f if line.strip() and not line.startswith("#")]
        for i, rel in enumerate(paths):
            path = os.path.join(args.root, rel)
            if not os.path.exists(path):
                continue
            feeds = random_feeds(path, args.samples, 16, i)
            if not feeds:
                continue
            data = os.path.join(tmp, f"real{i}.npz")
            np.savez(data, **feeds)
            out.append((path, data))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="MODEL.onnx[:DATA.npz] (default data: MODEL.npz)")
    ap.add_argument("--zoo", action="store_true", help="the zoo models (default when no model is given)")
    ap.add_argument("--exported", action="store_true", help="tests/data/exported (default when no model is given)")
    ap.add_argument("--real", help="a models list (robustness_models.txt); random feeds")
    ap.add_argument("--root", default="/tmp/qatpass", help="the models list's root")
    ap.add_argument("--ort", action="store_true", help="also onnxruntime's quantize_static model (--quantized)")
    ap.add_argument("--no-qtool", action="store_true", help="only the --ort models")
    ap.add_argument("--layers", action="store_true", help="also run every single-layer model and render the report")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if not args.models and not args.real:
        args.zoo = args.exported = True
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, data in cases(args, tmp):
            kinds = ([] if args.no_qtool else [None]) + (["ort"] if args.ort else [])
            for kind in kinds:
                t = time.perf_counter()
                try:
                    quantized = ort_model(model, data, tmp) if kind else None
                    row = check(model, data, quantized, args.layers, tmp)
                except Exception as e:  # noqa: BLE001 - a checker: report and go on
                    row = {"model": model, "kind": kind or "qtool",
                           "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]}
                    if os.environ.get("TRACE"):
                        traceback.print_exc()
                row["seconds"] = round(time.perf_counter() - t, 1)
                rows.append(row)
                none = row.get("none_db")
                bad = "error" in row or none is None or (none != math.inf and none < 80)
                print(("MISMATCH " if bad else "ok       ") + json.dumps(row, default=str), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
