"""Models written by onnxruntime's quantizer (``quantize_static``, QDQ): every tensor goes to its layer.

onnxruntime's quantizer keeps exporters' empty node names, quantizes weights
held by ``Constant`` nodes as ``QuantizeLinear -> DequantizeLinear`` of the
float weight, drops a Relu its quantizer's range covers (the Conv or
BatchNormalization output then carries the Relu's name) and, after its
pre-processing, fuses batch norms into the convolutions.
"""

import math

import numpy as np
import onnx
import pytest
from sim_helpers import CALIB, EVAL, MODEL

from qtool.api import simulate

from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process
from qtool.simulate.config import SimulateConfig

N = 200  # evaluation samples (enough for stable numbers, fast)


class _Reader(CalibrationDataReader):
    def __init__(self):
        x = np.load(CALIB)["input"][:64]
        self.batches = iter([{"input": x[i : i + 32]} for i in range(0, 64, 32)])

    def get_next(self):
        return next(self.batches, None)


def _named(tmp_path):
    """The sample with PyTorch-style node names (``/conv1/Conv``), as most exporters write them."""
    proto = onnx.load(str(MODEL))
    for node in proto.graph.node:
        node.name = node.output[0].rsplit("_output_", 1)[0]
    path = tmp_path / "named.onnx"
    onnx.save(proto, str(path))
    return path


@pytest.fixture(scope="module", params=["unnamed-plain", "named-preprocessed"])
def case(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ortq")
    if request.param == "unnamed-plain":  # the exporter's empty names, weights in Constant nodes, BN kept
        float_path, source, per_channel = MODEL, MODEL, True
    else:  # quant_pre_process: ORT's optimizer fuses Conv+BN(+Relu); per-tensor
        float_path = _named(tmp)
        source = tmp / "pre.onnx"
        quant_pre_process(str(float_path), str(source))
        per_channel = False
    q_path = tmp / "q.onnx"
    quantize_static(str(source), str(q_path), _Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel)
    with np.load(EVAL) as d:
        data = {"input": d["input"][:N], "labels": d["labels"][:N]}
    report = simulate(float_path, data, SimulateConfig(labels="labels", quantized=[q_path], sensitivity=True)).report
    return request.param, float_path, q_path, data, report["models"][0]


def test_every_activation_is_compared_with_the_float_tensor_it_approximates(case):
    _, _, _, _, m = case
    assert m["activations"]
    for a in m["activations"]:
        # onnxruntime keeps tensor names: the float tensor is the one of the same name (the output's
        # quantizer reads the renamed Gemm output and writes 'logits')
        assert a["float_tensor"] == ("logits" if a["tensor"] == "logits_QuantizeLinear_Input" else a["tensor"]), a
        assert a["sqnr_db"] > 20, a  # a wrong counterpart (the BN output before a dropped Relu) gives ~2 dB
        assert a["clipped_fraction"] < 0.01, a  # ... and half its values "clipped"


def test_the_numbers_of_a_tensor_equal_a_direct_onnxruntime_computation(case):
    """'/Relu_output_0': the float Relu output against the quantized model's DequantizeLinear output."""
    import onnxruntime as ort

    _, float_path, q_path, data, m = case
    (entry,) = [a for a in m["activations"] if a["tensor"] == "/Relu_output_0"]

    def tensor(path, name):
        proto = onnx.load(str(path))
        proto.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        return np.concatenate([session.run([name], {"input": data["input"][i : i + 16]})[0]
                               for i in range(0, N, 16)]).astype(np.float64)

    f = tensor(float_path, "/Relu_output_0")
    q = tensor(q_path, "/Relu_output_0_DequantizeLinear_Output")
    # to a few ulps of the tensors: onnxruntime fuses a model with extra outputs differently
    assert entry["sqnr_db"] == pytest.approx(10 * math.log10(np.sum(f**2) / np.sum((f - q) ** 2)), rel=1e-5)
    assert entry["max_abs_error"] == pytest.approx(np.max(np.abs(f - q)), rel=1e-4)


def test_weights_belong_to_their_own_layers(case):
    name, _, _, _, m = case
    weights = [w for w in m["weights"] if w["role"] == "weight"]
    assert len(weights) == 5 and len({w["layer"] for w in weights}) == 5  # no two layers merged under ''
    for w in m["weights"]:
        assert w.get("problem") is None and w["sqnr_db"] > 35, w  # the float weight it quantizes was found
    if name == "unnamed-plain":  # the quantized batch-norm scales are constants of no layer: listed, not mixed in
        assert {u["tensor"] for u in m["unmatched_activations"]} == {
            "bn1.weight", "bn2.weight", "block.bn_dw.weight", "block.bn_pw.weight"}
        assert all("BatchNormalization" in u["reason"] for u in m["unmatched_activations"])
    else:
        assert m["unmatched_activations"] == []


def test_sensitivity_runs_every_layer_with_the_dropped_relus_kept(case):
    _, _, _, _, m = case
    sens = m["sensitivity"]
    assert len(sens) == 5 and not [n for n in m["notes"] if "skipped" in n]
    for s in sens:  # one layer quantized costs less than all of them; bypassing a Relu's quantizer would break it
        assert s["sqnr_db"] > m["output"]["sqnr_db"], s
