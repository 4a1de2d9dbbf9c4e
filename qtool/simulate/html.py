"""The simulation report as one self-contained HTML page, answer first.

1. **Summary**: float vs quantized accuracy (or agreement) and output SQNR,
   a verdict per model, and for the main model the three layers that cost
   the most with what to do about each (keep in float, 16 bits, more
   calibration data, fine-tune) -- see :mod:`qtool.simulate.advice`;
2. a table of contents;
3. the details: the model table (a heat map of accuracy by bit widths for a
   what-if grid), per model the SQNR of every quantized activation and
   weight, histograms of the worst activations with the quantizer's range,
   the sensitivity ranking; how to read it all.

Plots are PNG images embedded as ``data:`` URIs (one file, no network) drawn
with matplotlib (a dependency) on the Agg backend, sized to read at the
page's width (names cut in the middle, not squeezed). The page has no
script. It renders from the report dict, so a saved ``--json`` renders the
same page.
"""

from __future__ import annotations

import base64
import html
import io
import math

from qtool.model.profile import op_summary
from qtool.simulate import advice
from qtool.simulate.report import atomic_write, ellipsize, fmt_acc, fmt_db, fmt_num

WORST_HISTOGRAMS = 4
MAX_BARS = 40  # bars per SQNR plot (the worst); the table below it has every row
PLOT_DPI = 100
NAME_CHARS = 44  # tensor names on plot axes, cut in the middle beyond this

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em auto;max-width:1100px;color:#222;
padding:0 1em;line-height:1.4}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ccc}
h3{font-size:1.05em} .meta{color:#555;margin-top:0}
table{border-collapse:collapse;margin:.5em 0 1em} td,th{border:1px solid #ddd;padding:.25em .6em;font-size:.9em}
td{overflow-wrap:anywhere} .wide{overflow-x:auto;max-width:100%}
th{background:#f4f4f4;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
#summary{background:#f7f9fc;border:1px solid #cfd8e6;border-radius:6px;padding:.5em 1.2em 1em}
#summary h2{margin-top:.5em;border:none}
.verdict{font-weight:600;padding:.1em .5em;border-radius:4px;white-space:nowrap}
.good{background:#d9f2d9;color:#1d5e1d} .acceptable{background:#fff1c2;color:#6b5200} .poor{background:#f9d4d4;color:#8a1c1c}
.lead{font-size:1.1em} .action{font-weight:600}
.note{background:#fff7d6;border:1px solid #e6d48a;padding:.5em 1em;margin:.5em 0}
.warn{background:#fde8e8;border:1px solid #e9a5a5;padding:.5em 1em;margin:.5em 0}
img.plot{max-width:100%;display:block;margin:.5em 0} .hists{display:flex;flex-wrap:wrap;gap:8px}
.hists img.plot{max-width:calc(50% - 4px)}
code{background:#f4f4f4;padding:0 .2em} nav ol{columns:2}
"""


def _pyplot():
    """matplotlib's pyplot on the Agg backend (imported here: a heavy module only the page needs)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig, plt) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PLOT_DPI)
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
    """Horizontal SQNR bars, worst at the top; one row per name at a readable size."""
    labels, values = labels[:MAX_BARS], values[:MAX_BARS]
    n = len(labels)
    fig, ax = plt.subplots(figsize=(10, 0.32 * n + 1.3), layout="constrained")
    vals = [_finite_db(v) for v in values]
    shown = [0.0 if v is None else v for v in vals]
    ax.barh(range(n), shown, color=color, height=0.7)
    ax.set_yticks(range(n), [ellipsize(label, NAME_CHARS) for label in labels], fontsize=9)
    ax.invert_yaxis()  # worst at the top
    ax.set_xlabel("SQNR (dB, a log scale of the error: +6 dB = half the error; higher is better)", fontsize=9)
    ax.set_title(title, fontsize=11)
    for i, raw in enumerate(values):
        ax.text(shown[i], i, " " + fmt_db(raw), va="center", fontsize=8)
    ax.set_xlim(0, max([v for v in shown if v] + [10.0]) * 1.12)
    ax.grid(axis="x", alpha=0.3)
    ax.tick_params(axis="x", labelsize=9)
    return _png(fig, plt)


def _histogram_plot(plt, entry: dict) -> str:
    h = entry["histogram"]
    lo, hi = h["range"]
    counts = h["counts"]
    width = (hi - lo) / len(counts)
    fig, ax = plt.subplots(figsize=(5.4, 3.4), layout="constrained")
    ax.stairs(counts, [lo + i * width for i in range(len(counts) + 1)], fill=True, color="#4c72b0")
    q_lo, q_hi = entry["quantizer_range"]
    ax.axvline(q_lo, color="#c44e52", lw=1.4, ls="--")
    ax.axvline(q_hi, color="#c44e52", lw=1.4, ls="--", label="quantizer range")
    ax.set_yscale("log")  # counts span decades: the tails that get clipped stay visible
    ax.set_ylabel("values (log scale)", fontsize=9)
    fr = entry.get("float_range") or [float("nan")] * 2
    clipped = entry.get("clipped_fraction")
    title = f"{ellipsize(entry['float_tensor'], 48)}\nSQNR {fmt_db(entry['sqnr_db'])} dB"
    if clipped is not None:
        title += f", clipped {clipped * 100:.3g}%"
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(f"float value (seen: {fmt_num(fr[0], 3)} to {fmt_num(fr[1], 3)}; "
                  f"{h['below']} below / {h['above']} above the plot)", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8)
    return _png(fig, plt)


def _heatmap(plt, report: dict) -> str | None:
    models = [m for m in report["models"] if "weight_bits" in m]
    wbs = sorted({m["weight_bits"] for m in models})
    abs_ = sorted({m["activation_bits"] for m in models})
    key, unit = _grid_metric(report)
    if len(wbs) * len(abs_) < 2 or key is None:
        return None
    grid = [[float("nan")] * len(abs_) for _ in wbs]
    for m in models:
        v = m[key] if key != "sqnr_db" else _finite_db(m["output"]["sqnr_db"])
        grid[wbs.index(m["weight_bits"])][abs_.index(m["activation_bits"])] = (
            float("nan") if v is None else (v * 100 if unit == "%" else v))
    fig, ax = plt.subplots(figsize=(max(5.5, 1.4 * len(abs_) + 3), max(2.8, 0.9 * len(wbs) + 1.6)),
                           layout="constrained")
    seen = [v for row in grid for v in row if not math.isnan(v)]
    span = 5.0 if unit == "%" else 20.0  # a small difference must look small: at least 5 points / 20 dB of scale
    hi = max(seen)
    lo = min(min(seen), hi - span)
    im = ax.imshow(grid, cmap="RdYlGn", aspect="auto", vmin=lo, vmax=hi)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            dark = not math.isnan(v) and not 0.25 < (v - lo) / (hi - lo or 1) < 0.8
            ax.text(j, i, "-" if math.isnan(v) else f"{v:.2f}{unit if unit == '%' else ''}",
                    ha="center", va="center", fontsize=10, color="white" if dark else "black")
    ax.set_xticks(range(len(abs_)), [f"A{b}" for b in abs_], fontsize=10)
    ax.set_yticks(range(len(wbs)), [f"W{b}" for b in wbs], fontsize=10)
    ax.set_xlabel("activation bits", fontsize=10)
    ax.set_ylabel("weight bits", fontsize=10)
    ax.set_title(f"{key.replace('_', ' ')} by weight / activation bits", fontsize=11)
    bar = fig.colorbar(im, ax=ax)
    bar.set_label(f"{key.replace('_db', '').replace('_', ' ')} ({'dB' if unit == 'dB' else '%'})", fontsize=10)
    return _png(fig, plt)


def _grid_metric(report: dict) -> tuple[str | None, str]:
    if report.get("output_kind", "classes") != "classes":
        return "sqnr_db", "dB"
    return ("accuracy", "%") if report["labels"] else ("agreement", "%")


def _table(header: list[str], rows: list[list[str]], numeric: list[bool]) -> str:
    out = ['<div class="wide"><table><tr>' + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for r in rows:
        cells = "".join(
            f'<td class="n">{html.escape(c)}</td>' if n else f"<td>{html.escape(c)}</td>" for c, n in zip(r, numeric)
        )
        out.append(f"<tr>{cells}</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _rng(r) -> str:
    return "-" if not r else f"[{fmt_num(r[0], 3)}, {fmt_num(r[1], 3)}]"


# --- sections -----------------------------------------------------------------------------------


def _summary(report: dict) -> list[str]:
    """The answer: the model numbers with a verdict each, then the main model's costliest layers."""
    esc = html.escape
    values = report.get("output_kind", "classes") != "classes"
    parts = ['<section id="summary"><h2>Summary</h2>']
    main = advice.main_model(report)
    if main is not None:
        v = advice.verdict(report, main)
        parts.append(f'<p class="lead"><span class="verdict {v.level}">{esc(v.level)}</span> '
                     f"<b>{esc(main['name'])}</b>: {esc(v.sentence)}</p>")
    cal = report.get("calibration")
    if cal and cal.get("on_evaluation_data"):
        parts.append('<div class="warn">Calibrated on the evaluation data itself (no <code>--calibration-data</code>): '
                     "the ranges fit this data exactly, so the accuracy shown is optimistic.</div>")
    header = ["model", "output SQNR dB", "relative error", "verdict"] if values else \
        ["model", "accuracy" if report["labels"] else "agreement with float", "output SQNR dB", "verdict"]
    rows = [] if values or not report["labels"] else [["float", fmt_acc(report["float"]["accuracy"]), "-", "-"]]
    for m in report["models"]:
        o = m["output"]
        first = fmt_num(o.get("relative_rms_error")) if values else fmt_acc(m["accuracy"] if report["labels"]
                                                                            else m["agreement"])
        row = [m["name"], fmt_db(o["sqnr_db"]), first] if values else [m["name"], first, fmt_db(o["sqnr_db"])]
        rows.append(row + [advice.verdict(report, m).level])
    parts.append(_table(header, rows, [False, True, True, False]))
    parts += _runtime(report) + _latency(report)
    if main is not None:
        parts += _costly_layers(main)
    parts.append("</section>")
    return parts


def _runtime(report: dict) -> list[str]:
    """Each model's layers in onnxruntime's optimized graph by kernel kind (``in_onnxruntime``)."""
    if not any(m.get("in_onnxruntime") for m in report["models"]):
        return []
    rows = [[name, str(r["integer_layers"]), str(len(r["float_layers"])),
             ", ".join(x["node"] for x in r["float_layers"]) if name != "float" else ""]
            for name, r in [("float", report["float"].get("in_onnxruntime"))]
            + [(m["name"], m.get("in_onnxruntime")) for m in report["models"]] if r is not None]
    return ["<p>Layers in onnxruntime's optimized graph: a quantized model's layer in a float kernel runs on "
            "dequantized values, slower than in the float model.</p>",
            _table(["model", "integer kernels", "float kernels", "in float"], rows, [False, True, True, False])]


def _latency(report: dict) -> list[str]:
    """``--latency``: each model's one-thread time, as a multiple of float's measured in the same loop."""
    lat = report.get("latency")
    if not lat:
        return []
    rows = [["float", f"{lat['float_ms']:.3f}", "1.00x"]]
    rows += [[m["name"], f"{m['ms']:.3f}", f"{m['x_float']:.2f}x" + (" (slower than float)" if m["x_float"] > 1 else "")]
             for m in lat["models"]]
    parts = [f"<p>Latency in onnxruntime: one thread, batch 1, median of {lat['rounds']} interleaved runs "
             "(thread CPU time).</p>", _table(["model", "ms", "x float"], rows, [False, True, False])]
    slower = [m["name"] for m in lat["models"] if m["x_float"] and m["x_float"] > 1]
    by_op = lat.get("by_op", {})
    if slower and by_op:
        parts.append("<p>Where the time goes in the models slower than float: onnxruntime's profile, the five "
                     "slowest op types of its optimized graph (ms per run; the profiler adds about a microsecond "
                     "per node).</p>")
        rows = [[name, ", ".join(op_summary(by_op[name]))] for name in ["float"] + slower if by_op.get(name)]
        parts.append(_table(["model", "op types, slowest first"], rows, [False, False]))
    return parts


def _costly_layers(model: dict) -> list[str]:
    esc = html.escape
    layers = advice.costly_layers(model)
    if not layers:
        return []
    how = ("measured with one layer quantized at a time" if model.get("sensitivity")
           else "from the per-tensor SQNR (run with <code>--sensitivity</code> to measure each layer alone)")
    parts = [f"<h3>Where {esc(model['name'])} loses the most</h3><p>The layers that cost the most, {how}, "
             "and what to do about each:</p><ol>"]
    for layer in layers:
        parts.append(f"<li><code>{esc(layer.name)}</code> ({esc(layer.op)}): {esc(layer.evidence)}. "
                     f'<span class="action">{esc(layer.action)}</span>: {esc(layer.how)}</li>')
    parts.append("</ol>")
    return parts


def _notes(report: dict) -> list[str]:
    """The report's notes, with why the batches were smaller than asked (memory) first."""
    return ([report["memory_note"]] if report.get("memory_note") else []) + report["notes"]


def _contents(report: dict) -> list[str]:
    items = [("models", "Models")] + [(f"model-{i}", f"{m['name']}: where the error comes from")
                                      for i, m in enumerate(report["models"])]
    items += [("notes", "Notes")] if _notes(report) else []
    items.append(("how-to-read", "How to read this"))
    links = "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for a, t in items)
    return [f'<nav id="contents"><h2>Contents</h2><ol>{links}</ol></nav>']


def _models_section(plt, report: dict) -> list[str]:
    parts = ['<section id="models"><h2>Models</h2>']
    rows = [["float", "-", "-", fmt_acc(report["float"]["accuracy"]), "-", "-", "-", "-", "-", "-"]]
    for m in report["models"]:
        o = m["output"]
        rows.append([m["name"], str(m.get("weight_bits", "-")), str(m.get("activation_bits", "-")),
                     fmt_acc(m["accuracy"]), fmt_acc(m["agreement"]), fmt_db(o["sqnr_db"]),
                     fmt_num(o.get("relative_rms_error")), fmt_num(o["mean_abs_error"]), fmt_num(o["max_abs_error"]),
                     fmt_num(o["cosine"], 6)])
    header = ["model", "weight bits", "activation bits", "accuracy", "agreement with float", "output SQNR dB",
              "relative error", "mean |err|", "max |err|", "cosine"]
    if report.get("output_kind", "classes") != "classes":  # no top-1: no accuracy or agreement columns
        header, rows = header[:3] + header[5:], [r[:3] + r[5:] for r in rows]
    parts.append(_table(header, rows, [False] + [True] * (len(header) - 1)))
    uri = _heatmap(plt, report)
    if uri:
        parts.append(_img(uri, "accuracy by bit widths", "bits"))
    parts.append("</section>")
    return parts


def _activations(plt, m: dict) -> list[str]:
    acts = m["activations"]
    parts = ["<h3>Quantized activations, worst first</h3>"]
    if acts:
        parts.append(_img(_bar_plot(plt, [a["float_tensor"] or a["quantizer"] for a in acts],
                                    [a["sqnr_db"] for a in acts], f"{m['name']}: activation SQNR (quantized vs float)",
                                    "#4c72b0"), "activation SQNR", "sqnr"))
    parts.append(_table(
        ["SQNR dB", "mean |err|", "max |err|", "cosine", "clipped", "float range", "quantizer range",
         "float tensor", "layer", "quantizer"],
        [[fmt_db(a["sqnr_db"]), fmt_num(a.get("mean_abs_error")), fmt_num(a.get("max_abs_error")),
          fmt_num(a.get("cosine"), 6),
          "-" if a.get("clipped_fraction") is None else f"{a['clipped_fraction'] * 100:.3g}%",
          _rng(a.get("float_range")), _rng(a.get("quantizer_range")), a["float_tensor"] or "-", a.get("layer") or "-",
          a["quantizer"] + (f" ({a['problem']})" if a.get("problem") else "")] for a in acts],
        [True] * 7 + [False] * 3))
    for u in m["unmatched_activations"]:
        parts.append(f"<p>Not compared: <code>{html.escape(u['quantizer'])}</code>: {html.escape(u['reason'])}</p>")
    with_hist = [a for a in acts if a.get("histogram")][:WORST_HISTOGRAMS]
    if with_hist:
        parts.append("<h3>Worst activations: float values and the quantizer's range</h3><div class='hists'>")
        parts += [_img(_histogram_plot(plt, a), f"histogram of {a['float_tensor']}", "histogram") for a in with_hist]
        parts.append("</div>")
    return parts


def _weights_and_sensitivity(plt, m: dict, top1: bool) -> list[str]:
    parts = []
    ws = m["weights"]
    if ws:
        parts.append("<h3>Weights, worst first</h3>")
        parts.append(_img(_bar_plot(plt, [f"{w['layer']} {w['role']}" for w in ws], [w["sqnr_db"] for w in ws],
                                    f"{m['name']}: weight SQNR", "#55a868"), "weight SQNR", "sqnr"))
        parts.append(_table(["SQNR dB", "max |err|", "role", "codes", "layer"],
                            [[fmt_db(w["sqnr_db"]), fmt_num(w.get("max_abs_error")), w["role"], w.get("dtype") or "-",
                              f"{w['layer']} ({w['op']})" + (f" ({w['problem']})" if w.get("problem") else "")]
                             for w in ws], [True, True, False, False, False]))
    sens = m.get("sensitivity")
    if sens is not None:
        parts.append("<h3>Sensitivity: one layer quantized at a time, worst first</h3>")
        if sens:
            parts.append(_img(_bar_plot(plt, [s["layer"] for s in sens], [s["sqnr_db"] for s in sens],
                                        f"{m['name']}: output SQNR with one layer quantized", "#c44e52"),
                              "sensitivity", "sensitivity"))
        rows = [[fmt_db(s["sqnr_db"]), fmt_acc(s["accuracy"]), fmt_acc(s["agreement"]), f"{s['layer']} ({s['op']})"]
                for s in sens]
        if top1:
            parts.append(_table(["output SQNR dB", "accuracy", "agreement", "layer"], rows, [True, True, True, False]))
        else:
            parts.append(_table(["output SQNR dB", "layer"], [[r[0], r[3]] for r in rows], [True, False]))
    return parts


def render_html(report: dict) -> str:
    plt = _pyplot()
    esc = html.escape
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>qtool simulate: {esc(str(report['model']))}</title><style>{_CSS}</style></head><body>",
        f"<h1>qtool simulate: {esc(str(report['model']).replace(chr(92), '/').rsplit('/', 1)[-1])}</h1>",
        f"<p class='meta'>Float model <code>{esc(str(report['model']))}</code> on <code>{esc(str(report['data']))}"
        f"</code>: {report['samples']} samples, output <code>{esc(report['output'])}</code>"
        + (f" (no top-1: {esc(report['no_top1'])}; judged by SQNR)" if report.get("no_top1") else "") + ", "
        + (f"labels <code>{esc(report['labels'])}</code>." if report["labels"] else "no labels.") + "</p>",
    ]
    parts += _summary(report) + _contents(report) + _models_section(plt, report)
    top1 = report.get("output_kind", "classes") == "classes"
    for i, m in enumerate(report["models"]):
        parts.append(f'<section id="model-{i}"><h2>{esc(m["name"])}: where the error comes from</h2>')
        parts += [f'<div class="note">{esc(n)}</div>' for n in m["notes"]]
        parts += _activations(plt, m) + _weights_and_sensitivity(plt, m, top1)
        parts.append("</section>")
    if _notes(report):
        parts.append('<section id="notes"><h2>Notes</h2>')
        parts += [f'<div class="note">{esc(n)}</div>' for n in _notes(report)] + ["</section>"]
    parts.append('<section id="how-to-read"><h2>How to read this</h2><ul>')
    parts += [f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in report["conventions"].items()]
    parts.append("</ul></section></body></html>")
    return "\n".join(parts)


def write_html(report: dict, path) -> None:
    atomic_write(path, render_html(report))
