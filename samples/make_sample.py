"""Build qtool's bundled sample: a small digits CNN with batch norms, and its data.

How to run (from the repository root, in an environment with torch, scikit-learn,
onnx and numpy; onnxruntime is used for the check when it is installed):

    python3 -m venv /tmp/samplesenv
    /tmp/samplesenv/bin/pip install torch==2.13.0 scikit-learn onnx onnxscript numpy onnxruntime
    /tmp/samplesenv/bin/python samples/make_sample.py

torch and scikit-learn are NOT qtool dependencies; they are needed only here.
A CPU build of torch is enough (training takes a few seconds on 2 cores).

To check the committed files without torch (e.g. in qtool's own venv, which has
onnx, onnxruntime and numpy):

    python samples/make_sample.py --check

What it writes, next to this script:
    digits_cnn.onnx  opset 11, IR version 7, dynamic batch: input "input"
                     float32 [N,1,8,8] (pixels / 16, in [0, 1]), output "logits"
                     float32 [N,10]. BatchNormalization nodes are kept (not
                     folded into the convs); every weight lives in a Constant
                     node (no initializers) and nodes have no names, like models
                     from many real exporters.
    calib.npz        "input": 100 samples of the TRAIN split, float32 [100,1,8,8]
                     (model inputs only, no labels).
    eval.npz         "input": the held-out test split, float32 [500,1,8,8];
                     "labels": int64 class ids [500].

Data: scikit-learn's bundled load_digits (1797 8x8 images, 10 classes; ships
inside the package, no download). Fixed seed split: 1297 train / 500 test.
Everything is seeded, so a rerun on the same software gives the same weights.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_PATH = os.path.join(HERE, "digits_cnn.onnx")
CALIB_PATH = os.path.join(HERE, "calib.npz")
EVAL_PATH = os.path.join(HERE, "eval.npz")

SEED = 0
N_TEST = 500
N_CALIB = 100
EPOCHS = 30
BATCH = 64
OPSET = 11
IR_VERSION = 7


def load_split():
    """Return (x_train, y_train, x_test, y_test): float32 NCHW in [0,1], int64 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    perm = np.random.default_rng(SEED).permutation(len(x))
    test, train = perm[:N_TEST], perm[N_TEST:]
    return x[train], y[train], x[test], y[test]


def build_model():
    import torch
    from torch import nn

    class ResidualDepthwise(nn.Module):
        """Depthwise 3x3 -> BN -> Relu -> pointwise 1x1 -> BN -> Add(input) -> Relu."""

        def __init__(self, c: int):
            super().__init__()
            self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
            self.bn_dw = nn.BatchNorm2d(c)
            self.pw = nn.Conv2d(c, c, 1, bias=False)
            self.bn_pw = nn.BatchNorm2d(c)

        def forward(self, x):
            y = torch.relu(self.bn_dw(self.dw(x)))
            y = self.bn_pw(self.pw(y))
            return torch.relu(y + x)

    class DigitsCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(16)
            self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
            self.bn2 = nn.BatchNorm2d(32)
            self.pool = nn.MaxPool2d(2)
            self.block = ResidualDepthwise(32)
            self.gap = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            x = torch.relu(self.bn2(self.conv2(x)))
            x = self.pool(x)
            x = self.block(x)
            x = torch.flatten(self.gap(x), 1)
            return self.fc(x)

    return DigitsCNN()


def train(model, x_train, y_train):
    import torch
    from torch import nn

    xt = torch.from_numpy(x_train)
    yt = torch.from_numpy(y_train)
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for epoch in range(EPOCHS):
        order = torch.randperm(len(xt), generator=gen)
        total = 0.0
        for i in range(0, len(xt), BATCH):
            idx = order[i : i + BATCH]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        sched.step()
        if epoch % 5 == 4 or epoch == EPOCHS - 1:
            print(f"epoch {epoch + 1:2d}  train loss {total / len(xt):.4f}")
    model.eval()


def export_onnx(model, path):
    """Export with the TorchScript exporter at opset 11, BN nodes kept, then post-process."""
    import io

    import onnx
    import torch

    buf = io.BytesIO()
    torch.onnx.export(
        model,
        (torch.zeros(1, 1, 8, 8),),
        buf,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
        opset_version=OPSET,
        # PRESERVE with the model in eval() mode exports inference-mode BN
        # (moving statistics) WITHOUT the Conv+BN fusion that EVAL applies.
        training=torch.onnx.TrainingMode.PRESERVE,
        do_constant_folding=False,
        dynamo=False,
    )
    m = onnx.load_from_string(buf.getvalue())
    m = restyle(m)
    onnx.checker.check_model(m, full_check=True)
    data = m.SerializeToString()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return m


def restyle(m):
    """Make the export look like other exporters' output.

    Every initializer becomes a Constant node at the start of the graph, node
    names are cleared, IR version set to 7 (opset 11 era).
    """
    from onnx import helper

    g = m.graph
    init_names = {t.name for t in g.initializer}
    # No initializer may also be listed as a graph input (keep_initializers_as_inputs).
    kept_inputs = [i for i in g.input if i.name not in init_names]
    del g.input[:]
    g.input.extend(kept_inputs)

    consts = [
        helper.make_node("Constant", [], [t.name], value=t) for t in g.initializer
    ]
    nodes = consts + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    for n in g.node:
        n.name = ""
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    a.t.name = ""
    m.ir_version = IR_VERSION
    return m


def ort_accuracy(path, x, y):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    logits = sess.run(["logits"], {"input": x})[0]
    return float((logits.argmax(1) == y).mean()), logits


def check():
    """Verify the committed files with onnx + onnxruntime only (no torch)."""
    import onnx

    m = onnx.load(MODEL_PATH)
    onnx.checker.check_model(m, full_check=True)
    assert m.ir_version == IR_VERSION, m.ir_version
    assert [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")] == [OPSET]
    assert len(m.graph.initializer) == 0
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("BatchNormalization") == 4, ops
    calib = np.load(CALIB_PATH)
    ev = np.load(EVAL_PATH)
    assert list(calib.keys()) == ["input"], list(calib.keys())
    assert calib["input"].shape == (N_CALIB, 1, 8, 8) and calib["input"].dtype == np.float32
    assert ev["input"].shape == (N_TEST, 1, 8, 8) and ev["input"].dtype == np.float32
    assert ev["labels"].shape == (N_TEST,) and ev["labels"].dtype == np.int64
    acc, _ = ort_accuracy(MODEL_PATH, ev["input"], ev["labels"])
    print("ops:", " ".join(o for o in ops if o != "Constant"))
    print(f"onnxruntime accuracy on eval.npz: {acc:.4f} ({round(acc * N_TEST)}/{N_TEST})")
    return acc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="only verify the existing files (no torch needed)"
    )
    args = ap.parse_args(argv)
    if args.check:
        check()
        return 0

    import torch

    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)

    x_train, y_train, x_test, y_test = load_split()
    model = build_model()
    train(model, x_train, y_train)

    with torch.no_grad():
        torch_logits = model(torch.from_numpy(x_test)).numpy()
    torch_acc = float((torch_logits.argmax(1) == y_test).mean())
    print(f"PyTorch accuracy on test split: {torch_acc:.4f}")

    export_onnx(model, MODEL_PATH)
    np.savez(CALIB_PATH, input=np.ascontiguousarray(x_train[:N_CALIB]))
    np.savez(EVAL_PATH, input=np.ascontiguousarray(x_test), labels=y_test)

    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("onnxruntime not installed: run `python samples/make_sample.py --check` in qtool's venv")
        return 0
    ort_acc, ort_logits = ort_accuracy(MODEL_PATH, x_test, y_test)
    print(f"onnxruntime accuracy on eval.npz: {ort_acc:.4f}")
    print(f"max |logits torch - onnxruntime|: {np.abs(ort_logits - torch_logits).max():.2e}")
    if ort_acc != torch_acc:
        print("ERROR: onnxruntime and PyTorch accuracies differ", file=sys.stderr)
        return 1
    check()
    return 0


if __name__ == "__main__":
    sys.exit(main())
