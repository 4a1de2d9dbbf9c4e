"""Straightforward numpy versions of the calibration methods, for the tests.

Each works on raw samples (or on a histogram given as counts and edges) with
plain loops, as the methods are described in ``docs/calibration.md``.
"""

from __future__ import annotations

import numpy as np


def percentile_range(x: np.ndarray, percentile: float):
    cut = (100.0 - percentile) / 2.0
    lo, hi = np.percentile(x.astype(np.float64), [cut, 100.0 - cut])
    return float(lo), float(hi)


def kl_divergence(counts: np.ndarray, left: int, right: int, L: int) -> float:
    """TensorRT's KL(p || q) for the window of bins [left, right) of ``counts``.

    pytorch-quantization's loop, with onnxruntime's rule for the bins that share a
    group's mass (where ``p``, which includes the clipped mass, is non-zero).
    """
    counts = counts.astype(np.float64)
    window = counts[left:right].copy()
    W = right - left
    p = window.copy()
    p[0] += counts[:left].sum()
    p[-1] += counts[right:].sum()
    group = (np.arange(W) * L) // W
    mass = np.bincount(group, weights=window, minlength=L)  # each group's in-window mass
    members = np.bincount(group, weights=(p > 0), minlength=L)  # ... shared by its bins where p > 0
    q = np.where(p > 0, mass[group] / np.maximum(members[group], 1), 0.0)
    P = p / p.sum()
    Q = q / q.sum()
    nz = P > 0
    if np.any(Q[nz] == 0):
        return np.inf
    return float(np.sum(P[nz] * np.log(P[nz] / Q[nz])))


def entropy_range(counts: np.ndarray, edges: np.ndarray, lo: float, hi: float, num_bits: int = 8):
    """Thresholds T on bin edges; window [max(lo, -T), min(hi, T)]; the smallest KL wins (first on ties).

    ``counts`` without the exact zeros; windows need ``2**num_bits`` non-empty bins.

    ``edges`` must contain 0 (qtool's histograms do). Returns (range, thresholds, kl).
    """
    L = 2**num_bits
    w = edges[1] - edges[0]
    z = int(round(-edges[0] / w))  # index of the edge at 0
    lo_bin = int(np.searchsorted(edges, lo, side="right")) - 1
    hi_bin = int(np.searchsorted(edges, hi, side="right")) - 1
    m_full = max(z - lo_bin, hi_bin + 1 - z)
    ts, kls = [], []
    for m in range(1, m_full + 1):
        left, right = max(lo_bin, z - m), min(hi_bin + 1, z + m)
        if right - left < L or np.count_nonzero(counts[max(left, 0):right]) < L:
            continue
        ts.append(m * w)
        kls.append(kl_divergence(counts, left, right, L))
    kls = np.array(kls)
    if not np.isfinite(kls).any():
        return (lo, hi), np.array(ts), kls
    t = ts[int(np.argmin(kls))]
    return (max(-t, lo), min(t, hi)), np.array(ts), kls


def fake_quant(x: np.ndarray, lo: float, hi: float, num_bits: int = 8) -> np.ndarray:
    """TF's FakeQuantWithMinMaxVars (nudged range, half-up rounding), float32 numpy."""
    f = np.float32
    lo, hi = f(min(lo, 0.0)), f(max(hi, 0.0))
    qmin, qmax = f(0), f(2**num_bits - 1)
    scale = (hi - lo) / (qmax - qmin)
    zp_from_min = qmin - lo / scale
    if zp_from_min < qmin:
        zp = qmin
    elif zp_from_min > qmax:
        zp = qmax
    else:
        zp = f(np.sign(zp_from_min) * np.floor(np.abs(zp_from_min) + f(0.5)))
    nmin, nmax = (qmin - zp) * scale, (qmax - zp) * scale
    qz = np.floor(-nmin / scale + f(0.5))
    clamped = np.clip(x.astype(np.float32), nmin, nmax)
    return (np.floor((clamped - nmin) / scale - qz + f(0.5)) * scale).astype(np.float32)


def mse(x: np.ndarray, lo: float, hi: float, num_bits: int = 8) -> float:
    d = fake_quant(x, lo, hi, num_bits).astype(np.float64) - x.astype(np.float64)
    return float(np.mean(d * d))


def mse_range(x: np.ndarray, num_bits: int = 8, steps: int = 2000):
    """Brute force: thresholds T on a fine grid, range [max(lo, -T), min(hi, T)], then each end alone."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    d = max(-lo, hi)
    best = (np.inf, lo, hi)
    for t in d * np.arange(1, steps + 1) / steps:
        a, b = max(lo, -t), min(hi, t)
        best = min(best, (mse(x, a, b, num_bits), a, b))
    return best


def mse_errors(counts, k_lo, w, cand_lo, cand_hi, num_bits, narrow, symmetric, total):
    """``qtool.kernels.histogram.mse_search`` as first written: every non-empty bin, in or out of the
    nudged range, split into sub-intervals each put through the scalar FakeQuant (``cpu.fq_div``)."""
    import math

    from qtool.kernels import cpu
    from qtool.kernels.histogram import _prepare

    qminf, qmaxf = np.float32(1.0 if narrow else 0.0), np.float32(2.0**num_bits - 1.0)
    out = []
    for a, b in zip(cand_lo, cand_hi):
        nmin, nmax, scale, _, _, qz = map(np.float32, _prepare(a, b, qminf, qmaxf, symmetric, narrow, num_bits))
        if not scale > 0:
            out.append(np.inf)
            continue
        acc = 0.0
        for j, c in enumerate(counts):
            if c == 0:
                continue
            x0 = (k_lo + j) * w
            x1 = x0 + w
            sub = 1 if (x1 <= nmin or x0 >= nmax) else min(64, max(1, int(math.ceil(4.0 * w / float(scale)))))
            sw = w / sub
            err = 0.0
            for t in range(sub):
                cx = x0 + (t + 0.5) * sw
                d = float(cpu.fq_div(np.float32(cx), nmin, nmax, scale, qz)) - cx
                err += d * d
            acc += int(c) * (err / sub + sw * sw / 12.0)
        out.append(acc / total)
    return np.array(out)
