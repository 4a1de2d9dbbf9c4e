"""The simulation report as text for the terminal, and as JSON.

JSON has no infinity: non-finite numbers are written as the strings
``"inf"``, ``"-inf"`` and ``"nan"`` (an SQNR of ``"inf"`` means the two
tensors are identical); ``null`` means "not measured" and comes with a
reason (``problem``) or a documented cause (no labels).
"""

from __future__ import annotations

import json
import math
import re
import textwrap

from qtool.model.io import write_text
from qtool.model.profile import op_summary_lines


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
    """Write ``text`` to ``path`` atomically (the model floor's writer)."""
    write_text(path, text)


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


def ellipsize(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters with an ellipsis in the middle (both ends stay readable)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = (width - 1) // 2
    tail = width - 1 - head
    return text[:head] + "\u2026" + (text[-tail:] if tail else "")


def _table(header: list[str], rows: list[list[str]], right: list[bool], indent: str = "  ",
           width: int = 80, shrink: int | None = None) -> list[str]:
    """Aligned columns; column ``shrink`` (names) is cut in the middle so that lines fit ``width``."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    if shrink is not None:
        others = len(indent) + sum(w for i, w in enumerate(widths) if i != shrink) + 2 * (len(header) - 1)
        widths[shrink] = max(min(widths[shrink], width - others), len(header[shrink]), 12)
        rows = [[ellipsize(c, widths[shrink]) if i == shrink else c for i, c in enumerate(r)] for r in rows]

    def line(cells):
        parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)]
        return (indent + "  ".join(parts)).rstrip()

    return [line(header)] + [line(r) for r in rows]


def _short(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return fmt_db(v)
    return f"{v:.3g}"


def _range(r) -> str:
    return "-" if not r else f"[{_short(r[0])}, {_short(r[1])}]"


def _pct(frac) -> str:
    if frac is None:
        return "-"
    if 0 < frac < 1e-4:
        return "<0.01%"
    return f"{frac * 100:.2f}%"


def _tensor_name(name: str) -> str:
    """Exporters' ``_output_0`` suffix says nothing on a terminal (the JSON has the full name)."""
    return name[: -len("_output_0")] if name.endswith("_output_0") else name


def _header(report: dict, width: int) -> list[str]:
    labels = f", labels '{report['labels']}'" if report["labels"] else ", no labels"
    kind = ""
    if report.get("output_kind", "classes") != "classes":
        why = report.get("no_top1") or ("several axes per sample, no --class-axis"
                                        if report.get("positions", 1) == 0 else "one value per sample")
        kind = f" ({why}: SQNR, no top-1)"
    elif report.get("class_axis") is not None:
        per = report.get("positions", 1)
        per = f"{per} per sample" if per is not None else f"{report.get('predictions')} in all, per sample as its shape"
        kind = f" (top-1 along axis {report['class_axis']}, {per})"
    lines = [ellipsize(f"qtool simulate: {report['model']}", width),
             ellipsize(f"  data: {report['data']}", width),
             f"  {report['samples']} samples, output '{report['output']}'{kind}{labels}"]
    if report.get("memory_note"):
        lines += textwrap.wrap(report["memory_note"], width, initial_indent="  ", subsequent_indent="    ")
    cal = report.get("calibration")
    if cal and cal.get("on_evaluation_data"):
        lines.append("  calibration: ON THE EVALUATION DATA ITSELF: accuracy is optimistic")
    elif cal:
        n = f" ({cal['samples']} samples)" if cal.get("samples") else ""
        lines.append(ellipsize(f"  calibration: {cal['source']}{n}", width))
    return lines


def _model_table(report: dict, width: int) -> list[str]:
    values = report.get("output_kind", "classes") != "classes"
    if values:
        header = ["model", "SQNR dB", "rel.err", "mean|err|", "max|err|", "cosine"]
        rows = [[mdl["name"], fmt_db(mdl["output"]["sqnr_db"]), fmt_num(mdl["output"].get("relative_rms_error")),
                 fmt_num(mdl["output"]["mean_abs_error"]), fmt_num(mdl["output"]["max_abs_error"]),
                 fmt_num(mdl["output"]["cosine"], 6)] for mdl in report["models"]]
    else:
        header = ["model", "accuracy", "agreement", "SQNR dB", "mean|err|", "max|err|", "cosine"]
        rows = [["float", fmt_acc(report["float"]["accuracy"]), "-", "-", "-", "-", "-"]]
        rows += [[mdl["name"], fmt_acc(mdl["accuracy"]), fmt_acc(mdl["agreement"]), fmt_db(mdl["output"]["sqnr_db"]),
                  fmt_num(mdl["output"]["mean_abs_error"]), fmt_num(mdl["output"]["max_abs_error"]),
                  fmt_num(mdl["output"]["cosine"], 6)] for mdl in report["models"]]
    return _table(header, rows, [False] + [True] * (len(header) - 1), width=width, shrink=0)


def _runtime_lines(report: dict, width: int) -> list[str]:
    """Each model's layers in onnxruntime's optimized graph, integer and float kernels (a layer of a quantized model
    in a float kernel runs on dequantized values: slower than in the float model)."""
    rows = [(m["name"], m.get("in_onnxruntime")) for m in report["models"]]
    rows = [("float", report["float"].get("in_onnxruntime"))] + rows
    if all(r is None for _, r in rows[1:]):
        return []
    lines = ["", "  layers in onnxruntime's optimized graph (integer / float kernels):"]
    for name, r in rows:
        if r is None:
            continue
        floats = r["float_layers"]
        lines.append(f"    {ellipsize(name, 28):28s} {r['integer_layers']:4d} / {len(floats)}")
        if floats and name != "float":
            names = ", ".join(x["node"] for x in floats[:3]) + (f" and {len(floats) - 3} more" if len(floats) > 3
                                                                  else "")
            lines.append(ellipsize(f"      in float: {names}", width))
    return lines


def _latency_lines(report: dict, width: int) -> list[str]:
    lat = report.get("latency")
    if not lat:
        return []
    lines = ["", f"  latency in onnxruntime, 1 thread, batch 1 (median of {lat['rounds']} rounds, thread CPU time):",
             f"    float  {lat['float_ms']:.3f} ms"]
    slower = []
    for m in lat["models"]:
        ratio = m["x_float"]
        lines.append(ellipsize(f"    {m['name']}", width - 28) + f"  {m['ms']:.3f} ms = {ratio:.2f}x float")
        if ratio and ratio > 1:
            slower.append(m["name"])
    if slower:
        lines.append(ellipsize(f"  slower than float: {', '.join(slower)}", width))
        lines.append("    per-op overhead (small tensors) and the ops left in float between DequantizeLinear and")
        lines.append("    QuantizeLinear (rewrite-eval's 'ops in float') cost more than the integer layers save")
        lines.append("    (docs/deploy.md); where the time goes, in onnxruntime's profile (ms per run):")
        by_op = lat.get("by_op", {})
        for name in ["float"] + slower:
            if by_op.get(name):
                lines.append(ellipsize(f"    {name}:", width))
                lines.extend(f"      {line}" for line in op_summary_lines(by_op[name], width - 6))
    return lines


def _more(items: list, limit: int | None) -> list[str]:
    return [f"    ... {len(items) - limit} more (all in --json)"] if limit is not None and len(items) > limit else []


def _unmatched_lines(unmatched: list[dict], width: int) -> list[str]:
    """One line per reason a quantizer was not compared (the reason with its quoted names taken out),
    with a count where several share it: a model with an integer gate per HardSwish has dozens."""
    groups: dict[str, list[dict]] = {}
    for u in unmatched:
        groups.setdefault(re.sub(r" ?'[^']*'", "", u["reason"]), []).append(u)
    lines = []
    for reason, items in groups.items():
        if len(items) == 1:
            lines.append(f"    not compared: {items[0]['quantizer']}: {items[0]['reason']}")
        else:
            lines.append(f"    {len(items)} not compared: {reason}")
    return [ellipsize(line, width) for line in lines]


def _model_details(mdl: dict, limit: int | None, verbose: bool, width: int, top1: bool) -> list[str]:
    lines = ["", ellipsize(f"{mdl['name']}: quantized activations, worst first (SQNR against the float tensor)", width)]
    acts = mdl["activations"]
    rows = [[fmt_db(a["sqnr_db"]), _pct(a.get("clipped_fraction")),
             _range(a.get("float_range")) + ("*" if a.get("readers_saturate") else ""), _range(a.get("quantizer_range")),
             _tensor_name(a["float_tensor"] or a["quantizer"]) + (f" ({a['problem']})" if a.get("problem") else "")]
            for a in acts[:limit]]
    if rows:
        lines += _table(["SQNR dB", "clipped", "float range", "quant range", "tensor"], rows,
                        [True, True, True, True, False], indent="    ", width=width, shrink=4)
    else:
        lines.append("    (none)")
    lines += _more(acts, limit)
    if any(a.get("readers_saturate") for a in acts[:limit]):
        lines.append("    * inside the bound where every reader saturates (a HardSwish input below -3): compared there")
    lines += _unmatched_lines(mdl["unmatched_activations"], width)
    if mdl["weights"]:
        lines.append("  weights, worst first")
        rows = [[fmt_db(w["sqnr_db"]), fmt_num(w.get("max_abs_error")), w["role"], w.get("dtype") or "-",
                 f"{w['layer']} ({w['op']})" + (f" {w['problem']}" if w.get("problem") else "")]
                for w in mdl["weights"][:limit]]
        lines += _table(["SQNR dB", "max|err|", "role", "codes", "layer"], rows, [True, True, False, False, False],
                        indent="    ", width=width, shrink=4)
        lines += _more(mdl["weights"], limit)
    if mdl.get("sensitivity"):
        lines.append("  sensitivity: one layer quantized at a time, worst first (keep those in float)")
        rows = [[fmt_db(s["sqnr_db"]), fmt_acc(s["accuracy"]), fmt_acc(s["agreement"]), f"{s['layer']} ({s['op']})"]
                for s in mdl["sensitivity"][:limit]]
        if top1:
            lines += _table(["out SQNR dB", "accuracy", "agreement", "layer"], rows, [True, True, True, False],
                            indent="    ", width=width, shrink=3)
        else:  # no top-1: the SQNR alone
            lines += _table(["out SQNR dB", "layer"], [[r[0], r[3]] for r in rows], [True, False],
                            indent="    ", width=width, shrink=1)
        lines += _more(mdl["sensitivity"], limit)
    if verbose:
        lines += [f"  note: {n}" for n in mdl["notes"]]
    return lines


def format_text(report: dict, limit: int | None = 10, verbose: bool = False, width: int = 80) -> str:
    """The report for a terminal: lines fit ``width`` columns (names cut in the middle).

    ``verbose``: every row (no ``limit``) and the notes.
    """
    limit = None if verbose else limit
    lines = (_header(report, width) + [""] + _model_table(report, width) + _runtime_lines(report, width)
             + _latency_lines(report, width))
    top1 = report.get("output_kind", "classes") == "classes"
    for mdl in report["models"]:
        lines += _model_details(mdl, limit, verbose, width, top1)
    if verbose:
        lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
