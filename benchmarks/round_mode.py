"""Benchmark: train == eval with ``--round-mode half_up`` and ``half_to_even`` on the zoo (issue 13).

For each model of ``--models`` (``benchmarks/zoo/models/<name>.onnx``) and each round mode, in a
temporary folder: ``rewrite_train`` at W8A8 (activation ranges calibrated on ``<name>.calib.npz``,
batch norms frozen from step 0) -> ``rewrite_eval`` of the training graph (its trained ranges, no
calibration) -> ``--samples`` held-out samples of ``<name>.eval.npz`` run by onnxruntime (one thread)
through

- the training graph in evaluation mode (``qtool_step`` past every delay, ``qtool_range_update = 0``:
  the stored ranges, the ones the deployed model was written with), the reference;
- the deployed model with onnxruntime's default optimizations (int8 kernels: QLinearConv, QGemm, ...);
- the deployed model with optimizations off (every QuantizeLinear/DequantizeLinear runs as written);
- that again against the training graph also run without optimizations (onnxruntime otherwise fuses
  float subgraphs of it, LayerNormalization, GELU, attention, into kernels that round differently).

It prints the SQNR (dB) of the deployed logits against the training graph's ("inf": bit for bit), the
fraction of logits that differ, and, with optimizations off, the first activation quantizer (graph
order) whose output differs between the two graphs, with the number of differing values; then the
first QuantizeLinear whose codes differ between the deployed model with and without onnxruntime's
optimizations (its integer kernels requantize an int32 accumulator instead of rounding the float
result), and the op it follows.

    python benchmarks/round_mode.py [--models mobilenetv3 ocr bert] [--samples 64] [--batch 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's qtool, before any import of it
sys.path.insert(0, str(ROOT / "benchmarks" / "zoo"))

from qtool.config import QuantConfig, TrainSchedule  # noqa: E402

MODELS = ROOT / "benchmarks" / "zoo" / "models"
STEP = 10**9  # past every quant_delay / freeze_bn_delay


def sqnr(reference: np.ndarray, other: np.ndarray) -> float:
    reference, other = reference.astype(np.float64), other.astype(np.float64)
    noise = np.sum((reference - other) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(reference ** 2) / noise))


def _run(path: Path, names: list[str], feeds: dict, batch: int, optimize: bool) -> dict[str, np.ndarray]:
    """``names`` (graph outputs or intermediate tensors) over ``feeds`` in batches, one thread."""
    from qtool.model.io import load_model
    from qtool.model.session import session_options, tapped_session, value_map

    model = load_model(str(path)).model
    values = value_map(model.graph)
    options = session_options(optimize=optimize)
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = tapped_session(model, [values[n] for n in names], options=options)
    n = len(next(iter(feeds.values())))
    parts: dict[str, list] = {name: [] for name in names}
    for i in range(0, n, batch):
        chunk = {k: (v[i:i + batch] if np.ndim(v) else v) for k, v in feeds.items()}
        for name, out in zip(names, session.run(chunk, names)):
            parts[name].append(out.numpy().copy())
    return {name: np.concatenate(p) for name, p in parts.items()}


def _first_difference(train: Path, deploy: Path, feeds: dict, eval_feeds: dict, batch: int) -> dict | None:
    """The first activation quantizer (graph order) whose output differs, optimizations off."""
    import onnx

    from qtool.onnx_rewrite.train_graph import training_contract

    contract = training_contract(onnx.load(str(train), load_external_data=False))
    nodes = onnx.load(str(deploy), load_external_data=False).graph.node
    # the deployed quantizer of a tensor: the QuantizeLinear reading it, and the DequantizeLinear of its prefix
    dequantized = {n.name: n.output[0] for n in nodes if n.op_type == "DequantizeLinear"}
    of_tensor = {n.input[0]: dequantized.get(n.name.rsplit("/", 1)[0] + "/DequantizeLinear")
                 for n in nodes if n.op_type == "QuantizeLinear"}
    pairs = [(q["output"], of_tensor[q["tensor"]]) for q in contract["activation_quantizers"]
             if of_tensor.get(q["tensor"])]
    order = {o: i for i, n in enumerate(onnx.load(str(train), load_external_data=False).graph.node) for o in n.output}
    pairs.sort(key=lambda p: order.get(p[0], 1 << 30))
    t = _run(train, [p[0] for p in pairs], feeds, batch, optimize=False)
    d = _run(deploy, [p[1] for p in pairs], eval_feeds, batch, optimize=False)
    for ours, theirs in pairs:
        # a depthwise Conv widened to 16k channels (channel_padding) has extra channels in the deployed model
        differ = int(np.count_nonzero(t[ours] != d[theirs][tuple(slice(n) for n in t[ours].shape)]))
        if differ:
            return {"tensor": ours, "differ": differ, "size": int(t[ours].size), "checked": len(pairs)}
    return {"tensor": None, "checked": len(pairs)}


def _first_fused_difference(deploy: Path, eval_feeds: dict, batch: int) -> dict:
    """The first QuantizeLinear (graph order) whose integer output differs between the deployed model with
    onnxruntime's default optimizations and without any, and the op whose output it quantizes (tapping the
    quantized tensors leaves the fused kernels in place: the logits are those of the untapped session)."""
    import onnx

    nodes = onnx.load(str(deploy), load_external_data=False).graph.node
    producer = {o: n for n in nodes for o in n.output}
    quantizers = [n for n in nodes if n.op_type == "QuantizeLinear"]
    names = [n.output[0] for n in quantizers]
    fused = _run(deploy, names, eval_feeds, batch, optimize=True)
    plain = _run(deploy, names, eval_feeds, batch, optimize=False)
    for q in quantizers:
        a, b = fused[q.output[0]].astype(np.int64), plain[q.output[0]].astype(np.int64)
        differ = int(np.count_nonzero(a != b))
        if differ:
            source = producer.get(q.input[0])
            return {"tensor": q.output[0], "op": source.op_type if source is not None else "input",
                    "differ": differ, "size": int(a.size), "max_steps": int(np.max(np.abs(a - b))),
                    "quantizers_differing": sum(bool(np.any(fused[n] != plain[n])) for n in names),
                    "quantizers": len(names)}
    return {"tensor": None, "quantizers": len(names)}


def measure(name: str, mode: str, folder: Path, samples: int, batch: int) -> dict:
    import qtool
    from zoo_metrics import load_inputs

    meta = json.loads((MODELS / f"{name}.json").read_text())
    eval_feeds = {k: v[:samples] for k, v in load_inputs(np.load(MODELS / f"{name}.eval.npz"), meta).items()}
    output = meta["output"]
    train, deploy = folder / f"{name}.{mode}.qat.onnx", folder / f"{name}.{mode}.qdq.onnx"
    quant = QuantConfig(weight_bits=8, activation_bits=8, round_mode=mode)
    qtool.rewrite_train(str(MODELS / f"{name}.onnx"), str(train), calibration_data=str(MODELS / f"{name}.calib.npz"),
                        quant=quant, schedule=TrainSchedule(freeze_bn_delay=0))
    qtool.rewrite_eval(str(train), str(deploy))
    feeds = {**eval_feeds, "qtool_step": np.array(STEP, np.int64), "qtool_range_update": np.array(0, np.float32)}
    reference = _run(train, [output], feeds, batch, optimize=True)[output]
    row = {"model": name, "mode": mode, "samples": samples}
    for label, optimize in (("default", True), ("no_opt", False)):
        got = _run(deploy, [output], eval_feeds, batch, optimize=optimize)[output]
        row[f"sqnr_{label}"] = sqnr(reference, got)
        row[f"differ_{label}"] = float(np.mean(reference != got))
    # both graphs as written: onnxruntime's fusions of float ops (LayerNormalization, GELU, attention) in the
    # training graph round differently from the same ops run one by one (``got``: the loop's last, no-opt)
    plain = _run(train, [output], feeds, batch, optimize=False)[output]
    row["sqnr_both_no_opt"] = sqnr(plain, got)
    row["differ_both_no_opt"] = float(np.mean(plain != got))
    row["first_difference"] = _first_difference(train, deploy, feeds, eval_feeds, batch)
    row["first_fused_difference"] = _first_fused_difference(deploy, eval_feeds, batch)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["mobilenetv3", "ocr", "bert"])
    parser.add_argument("--modes", nargs="+", default=["half_up", "half_to_even"])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for mode in args.modes:
                row = measure(name, mode, Path(tmp), args.samples, args.batch)
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(f"\n{'model':<12} {'round mode':<13} {'SQNR default':>12} {'differ':>7} {'SQNR no-opt':>12} {'differ':>7} "
          f"{'both no-opt':>12} {'differ':>7}  first differing quantizer (no-opt)")
    for r in rows:
        first = r["first_difference"]
        where = "none" if first["tensor"] is None else f"{first['tensor']} ({first['differ']} of {first['size']})"
        print(f"{r['model']:<12} {r['mode']:<13} {r['sqnr_default']:>10.1f}dB {100 * r['differ_default']:>6.1f}% "
              f"{r['sqnr_no_opt']:>10.1f}dB {100 * r['differ_no_opt']:>6.1f}% "
              f"{r['sqnr_both_no_opt']:>10.1f}dB {100 * r['differ_both_no_opt']:>6.1f}%  {where}")
    for r in rows:
        f = r["first_fused_difference"]
        if f["tensor"] is not None:
            print(f"{r['model']} {r['mode']}: default optimizations vs none, first differing QuantizeLinear "
                  f"{f['tensor']} (after {f['op']}): {f['differ']} of {f['size']} codes, up to {f['max_steps']} "
                  f"step(s); {f['quantizers_differing']} of {f['quantizers']} quantizers differ")
    print("SQNR of the deployed model's logits against the training graph's in evaluation mode "
          "(qtool_range_update = 0), onnxruntime, W8A8; inf: bit for bit. default / no-opt: the deployed model with "
          "onnxruntime's default optimizations (int8 kernels) / with none; both no-opt: the training graph too run "
          "without optimizations (its float ops one by one, as the deployed model's).")


if __name__ == "__main__":
    main()
