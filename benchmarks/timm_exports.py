"""Modern CNN / hybrid image models from ``timm`` at real size, exported both ways, for ``timm_deploy.py``.

    /work/venv-torch/bin/python benchmarks/timm_exports.py OUT_DIR [--models fastvit_t8,levit_128s]
        [--exporters torchscript,dynamo] [--samples 32]

Each model is ``timm.create_model(name, pretrained=False)`` (random weights, seeded: nothing can be
downloaded), its batch norms given the running statistics of a trained net by a few forward passes in
train mode on procedural images (``images``; cumulative averages, ``momentum=None``), then put in eval
mode and re-parameterized as timm's docs tell a deployer to (``timm.utils.reparameterize_model``: the
multi-branch blocks of FastViT / MobileOne / RepViT / EfficientViT-M / LeViT folded into single
convolutions; a no-op elsewhere). It is exported at 224 px (the model's own default size) with a dynamic
batch axis, as users do, once per exporter:

- ``torchscript``: ``torch.onnx.export(..., dynamo=False, opset_version=17, dynamic_axes={batch})`` ->
  ``OUT_DIR/<name>.ts.onnx``;
- ``dynamo``: ``torch.onnx.export(..., dynamo=True, dynamic_shapes=...)`` at torch's default opset ->
  ``OUT_DIR/<name>.dy.onnx``.

Beside each: ``<name>.<ts|dy>.calib.npz`` (``--samples`` procedural images, normalized with ImageNet's mean
and std, as ``dynamo_deploy.py`` reads them), ``.eval.npz`` (32 held-out images of the same kind, another
seed) and ``.json`` (input name and the batch-1 feed shape, ``dynamo_exports.py``'s format).

torch and timm are NOT qtool dependencies; the models are not committed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dynamo_exports import SEED, exported_opset  # noqa: E402

# CPU deployables first, then the hybrids whose attention / re-parameterization stresses placement
MODELS = ["mobilenetv4_conv_small", "mobilenetv4_hybrid_medium", "lcnet_050", "ghostnetv2_100", "hgnetv2_b0",
          "mobileone_s0", "fastvit_t8", "repvit_m1", "efficientvit_b0", "efficientvit_m0", "levit_128s",
          "edgenext_x_small", "efficientformerv2_s0", "tiny_vit_5m_224", "convnextv2_atto"]
MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]


def images(n: int, size: int, seed: int) -> np.ndarray:
    """``n`` natural-ish RGB images (NCHW, ImageNet-normalized): smooth colour fields (low-pass noise whose
    three channels are mixed by a random colour matrix, so that channels correlate as in photographs), a few
    flat-coloured shapes with sharp edges, fine texture and a brightness gradient."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    out = np.empty((n, 3, size, size), np.float32)
    for i in range(n):
        img = np.zeros((3, size, size), np.float32)
        for scale in (4, 8, 16, 32):  # octaves of upsampled noise: 1/f-like spectrum
            g = rng.standard_normal((3, scale, scale)).astype(np.float32)
            up = np.kron(g, np.ones((size // scale + 1, size // scale + 1), np.float32))[:, :size, :size]
            k = size // scale + 1  # a box blur as wide as a block hides the blocks
            up = np.cumsum(np.pad(up, ((0, 0), (k, 0), (0, 0)), mode="edge"), 1)
            up = (up[:, k:] - up[:, :-k]) / k
            up = np.cumsum(np.pad(up, ((0, 0), (0, 0), (k, 0)), mode="edge"), 2)
            up = (up[:, :, k:] - up[:, :, :-k]) / k
            img += up * (8.0 / scale) ** 0.5
        mix = rng.normal(0.5, 0.25, (3, 3)).astype(np.float32) + np.eye(3, dtype=np.float32)
        img = np.einsum("ij,jhw->ihw", mix, img) * 0.07
        img += rng.uniform(0.25, 0.65, (3, 1, 1)).astype(np.float32)
        img += (rng.uniform(-0.3, 0.3) * yy + rng.uniform(-0.3, 0.3) * xx)[None]
        for _ in range(rng.integers(1, 5)):  # shapes: discs and rectangles of one colour
            cy, cx, r = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.05, 0.3)
            mask = ((yy - cy) ** 2 + (xx - cx) ** 2 < r * r) if rng.random() < 0.5 else \
                ((abs(yy - cy) < r) & (abs(xx - cx) < r * rng.uniform(0.3, 1.5)))
            img[:, mask] = rng.uniform(0, 1, (3, 1)).astype(np.float32)
        img += rng.standard_normal((3, size, size)).astype(np.float32) * 0.02
        out[i] = (np.clip(img, 0, 1) - MEAN) / STD
    return out


def build(name: str):
    import timm
    import torch
    from timm.utils.model import reparameterize_model

    torch.manual_seed(SEED)
    model = timm.create_model(name, pretrained=False)
    size = model.pretrained_cfg.get("input_size", (3, 224, 224))[1:]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the passes below
    model.train()
    with torch.no_grad():
        for i in range(4):
            model(torch.from_numpy(images(8, size[0], 100 + i)))
    model.eval()
    return reparameterize_model(model), size


def export(name: str, out_dir: str, samples: int, exporters: list[str]) -> None:
    import torch

    model, size = build(name)
    calib = images(samples, size[0], SEED)
    evals = images(32, size[0], SEED + 1)
    x = torch.from_numpy(calib[:2])
    for exporter in exporters:
        tag = {"torchscript": "ts", "dynamo": "dy"}[exporter]
        stem = os.path.join(out_dir, f"{name}.{tag}")
        t = time.perf_counter()
        try:
            with torch.no_grad():
                if exporter == "torchscript":
                    torch.onnx.export(model, (x,), stem + ".onnx", dynamo=False, opset_version=17,
                                      input_names=["pixel_values"], output_names=["logits"],
                                      dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}})
                else:
                    batch = torch.export.Dim("batch", min=1, max=1024)
                    torch.onnx.export(model, (x,), stem + ".onnx", dynamo=True, dynamic_shapes=({0: batch},),
                                      input_names=["pixel_values"], output_names=["logits"])
        except Exception as e:  # one failing export is a result, not the end of the run
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            print(f"{name:28s} {exporter:11s} FAILED: {type(e).__name__}: {(lines or [''])[0][:300]}", flush=True)
            continue
        np.savez(stem + ".calib.npz", pixel_values=calib)
        np.savez(stem + ".eval.npz", pixel_values=evals)
        json.dump({"inputs": ["pixel_values"], "shapes": {"pixel_values": [3, *size]}, "timm": name,
                   "exporter": exporter}, open(stem + ".json", "w"))
        opset = exported_opset(stem + ".onnx")
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"{name:28s} {exporter:11s} opset {opset} {params:5.1f} M params  {time.perf_counter() - t:5.1f} s",
              flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--exporters", default="torchscript,dynamo")
    ap.add_argument("--samples", type=int, default=32)
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    import types

    # torchvision (a timm dependency) from PyPI is built against CUDA torch: with CPU-only torch its C
    # extension cannot load and its fake-op registrations raise at import; timm does not need either
    for mod in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(mod, types.ModuleType(mod))
    for name in args.models.split(","):
        try:
            export(name, args.out_dir, args.samples, args.exporters.split(","))
        except Exception as e:
            print(f"{name:28s} FAILED to build: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
