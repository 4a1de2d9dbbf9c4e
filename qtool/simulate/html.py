"""The simulation report as one self-contained HTML page.

Tables always; plots (PNG images embedded as ``data:`` URIs, so the page is a
single file) when matplotlib is installed (``pip install 'qtool[report]'``).
Without it the page says how to get them. Plots:

- the accuracy / bit-width table (a heat map when several weight and
  activation widths were simulated);
- per model, the SQNR of every quantized activation and weight, worst first;
- per model, histograms of the float values of the worst activations with
  the quantizer's range drawn on them (what falls outside is clipped);
- with ``--sensitivity``, the output SQNR of each single-layer model.
"""

from __future__ import annotations

import base64
import html
import io
import math

from qtool.simulate.report import atomic_write, fmt_acc, fmt_db, fmt_num

WORST_HISTOGRAMS = 4
INSTALL_HINT = "pip install 'qtool[report]'"

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em} h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ccc} h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0 1em} td,th{border:1px solid #ddd;padding:.25em .6em;font-size:.9em}
th{background:#f4f4f4} td.n{text-align:right;font-variant-numeric:tabular-nums}
.note{background:#fff7d6;border:1px solid #e6d48a;padding:.5em 1em;margin:.5em 0}
.warn{background:#fde8e8;border:1px solid #e9a5a5;padding:.5em 1em;margin:.5em 0}
img{max-width:100%;display:block;margin:.5em 0}
code{background:#f4f4f4;padding:0 .2em}
"""


def _pyplot():
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig, plt) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(uri: str, alt: str, kind: str) -> str:
    return f'<img class="plot" data-plot="{kind}" alt="{html.escape(alt)}" src="{uri}">'


def _finite_db(v, cap: float = 150.0) -> float | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if math.isinf(v):
        return cap if v > 0 else -cap
    return float(v)


def _bar_plot(plt, labels: list[str], values: list, title: str, color: str) -> str:
    n = len(labels)
    fig, ax = plt.subplots(figsize=(9, max(1.8, 0.28 * n + 1.0)), layout="constrained")
    vals = [_finite_db(v) for v in values]
    shown = [0.0 if v is None else v for v in vals]
    ax.barh(range(n), shown, color=color)
    ax.set_yticks(range(n))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()  # worst at the top
    ax.set_xlabel("SQNR (dB), higher is better")
    ax.set_title(title, fontsize=10)
    for i, (v, raw) in enumerate(zip(vals, values)):
        ax.text(shown[i], i, " " + fmt_db(raw), va="center", fontsize=7)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig, plt)


def _histogram_plot(plt, entry: dict) -> str:
    h = entry["histogram"]
    lo, hi = h["range"]
    counts = h["counts"]
    n = len(counts)
    width = (hi - lo) / n
    fig, ax = plt.subplots(figsize=(4.8, 2.9), layout="constrained")
    ax.stairs(counts, [lo + i * width for i in range(n + 1)], fill=True, color="#4c72b0")
    q_lo, q_hi = entry["quantizer_range"]
    ax.axvline(q_lo, color="#c44e52", lw=1.2, ls="--")
    ax.axvline(q_hi, color="#c44e52", lw=1.2, ls="--", label="quantizer range")
    ax.set_yscale("log")
    fr = entry.get("float_range") or [float("nan")] * 2
    clipped = entry.get("clipped_fraction")
    title = f"{entry['float_tensor']}\nSQNR {fmt_db(entry['sqnr_db'])} dB"
    if clipped is not None:
        title += f", clipped {clipped * 100:.3g}%"
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(
        f"float values: min {fmt_num(fr[0], 3)}, max {fmt_num(fr[1], 3)}  "
        f"({h['below']} below / {h['above']} above the plot)",
        fontsize=7,
    )
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    return _png(fig, plt)


def _heatmap(plt, report: dict) -> str | None:
    models = [m for m in report["models"] if "weight_bits" in m]
    wbs = sorted({m["weight_bits"] for m in models})
    abs_ = sorted({m["activation_bits"] for m in models})
    if len(wbs) * len(abs_) < 2:
        return None
    key = "accuracy" if report["labels"] else "agreement"
    grid = [[None] * len(abs_) for _ in wbs]
    for m in models:
        grid[wbs.index(m["weight_bits"])][abs_.index(m["activation_bits"])] = m[key]
    fig, ax = plt.subplots(figsize=(1.2 * len(abs_) + 2.5, 0.8 * len(wbs) + 1.5), layout="constrained")
    data = [[float("nan") if v is None else v * 100 for v in row] for row in grid]
    im = ax.imshow(data, cmap="RdYlGn", aspect="auto")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, fmt_acc(v), ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(abs_)))
    ax.set_xticklabels([f"A{b}" for b in abs_])
    ax.set_yticks(range(len(wbs)))
    ax.set_yticklabels([f"W{b}" for b in wbs])
    ax.set_title(f"{key} by weight / activation bits", fontsize=10)
    fig.colorbar(im, ax=ax, label=f"{key} (%)")
    return _png(fig, plt)


def _table(header: list[str], rows: list[list[str]], numeric: list[bool]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for r in rows:
        cells = "".join(
            f'<td class="n">{html.escape(c)}</td>' if n else f"<td>{html.escape(c)}</td>" for c, n in zip(r, numeric)
        )
        out.append(f"<tr>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def render_html(report: dict) -> str:
    plt = _pyplot()
    esc = html.escape
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>qtool simulate: {esc(str(report['model']))}</title><style>{_CSS}</style></head><body>",
        "<h1>qtool simulate</h1>",
        f"<p>Float model <code>{esc(str(report['model']))}</code> on <code>{esc(str(report['data']))}</code>: "
        f"{report['samples']} samples, output <code>{esc(report['output'])}</code>, "
        + (f"labels <code>{esc(report['labels'])}</code>." if report["labels"] else "no labels (agreement only).")
        + "</p>",
    ]
    if plt is None:
        parts.append(
            f'<div class="note" id="no-plots">Plots are not included: matplotlib is not installed. '
            f"Install the report extra with <code>{esc(INSTALL_HINT)}</code> and run again to get them.</div>"
        )
    cal = report.get("calibration")
    if cal and cal.get("on_evaluation_data"):
        parts.append('<div class="warn">Calibrated on the evaluation data itself (no <code>--calibration-data</code>): '
                     "the ranges fit this data exactly, so the accuracy shown is optimistic.</div>")
    elif cal:
        parts.append(f"<p>Calibration data: <code>{esc(str(cal['source']))}</code>.</p>")
    for n in report["notes"]:
        parts.append(f'<div class="note">{esc(n)}</div>')

    parts.append("<h2>Models</h2>")
    rows = [["float", "-", "-", fmt_acc(report["float"]["accuracy"]), "-", "-", "-", "-", "-"]]
    for m in report["models"]:
        o = m["output"]
        rows.append([m["name"], str(m.get("weight_bits", "-")), str(m.get("activation_bits", "-")),
                     fmt_acc(m["accuracy"]), fmt_acc(m["agreement"]), fmt_db(o["sqnr_db"]),
                     fmt_num(o["mean_abs_error"]), fmt_num(o["max_abs_error"]), fmt_num(o["cosine"], 6)])
    parts.append(_table(["model", "weight bits", "activation bits", "accuracy", "agreement with float",
                         "output SQNR dB", "mean |err|", "max |err|", "cosine"], rows,
                        [False, True, True, True, True, True, True, True, True]))
    if plt is not None:
        uri = _heatmap(plt, report)
        if uri:
            parts.append(_img(uri, "accuracy by bit widths", "bits"))

    for m in report["models"]:
        parts.append(f"<h2>{esc(m['name'])}</h2>")
        for n in m["notes"]:
            parts.append(f'<div class="note">{esc(n)}</div>')
        acts = m["activations"]
        parts.append("<h3>Quantized activations, worst first</h3>")
        if plt is not None and acts:
            parts.append(_img(_bar_plot(plt, [a["float_tensor"] or a["quantizer"] for a in acts],
                                        [a["sqnr_db"] for a in acts],
                                        f"{m['name']}: activation SQNR (quantized vs float)", "#4c72b0"),
                              "activation SQNR", "sqnr"))
        parts.append(_table(
            ["SQNR dB", "mean |err|", "max |err|", "cosine", "clipped", "float range", "quantizer range",
             "float tensor", "quantizer"],
            [[fmt_db(a["sqnr_db"]), fmt_num(a.get("mean_abs_error")), fmt_num(a.get("max_abs_error")),
              fmt_num(a.get("cosine"), 6),
              "-" if a.get("clipped_fraction") is None else f"{a['clipped_fraction'] * 100:.3g}%",
              _rng(a.get("float_range")), _rng(a.get("quantizer_range")), a["float_tensor"] or "-",
              a["quantizer"] + (f" ({a['problem']})" if a.get("problem") else "")] for a in acts],
            [True, True, True, True, True, True, True, False, False]))
        for u in m["unmatched_activations"]:
            parts.append(f"<p>Not compared: <code>{esc(u['quantizer'])}</code>: {esc(u['reason'])}</p>")
        with_hist = [a for a in acts if a.get("histogram")][:WORST_HISTOGRAMS]
        if with_hist:
            parts.append("<h3>Worst activations: float values and the quantizer's range</h3>")
            if plt is not None:
                for a in with_hist:
                    parts.append(_img(_histogram_plot(plt, a), f"histogram of {a['float_tensor']}", "histogram"))
        if m["weights"]:
            parts.append("<h3>Weights, worst first</h3>")
            ws = m["weights"]
            if plt is not None:
                parts.append(_img(_bar_plot(plt, [f"{w['layer']} {w['role']}" for w in ws], [w["sqnr_db"] for w in ws],
                                            f"{m['name']}: weight SQNR", "#55a868"), "weight SQNR", "sqnr"))
            parts.append(_table(["SQNR dB", "max |err|", "role", "codes", "layer"],
                                [[fmt_db(w["sqnr_db"]), fmt_num(w.get("max_abs_error")), w["role"], w.get("dtype") or "-",
                                  f"{w['layer']} ({w['op']})"] for w in ws], [True, True, False, False, False]))
        if "sensitivity" in m:
            parts.append("<h3>Sensitivity: only this layer quantized, worst first</h3>")
            sens = m["sensitivity"]
            if plt is not None and sens:
                parts.append(_img(_bar_plot(plt, [s["layer"] for s in sens], [s["sqnr_db"] for s in sens],
                                            f"{m['name']}: output SQNR with one layer quantized", "#c44e52"),
                                  "sensitivity", "sensitivity"))
            parts.append(_table(["output SQNR dB", "accuracy", "agreement", "layer"],
                                [[fmt_db(s["sqnr_db"]), fmt_acc(s["accuracy"]), fmt_acc(s["agreement"]),
                                  f"{s['layer']} ({s['op']})"] for s in sens], [True, True, True, False]))
    parts.append("<h2>How to read this</h2><ul>")
    for k, v in report["conventions"].items():
        parts.append(f"<li><b>{esc(k)}</b>: {esc(v)}</li>")
    parts.append("</ul></body></html>")
    return "\n".join(parts)


def _rng(r) -> str:
    if not r:
        return "-"
    return f"[{fmt_num(r[0], 3)}, {fmt_num(r[1], 3)}]"


def write_html(report: dict, path) -> None:
    atomic_write(path, render_html(report))
