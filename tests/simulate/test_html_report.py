"""The HTML page: plots with matplotlib, a plain note without it; one self-contained file."""

import base64
import re
import sys

import pytest
from sim_helpers import EVAL, MODEL

import qtool
from qtool.simulate.core import simulate


@pytest.fixture(scope="module")
def result(q_damaged):
    return simulate(MODEL, EVAL, labels="labels", quantized=[q_damaged], sensitivity=True, histograms=True)


def _images(page):
    return re.findall(r'<img class="plot" data-plot="(\w+)" alt="[^"]*" src="data:image/png;base64,([^"]+)"', page)


def test_html_with_matplotlib_has_the_plots(tmp_path, result):
    import matplotlib  # noqa: F401  (fails loudly if the report extra is missing)

    path = tmp_path / "report.html"
    result.write_html(path)
    page = path.read_text()
    assert "no-plots" not in page
    kinds = [k for k, _ in _images(page)]
    assert kinds.count("sqnr") == 2  # activations and weights
    assert kinds.count("histogram") == 4  # the worst activations, with their ranges
    assert kinds.count("sensitivity") == 1
    for _, data in _images(page):
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "src=\"http" not in page and "<script" not in page  # self-contained
    assert "Conv_2" in page


def test_html_with_a_bit_width_grid_has_the_accuracy_map(tmp_path):
    import matplotlib  # noqa: F401

    from qtool.simulate.html import render_html

    rep = simulate(MODEL, EVAL, labels="labels", weight_bits="4,8", activation_bits="8").report
    for m in rep["models"]:  # keep the page (and the test) small: only the table of models is under test
        m["activations"], m["weights"] = [], []
    page = render_html(rep)
    kinds = [k for k, _ in _images(page)]
    assert kinds == ["bits"]
    assert "W4A8" in page and "evaluation data itself" in page


def test_html_without_matplotlib_says_how_to_get_the_plots(tmp_path, result, monkeypatch):
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    path = tmp_path / "plain.html"
    result.write_html(path)
    page = path.read_text()
    assert 'id="no-plots"' in page
    assert "pip install &#x27;qtool[report]&#x27;" in page
    assert _images(page) == [] and "<img" not in page
    # the numbers are all there
    assert "Sensitivity" in page and "Conv_2" in page and "Weights, worst first" in page
