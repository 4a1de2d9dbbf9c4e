"""Real models other people exported, deployed in 8 bits as a new user would: latency and agreement with float.

Google's Magika file-type classifier (jax2tf, opset 15, int32 byte tokens), PaddleOCR's text-direction
classifier (paddle2onnx, opset 11, as RapidOCR ships it) and the Silero voice-activity detector (PyTorch
exports: ``16k_op15`` with ``If`` nodes, ``half``, ``16k_sequence`` (one LSTM run over a whole sequence),
``op18_ifless`` (all its work inside one top-level ``If`` on the sample rate)). Not in this repository::

    pip download --no-deps magika==1.0.3 silero-vad==6.2.3 rapidocr_onnxruntime==1.4.4 -d /tmp/real
    cd /tmp/real && for w in *.whl; do unzip -oq "$w" -d wheels; done
    python benchmarks/real_models.py /tmp/real/wheels [--rounds 60]

Per model, in one run: qtool's ``rewrite_eval`` (defaults, minmax) and onnxruntime's ``quantize_static``
(``benchmarks/deploy.py``'s settings) on the same calibration samples; one-thread batch-1 latency of
float, qtool and ort, interleaved round-robin, median thread CPU time (``deploy.median_seconds``); and
agreement with float on held-out inputs:

- magika: the first and last 1024 bytes of 64 + 256 files of this machine (``/usr/share``, ``/usr/lib``,
  ``/etc``, this checkout), as magika's own reader takes them (stripped, padded with token 256);
  agreement = same top-1 label as float;
- ppocr_cls: 64 + 256 lines of English words (this repository's README) rendered by Pillow's default
  font at 48 x 192, every other one turned 180 degrees; agreement = same top-1 as float (float's
  accuracy against the truth is printed too);
- silero: 20 s of formant-synthesised speech in background noise for calibration (64 chunks, with
  the recurrent state the float model had there) and another 20 s for evaluation, run chunk by chunk
  as silero_vad's ``OnnxWrapper`` does (512 samples + 64 of context, each model carrying its own
  state); agreement = same speech decision (probability > 0.5) as float, and the largest probability
  difference. Timing: one chunk (the sequence export: 32 chunks, one second).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))  # this checkout's qtool

import deploy  # noqa: E402

SR = 16000


@dataclass
class Case:
    name: str
    path: Path
    calib: dict  # samples first, qtool's layout
    ort_calib: object  # what deploy.quantize_ort reads (a dict, or batches in the model's layout)
    timing_feed: dict  # batch 1, the model's layout
    agree: Callable  # (float session, int8 session) -> (agreement text, number)


# --- magika ------------------------------------------------------------------------------------
def _magika_tokens(path: str, beg: int = 1024, end: int = 1024, block: int = 4096, pad: int = 256) -> np.ndarray:
    """magika 1.0.3's ``_extract_features_from_seekable``: the first and last ``block`` bytes, stripped,
    cut to ``beg``/``end`` bytes and padded with ``pad``."""
    data = Path(path).read_bytes()
    n = min(block, len(data))
    head, tail = data[:n], data[len(data) - n:]
    head, tail = (head.strip(), tail.strip()) if len(data) <= block else (head.lstrip(), tail.rstrip())
    b = list(head[:beg]) + [pad] * max(0, beg - len(head))
    e = [pad] * max(0, end - len(tail)) + list(tail[-end:])
    return np.array(b + e, np.int32)


def _files(n: int, seed: int) -> list[str]:
    patterns = ["/usr/share/**/*.*", "/usr/lib/python3*/**/*.py", "/usr/lib/x86_64-linux-gnu/*.so*", "/etc/**/*",
                str(ROOT / "**" / "*.*")]
    found = sorted({f for p in patterns for f in glob.glob(p, recursive=True)
                    if os.path.isfile(f) and not os.path.islink(f) and os.path.getsize(f) >= 8})
    return [found[i] for i in np.random.default_rng(seed).choice(len(found), n, replace=False)]


def _top1(x: dict) -> Callable:
    def run(sess):
        starts = range(0, len(next(iter(x.values()))), 32)
        return np.concatenate([sess.run(None, {k: v[i:i + 32] for k, v in x.items()})[0] for i in starts])

    def agree(ref, sess):
        same = float(np.mean(run(ref).argmax(-1) == run(sess).argmax(-1)))
        return f"top-1 {same:.1%}", same
    return agree


def _model(root: Path, relative: str) -> Path:
    path = root / relative
    if not path.exists():
        sys.exit(f"real_models.py: no {path} (see the instructions at the top of this script)")
    return path


def magika(root: Path) -> Case:
    tokens = np.stack([_magika_tokens(f) for f in _files(64 + 256, 0)])
    calib = {"bytes": tokens[:64]}
    return Case("magika", _model(root, "magika/models/standard_v3_3/model.onnx"), calib, calib,
                {"bytes": tokens[64:65]}, _top1({"bytes": tokens[64:]}))


# --- PaddleOCR text direction ----------------------------------------------------------------------
def _text_lines(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """English words at 48 x 192, normalised as PaddleOCR's classifier takes them; odd rows turned 180 degrees."""
    from PIL import Image, ImageDraw, ImageFont

    words = sorted(set(re.findall(r"[A-Za-z]{3,12}", (ROOT / "README.md").read_text())))
    rng = np.random.default_rng(seed)
    x, label = np.zeros((n, 3, 48, 192), np.float32), np.arange(n) % 2
    for i in range(n):
        size = int(rng.integers(22, 34))
        img = Image.new("L", (192, 48), int(rng.integers(200, 256)))
        ImageDraw.Draw(img).text((int(rng.integers(0, 8)), (48 - size) // 2 - 2), " ".join(rng.choice(words, 4)),
                                 fill=int(rng.integers(0, 60)), font=ImageFont.load_default(size=size))
        a = np.asarray(img, np.float32)
        x[i] = ((a[::-1, ::-1] if label[i] else a) / 255.0 - 0.5) / 0.5
    return x, label


def ppocr_cls(root: Path) -> Case:
    calib, _ = _text_lines(64, 1)
    x, label = _text_lines(256, 2)
    top1 = _top1({"x": x})

    def agree(ref, sess):
        text, same = top1(ref, sess)
        truth = float(np.mean(ref.run(None, {"x": x})[0].argmax(-1) == label))
        return f"{text} (float right on {truth:.0%})", same

    return Case("ppocr_cls", _model(root, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
                {"x": calib}, {"x": calib}, {"x": x[:1]}, agree)


# --- Silero VAD --------------------------------------------------------------------------------------
VOWELS = [(730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410),
          (660, 1720, 2410)]  # formants F1-F3 of a, i, u, e, o, ae


def _resonator(x: np.ndarray, f: float, bw: float) -> np.ndarray:
    from scipy.signal import lfilter

    r = np.exp(-np.pi * bw / SR)
    return lfilter([1 - r], [1, -2 * r * np.cos(2 * np.pi * f / SR), r * r], x)


def _utterance(rng) -> np.ndarray:
    """Syllables: a glottal pulse train (gliding pitch) through a vowel's three formants, after a noise burst."""
    from scipy.signal import lfilter

    parts = []
    for _ in range(int(rng.integers(2, 7))):
        n = int(rng.uniform(0.12, 0.3) * SR)
        f0 = rng.uniform(95, 230) * (1 + 0.08 * np.linspace(-1, 1, n) * rng.uniform(-1, 1))
        pulses = (np.diff(np.floor(np.cumsum(f0 / SR)), prepend=0) > 0).astype(float)
        source = lfilter([1], [1, -0.97], pulses)
        v = sum(_resonator(source, f, 60 + 40 * k) * 0.9 ** k for k, f in enumerate(VOWELS[rng.integers(len(VOWELS))]))
        v = v * np.hanning(n) ** 0.3 / (np.abs(v).max() + 1e-9)
        parts += [lfilter([1, -0.95], [1], rng.normal(0, 1, int(rng.uniform(0.03, 0.08) * SR))) * 0.05, v]
    return np.concatenate(parts)


def _audio_chunks(seconds: float, seed: int, size: int = 512, context: int = 64) -> np.ndarray:
    """Noise, and noise with utterances, cut as silero_vad's OnnxWrapper feeds it: [chunks, context + size]."""
    rng = np.random.default_rng(seed)
    parts = []
    while sum(map(len, parts)) < seconds * SR:
        x = _utterance(rng) * rng.uniform(0.1, 0.5) if rng.random() < 0.5 else np.zeros(int(rng.uniform(0.3, 1.2) * SR))
        parts.append(x + rng.normal(0, 10 ** rng.uniform(-3.5, -2.2), len(x)))
    audio = np.concatenate([np.zeros(context)] + parts).astype(np.float32)
    n = (len(audio) - context) // size
    return np.stack([audio[i * size: i * size + size + context] for i in range(n)])


def _inputs_of(sess, feed: dict) -> dict:
    """The arrays of ``feed`` that ``sess`` takes (the half-precision export has no ``sr``)."""
    names = {i.name for i in sess.get_inputs()}
    return {k: v for k, v in feed.items() if k in names}


def _stream(sess, chunks: np.ndarray, sequence: bool) -> tuple[np.ndarray, np.ndarray]:
    """Speech probability per chunk, the recurrent state carried; and the state before each chunk."""
    state, probs, before = np.zeros((2, 1, 128), np.float32), [], []
    for i in range(0, len(chunks), 32 if sequence else 1):
        if sequence:
            p, h, c = sess.run(None, {"input": chunks[i:i + 32], "h": state[:1], "c": state[1:]})
            state = np.concatenate([h, c])
        else:
            before.append(state[:, 0])
            feed = {"input": chunks[i:i + 1], "state": state, "sr": np.array(SR, np.int64)}
            p, state = sess.run(None, _inputs_of(sess, feed))
        probs.append(p.ravel())
    return np.concatenate(probs), np.stack(before) if before else None


class _Feeds:
    """A CalibrationDataReader over feeds already in the model's layout."""

    def __init__(self, feeds: list[dict]):
        self._feeds = iter(feeds)

    def get_next(self):
        return next(self._feeds, None)


def silero(root: Path, export: str) -> Case:
    import onnxruntime as ort

    sequence = export == "16k_sequence"
    path = _model(root, f"silero_vad/data/silero_vad_{export}.onnx")
    model = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(root / "silero_vad/data/silero_vad.onnx"), providers=["CPUExecutionProvider"])
    chunks, held_out = _audio_chunks(20, 0), _audio_chunks(20, 1)
    _, states = _stream(reference, chunks, sequence=False)
    pick = np.sort(np.random.default_rng(0).choice(len(chunks), 64, replace=False))
    if sequence:  # one call over the whole calibration sequence; its h, c are fed whole
        zero = np.zeros((1, 1, 128), np.float32)
        calib = {"input": chunks[:64], "h": zero, "c": zero}
        ort_calib = _Feeds([calib])
        timing = {"input": held_out[:32], "h": zero, "c": zero}
    else:  # the half-precision export has no sr
        sr = np.array(SR, np.int64)
        calib = _inputs_of(model, {"input": chunks[pick], "state": states[pick], "sr": sr})
        ort_calib = _Feeds([_inputs_of(model, {"input": chunks[i:i + 1], "state": states[i][:, None], "sr": sr})
                            for i in pick])
        timing = _inputs_of(model, {"input": held_out[:1], "state": states[:1].transpose(1, 0, 2), "sr": sr})

    def agree(ref, sess):
        p, q = _stream(ref, held_out, sequence)[0], _stream(sess, held_out, sequence)[0]
        same = float(np.mean((p > 0.5) == (q > 0.5)))
        return f"speech {same:.1%}, max |dp| {np.max(np.abs(p - q)):.2f}", same

    return Case(f"silero {export}", path, calib, ort_calib, timing, agree)


SILERO_EXPORTS = ("16k_op15", "half", "16k_sequence", "openvino_16k", "op18_ifless")
CASES = {"magika": magika, "ppocr_cls": ppocr_cls,
         **{f"silero_{e}": (lambda root, e=e: silero(root, e)) for e in SILERO_EXPORTS}}


def measure(case: Case, rounds: int) -> dict:
    import onnxruntime as ort

    from qtool.api import rewrite_eval

    tmp = tempfile.mkdtemp()
    np.savez(f"{tmp}/calib.npz", **case.calib)
    paths, notes = {"float": str(case.path)}, []
    summary = rewrite_eval(str(case.path), f"{tmp}/qtool.onnx", calibration_data=f"{tmp}/calib.npz")
    paths["qtool"] = f"{tmp}/qtool.onnx"
    counts = summary.counts()
    notes.append(f"qtool: {counts['layers_quantized']} layers quantized, {counts['lstms_dynamic']} LSTMs dynamic, "
                 f"{counts['left_in_float']} nodes left in float")
    try:
        deploy.quantize_ort(str(case.path), f"{tmp}/ort.onnx", case.ort_calib, tmp)
        paths["ort"] = f"{tmp}/ort.onnx"
    except Exception as e:  # noqa: BLE001 - a failing tool is a result
        notes.append(f"ort: quantize_static fails ({type(e).__name__}: {str(e).splitlines()[0][:90]})")
    sessions = {}
    for name, path in paths.items():
        try:
            sessions[name] = ort.InferenceSession(path, deploy.session_options(), providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime's tool writes models it cannot load
            notes.append(f"{name}: does not load ({str(e).splitlines()[0][:90]})")
    t = deploy.median_seconds(sessions, case.timing_feed, rounds, 5)
    row = {"model": case.name, "float_ms": t["float"] * 1e3, "notes": [n for n in notes if n]}
    for name in ("qtool", "ort"):
        if name in sessions:
            row[name] = {"x_float": t[name] / t["float"], "agreement": case.agree(sessions["float"], sessions[name])[0]}
    return row


def _cell(row: dict, name: str) -> tuple[str, str]:
    if name not in row:
        return "-", "-"
    return f"{row[name]['x_float']:.2f}x", row[name]["agreement"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", type=Path, help="folder the three wheels are unzipped into")
    parser.add_argument("--models", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    print("| model | float ms | qtool x float | qtool agreement | ort x float | ort agreement |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        row = measure(CASES[name](args.wheels), args.rounds)
        (qx, qa), (ox, oa) = _cell(row, "qtool"), _cell(row, "ort")
        print(f"| {row['model']} | {row['float_ms']:.2f} | {qx} | {qa} | {ox} | {oa} |", flush=True)
        for note in row["notes"]:
            print(f"|   | {note} |||||", flush=True)


if __name__ == "__main__":
    main()
