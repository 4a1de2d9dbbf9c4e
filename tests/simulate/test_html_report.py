"""The HTML page: the answer first (verdict, costly layers, what to do), then contents, then details."""

import base64
import re

import pytest
from sim_helpers import CALIB, DAMAGED_LAYER, EVAL, MODEL

from qtool.simulate import advice
from qtool.simulate import html as page_module
from qtool.api import simulate
from qtool.simulate.config import SimulateConfig


@pytest.fixture(scope="module")
def result(q_damaged):
    return simulate(MODEL, EVAL, SimulateConfig(labels="labels", quantized=[q_damaged], sensitivity=True, histograms=True))


def _images(page):
    return re.findall(r'<img class="plot" data-plot="(\w+)" alt="[^"]*" src="data:image/png;base64,([^"]+)"', page)


def test_the_page_has_every_plot_and_is_self_contained(tmp_path, result):
    path = tmp_path / "report.html"
    result.write_html(path)
    page = path.read_text()
    kinds = [k for k, _ in _images(page)]
    assert kinds.count("sqnr") == 2  # activations and weights
    assert kinds.count("histogram") == 4  # the worst activations, with their ranges
    assert kinds.count("sensitivity") == 1
    for _, data in _images(page):
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'src="http' not in page and "<script" not in page  # self-contained, no script
    assert "qtool[report]" not in page  # plots are always there: no install hint


def test_the_summary_leads_with_the_verdict_and_the_damaged_layer(result):
    page = page_module.render_html(result.report)
    summary = page[page.index('<section id="summary">'):page.index("</section>")]
    assert page.index('id="summary"') < page.index('id="contents"') < page.index('id="models"')
    assert re.search(r'<span class="verdict (good|acceptable|poor)">', summary)
    items = re.findall(r"<li><code>([^<]+)</code>.*?<span class=\"action\">([^<]+)</span>", summary)
    assert len(items) == 3
    assert items[0][0] == DAMAGED_LAYER  # its 2-bit weights cost the most on their own
    assert items[0][1] in ("keep in float", "16 bits")
    assert all(action in ("keep in float", "16 bits", "more calibration data", "fine-tune") for _, action in items)
    assert "measured with one layer quantized at a time" in summary


def test_verdicts_follow_the_accuracy_drop():
    report = {"labels": "y", "output_kind": "classes", "float": {"accuracy": 0.99}}
    model = {"accuracy": 0.99, "agreement": 1.0, "output": {"sqnr_db": 30.0}}
    assert advice.verdict(report, model).level == "good"
    assert advice.verdict(report, dict(model, accuracy=0.975)).level == "acceptable"
    assert advice.verdict(report, dict(model, accuracy=0.90)).level == "poor"
    unlabelled = dict(report, labels=None)
    assert advice.verdict(unlabelled, dict(model, agreement=0.97)).level == "poor"
    values = dict(report, output_kind="values")
    assert advice.verdict(values, dict(model, output={"sqnr_db": 25.0, "relative_rms_error": 0.05})).level == \
        "acceptable"


def test_advice_rules():
    base = {"name": "m", "output": {"sqnr_db": 30.0}, "activations": [], "sensitivity": None}
    clipped = dict(base, weights=[{"layer": "a", "op": "Conv", "role": "weight", "sqnr_db": 45.0}],
                   activations=[{"layer": "a", "sqnr_db": 35.0, "clipped_fraction": 0.01}])
    assert advice.costly_layers(clipped)[0].action == "more calibration data"
    dominant = dict(base, weights=[{"layer": "a", "op": "Conv", "role": "weight", "sqnr_db": 45.0}],
                    sensitivity=[{"layer": "a", "op": "Conv", "sqnr_db": 31.0}])
    (a,) = advice.costly_layers(dominant)
    assert a.action == "keep in float" and "--exclude 'a'" in a.how
    low_weights = dict(base, weights=[{"layer": "a", "op": "Conv", "role": "weight", "sqnr_db": 20.0}])
    assert advice.costly_layers(low_weights)[0].action == "16 bits"
    spread = dict(base, weights=[{"layer": "a", "op": "Conv", "role": "weight", "sqnr_db": 45.0}])
    assert advice.costly_layers(spread)[0].action == "fine-tune"


def test_plots_are_drawn_to_be_read(monkeypatch, result):
    """Names legible (cut in the middle, 9 pt), the heat map's colour scale labelled."""
    figures = []
    real = page_module._png
    monkeypatch.setattr(page_module, "_png", lambda fig, plt: figures.append(fig) or real(fig, plt))
    rep = simulate(MODEL, EVAL, SimulateConfig(labels="labels", weight_bits="4,8", activation_bits="8,16", calibration_data=CALIB)).report
    page_module.render_html(rep)
    heat = [f for f in figures if any(ax.get_label() == "<colorbar>" for ax in f.axes)]
    assert len(heat) == 1
    (bar_axes,) = [ax for ax in heat[0].axes if ax.get_label() == "<colorbar>"]
    assert bar_axes.get_ylabel() == "accuracy (%)"
    bars = [f for f in figures if f not in heat]
    assert bars
    for fig in bars:
        ax = fig.axes[0]
        labels = ax.get_yticklabels()
        assert labels and all(len(t.get_text()) <= page_module.NAME_CHARS for t in labels)
        assert all(t.get_fontsize() >= 9 for t in labels)
        assert fig.get_size_inches()[0] >= 9  # the page's width, not a thumbnail


def test_a_saved_json_renders_the_same_page(tmp_path, result):
    import json

    result.write_json(tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert "<section id=\"summary\">" in page_module.render_html(_floats(doc))


def _floats(value):
    """JSON's "inf"/"nan" strings back to floats (what a reader of the JSON does)."""
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return float(value) if value in ("inf", "-inf", "nan") else value
