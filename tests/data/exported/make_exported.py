"""Build small models the way real users export them, for qtool's exporter tests.

Run from the repository root:

    /work/samplesenv/bin/python tests/data/exported/make_exported.py          # torch exports
    /work/tfenv/bin/python tests/data/exported/make_exported.py --tf          # Keras via tf2onnx

(samplesenv: torch 2.13 CPU, onnx, onnxscript, onnxruntime; tfenv: TensorFlow
2.21 and tf2onnx.) torch and TensorFlow are NOT qtool dependencies: the .onnx
and .npz files are committed and the tests read them only.

Each model `<name>.onnx` comes with `<name>.npz`: the model inputs (float32,
a few samples, random normal), used as calibration and evaluation data.
Weights are random (seeded); batch norms get random moving statistics so that
folding them is not a no-op.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 0


ONLY: set[str] = set()  # --only: write these models alone (the others are built, not written: same data)


def save(name, model_proto, inputs):
    import onnx

    if ONLY and name not in ONLY:
        return

    onnx.checker.check_model(model_proto, full_check=True)
    path = os.path.join(HERE, name + ".onnx")
    with open(path, "wb") as f:
        f.write(model_proto.SerializeToString())
    np.savez(os.path.join(HERE, name + ".npz"), **inputs)
    size = os.path.getsize(path)
    assert size < 200_000, (name, size)
    ops = sorted({n.op_type for n in model_proto.graph.node})
    opset = [o.version for o in model_proto.opset_import if o.domain in ("", "ai.onnx")]
    print(f"{name:28s} opset {opset} ir {model_proto.ir_version} {size:7d} B  {' '.join(ops)}")


def restyle(m, ir_version=None):
    """Initializers -> Constant nodes, node names cleared (like samples/make_sample.py)."""
    from onnx import helper

    g = m.graph
    init_names = {t.name for t in g.initializer}
    kept = [i for i in g.input if i.name not in init_names]
    del g.input[:]
    g.input.extend(kept)
    consts = [helper.make_node("Constant", [], [t.name], value=t) for t in g.initializer]
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
    if ir_version is not None:
        m.ir_version = ir_version
    return m


# ------------------------------------------------------------------------------------- torch
def torch_models():
    import torch
    from torch import nn

    def bn(c, d=2):
        m = nn.BatchNorm2d(c) if d == 2 else nn.BatchNorm1d(c)
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.3, 0.3)
            m.running_mean.uniform_(-0.3, 0.3)
            m.running_var.uniform_(0.5, 2.0)
        return m

    class ResBlock(nn.Module):
        def __init__(self, c=8):
            super().__init__()
            self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
            self.bn0 = bn(c)
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = bn(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = bn(c)
            self.down = nn.Conv2d(c, 2 * c, 1, stride=2, bias=False)
            self.bn_down = bn(2 * c)
            self.fc = nn.Linear(2 * c, 5)

        def forward(self, x):
            x = torch.relu(self.bn0(self.stem(x)))
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            x = torch.relu(x + y)
            x = torch.relu(self.bn_down(self.down(x)))
            x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
            return self.fc(x)

    class MobileBlock(nn.Module):
        def __init__(self, c=8):
            super().__init__()
            self.stem = nn.Conv2d(3, c, 3, stride=2, padding=1, bias=False)
            self.bn0 = bn(c)
            self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
            self.bn_dw = bn(c)
            self.pw = nn.Conv2d(c, 2 * c, 1, bias=False)
            self.bn_pw = bn(2 * c)
            self.head = nn.Conv2d(2 * c, 4, 1)

        def forward(self, x):
            x = nn.functional.relu6(self.bn0(self.stem(x)))
            x = nn.functional.relu6(self.bn_dw(self.dw(x)))
            x = nn.functional.relu6(self.bn_pw(self.pw(x)))
            x = x.mean((2, 3), keepdim=True)
            return torch.flatten(self.head(x), 1)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(20, 32)
            self.bn1 = bn(32, d=1)
            self.fc2 = nn.Linear(32, 16, bias=False)
            self.bn2 = bn(16, d=1)
            self.out = nn.Linear(16, 3)

        def forward(self, x):
            x = torch.relu(self.bn1(self.fc1(x)))
            x = nn.functional.leaky_relu(self.bn2(self.fc2(x)), 0.1)
            return torch.sigmoid(self.out(x))

    class MLP3d(nn.Module):
        """Linear on a [N, T, F] input: MatMul + Add in the legacy exporter."""

        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(12, 24)
            self.fc2 = nn.Linear(24, 6)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3, padding=1)
            self.bn = bn(8)
            self.up1 = nn.ConvTranspose2d(8, 8, 4, stride=2, padding=1, bias=False)
            self.bn1 = bn(8)
            self.up2 = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1, groups=2)
            self.bn2 = bn(4)
            self.out = nn.Conv2d(4, 1, 1)

        def forward(self, x):
            x = torch.relu(self.bn(self.conv(x)))
            x = torch.relu(self.bn1(self.up1(x)))
            x = nn.functional.leaky_relu(self.bn2(self.up2(x)), 0.2)
            return torch.sigmoid(self.out(x))

    class Shared(nn.Module):
        """One conv (and one Linear) applied twice: shared weights."""

        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.shared = nn.Conv2d(8, 8, 3, padding=1)
            self.fc = nn.Linear(8, 8)
            self.head = nn.Linear(8, 4)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            x = torch.relu(self.shared(x))
            x = torch.relu(self.shared(x))
            x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
            x = torch.relu(self.fc(x))
            x = torch.relu(self.fc(x))
            return nn.functional.hardsigmoid(self.head(x))

    class Indirect(nn.Module):
        """Weights reach the layer through Transpose / Reshape / Cast (functional calls)."""

        def __init__(self):
            super().__init__()
            self.w1 = nn.Parameter(torch.randn(3, 3, 3, 8) * 0.3)  # HWIO, transposed at run time
            self.b1 = nn.Parameter(torch.randn(8) * 0.1)
            self.w2 = nn.Parameter(torch.randn(8 * 9) * 0.2)  # flat, reshaped at run time
            self.w3 = nn.Parameter(torch.randn(16, 8, dtype=torch.float64) * 0.3)  # cast
            self.b3 = nn.Parameter(torch.randn(16) * 0.1)

        def forward(self, x):
            w1 = self.w1.permute(3, 2, 0, 1)
            x = torch.relu(nn.functional.conv2d(x, w1, self.b1, padding=1))
            w2 = self.w2.reshape(8, 1, 3, 3)
            x = torch.relu(nn.functional.conv2d(x, w2, None, padding=1, groups=8))
            x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
            return nn.functional.linear(x, self.w3.float(), self.b3)

    class SEBlock(nn.Module):
        """EfficientNet's MBConv: Conv-BN-SiLU, depthwise, squeeze-excite (adaptive_avg_pool2d, SiLU, Sigmoid gate),
        projection; a ``x.mean((2, 3))`` head (keepdim=False) then a Linear."""

        def __init__(self, c=16):
            super().__init__()
            self.stem = nn.Conv2d(3, c, 3, stride=2, padding=1, bias=False)
            self.bn0 = bn(c)
            self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
            self.bn_dw = bn(c)
            self.se_reduce = nn.Conv2d(c, c // 4, 1)
            self.se_expand = nn.Conv2d(c // 4, c, 1)
            self.project = nn.Conv2d(c, 24, 1, bias=False)
            self.bn_project = bn(24)
            self.fc = nn.Linear(24, 5)

        def forward(self, x):
            x = nn.functional.silu(self.bn0(self.stem(x)))
            x = nn.functional.silu(self.bn_dw(self.dw(x)))
            s = nn.functional.adaptive_avg_pool2d(x, 1)
            s = torch.sigmoid(self.se_expand(nn.functional.silu(self.se_reduce(s))))
            x = self.bn_project(self.project(x * s))
            return self.fc(x.mean((2, 3)))

    class PostNormBlock(nn.Module):
        """A BERT layer (post-norm): self-attention, residual Add, LayerNorm, GELU MLP, residual Add, LayerNorm;
        exported with a dynamic batch and a static sequence, so every value has a static 3-D shape."""

        def __init__(self, dim=32, heads=2):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.norm1 = nn.LayerNorm(dim)
            self.fc1 = nn.Linear(dim, 4 * dim)
            self.fc2 = nn.Linear(4 * dim, dim)
            self.norm2 = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, 3)

        def forward(self, x):
            n, t, d = x.shape
            q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5, dim=-1)
            y = (a @ v).transpose(1, 2).reshape(n, t, d)
            x = self.norm1(x + self.proj(y))
            x = self.norm2(x + self.fc2(nn.functional.gelu(self.fc1(x))))
            return self.head(x[:, 0])

    class AffineBlock(nn.Module):
        """HGNetV2's conv block as timm builds it: Conv-BN-ReLU then a LearnableAffineBlock (a scalar scale and bias,
        initialised to 1 and 0, as in a model not yet trained), twice; a global pool and a Linear."""

        def __init__(self, c=8):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, c, 3, padding=1, bias=False), bn(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), bn(c)
            self.scale1, self.bias1 = nn.Parameter(torch.ones(1)), nn.Parameter(torch.zeros(1))
            self.scale2, self.bias2 = nn.Parameter(torch.ones(1)), nn.Parameter(torch.zeros(1))
            self.fc = nn.Linear(c, 4)

        def forward(self, x):
            x = self.scale1 * torch.relu(self.bn1(self.conv1(x))) + self.bias1
            x = self.scale2 * torch.relu(self.bn2(self.conv2(x))) + self.bias2
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    class MultiplierBlock(nn.Module):
        """FastViT's patch embedding: a stride-2 7x7 depthwise conv with channel multiplier 2 (``groups=C``, ``C ->
        2C``), BN, GELU, then a 1x1 conv; a global pool and a Linear."""

        def __init__(self, c=8):
            super().__init__()
            self.stem, self.bn0 = nn.Conv2d(3, c, 3, padding=1, bias=False), bn(c)
            self.dw, self.bn1 = nn.Conv2d(c, 2 * c, 7, stride=2, padding=3, groups=c, bias=False), bn(2 * c)
            self.pw = nn.Conv2d(2 * c, 2 * c, 1)
            self.fc = nn.Linear(2 * c, 4)

        def forward(self, x):
            x = torch.relu(self.bn0(self.stem(x)))
            x = self.pw(nn.functional.gelu(self.bn1(self.dw(x))))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    class LinearAttention(nn.Module):
        """EfficientViT's ReLU linear attention (timm's ``LiteMLA._attn``), small: a Conv-BN-ReLU stem, one 1x1
        ``qkv`` conv split per head into q, k, v; ``v`` padded with a column of ones so that ``kv = k^T [v, 1]``
        holds the numerators and, in its last column, the denominators ``sum(k)``; ``out = q kv``, then
        ``out[..., :-1] / (out[..., -1:] + eps)``; a 1x1 projection and BN (a dense map out, as a segmenter's).
        As in EfficientViT-B0, whose heads' ``kv`` differ 10-30x in size, head 0's q, k, v are 10x head 1's
        (the projection scaled back, so both heads reach the output alike): head 1's denominators are a step or two
        of ``kv``'s one range."""

        def __init__(self, c=16, heads=2, dim=8):
            super().__init__()
            self.dim = dim
            self.stem, self.bn0 = nn.Conv2d(3, c, 3, padding=1, bias=False), bn(c)
            self.qkv = nn.Conv2d(c, 3 * heads * dim, 1, bias=False)
            self.proj, self.bn1 = nn.Conv2d(heads * dim, c, 1, bias=False), bn(c)
            with torch.no_grad():
                w = self.qkv.weight.view(heads, 3, dim, c)
                w[0] *= 2.0
                w[1] *= 0.2
                self.proj.weight[:, :dim] /= 2.0
                self.proj.weight[:, dim:] /= 0.2

        def forward(self, x):
            x = torch.relu(self.bn0(self.stem(x)))
            b, _, h, w = x.shape
            qkv = self.qkv(x).reshape(b, -1, 3 * self.dim, h * w).transpose(-1, -2)
            q, k, v = qkv.chunk(3, dim=-1)
            q, k = torch.relu(q), torch.relu(k)
            v = nn.functional.pad(v, (0, 1), mode="constant", value=1.0)
            out = q @ (k.transpose(-1, -2) @ v)
            out = out[..., :-1] / (out[..., -1:] + 1e-5)
            return self.bn1(self.proj(out.transpose(-1, -2).reshape(b, -1, h, w)))

    return {
        "LinearAttention": (LinearAttention, (2, 3, 16, 16)),
        "MultiplierBlock": (MultiplierBlock, (2, 3, 32, 32)),
        "AffineBlock": (AffineBlock, (2, 3, 16, 16)),
        "PostNormBlock": (PostNormBlock, (2, 16, 32)),
        "SEBlock": (SEBlock, (2, 3, 32, 32)),
        "ResBlock": (ResBlock, (2, 3, 16, 16)),
        "MobileBlock": (MobileBlock, (2, 3, 16, 16)),
        "MLP": (MLP, (4, 20)),
        "MLP3d": (MLP3d, (2, 5, 12)),
        "Decoder": (Decoder, (2, 4, 6, 6)),
        "Shared": (Shared, (2, 3, 12, 12)),
        "Indirect": (Indirect, (2, 3, 10, 10)),
    }


def export_legacy(model, shape, opset, dynamic_spatial=False, fold=False):
    import onnx
    import torch

    x = torch.zeros(*shape)
    axes = {0: "N"}
    if dynamic_spatial and len(shape) == 4:
        axes.update({2: "H", 3: "W"})
    if len(shape) == 3:
        axes[1] = "T"
    buf = io.BytesIO()
    torch.onnx.export(
        model,
        (x,),
        buf,
        input_names=["input"],
        output_names=["output"],
        dynamic_axes={"input": axes, "output": {0: "N"}},
        opset_version=opset,
        training=torch.onnx.TrainingMode.EVAL if fold else torch.onnx.TrainingMode.PRESERVE,
        do_constant_folding=fold,
        dynamo=False,
    )
    return onnx.load_from_string(buf.getvalue())


def export_dynamo(model, shape, opset: int | None = 18, sequence: bool = False):
    import onnx
    import torch

    x = torch.randn(*shape)
    dyn = {0: torch.export.Dim("N", min=1, max=64)}
    if sequence:  # a dynamic sequence too (dim 1 of a [N, T, F] input)
        dyn[1] = torch.export.Dim("T", min=2, max=64)
    onnx_program = torch.onnx.export(
        model, (x,), input_names=["input"], output_names=["output"],
        dynamic_shapes={"x": dyn}, opset_version=opset, dynamo=True, verbose=False,
    )
    return onnx.load_from_string(onnx_program.model_proto.SerializeToString())


def make_torch():
    import torch

    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    rng = np.random.default_rng(SEED)
    specs = torch_models()

    def data(shape):
        return {"input": rng.normal(size=(8,) + tuple(shape[1:])).astype(np.float32)}

    def build(name):
        torch.manual_seed(SEED)
        cls, shape = specs[name]
        return cls().eval(), shape

    # legacy TorchScript exporter, opset 11, BN kept, Constant weights, unnamed nodes
    for name in ("ResBlock", "MobileBlock", "MLP", "MLP3d", "Decoder", "Shared", "Indirect"):
        m, shape = build(name)
        dyn = name in ("ResBlock", "Decoder")
        proto = restyle(export_legacy(m, shape, 11, dynamic_spatial=dyn), ir_version=6)
        save(f"legacy11_{name}", proto, data(shape))
    # legacy exporter keeping initializers (named nodes), opset 13 and 17
    for opset, name in ((13, "ResBlock"), (13, "MLP"), (17, "MobileBlock"), (17, "Decoder")):
        m, shape = build(name)
        save(f"legacy{opset}_{name}", export_legacy(m, shape, opset), data(shape))
    # legacy exporter with folding (EVAL mode: BN fused by torch)
    m, shape = build("ResBlock")
    save("legacy11_fold_ResBlock", export_legacy(m, shape, 11, fold=True), data(shape))
    # dynamo exporter (torch 2.13 default), opset 18
    for name in ("ResBlock", "MobileBlock", "MLP", "Decoder", "Shared", "Indirect"):
        m, shape = build(name)
        try:
            proto = export_dynamo(m, shape)
        except Exception as e:  # noqa: BLE001
            print(f"dynamo export of {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        save(f"dynamo18_{name}", proto, data(shape))
    # dynamo, then Constant-node weights and cleared names
    m, shape = build("MobileBlock")
    save("dynamo18_const_MobileBlock", restyle(export_dynamo(m, shape)), data(shape))
    # torch.onnx.export as a user calls it today: dynamo at its default opset (20 with torch 2.13), and the
    # TorchScript exporter at 17 for the same model
    m, shape = build("SEBlock")
    save("dynamo_SEBlock", export_dynamo(m, shape, opset=None), data(shape))
    save("legacy17_SEBlock", export_legacy(m, shape, 17), data(shape))
    m, shape = build("PostNormBlock")
    save("dynamo_PostNormBlock", export_dynamo(m, shape, opset=None), data(shape))
    # its Linears on [N, T, F] with a dynamic batch and sequence (MatMul + Add, no Gemm in onnxruntime): both exporters
    save("dynamo_seq_PostNormBlock", export_dynamo(m, shape, opset=None, sequence=True), data(shape))
    save("legacy17_PostNormBlock", export_legacy(m, shape, 17), data(shape))
    # learnable scalar scale and bias at their initial 1 and 0 (HGNetV2's LearnableAffineBlock): both exporters
    m, shape = build("AffineBlock")
    save("dynamo_AffineBlock", export_dynamo(m, shape, opset=None), data(shape))
    save("legacy17_AffineBlock", export_legacy(m, shape, 17), data(shape))
    # a depthwise conv with channel multiplier 2 (FastViT's patch embedding): both exporters
    m, shape = build("MultiplierBlock")
    save("dynamo_MultiplierBlock", export_dynamo(m, shape, opset=None), data(shape))
    save("legacy17_MultiplierBlock", export_legacy(m, shape, 17), data(shape))
    # EfficientViT's ReLU linear attention (numerators and denominator in one tensor): both exporters
    m, shape = build("LinearAttention")
    save("dynamo_LinearAttention", export_dynamo(m, shape, opset=None), data(shape))
    save("legacy17_LinearAttention", export_legacy(m, shape, 17), data(shape))


# ------------------------------------------------------------------------------------- keras
def make_tf():
    import tensorflow as tf
    import tf2onnx

    tf.random.set_seed(SEED)
    rng = np.random.default_rng(SEED)
    inp = tf.keras.Input((12, 12, 3), name="input")
    x = tf.keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inp)
    x = tf.keras.layers.BatchNormalization()(x)
    x = tf.keras.layers.ReLU()(x)
    x = tf.keras.layers.DepthwiseConv2D(3, padding="same")(x)
    x = tf.keras.layers.BatchNormalization()(x)
    x = tf.keras.layers.ReLU(6.0)(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    x = tf.keras.layers.Dense(16, activation="relu")(x)
    out = tf.keras.layers.Dense(4, activation="softmax")(x)
    model = tf.keras.Model(inp, out)
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            g, b, mu, var = layer.get_weights()
            layer.set_weights([
                rng.uniform(0.5, 1.5, g.shape).astype(np.float32),
                rng.uniform(-0.3, 0.3, b.shape).astype(np.float32),
                rng.uniform(-0.3, 0.3, mu.shape).astype(np.float32),
                rng.uniform(0.5, 2.0, var.shape).astype(np.float32),
            ])
    spec = (tf.TensorSpec((None, 12, 12, 3), tf.float32, name="input"),)
    for opset in (13,):
        proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset)
        save(f"tf2onnx{opset}_KerasCNN", proto,
             {"input": rng.normal(size=(8, 12, 12, 3)).astype(np.float32)})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tf", action="store_true", help="only the Keras/tf2onnx models")
    ap.add_argument("--only", default="", help="comma-separated names: write only these (e.g. dynamo_SEBlock)")
    args = ap.parse_args(argv)
    ONLY.update(filter(None, args.only.split(",")))
    if args.tf:
        make_tf()
    else:
        make_torch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
