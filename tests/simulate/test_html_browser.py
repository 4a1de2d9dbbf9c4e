"""The HTML report in a real browser: headless Chromium renders it, a screenshot is taken and decoded.

Chromium is Debian's ``chromium`` package (``.ci/run`` installs it). This test
does not skip without it: a report nobody checked in a browser is not done.
"""

import base64
import io
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image
from sim_helpers import CALIB, EVAL, MODEL

from qtool.api import simulate
from qtool.simulate.config import SimulateConfig

WIDTH, HEIGHT = 1280, 2000

# Test-only instrumentation, put into a copy of the page: records script errors and failed loads, and
# after the load event writes what the browser made of the page (images decoded, section positions).
PROBE = """<script>
window.__errors = [];
window.addEventListener('error', e => __errors.push(String(e.message || ('failed to load ' + (e.target && e.target.tagName)))), true);
const __ce = console.error; console.error = (...a) => { __errors.push(a.join(' ')); __ce(...a); };
window.addEventListener('load', () => {
  const top = id => { const e = document.getElementById(id); return e ? e.getBoundingClientRect().top : null; };
  const probe = document.createElement('pre');
  probe.id = 'qtool-test-probe';
  probe.textContent = JSON.stringify({
    errors: __errors,
    images: [...document.images].map(i => [i.dataset.plot, i.complete, i.naturalWidth, i.naturalHeight,
                                           i.getBoundingClientRect().width]),
    sections: {summary: top('summary'), contents: top('contents'), models: top('models'), first: top('model-0')},
    scrollWidth: document.documentElement.scrollWidth,
  });
  document.body.appendChild(probe);
});
</script>"""


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "headless Chromium is needed for this test: apt-get install chromium (.ci/run does)"
    return path


def _run_chromium(tmp_path, url: str, *extra: str) -> subprocess.CompletedProcess:
    args = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},{HEIGHT}",
            *extra, url]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A what-if grid with sensitivity: every kind of plot (heat map, SQNR bars, histograms, sensitivity)."""
    tmp = tmp_path_factory.mktemp("browser")
    path = tmp / "report.html"
    simulate(MODEL, EVAL, SimulateConfig(labels="labels", weight_bits="4,8", calibration_data=CALIB, sensitivity=True), html_path=path)
    return tmp, path


def test_the_page_renders_without_console_errors(page):
    tmp, path = page
    r = _run_chromium(tmp, path.as_uri(), "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert r.returncode == 0, r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    dom = r.stdout
    assert '<section id="summary">' in dom and '<nav id="contents">' in dom
    assert dom.index('id="summary"') < dom.index('id="contents"') < dom.index('id="models"')


def test_the_browser_decodes_every_plot_and_the_summary_leads(page):
    tmp, path = page
    probed = tmp / "probed.html"
    probed.write_text(path.read_text().replace("<head>", "<head>" + PROBE, 1))
    r = _run_chromium(tmp, probed.as_uri(), "--virtual-time-budget=10000", "--dump-dom")
    found = re.search(r'<pre id="qtool-test-probe">(.*?)</pre>', r.stdout, re.S)
    assert found, r.stdout[-2000:] + r.stderr[-2000:]
    probe = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert probe["errors"] == []
    kinds = [kind for kind, *_ in probe["images"]]
    assert kinds.count("bits") == 1 and kinds.count("sensitivity") == 2 and kinds.count("histogram") == 8
    assert kinds.count("sqnr") == 4  # activations and weights of W4A8 and W8A8
    for kind, complete, natural_w, natural_h, shown_w in probe["images"]:
        assert complete and natural_w > 0 and natural_h > 0, kind  # decoded by the browser
        assert shown_w >= 0.45 * (WIDTH - 200) or kind in ("bits",), (kind, shown_w)  # not squeezed into a corner
    s = probe["sections"]
    assert s["summary"] < 300 and s["summary"] < s["contents"] < s["models"] < s["first"]  # the answer first
    assert probe["scrollWidth"] <= WIDTH  # nothing wider than the window


def test_the_screenshot_has_real_content(page):
    tmp, path = page
    shot = tmp / "shot.png"
    r = _run_chromium(tmp, path.as_uri(), f"--screenshot={shot}")
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    image = np.asarray(Image.open(shot).convert("RGB"))
    assert image.shape == (HEIGHT, WIDTH, 3)
    not_white = np.any(image < 235, axis=2)
    assert 0.05 < not_white.mean() < 0.9  # text, tables and plots; not a blank or a black page
    colors = np.unique(image.reshape(-1, 3)[::7], axis=0)
    assert len(colors) > 200  # anti-aliased text and coloured plots, not a flat error page
    top = not_white[:400]
    assert top.mean() > 0.03  # the summary is at the top of the page


def test_every_embedded_plot_is_a_readable_picture(page):
    _, path = page
    uris = re.findall(r'<img class="plot" data-plot="(\w+)" alt="[^"]*" src="data:image/png;base64,([^"]+)"',
                      path.read_text())
    assert len(uris) == 15
    for kind, data in uris:
        image = np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")).astype(float)
        h, w, _ = image.shape
        assert w >= 540 and h >= 200, (kind, w, h)  # drawn at a size that reads at the page's width
        assert image.std() > 20, kind  # not blank
        assert len(np.unique(image.reshape(-1, 3), axis=0)) > 30, kind
