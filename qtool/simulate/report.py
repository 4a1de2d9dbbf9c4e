"""The simulation report as text for the terminal, and as JSON.

JSON has no infinity: non-finite numbers are written as the strings
``"inf"``, ``"-inf"`` and ``"nan"`` (an SQNR of ``"inf"`` means the two
tensors are identical); ``null`` means "not measured" and comes with a
reason (``problem``) or a documented cause (no labels).
"""

from __future__ import annotations

import json
import math
import os
import tempfile


def json_safe(value):
    """A copy of ``value`` with non-finite floats as strings and numpy scalars as Python ones."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def atomic_write(path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        from qtool.errors import QtoolError

        raise QtoolError(f"cannot write '{path}': folder '{folder}' does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".qtool-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def write_json(report: dict, path) -> None:
    atomic_write(path, json.dumps(json_safe(report), indent=2, allow_nan=False) + "\n")


# --- text ----------------------------------------------------------------------------------------------


def fmt_db(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if math.isnan(v):
            return "nan"
        return f"{v:.2f}"
    return str(v)


def fmt_num(v, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return fmt_db(v)
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.{digits}f}"
    return str(v)


def fmt_acc(acc, correct=None) -> str:
    if acc is None:
        return "-"
    return f"{acc * 100:.2f}%"


def _table(header: list[str], rows: list[list[str]], indent: str = "  ", right=None) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    right = right if right is not None else [i > 0 for i in range(len(header))]

    def line(cells):
        parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)]
        return (indent + "  ".join(parts)).rstrip()

    return [line(header)] + [line(r) for r in rows]


def format_text(report: dict, limit: int = 15) -> str:
    lines = []
    labels = f", labels '{report['labels']}'" if report["labels"] else ", no labels"
    lines.append(
        f"qtool simulate: {report['model']} on {report['data']} "
        f"({report['samples']} samples, output '{report['output']}'{labels})"
    )
    cal = report.get("calibration")
    if cal:
        if cal.get("on_evaluation_data"):
            lines.append("  calibration: ON THE EVALUATION DATA ITSELF (no --calibration-data): accuracy is optimistic")
        else:
            n = f" ({cal['samples']} samples)" if cal.get("samples") else ""
            lines.append(f"  calibration: {cal['source']}{n}")
    lines.append("")
    header = ["model", "accuracy", "agreement", "SQNR dB", "mean|err|", "max|err|", "cosine"]
    rows = [["float", fmt_acc(report["float"]["accuracy"]), "-", "-", "-", "-", "-"]]
    for mdl in report["models"]:
        o = mdl["output"]
        rows.append([mdl["name"], fmt_acc(mdl["accuracy"]), fmt_acc(mdl["agreement"]), fmt_db(o["sqnr_db"]),
                     fmt_num(o["mean_abs_error"]), fmt_num(o["max_abs_error"]), fmt_num(o["cosine"], 6)])
    lines.extend(_table(header, rows, right=[False] + [True] * 6))
    for mdl in report["models"]:
        lines.append("")
        lines.append(f"{mdl['name']}: quantized activations, worst first (SQNR of the quantized model's tensor "
                     "against the float model's)")
        acts = mdl["activations"]
        rows = []
        for a in acts[:limit]:
            clipped = a.get("clipped_fraction")
            rows.append([
                fmt_db(a["sqnr_db"]),
                fmt_num(a.get("max_abs_error")),
                _pct(clipped),
                _range(a.get("float_range")),
                _range(a.get("quantizer_range")),
                f"{a['float_tensor']}  ({a['quantizer']})" + (f"  {a['problem']}" if a.get("problem") else ""),
            ])
        if rows:
            lines.extend(_table(["SQNR dB", "max|err|", "clipped", "float range", "quant range", "tensor (quantizer)"],
                                rows, indent="    ", right=[True, True, True, True, True, False]))
        else:
            lines.append("    (none)")
        if len(acts) > limit:
            lines.append(f"    ... {len(acts) - limit} more (all in --json)")
        for u in mdl["unmatched_activations"]:
            lines.append(f"    not compared: {u['quantizer']}: {u['reason']}")
        if mdl["weights"]:
            lines.append("  weights, worst first")
            rows = [[fmt_db(w["sqnr_db"]), fmt_num(w.get("max_abs_error")), w["role"], w.get("dtype") or "-",
                     f"{w['layer']} ({w['op']})" + (f"  {w['problem']}" if w.get("problem") else "")]
                    for w in mdl["weights"][:limit]]
            lines.extend(_table(["SQNR dB", "max|err|", "role", "codes", "layer"], rows, indent="    ",
                                right=[True, True, False, False, False]))
            if len(mdl["weights"]) > limit:
                lines.append(f"    ... {len(mdl['weights']) - limit} more (all in --json)")
        if "sensitivity" in mdl:
            lines.append("  sensitivity: only this layer quantized, worst first (keep the top ones in float)")
            rows = [[fmt_db(s["sqnr_db"]), fmt_acc(s["accuracy"]), fmt_acc(s["agreement"]), f"{s['layer']} ({s['op']})"]
                    for s in mdl["sensitivity"]]
            if rows:
                lines.extend(_table(["out SQNR dB", "accuracy", "agreement", "layer"], rows, indent="    ",
                                    right=[True, True, True, False]))
        for n in mdl["notes"]:
            lines.append(f"  note: {n}")
    for n in report["notes"]:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _pct(frac) -> str:
    if frac is None:
        return "-"
    if 0 < frac < 1e-4:
        return "<0.01%"
    return f"{frac * 100:.2f}%"


def _range(r) -> str:
    if not r:
        return "-"
    return f"[{fmt_num(r[0], 3)}, {fmt_num(r[1], 3)}]"
