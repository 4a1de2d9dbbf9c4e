"""Procedural text lines for the zoo's OCR recognizer (numpy only: ``benchmarks/finetune.py`` draws
unlabeled lines from it without torch; ``ocr.py`` holds the model).

One line of 4-10 characters from a 20-character charset (digits and ten capitals), drawn
with a hand-written 5x7 bitmap font: 2x supersampled, random glyph height (12-22 px), width,
italic shear, spacing, position, grey levels, a brightness gradient and pixel noise. Images
``[B, 1, 32, 128]`` uint8 (fed as /255); labels ``[B, 10]`` (class ids 1..20, padded with
-1; 0 is the CTC blank).
"""

from __future__ import annotations

import numpy as np

H, W = 32, 128
CHARSET = "0123456789ABCEHKMPXY"
MIN_LEN, MAX_LEN = 4, 10
FRAMES = W // 4

# 5x7 glyphs, one string of 7 rows of 5 pixels per character
_FONT = {
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.",
    "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####",
    "3": "####. ....# ....# .###. ....# ....# ####.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.",
    "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.",
    "9": ".###. #...# #...# .#### ....# ...#. .##..",
    "A": ".###. #...# #...# ##### #...# #...# #...#",
    "B": "####. #...# #...# ####. #...# #...# ####.",
    "C": ".###. #...# #.... #.... #.... #...# .###.",
    "E": "##### #.... #.... ####. #.... #.... #####",
    "H": "#...# #...# #...# ##### #...# #...# #...#",
    "K": "#...# #..#. #.#.. ##... #.#.. #..#. #...#",
    "M": "#...# ##.## #.#.# #.#.# #...# #...# #...#",
    "P": "####. #...# #...# ####. #.... #.... #....",
    "X": "#...# #...# .#.#. ..#.. .#.#. #...# #...#",
    "Y": "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#..",
}
GLYPHS = np.stack([np.array([[c == "#" for c in row] for row in _FONT[ch].split()], np.float32)
                   for ch in CHARSET])  # [20, 7, 5]
assert GLYPHS.shape == (len(CHARSET), 7, 5)


def render(codes: np.ndarray, rng) -> np.ndarray:
    """One text line (character indices into CHARSET) -> uint8 ``[H, W]``."""
    n = len(codes)
    gh = rng.uniform(12, 22)  # glyph height in px
    sy = gh / 7
    sx = sy * rng.uniform(0.75, 1.15)
    gap = sx * rng.uniform(0.4, 2.0)
    pitch = 5 * sx + gap
    total = n * pitch - gap
    if total > W - 6:  # shrink horizontally to fit
        f = (W - 6) / total
        sx, gap, pitch, total = sx * f, gap * f, pitch * f, total * f
    x0 = rng.uniform(2, W - 2 - total)
    y0 = rng.uniform(1, H - 1 - gh)
    shear = rng.uniform(-0.25, 0.25)
    ss = 2  # supersampling
    yy = (np.arange(H * ss) + 0.5) / ss
    xx = (np.arange(W * ss) + 0.5) / ss
    v = (yy - y0) / sy  # glyph row coordinate
    xs = xx[None, :] - x0 + shear * (v[:, None] - 3.5) * sy
    idx = np.floor(xs / pitch).astype(np.int64)
    u = (xs - idx * pitch) / sx
    inside = (idx >= 0) & (idx < n) & (u >= 0) & (u < 5) & (v[:, None] >= 0) & (v[:, None] < 7)
    ci = codes[np.clip(idx, 0, n - 1)]
    r = np.clip(np.floor(v).astype(np.int64), 0, 6)[:, None]
    c = np.clip(np.floor(u).astype(np.int64), 0, 4)
    ink = np.where(inside, GLYPHS[ci, np.broadcast_to(r, ci.shape), c], 0.0)
    ink = ink.reshape(H, ss, W, ss).mean(axis=(1, 3))
    bg = rng.uniform(0, 255)
    fg = bg + rng.choice([-1, 1]) * rng.uniform(70, 200)
    if not 0 <= fg <= 255:
        fg = bg - (fg - bg)
    fg = float(np.clip(fg, 0, 255))
    img = bg + (fg - bg) * ink
    ramp = np.linspace(-1, 1, W, dtype=np.float32)
    img = img + rng.uniform(-30, 30) * ramp[None, :] + rng.uniform(-15, 15) * np.linspace(-1, 1, H)[:, None]
    img = img + rng.normal(0, rng.uniform(4, 16), size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def make_text(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    x = np.empty((n, 1, H, W), np.uint8)
    y = np.full((n, MAX_LEN), -1, np.int64)
    for i in range(n):
        length = int(rng.integers(MIN_LEN, MAX_LEN + 1))
        codes = rng.integers(0, len(CHARSET), size=length)
        x[i, 0] = render(codes, rng)
        y[i, :length] = codes + 1  # 0 is the CTC blank
    return x, y


def make_split(n: int, rng) -> tuple[dict, dict]:
    x, y = make_text(n, rng)
    return {"images": x}, {"labels": y}
