"""Ranges files: what ``qtool calibrate`` writes and ``rewrite-eval --ranges`` reads.

qtool's layout (``docs/calibration.md``)::

    {
      "format": "qtool.ranges", "version": 1,
      "model": "model.onnx", "method": "percentile",
      "options": {"percentile": 99.999, "num_bins": 2048},
      "quantization": {"activation_bits": 8, "weight_bits": 8, "symmetric": false,
                       "per_channel": true, "scope": null, "exclude": []},
      "samples": 100, "batches": 7, "batch_size": 16,
      "tensors": {"<tensor name>": {"min": -1.25, "max": 3.5}, "<no finite value>": null}
    }

Tensor names are those of the model after batch-norm folding, which are the
names ``rewrite-eval`` quantizes. Ranges are the calibrated ones, before TF's
widening to contain 0 (``rewrite-eval`` does that).

``load_ranges`` also reads onnxruntime's calibration caches: the JSON of
``onnxruntime.quantization.calibrate.save_tensors_data`` (``{"CLS":
"TensorsData", "data": {name: {"lowest": ..., "highest": ...}}}``) and the
``calibration.json`` of ``write_calibration_table`` (the same, or a plain
``{name: {"lowest": ..., "highest": ...}}``); numbers may be plain or
onnxruntime's ``{"CLS": "numpy.array", "data": ...}`` encoding.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from qtool.errors import QtoolError
from qtool.model.io import write_text

FORMAT = "qtool.ranges"
VERSION = 1


def ranges_document(ranges: Mapping, *, model=None, method: str, options: dict | None = None,
                    quantization: dict | None = None, samples: int | None = None,
                    batches: int | None = None, batch_size: int | None = None) -> dict:
    tensors = {}
    for name, r in ranges.items():
        tensors[name] = None if r is None else {"min": float(r[0]), "max": float(r[1])}
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": model,
        "method": method,
        "options": dict(options or {}),
        "quantization": dict(quantization or {}),
        "samples": samples,
        "batches": batches,
        "batch_size": batch_size,
        "tensors": tensors,
    }


def save_ranges(path, document: dict) -> str:
    """Write ``document`` to ``path`` atomically (temporary file in the folder, then rename)."""
    return write_text(path, json.dumps(document, indent=1, allow_nan=False) + "\n")


def _number(v, where: str) -> float:
    if isinstance(v, Mapping) and v.get("CLS") == "numpy.array":
        v = v.get("data")
    while isinstance(v, list) and len(v) == 1:
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise QtoolError(f"{where}: expected a number, got {json.dumps(v)[:60]}")
    v = float(v)
    if not math.isfinite(v):
        raise QtoolError(f"{where}: range values must be finite, got {v}")
    return v


def _pair(lo, hi, where: str):
    lo, hi = _number(lo, where), _number(hi, where)
    if lo > hi:
        raise QtoolError(f"{where}: min {lo} is larger than max {hi}")
    return lo, hi


def parse_ranges(doc, label: str = "ranges") -> dict[str, tuple[float, float] | None]:
    """Tensor name -> (min, max) (None: no finite value seen) from a qtool or onnxruntime document."""
    if not isinstance(doc, Mapping):
        raise QtoolError(f"{label}: expected a JSON object with tensor ranges")
    out: dict[str, tuple[float, float] | None] = {}
    if doc.get("format") == FORMAT:
        if doc.get("version") != VERSION:
            raise QtoolError(f"{label}: ranges file version {doc.get('version')!r} is not supported (qtool reads {VERSION})")
        tensors = doc.get("tensors")
        if not isinstance(tensors, Mapping):
            raise QtoolError(f"{label}: 'tensors' must map tensor names to {{\"min\": ..., \"max\": ...}}")
        for name, r in tensors.items():
            if r is None:
                out[name] = None
                continue
            if not isinstance(r, Mapping) or "min" not in r or "max" not in r:
                raise QtoolError(f"{label}: tensor '{name}' needs \"min\" and \"max\"")
            out[name] = _pair(r["min"], r["max"], f"{label}: tensor '{name}'")
        return out
    data = _cache_entries(doc)
    if not isinstance(data, Mapping):
        raise QtoolError(f"{label}: not a qtool ranges file or an onnxruntime calibration cache")
    for name, r in data.items():
        if not isinstance(r, Mapping) or "lowest" not in r or "highest" not in r:
            raise QtoolError(
                f"{label}: not a qtool ranges file (no \"format\": \"{FORMAT}\") or an onnxruntime calibration "
                f"cache (entry '{name}' has no \"lowest\"/\"highest\")"
            )
        out[name] = _pair(r["lowest"], r["highest"], f"{label}: tensor '{name}'")
    return out


@dataclass
class GivenRanges:
    """Ranges read from a file or given as a mapping, and what produced them."""

    ranges: dict[str, tuple[float, float] | None]
    format: str  # "qtool", "onnxruntime" (a calibration cache) or "mapping"
    quantization: dict = field(default_factory=dict)  # the options a qtool ranges file was calibrated for
    label: str = "the given ranges"


def read_ranges(source) -> GivenRanges:
    """:func:`load_ranges` with the file's format and recorded options."""
    doc, label = source, "the given ranges"
    if isinstance(source, (str, os.PathLike)):
        label = f"ranges file '{os.fspath(source)}'"
        doc = _read_json(os.fspath(source))
        ranges = parse_ranges(doc, label)  # a file is a qtool or onnxruntime document, never a bare mapping
    else:
        ranges = load_ranges(doc)
    if isinstance(doc, Mapping) and doc.get("format") == FORMAT:
        quantization = doc.get("quantization") if isinstance(doc.get("quantization"), Mapping) else {}
        return GivenRanges(ranges, "qtool", dict(quantization), label)
    entries = _cache_entries(doc) if isinstance(doc, Mapping) else None
    fmt = "onnxruntime" if isinstance(entries, Mapping) and any(
        isinstance(r, Mapping) and "lowest" in r for r in entries.values()) else "mapping"
    return GivenRanges(ranges, fmt, {}, label)


def _cache_entries(doc: Mapping):
    """The tensor entries of an onnxruntime calibration cache: under ``data`` in its ``TensorsData`` form, else
    the document itself (a mapping of ranges may name a tensor ``data``: SINet's input)."""
    return doc.get("data") if doc.get("CLS") == "TensorsData" else doc


def _read_json(path: str):
    if not os.path.exists(path):
        raise QtoolError(f"ranges file '{path}' does not exist")
    if os.path.isdir(path):
        raise QtoolError(f"ranges file '{path}' is a folder")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise QtoolError(f"cannot read ranges file '{path}': {exc}") from exc


def load_ranges(source) -> dict[str, tuple[float, float] | None]:
    """Ranges from a path (qtool or onnxruntime JSON), a parsed document, or a mapping of pairs."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        return parse_ranges(_read_json(path), f"ranges file '{path}'")
    if isinstance(source, Mapping) and source and all(
        r is None or (isinstance(r, (tuple, list)) and len(r) == 2) for r in source.values()
    ):
        return {str(k): None if r is None else _pair(r[0], r[1], f"range of '{k}'") for k, r in source.items()}
    return parse_ranges(source)


def select(ranges: Mapping, tensors, label: str = "the ranges file") -> dict:
    """The ranges of ``tensors``; a tensor missing from ``ranges`` is an error naming it."""
    missing = [t for t in tensors if t not in ranges]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise QtoolError(
            f"{label} has no range for tensor '{missing[0]}'{more}: it was made for another model or with "
            "other quantization options (--scope, --exclude, bits); run 'qtool calibrate' again with the same options"
        )
    return {t: ranges[t] for t in tensors}


@dataclass
class RangesFileSummary:
    """What ``qtool calibrate`` wrote (``to_dict()`` is its ``--json``)."""

    model: str | None
    output: str
    method: str
    options: dict
    tensors: int
    samples: int
    batches: int
    seconds: float
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"model": self.model, "output": self.output, "method": self.method, "options": self.options,
                "tensors": self.tensors, "samples": self.samples, "batches": self.batches,
                "seconds": round(self.seconds, 3), "warnings": list(self.warnings)}



def write_ranges_file(path: str, result, model_label: str | None, quant, batch_size: int) -> RangesFileSummary:
    """Write ``result`` (a :class:`~qtool.calibrate.runner.CalibrationResult`) as a ranges file."""
    quantization = quant.to_dict()
    doc = ranges_document(result.ranges, model=model_label, method=result.method, options=result.options,
                          quantization=quantization, samples=result.num_samples, batches=result.num_batches,
                          batch_size=batch_size)
    save_ranges(path, doc)
    warnings = result.warnings()
    if result.ignored_arrays:
        warnings.append(f"ignored array(s) not named like a model input: {', '.join(result.ignored_arrays)}")
    return RangesFileSummary(model_label, path, result.method, result.options, len(result.ranges),
                             result.num_samples, result.num_batches, result.seconds, warnings)
