"""simulate: each model's layers in onnxruntime's optimized graph, by kernel kind (a layer of a quantized model in a
float kernel runs on dequantized values, slower than in the float model)."""

from pathlib import Path

import pytest

import qtool
from qtool.api import simulate
from qtool.config import QuantConfig
from qtool.simulate.config import SimulateConfig

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runtime")
    uint8, int8 = folder / "uint8.onnx", folder / "int8.onnx"
    for path, quant in ((uint8, QuantConfig()), (int8, QuantConfig(int8_activations=True))):
        qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), str(path), calibration_data=str(SAMPLES / "calib.npz"),
                           quant=quant)
    return uint8, int8


def test_each_model_and_float_are_counted_by_kernel_kind(written):
    uint8, int8 = written
    res = simulate(str(SAMPLES / "digits_cnn.onnx"), str(SAMPLES / "eval.npz"),
                   SimulateConfig(labels="labels", quantized=[str(uint8), str(int8)]))
    report = res.to_dict()
    assert report["float"]["in_onnxruntime"]["integer_layers"] == 0
    assert len(report["float"]["in_onnxruntime"]["float_layers"]) == 5  # four Convs and the Gemm
    first, second = (m["in_onnxruntime"] for m in report["models"])
    assert first == {"integer_layers": 5, "float_layers": []}
    # int8 activations: onnxruntime's x86 kernels take uint8 ones, so one Conv stays a float kernel
    assert second["integer_layers"] == 4 and [x["op"] for x in second["float_layers"]] == ["Conv"]
    text = res.format_text()
    assert "  layers in onnxruntime's optimized graph (integer / float kernels):" in text
    assert f"    {'float':28s}    0 / 5" in text
    assert f"      in float: {second['float_layers'][0]['node']}" in text


def test_what_if_models_are_counted_and_sensitivity_models_are_not(monkeypatch):
    import qtool.simulate.session as session

    calls = []
    real = session.saving_optimized_graph

    def counting(options):
        calls.append(1)
        return real(options)

    monkeypatch.setattr(session, "saving_optimized_graph", counting)
    res = simulate(str(SAMPLES / "digits_cnn.onnx"), str(SAMPLES / "calib.npz"),
                   SimulateConfig(weight_bits="4,8", sensitivity=True))
    assert len(calls) == 3  # the float model and the two what-if models, not their 2 x 5 single-layer models
    assert [m["in_onnxruntime"]["integer_layers"] for m in res.to_dict()["models"]] == [5, 5]


def test_a_model_too_large_is_not_looked_at(written, monkeypatch):
    import qtool.model.runtime_graph

    monkeypatch.setattr(qtool.model.runtime_graph, "MAX_MODEL_BYTES", 0)
    res = simulate(str(SAMPLES / "digits_cnn.onnx"), str(SAMPLES / "eval.npz"),
                   SimulateConfig(quantized=[str(written[0])]))
    assert res.to_dict()["models"][0]["in_onnxruntime"] is None
    assert "layers in onnxruntime" not in res.format_text()


def test_the_html_page_has_the_table(written, tmp_path):
    res = simulate(str(SAMPLES / "digits_cnn.onnx"), str(SAMPLES / "eval.npz"),
                   SimulateConfig(quantized=[str(written[1])], histograms=True))
    path = tmp_path / "r.html"
    res.write_html(str(path))
    page = path.read_text()
    node = res.to_dict()["models"][0]["in_onnxruntime"]["float_layers"][0]["node"]
    assert "Layers in onnxruntime's optimized graph" in page
    assert f'<td class="n">4</td><td class="n">1</td><td>{node}</td>' in page
