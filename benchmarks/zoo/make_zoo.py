"""Build the deployment zoo: small modern networks trained on synthetic data with real signal.

Needs torch (a separate venv: torch is never a dependency of qtool or its tests):

    python3 -m venv /work/venv-torch
    /work/venv-torch/bin/pip install torch==2.13.0 onnx onnxruntime numpy onnxscript
    /work/venv-torch/bin/python benchmarks/zoo/make_zoo.py [--size deploy|small] [--models vit,bert]
        [--seconds 120] [--init-from DIR] [--batch N] [--lr X]

``--size deploy`` (default) builds the inputs at deployment sizes (224 px classifiers, 256 px U-Net
and YOLO, ViT patch 16 / dim 192, BERT sequence 128 / hidden 256: ``SIZES``); ``--size small`` the
first zoo (64 px, dim 128, sequence 32). ``--init-from`` starts from exported zoo models' weights
(matching names and shapes): how the committed 224/256 px CNNs started from the 64 px ones.

Each model is trained for a fixed time budget on 2 CPU threads and exported the way
people export: ``torch.onnx.export`` (TorchScript exporter, ``dynamo=False``), opset 17,
dynamic batch axis, BatchNormalization kept as nodes (``training=PRESERVE`` on a model in
eval mode: the exporter's eval mode would fold BN into Conv), weights as initializers.
Per model it writes into ``benchmarks/zoo/models/``:

- ``<name>.onnx``
- ``<name>.calib.npz``: 64 samples from the training distribution, keyed by input name
  (float32 / int64, what ``qtool rewrite-eval --calibration-data`` takes)
- ``<name>.eval.npz``: 256 held-out samples and their labels/targets (images as uint8,
  scaled by ``input_scale`` from the JSON; see ``zoo_metrics.load_inputs``)
- ``<name>.json``: task, metric, inputs, seed, training steps/seconds and the metric the
  float model reaches on the eval set (measured with onnxruntime on the exported file).

Tasks (all procedurally drawn, so labels are exact):
- shapes: one of 4 shapes (circle, square, triangle, cross), random position/size/rotation/
  colours, noisy background with a colour gradient -> classification (vit, mobilenetv3, efficientnet)
- segmentation: 1-4 shapes of 3 kinds, per-pixel class (unet, mIoU over 4 classes)
- detection: 1-3 shapes of 3 kinds, boxes on a stride-8 grid (yolo, F1 at IoU 0.5)
- tokens: BERT-style sequences of 8-32 tokens with padding; label = more tokens from
  [10, 40) than from [40, 70) (bert, top-1)
- frames: noisy 16-dim feature frames with segments of two hidden patterns; per-frame
  class (lstm, frame accuracy)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zoo_metrics  # noqa: E402
import ocr  # noqa: E402  (the PP-OCRv4-style recognizer: data, model, CTC loss)

OUT = os.path.join(HERE, "models")
IMG = 64
N_CALIB = 64
N_EVAL = 256
SEED = 1234
# transformer sizes (set per model from SIZES by apply_size)
VIT_PATCH, VIT_DIM, VIT_HEADS, VIT_MLP = 8, 128, 4, 2
BERT_DIM, BERT_HEADS = 128, 4

# Size presets. "deploy" (the committed zoo): inputs at the sizes people deploy (224 px classifiers,
# 256 px dense-prediction nets, ViT-Tiny-like 196 tokens of dim 192, BERT-mini-like sequence 128 /
# hidden 256) with the widths of the small models (compute grows with resolution, parameters do not).
# "small": the first zoo (64 px, dim 128, sequence 32), where per-op overhead dominates latency.
SIZES = {
    "deploy": {
        "image": {"unet": 256, "yolo": 256, "*": 224},
        "seq_len": 128,
        "vit": dict(patch=16, dim=192, heads=3, mlp=4),
        "bert": dict(dim=256, heads=4),
    },
    "small": {
        "image": {"*": 64},
        "seq_len": 32,
        "vit": dict(patch=8, dim=128, heads=4, mlp=2),
        "bert": dict(dim=128, heads=4),
    },
}


def apply_size(name: str, preset: str, image_size: int | None = None) -> dict:
    """Set the module-level sizes for model ``name``; returns them (recorded in the JSON)."""
    global IMG, SEQ_LEN, VIT_PATCH, VIT_DIM, VIT_HEADS, VIT_MLP, BERT_DIM, BERT_HEADS
    p = SIZES[preset]
    IMG = image_size or p["image"].get(name, p["image"]["*"])
    SEQ_LEN = p["seq_len"]
    v, b = p["vit"], p["bert"]
    VIT_PATCH, VIT_DIM, VIT_HEADS, VIT_MLP = v["patch"], v["dim"], v["heads"], v["mlp"]
    BERT_DIM, BERT_HEADS = b["dim"], b["heads"]
    return {"preset": preset, "image_size": IMG, "seq_len": SEQ_LEN, "vit": dict(v), "bert": dict(b)}

# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------
SHAPES = ("circle", "square", "triangle", "cross")


def shape_mask(kind: str, cx: float, cy: float, r: float, theta: float, size: int | None = None) -> np.ndarray:
    size = size or IMG
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    dx, dy = xx - cx, yy - cy
    c, s = math.cos(theta), math.sin(theta)
    u, v = c * dx + s * dy, -s * dx + c * dy
    if kind == "circle":
        return dx * dx + dy * dy <= r * r
    if kind == "square":
        return np.maximum(np.abs(u), np.abs(v)) <= r * 0.8
    if kind == "triangle":
        m = np.ones_like(u, dtype=bool)
        for a in (math.pi * 1.5, math.pi / 6, math.pi * 5 / 6):
            m &= u * math.cos(a) + v * math.sin(a) <= r / 2
        return m
    if kind == "cross":
        w = r / 3.5
        return ((np.abs(u) <= w) & (np.abs(v) <= r)) | ((np.abs(v) <= w) & (np.abs(u) <= r))
    if kind == "ring":
        d2 = dx * dx + dy * dy
        return (d2 <= r * r) & (d2 >= (0.55 * r) ** 2)
    if kind == "ellipse":
        return (u / r) ** 2 + (v / (0.45 * r)) ** 2 <= 1.0
    raise ValueError(kind)


def _background(rng):
    bg = rng.uniform(0, 255, size=3)
    img = np.broadcast_to(bg[:, None, None], (3, IMG, IMG)).astype(np.float32).copy()
    # a smooth gradient and pixel noise: the model must look at shape, not colour
    ramp = np.linspace(-1, 1, IMG, dtype=np.float32)
    img += rng.uniform(-25, 25) * ramp[None, None, :] + rng.uniform(-25, 25) * ramp[None, :, None]
    return img, bg


def _colour(rng, bg):
    while True:
        fg = rng.uniform(0, 255, size=3)
        if np.abs(fg - bg).mean() > 60:
            return fg


def _finish(img, rng):
    # pixel noise; above 64 px drawn on blocks of IMG // 16 pixels (blotchy noise that the model must
    # still ignore, but the stored eval images stay small: 8.5 kB instead of 30 kB an image at 224 px),
    # at 64 px per pixel as in the first zoo
    b = 1 if IMG <= 64 else IMG // 16
    if b == 1:
        img += rng.normal(0, 12, size=img.shape)
    else:
        n = -(-IMG // b)
        noise = rng.normal(0, 12, size=(3, n, n)).astype(np.float32)
        img += np.repeat(np.repeat(noise, b, axis=1), b, axis=2)[:, :IMG, :IMG]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def make_shapes(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    x = np.empty((n, 3, IMG, IMG), np.uint8)
    y = rng.integers(0, len(SHAPES), size=n)
    for i in range(n):
        img, bg = _background(rng)
        r = rng.uniform(10, 22) * IMG / 64
        cx, cy = rng.uniform(r, IMG - r, size=2)
        m = shape_mask(SHAPES[y[i]], cx, cy, r, rng.uniform(0, 2 * math.pi))
        img[:, m] = _colour(rng, bg)[:, None]
        x[i] = _finish(img, rng)
    return x, y.astype(np.int64)


SEG_KINDS = ("circle", "square", "triangle")


def make_segmentation(n: int, rng):
    x = np.empty((n, 3, IMG, IMG), np.uint8)
    masks = np.zeros((n, IMG, IMG), np.uint8)
    for i in range(n):
        img, bg = _background(rng)
        for _ in range(rng.integers(1, 5)):
            k = rng.integers(0, 3)
            r = rng.uniform(5, 14) * IMG / 64
            cx, cy = rng.uniform(0, IMG, size=2)
            m = shape_mask(SEG_KINDS[k], cx, cy, r, rng.uniform(0, 2 * math.pi))
            img[:, m] = _colour(rng, bg)[:, None]
            masks[i][m] = k + 1
        x[i] = _finish(img, rng)
    return x, masks


DET_STRIDE = 8
MAX_OBJ = 3


def make_detection(n: int, rng):
    x = np.empty((n, 3, IMG, IMG), np.uint8)
    boxes = np.zeros((n, MAX_OBJ, 4), np.float32)
    classes = np.full((n, MAX_OBJ), -1, np.int64)
    grid = IMG // DET_STRIDE
    for i in range(n):
        img, bg = _background(rng)
        cells = rng.choice(grid * grid, size=rng.integers(1, MAX_OBJ + 1), replace=False)
        for j, cell in enumerate(cells):
            k = rng.integers(0, 3)
            r = rng.uniform(6, 14) * IMG / 64
            cx = (cell % grid + rng.uniform(0.1, 0.9)) * DET_STRIDE
            cy = (cell // grid + rng.uniform(0.1, 0.9)) * DET_STRIDE
            m = shape_mask(SEG_KINDS[k], cx, cy, r, rng.uniform(0, 2 * math.pi))
            ys, xs = np.nonzero(m)
            img[:, m] = _colour(rng, bg)[:, None]
            boxes[i, j] = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
            classes[i, j] = k
        x[i] = _finish(img, rng)
    return x, boxes, classes


SEQ_LEN = 32
VOCAB = 100


def make_tokens(n: int, rng):
    ids = np.zeros((n, SEQ_LEN), np.int64)
    mask = np.zeros((n, SEQ_LEN), np.int64)
    y = np.zeros(n, np.int64)
    for i in range(n):
        length = rng.integers(8, SEQ_LEN + 1)
        # bias the two counted groups so that both labels and close calls are common
        p = np.ones(VOCAB - 2)
        p[8:38] *= rng.uniform(0.5, 2.0)
        p[38:68] *= rng.uniform(0.5, 2.0)
        toks = rng.choice(np.arange(2, VOCAB), size=length - 1, p=p / p.sum())
        ids[i, 0] = 1  # [CLS]
        ids[i, 1:length] = toks
        mask[i, :length] = 1
        y[i] = int(np.sum((toks >= 10) & (toks < 40)) > np.sum((toks >= 40) & (toks < 70)))
    return ids, mask, y


FRAMES = 64
FEAT = 16


def make_frames(n: int, rng):
    # two fixed hidden patterns (same for every split), buried in noise
    pat = np.random.default_rng(99).normal(0, 1, size=(3, FEAT)).astype(np.float32)
    pat[0] = 0
    x = rng.normal(0, 1, size=(n, FRAMES, FEAT)).astype(np.float32)
    y = np.zeros((n, FRAMES), np.int64)
    for i in range(n):
        t = int(rng.integers(0, 6))
        while t < FRAMES:
            length = int(rng.integers(4, 16))
            y[i, t:t + length] = rng.integers(0, 3)
            t += length
        x[i] += 0.6 * pat[y[i]] + 0.3 * rng.normal(0, 1, size=(1, FEAT)).astype(np.float32)
    return x, y


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------
class ConvBN(nn.Sequential):
    def __init__(self, cin, cout, k=3, s=1, groups=1, act=nn.ReLU):
        layers = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class Attention(nn.Module):
    """Multi-head self-attention written as HF BERT/ViT write it (MatMul, Softmax, MatMul)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x, mask=None):
        b, t, d = x.shape
        split = lambda z: z.view(b, t, self.heads, self.hd).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd)
        if mask is not None:
            scores = scores + mask
        probs = scores.softmax(dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, d)
        return self.o(ctx)


class Block(nn.Module):
    def __init__(self, dim, heads, mlp, pre_norm=True, gelu="none"):
        super().__init__()
        self.pre = pre_norm
        self.attn = Attention(dim, heads)
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(approximate=gelu), nn.Linear(mlp, dim))

    def forward(self, x, mask=None):
        if self.pre:  # ViT
            x = x + self.attn(self.n1(x), mask)
            return x + self.mlp(self.n2(x))
        x = self.n1(x + self.attn(x, mask))  # BERT (post-norm)
        return self.n2(x + self.mlp(x))


class ViT(nn.Module):
    def __init__(self, classes=len(SHAPES), dim=None, depth=4, heads=None, patch=None):
        super().__init__()
        dim, heads, patch = dim or VIT_DIM, heads or VIT_HEADS, patch or VIT_PATCH
        self.patch = nn.Conv2d(3, dim, patch, patch)
        n = (IMG // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, VIT_MLP * dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, pixel_values):
        x = self.patch(pixel_values).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


class Bert(nn.Module):
    def __init__(self, dim=None, depth=4, heads=None):
        super().__init__()
        dim, heads = dim or BERT_DIM, heads or BERT_HEADS
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(SEQ_LEN, dim)
        self.norm = nn.LayerNorm(dim)
        self.blocks = nn.ModuleList(Block(dim, heads, 4 * dim, pre_norm=False, gelu="tanh") for _ in range(depth))
        self.pool = nn.Linear(dim, dim)
        self.cls = nn.Linear(dim, 2)

    def forward(self, input_ids, attention_mask):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.norm(self.tok(input_ids) + self.pos(pos)[None])
        # HF-style extended mask: 0 where attended, finfo.min where padded
        ext = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
        for blk in self.blocks:
            x = blk(x, ext)
        return self.cls(torch.tanh(self.pool(x[:, 0])))


class SE(nn.Module):
    def __init__(self, c, squeeze, gate=nn.Hardsigmoid, act=nn.ReLU):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)
        self.act, self.gate = act(), gate()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


class InvertedResidual(nn.Module):
    def __init__(self, cin, exp, cout, k, s, se, act, gate=nn.Hardsigmoid, se_act=nn.ReLU, se_ratio=0.25):
        super().__init__()
        layers = []
        if exp != cin:
            layers.append(ConvBN(cin, exp, 1, act=act))
        layers.append(ConvBN(exp, exp, k, s, groups=exp, act=act))
        if se:
            layers.append(SE(exp, max(8, int(exp * se_ratio) // 8 * 8), gate, se_act))
        layers.append(ConvBN(exp, cout, 1, act=None))
        self.body = nn.Sequential(*layers)
        self.res = s == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.res else y


class MobileNetV3Small(nn.Module):
    # torchvision's mobilenet_v3_small table; 64 px inputs, total stride 16 (the first block keeps stride 1)
    CFG = [  # k, exp, out, se, act, stride
        (3, 16, 16, True, "RE", 1), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
        (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
        (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 1),
        (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1),
    ]

    def __init__(self, classes=len(SHAPES)):
        super().__init__()
        layers = [ConvBN(3, 16, 3, 2, act=nn.Hardswish)]
        cin = 16
        for k, exp, out, se, a, s in self.CFG:
            layers.append(InvertedResidual(cin, exp, out, k, s, se, nn.Hardswish if a == "HS" else nn.ReLU))
            cin = out
        layers.append(ConvBN(cin, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(576, 256), nn.Hardswish(), nn.Linear(256, classes))

    def forward(self, images):
        x = F.adaptive_avg_pool2d(self.features(images), 1).flatten(1)
        return self.classifier(x)


class EfficientNetB0(nn.Module):
    # EfficientNet-B0's first six stages (B0 widths, 1-2 blocks per stage), 64 px inputs, total stride 16
    CFG = [(1, 3, 16, 1), (6, 3, 24, 2), (6, 5, 40, 2), (6, 3, 80, 2), (6, 5, 112, 1), (6, 5, 192, 1)]

    def __init__(self, classes=len(SHAPES)):
        super().__init__()
        layers = [ConvBN(3, 32, 3, 2, act=nn.SiLU)]
        cin = 32
        for e, k, out, s in self.CFG:
            for rep in range(2 if out in (24, 40) else 1):
                layers.append(InvertedResidual(cin, cin * e, out, k, s if rep == 0 else 1, True, nn.SiLU,
                                               gate=nn.Sigmoid, se_act=nn.SiLU, se_ratio=0.25 / e))
                cin = out
        layers.append(ConvBN(cin, 640, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(640, classes)

    def forward(self, images):
        return self.fc(F.adaptive_avg_pool2d(self.features(images), 1).flatten(1))


class UNet(nn.Module):
    def __init__(self, classes=4, w=16):
        super().__init__()
        dc = lambda a, b: nn.Sequential(ConvBN(a, b), ConvBN(b, b))  # noqa: E731
        self.e1, self.e2, self.e3, self.mid = dc(3, w), dc(w, 2 * w), dc(2 * w, 4 * w), dc(4 * w, 4 * w)
        self.d3, self.d2, self.d1 = dc(8 * w, 2 * w), dc(4 * w, w), dc(2 * w, w)
        self.out = nn.Conv2d(w, classes, 1)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)

    def forward(self, images):
        e1 = self.e1(images)
        e2 = self.e2(F.max_pool2d(e1, 2))
        e3 = self.e3(F.max_pool2d(e2, 2))
        m = self.mid(F.max_pool2d(e3, 2))
        d3 = self.d3(torch.cat([self.up(m), e3], 1))
        d2 = self.d2(torch.cat([self.up(d3), e2], 1))
        d1 = self.d1(torch.cat([self.up(d2), e1], 1))
        return self.out(d1)


class C2f(nn.Module):
    def __init__(self, cin, cout, n=1):
        super().__init__()
        self.c = cout // 2
        self.cv1 = ConvBN(cin, 2 * self.c, 1, act=nn.SiLU)
        self.m = nn.ModuleList(nn.Sequential(ConvBN(self.c, self.c, act=nn.SiLU), ConvBN(self.c, self.c, act=nn.SiLU))
                               for _ in range(n))
        self.cv2 = ConvBN((2 + n) * self.c, cout, 1, act=nn.SiLU)

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(y[-1] + m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class Yolo(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        s = lambda a, b: ConvBN(a, b, 3, 2, act=nn.SiLU)  # noqa: E731
        self.stem = nn.Sequential(ConvBN(3, 16, 3, 2, act=nn.SiLU), s(16, 32), C2f(32, 32))  # /4
        self.p3 = nn.Sequential(s(32, 64), C2f(64, 64))  # /8
        self.p4 = nn.Sequential(s(64, 96), C2f(96, 96))  # /16
        self.p5 = nn.Sequential(s(96, 128), C2f(128, 128))  # /32
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.n4 = C2f(128 + 96, 96)
        self.n3 = C2f(96 + 64, 64)
        self.head = nn.Sequential(ConvBN(64, 64, act=nn.SiLU), ConvBN(64, 64, act=nn.SiLU), nn.Conv2d(64, 5 + classes, 1))

    def forward(self, images):
        p3 = self.p3(self.stem(images))
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        n4 = self.n4(torch.cat([self.up(p5), p4], 1))
        n3 = self.n3(torch.cat([self.up(n4), p3], 1))
        return self.head(n3)


class Tagger(nn.Module):
    def __init__(self, hidden=128, classes=3):
        super().__init__()
        self.lstm = nn.LSTM(FEAT, hidden, num_layers=2, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, features):
        return self.fc(self.lstm(features)[0])


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------
def det_loss(p, boxes, classes):
    b, _, g, _ = p.shape
    obj_t = torch.zeros(b, g, g)
    loss_box = loss_cls = 0.0
    npos = 0
    for i in range(b):
        for j in range(MAX_OBJ):
            c = int(classes[i, j])
            if c < 0:
                continue
            x1, y1, x2, y2 = boxes[i, j].tolist()
            cx, cy = (x1 + x2) / 2 / DET_STRIDE, (y1 + y2) / 2 / DET_STRIDE
            gx, gy = min(int(cx), g - 1), min(int(cy), g - 1)
            obj_t[i, gy, gx] = 1
            cell = p[i, :, gy, gx]
            target = torch.tensor([cx - gx, cy - gy, (x2 - x1) / IMG, (y2 - y1) / IMG])
            loss_box = loss_box + F.l1_loss(torch.sigmoid(cell[4:8]), target, reduction="sum")
            loss_cls = loss_cls + F.cross_entropy(cell[1:4][None], torch.tensor([c]))
            npos += 1
    loss_obj = F.binary_cross_entropy_with_logits(p[:, 0], obj_t, pos_weight=torch.tensor(4.0))
    return loss_obj + (5 * loss_box + loss_cls) / max(npos, 1)


def save_npz(path: str, arrays: dict) -> None:
    """``np.savez_compressed`` with LZMA instead of deflate (half the size on these images);
    ``np.load`` reads it like any npz (zipfile decompresses LZMA members)."""
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_LZMA) as zf:
        for key, value in arrays.items():
            with zf.open(f"{key}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)


def to_float(x):
    return torch.from_numpy(x.astype(np.float32) / 255.0)


SPECS = {
    # name: (model, task, data maker, lr, batch)
    "vit": dict(model=ViT, task="classification", data="shapes", lr=5e-4, batch=32, seconds=3.0),
    "bert": dict(model=Bert, task="classification", data="tokens", lr=1e-3, batch=64),
    "mobilenetv3": dict(model=MobileNetV3Small, task="classification", data="shapes", lr=3e-3, batch=32, seconds=2.5),
    "efficientnet": dict(model=EfficientNetB0, task="classification", data="shapes", lr=3e-3, batch=32),
    "unet": dict(model=UNet, task="segmentation", data="segmentation", lr=3e-3, batch=32),
    "yolo": dict(model=Yolo, task="detection", data="detection", lr=3e-3, batch=32),
    "lstm": dict(model=Tagger, task="sequence_tagging", data="frames", lr=3e-3, batch=64),
}
SPECS.update(ocr.SPECS)


def make_split(kind: str, n: int, rng) -> tuple[dict, dict]:
    """(model inputs, targets) as numpy; images stay uint8 here."""
    if kind in ocr.DATA:
        return ocr.DATA[kind](n, rng)
    if kind == "shapes":
        x, y = make_shapes(n, rng)
        return {"images": x}, {"labels": y}
    if kind == "segmentation":
        x, m = make_segmentation(n, rng)
        return {"images": x}, {"masks": m}
    if kind == "detection":
        x, b, c = make_detection(n, rng)
        return {"images": x}, {"boxes": b, "classes": c}
    if kind == "tokens":
        ids, mask, y = make_tokens(n, rng)
        return {"input_ids": ids, "attention_mask": mask}, {"labels": y}
    if kind == "frames":
        x, y = make_frames(n, rng)
        return {"features": x}, {"labels": y}
    raise ValueError(kind)


def input_names(name: str, kind: str) -> list[str]:
    if kind in ocr.DATA:
        return ocr.INPUTS
    if kind in ("shapes", "segmentation", "detection"):
        return ["pixel_values"] if name == "vit" else ["images"]
    return {"tokens": ["input_ids", "attention_mask"], "frames": ["features"]}[kind]


def torch_feeds(inputs: dict, names: list[str], idx=None) -> list[torch.Tensor]:
    out = []
    for key, name in zip(inputs, names):
        x = inputs[key] if idx is None else inputs[key][idx]
        out.append(to_float(x) if x.dtype == np.uint8 else torch.from_numpy(np.ascontiguousarray(x)))
    return out


def train_loss(name, spec, model, feeds, targets, idx):
    out = model(*feeds)
    task = spec["task"]
    if task == "classification":
        return F.cross_entropy(out, torch.from_numpy(targets["labels"][idx]))
    if task == "segmentation":
        return F.cross_entropy(out, torch.from_numpy(targets["masks"][idx].astype(np.int64)))
    if task == "detection":
        return det_loss(out, torch.from_numpy(targets["boxes"][idx]), torch.from_numpy(targets["classes"][idx]))
    if task == "sequence_tagging":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), torch.from_numpy(targets["labels"][idx]).reshape(-1))
    if task == "ctc":
        return ocr.ctc_loss(out, targets["labels"][idx])
    raise ValueError(task)


def init_from_onnx(model: nn.Module, path: str) -> dict:
    """Start from the weights of an exported zoo model (e.g. the 64 px one for the 224 px one: convolutional
    weights do not depend on the input size): every initializer whose name and shape match a parameter or
    buffer of ``model`` (BN statistics included). Returns counts for the JSON."""
    import onnx
    from onnx import numpy_helper

    state = model.state_dict()
    graph = onnx.load(path).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    # a Linear exported as MatMul (3-D input) has its weight transposed under a generated name
    # (onnx::MatMul_123): it is the weight of the module whose bias the following Add reads
    renamed = {}
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in inits:
            for add in graph.node:
                bias = [i for i in add.input if i.endswith(".bias") and i in inits]
                if add.op_type == "Add" and node.output[0] in add.input and bias:
                    renamed[bias[0][:-5] + ".weight"] = inits[node.input[1]].T
    # an nn.LSTM exported as ONNX LSTM nodes (one per layer, in order): W, R, B under generated names, gates
    # in ONNX's order (i, o, f, c) against torch's (i, f, g, o)
    lstms = [n for n in graph.node if n.op_type == "LSTM" and n.input[1] in inits]
    for layer, node in enumerate(lstms):
        prefix = next(k[:-len("weight_ih_l0")] for k in state if k.endswith("weight_ih_l0"))

        def gates(a):
            i, o, f, c = np.split(a, 4, axis=0)
            return np.concatenate([i, f, c, o], axis=0)
        w, r, b = (inits[node.input[k]][0] for k in (1, 2, 3))
        renamed[f"{prefix}weight_ih_l{layer}"] = gates(w)
        renamed[f"{prefix}weight_hh_l{layer}"] = gates(r)
        renamed[f"{prefix}bias_ih_l{layer}"] = gates(b[: b.shape[0] // 2])
        renamed[f"{prefix}bias_hh_l{layer}"] = gates(b[b.shape[0] // 2:])
    loaded = 0
    for name, array in list(inits.items()) + list(renamed.items()):
        if name in state and tuple(state[name].shape) == tuple(array.shape):
            state[name] = torch.from_numpy(np.array(array, copy=True))
            loaded += 1
    model.load_state_dict(state)
    info = {"init_from": os.path.basename(path), "tensors_loaded": loaded, "tensors_in_model": len(state)}
    prev = path[:-5] + ".json"
    if os.path.exists(prev):  # a zoo model: keep how it was trained (the training continues it)
        meta = json.load(open(prev))
        info["previous"] = {k: meta.get(k) for k in ("size", "train_steps", "train_cpu_seconds", "train_batch",
                                                     "float_eval", "warm_start")}
    return info


def build(name: str, seconds: float, n_train: int, preset: str = "deploy", image_size: int | None = None,
          batch: int | None = None, init_from: str | None = None, lr: float | None = None,
          exporter: str = "torchscript") -> dict:
    spec = dict(SPECS[name])
    size = apply_size(name, preset, image_size)
    if batch:
        spec["batch"] = batch
    if lr:
        spec["lr"] = lr
    seconds *= spec.get("seconds", 1.0)  # models that learn slowly get a longer budget
    seed = SEED + sum(map(ord, name))
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    t0 = time.time()
    train_x, train_y = make_split(spec["data"], n_train, rng)
    calib_x, _ = make_split(spec["data"], N_CALIB, rng)
    eval_x, eval_y = make_split(spec["data"], N_EVAL, rng)
    names = input_names(name, spec["data"])
    print(f"[{name}] data in {time.time() - t0:.1f}s", flush=True)

    model = spec["model"]()
    warm = init_from_onnx(model, os.path.join(init_from, f"{name}.onnx")) if init_from else None
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=1e-4)
    est_steps = None
    # the budget is CPU time of this process, so that a busy shared machine slows training
    # down instead of cutting it short
    steps, t0, losses = 0, time.process_time(), []
    wall0 = time.time()
    model.train()
    while time.process_time() - t0 < seconds:
        idx = rng.integers(0, n_train, size=spec["batch"])
        # linear warm-up over 30 steps, then cosine decay over the estimated number of steps
        scale = min(1.0, (steps + 1) / 30)
        if est_steps:
            scale *= 0.5 * (1 + math.cos(math.pi * min(steps / est_steps, 1.0)))
        for g in opt.param_groups:
            g["lr"] = spec["lr"] * scale
        loss = train_loss(name, spec, model, torch_feeds(train_x, names, idx), train_y, idx)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()
        losses.append(loss.item())
        steps += 1
        if steps == 20:
            est_steps = int(seconds / ((time.process_time() - t0) / 20))
        if steps % 100 == 0:
            print(f"[{name}] step {steps} loss {np.mean(losses[-100:]):.4f} ({time.process_time() - t0:.0f} cpu s)", flush=True)
    train_seconds = time.process_time() - t0
    wall_seconds = time.time() - wall0
    model.eval()

    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"{name}.onnx")
    sample = tuple(torch_feeds(calib_x, names, slice(0, 2)))
    out_name = {"classification": "logits", "segmentation": "logits", "detection": "preds",
                "sequence_tagging": "logits", "ctc": "logits"}[spec["task"]]
    dyn = {n: {0: "batch"} for n in names + [out_name]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":  # torch.onnx.export's default since torch 2.9, at its default opset
            torch.onnx.export(model, sample, path, dynamo=True, input_names=names, output_names=[out_name],
                              dynamic_axes=dyn, external_data=False)
        else:
            torch.onnx.export(model, sample, path, dynamo=False, opset_version=17, input_names=names,
                              output_names=[out_name], dynamic_axes=dyn, training=torch.onnx.TrainingMode.PRESERVE,
                              do_constant_folding=True)

    # calibration data: float32/int64 exactly as the model takes it
    calib = {n: (calib_x[k].astype(np.float32) / 255.0 if calib_x[k].dtype == np.uint8 else calib_x[k])
             for k, n in zip(calib_x, names)}
    save_npz(os.path.join(OUT, f"{name}.calib.npz"), calib)
    ev = {n: eval_x[k] for k, n in zip(eval_x, names)}
    ev.update(eval_y)
    save_npz(os.path.join(OUT, f"{name}.eval.npz"), ev)

    meta = {
        "name": name,
        "task": spec["task"],
        "inputs": names,
        "output": out_name,
        "input_scale": {n: 1.0 / 255.0 for k, n in zip(eval_x, names) if eval_x[k].dtype == np.uint8},
        "seed": seed,
        "size": size,
        "warm_start": warm,
        "train_steps": steps,
        "train_cpu_seconds": round(train_seconds, 1),
        "train_wall_seconds": round(wall_seconds, 1),
        "train_batch": spec["batch"],
        "train_lr": spec["lr"],
        "train_samples": n_train,
        "final_train_loss": round(float(np.mean(losses[-50:])), 4),
        "torch": torch.__version__,
        "export": ("torch.onnx.export(dynamo=True, default opset, dynamic batch)" if exporter == "dynamo" else
                   "torch.onnx.export(dynamo=False, opset_version=17, training=PRESERVE, dynamic batch)"),
    }
    if spec["task"] == "segmentation":
        meta["num_classes"] = 4
    if spec["task"] == "detection":
        meta.update(num_classes=3, stride=DET_STRIDE, image_size=IMG)
    if spec["task"] == "ctc":
        meta.update(ocr.META)
    meta["metric"] = {"classification": "top1", "segmentation": "miou", "detection": "f1",
                      "sequence_tagging": "frame_acc", "ctc": "seq_acc"}[spec["task"]]

    # metrics of the exported float model (onnxruntime) on the train subset and the eval set
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    npz = np.load(os.path.join(OUT, f"{name}.eval.npz"))
    meta["float_eval"] = zoo_metrics.evaluate(meta, sess.run(None, zoo_metrics.load_inputs(npz, meta))[0], npz)
    sub = {n: train_x[k][:N_EVAL] for k, n in zip(train_x, names)}
    sub.update({k: v[:N_EVAL] for k, v in train_y.items()})
    meta["float_train"] = zoo_metrics.evaluate(meta, sess.run(None, zoo_metrics.load_inputs(sub, meta))[0], sub)
    with torch.no_grad():  # the export must match the torch model
        ref = model(*torch_feeds(eval_x, names, slice(0, 8))).numpy()
    got = sess.run(None, zoo_metrics.load_inputs({n: ev[n][:8] for n in names}, meta))[0]
    meta["export_max_abs_diff"] = float(np.max(np.abs(ref - got)))
    with open(os.path.join(OUT, f"{name}.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(f"[{name}] {steps} steps in {train_seconds:.0f} cpu s; eval {meta['float_eval']}; train {meta['float_train']}; "
          f"export diff {meta['export_max_abs_diff']:.2e}; {os.path.getsize(path) / 1e6:.2f} MB", flush=True)
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(SPECS), help="comma-separated subset of " + ",".join(SPECS))
    ap.add_argument("--seconds", type=float, default=120.0, help="training budget per model, CPU seconds")
    ap.add_argument("--train-samples", type=int, default=None,
                    help="training set size (default 4000 for --size small, 2000 for deploy)")
    ap.add_argument("--size", choices=sorted(SIZES), default="deploy",
                    help="input sizes: deploy (default: 224/256 px, ViT 196 tokens dim 192, BERT seq 128 hidden 256) "
                         "or small (the first zoo: 64 px, dim 128, seq 32)")
    ap.add_argument("--batch", type=int, default=None, help="training batch (default: per model)")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per model)")
    ap.add_argument("--init-from", default=None,
                    help="folder of exported zoo models to start from (the tensors whose names and shapes match; "
                         "e.g. a --size small zoo for the convolutional nets, whose weights do not depend on the size)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine slows 2 threads 10x)")
    ap.add_argument("--out", default=OUT, help="output folder (default: the committed zoo, benchmarks/zoo/models)")
    ap.add_argument("--image-size", type=int, default=None,
                    help="image side in pixels, overriding --size's (e.g. with --seconds 1 for latency studies)")
    ap.add_argument("--exporter", choices=("torchscript", "dynamo"), default="torchscript",
                    help="torchscript (the committed zoo: dynamo=False, opset 17, BN kept as nodes) or dynamo "
                         "(torch.onnx.export's default since torch 2.9; with --init-from benchmarks/zoo/models "
                         "--seconds 0 --out DIR: the committed zoo's trained weights exported again)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    globals()["OUT"] = args.out
    for name in args.models.split(","):
        if name not in SPECS:
            sys.exit(f"unknown model {name!r}; choose from {', '.join(SPECS)}")
        n_train = args.train_samples or (4000 if args.size == "small" else 2000)
        build(name, args.seconds, n_train, args.size, args.image_size, args.batch, args.init_from, args.lr,
              args.exporter)


if __name__ == "__main__":
    main()
