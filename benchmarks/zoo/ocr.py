"""PP-OCRv4-style text-line recognizer for the deployment zoo (``ocr``), used by make_zoo.py.

Data (``text``, numpy only, in ``ocr_data.py``): one line of 4-10 characters from a 20-character charset (digits and ten
capitals), drawn with a hand-written 5x7 bitmap font in numpy: 2x supersampled, random glyph
height (12-22 px), width, italic shear, spacing, position, grey levels, a brightness gradient
and pixel noise. Input ``x`` is ``[B, 1, 32, 128]`` (grey, stored as uint8, fed as /255);
targets are ``labels`` ``[B, 10]`` (class ids 1..20, padded with -1; 0 is the CTC blank).

Model (``Recognizer``), PP-OCRv4's rec layout at toy size:

- PP-LCNet-like backbone: Conv-BN-HardSwish stem (stride 2), depthwise-separable blocks
  (depthwise k x k Conv-BN-HardSwish, pointwise Conv-BN-HardSwish), squeeze-excite with
  ReLU + HardSigmoid in the last blocks, strides (2, 1) that collapse the height and keep the
  width; AveragePool over the remaining height -> a sequence of 32 frames;
- SVTR-style neck: 1x1 conv to dim 64, two global-mixing blocks (pre-LayerNorm, one qkv
  Linear split per head, Softmax attention, LayerNorm + GELU MLP), a 1x1 conv back, Concat
  with the shortcut and a Conv-BN-HardSwish fusion (as SVTR-LCNet's ``EncoderWithSVTR``);
- CTC head: Linear to 21 classes (blank + charset), output ``logits`` ``[B, 32, 21]``.

Metric (``zoo_metrics``, task ``ctc``): sequence accuracy after greedy CTC decoding, and
character accuracy (1 - edit distance / label length, summed over the set).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ocr_data import CHARSET, FRAMES, H, MAX_LEN, make_split, make_text  # noqa: E402,F401


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------
class ConvBNAct(nn.Sequential):
    def __init__(self, cin, cout, k=3, s=1, groups=1, act=nn.Hardswish):
        pad = (k // 2, k // 2)
        layers = [nn.Conv2d(cin, cout, k, s, pad, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class SE(nn.Module):
    """PP-LCNet's SE: GAP, 1x1 conv, ReLU, 1x1 conv, HardSigmoid, multiply."""

    def __init__(self, c, r=4):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))


class DepSep(nn.Module):
    """PP-LCNet's DepthwiseSeparable: dw Conv-BN-HardSwish, [SE], pw Conv-BN-HardSwish."""

    def __init__(self, cin, cout, k, s, se=False):
        super().__init__()
        self.dw = ConvBNAct(cin, cin, k, s, groups=cin)
        self.se = SE(cin) if se else nn.Identity()
        self.pw = ConvBNAct(cin, cout, 1)

    def forward(self, x):
        return self.pw(self.se(self.dw(x)))


class MixingBlock(nn.Module):
    """SVTR's global mixing block (pre-norm): qkv Linear, per-head Softmax attention, GELU MLP."""

    def __init__(self, dim, heads, mlp_ratio=2.0):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Linear(int(dim * mlp_ratio), dim))

    def attn(self, x):
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * (self.hd ** -0.5), qkv[1], qkv[2]
        a = torch.matmul(q, k.transpose(-1, -2)).softmax(dim=-1)
        return self.proj(torch.matmul(a, v).transpose(1, 2).reshape(b, n, d))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Recognizer(nn.Module):
    # PP-LCNet-like: (k, cin, cout, stride, se); strides (2, 1) halve the height only
    CFG = [(3, 16, 32, 1, False), (3, 32, 64, 2, False), (3, 64, 64, 1, False), (3, 64, 96, (2, 1), False),
           (5, 96, 96, 1, False), (5, 96, 128, (2, 1), True), (5, 128, 128, 1, True)]

    def __init__(self, classes=len(CHARSET) + 1, dim=64, heads=4, depth=2):
        super().__init__()
        layers = [ConvBNAct(1, 16, 3, 2)]
        for k, cin, cout, s, se in self.CFG:
            layers.append(DepSep(cin, cout, k, s, se))
        self.backbone = nn.Sequential(*layers)  # [B, 128, 2, 32]
        c = self.CFG[-1][2]
        self.conv1 = ConvBNAct(c, c // 2, 3)  # SVTR neck: local conv, then 1x1 to dim
        self.conv2 = ConvBNAct(c // 2, dim, 1)
        self.blocks = nn.ModuleList(MixingBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.conv3 = ConvBNAct(dim, c, 1)
        self.conv4 = ConvBNAct(2 * c, c // 2, 3)
        self.conv5 = ConvBNAct(c // 2, dim, 1)
        self.head = nn.Linear(dim, classes)

    def forward(self, images):
        x = self.backbone(images)
        x = F.avg_pool2d(x, (H // 16, 1))  # [B, C, 1, T]: the remaining height (2)
        z = self.conv2(self.conv1(x))
        b, d, _, t = z.shape
        z = z.flatten(2).transpose(1, 2)  # [B, T, dim]
        for blk in self.blocks:
            z = blk(z)
        z = self.norm(z).transpose(1, 2).reshape(b, d, 1, t)
        z = self.conv3(z)
        z = self.conv5(self.conv4(torch.cat([x, z], 1)))
        return self.head(z.flatten(2).transpose(1, 2))  # [B, T, classes]


def ctc_loss(logits: torch.Tensor, labels: np.ndarray) -> torch.Tensor:
    """CTC loss of ``logits [B, T, K]`` (blank 0) against ``labels [B, L]`` padded with -1."""
    lab = torch.from_numpy(labels)
    lengths = (lab > 0).sum(1)
    targets = lab[lab > 0]
    logp = logits.log_softmax(-1).transpose(0, 1)  # [T, B, K]
    t = torch.full((logits.shape[0],), logits.shape[1], dtype=torch.long)
    return F.ctc_loss(logp, targets, t, lengths, blank=0, zero_infinity=True)


# what make_zoo.py registers
SPECS = {"ocr": dict(model=Recognizer, task="ctc", data="text", lr=2e-3, batch=64, seconds=4.0)}
DATA = {"text": make_split}
INPUTS = ["images"]
META = {"blank": 0, "charset": CHARSET, "frames": FRAMES, "max_label_length": MAX_LEN}
