"""Streaming range statistics: exact mergeable histograms, percentile, entropy, MSE.

One pass per batch
    ``Histogram.update(x)`` reads each batch once, in chunks of ``CHUNK``
    values (in parallel from ``PARALLEL_MIN`` values on, on one thread below:
    the same chunks, so the same results), in one loop: finite min/max, exact zeros, and the bin of
    every value the running histogram's window can hold. Counts go to
    ``LANES`` interleaved sub-histograms, so a tensor with many equal values
    (a Relu's zeros) does not serialise on one counter. Only chunks holding
    values outside the window (the first batch, or a batch that widens the
    range) are read again, after re-binning, and then only those values are
    counted.

Exact re-binning (no mass lost, no interpolation)
    Bins have a power-of-two width ``w = 2**e`` and edges at integer multiples
    of ``w``: bin ``k`` holds ``[k*w, (k+1)*w)``. The histogram keeps
    ``2 * num_bins`` slots, bins ``k_lo .. k_lo + 2*num_bins - 1``. ``e`` is
    the smallest exponent whose window holds the whole observed range (and
    no finer than 2**-42 of the largest magnitude, so bin numbers fit int64),
    so the range spans between ``num_bins`` and ``2 * num_bins`` bins. When a
    batch widens the range, ``e`` grows and every old bin ``k`` moves to bin
    ``k >> (e_new - e_old)``: a value ``x`` in bin ``floor(x / 2**e_old)`` is
    in bin ``floor(x / 2**e_new)``, so re-binned counts are exactly the
    counts that direct binning would give. ``x * 2**-e`` is exact in float64,
    so there is no rounding anywhere: the histogram depends only on the
    multiset of values seen, not on how they were split into batches.

Ranges from a histogram (all return ``(lo, hi)`` inside the observed range)
    - ``percentile_range``: the two-sided range that keeps ``P`` percent of the
      values (``(100 - P) / 2`` cut on each side), linear inside a bin.
    - ``entropy_range``: TensorRT's KL-divergence threshold search, as in
      NVIDIA's pytorch-quantization, on qtool's asymmetric ranges.
      Candidates are thresholds ``T`` on bin edges, the window
      ``[max(lo, -T), min(hi, T)]`` (``[-T, T]`` when symmetric); the window's
      bins are grouped into ``2**bits`` quantized bins; the reference ``p`` is
      the window's counts with the clipped mass added to the edge bins, the
      candidate ``q`` spreads each group's in-window mass over the bins where
      ``p`` is non-empty (onnxruntime's and MXNet's rule; an edge bin that only
      holds clipped mass gets a share, so thresholds in a gap of the
      distribution stay comparable);
      the threshold with the smallest ``KL(p || q)`` wins. Exact zeros are
      left out (every range contains 0 and quantizes it exactly; a spike of
      zeros after a Relu would otherwise dominate the divergence). A window
      must hold at least ``2**bits`` non-empty bins: with fewer, ``q`` copies
      ``p`` whatever is clipped and the divergence is 0 (on discrete data,
      such as 8-bit images, no window qualifies and the result is min/max,
      which is right for such data). Because the range always spans at least
      ``num_bins >= 4 * 2**bits`` bins, the search has candidates far below
      the full range (onnxruntime's default ``num_bins ==
      num_quantized_bins == 128`` leaves it exactly one candidate: min/max).
    - ``mse_range``: the range minimising the mean squared error of TF's
      FakeQuant (``vars`` variant: the nudged range, its zero-point rounding
      and the half-up rounding of ``qtool.kernels.cpu``'s scalar math) over
      the histogram's density. Each bin's values are taken as uniform in the
      bin: a bin entirely outside the nudged range (where FakeQuant is
      constant) contributes its exact error ``(fq(c) - c)**2 + w**2/12``; a
      bin inside the range is split into sub-intervals no wider than a
      quarter of the quantization step, each evaluated through the
      quantizer at its centre (computed once per candidate for the bins
      outside, where FakeQuant clamps). Search: thresholds ``T`` (coarse grid, then a
      fine grid around the best), then, for asymmetric ranges, the low end
      with the high end fixed and the high end with the low end fixed.
"""

from __future__ import annotations

import math

import numpy as np
from numba import get_num_threads, njit, prange

from qtool.kernels import cpu

from qtool.kernels._cache import drop_stale_cache

drop_stale_cache("histogram", ("_scalar.py", "_targets.py", "cpu.py"))

CHUNK = 1 << 14
E_MIN = -200  # bin exponent floor (all-zero tensors)
MAG_BITS = 42  # bins are at least 2**-MAG_BITS of the largest magnitude
_jit = dict(cache=True, error_model="numpy")


# --- grid ---------------------------------------------------------------------------
@njit(**_jit)
def grid_for(lo, hi, nslots):
    """``(e, k_lo)``: the smallest power-of-two bin width holding ``[lo, hi]`` in ``nslots`` bins."""
    mag = max(abs(lo), abs(hi))
    if mag == 0.0:
        return E_MIN, 0
    e = math.frexp(mag)[1] - MAG_BITS
    span = hi - lo
    if span > 0.0:
        e = max(e, math.frexp(span / nslots)[1] - 1)
    e = max(e, E_MIN)
    while True:
        s = math.ldexp(1.0, -e)
        if math.floor(hi * s) - math.floor(lo * s) + 1 <= nslots:
            return e, np.int64(math.floor(lo * s))
        e += 1


@njit(**_jit)
def rebin(counts, e_old, k_old, e_new, k_new):
    """Counts of grid ``(e_old, k_old)`` moved to the coarser or shifted grid ``(e_new, k_new)``."""
    out = np.zeros_like(counts)
    d = e_new - e_old
    for j in range(counts.size):
        c = counts[j]
        if c:
            k = k_old + j
            k = k >> d if d < 63 else (np.int64(-1) if k < 0 else np.int64(0))
            out[k - k_new] += c
    return out


# --- one pass per batch -------------------------------------------------------------
LANES = 4  # interleaved sub-histograms: repeated values do not serialise on one counter


@njit(**_jit)
def _scan(xs, sub, s, k_lo, have_grid):
    """One read of a chunk: finite min/max, exact zeros, and counts into the grid ``(s = 2**-e, k_lo)``.

    Returns ``(lo, hi, finite, zeros, outside)``: ``outside`` counts finite
    values the grid cannot hold (all of them without a grid); those are left
    for ``_scan_outside`` once the grid has grown. The loop has no
    data-dependent branch but the (rare) out-of-window one.
    """
    nslots = sub.shape[1]
    lo = np.inf
    hi = -np.inf
    nfin = 0
    zeros = 0
    outside = 0
    for i in range(xs.size):
        v = np.float64(xs[i])
        if abs(v) < np.inf:  # finite (NaN compares false)
            nfin += 1
            lo = v if v < lo else lo
            hi = v if v > hi else hi
            zeros += v == 0.0
            if have_grid:
                k = np.int64(math.floor(v * s)) - k_lo
                if 0 <= k < nslots:
                    sub[i & (LANES - 1), k] += 1
                else:
                    outside += 1
    if not have_grid:
        outside = nfin
    return lo, hi, nfin, zeros, outside


@njit(**_jit)
def _scan_outside(xs, sub, s, k_lo, s_old, k_old, have_old):
    """Count the finite values of a chunk that the old grid could not hold into the new grid."""
    nslots = sub.shape[1]
    for i in range(xs.size):
        v = np.float64(xs[i])
        if abs(v) < np.inf:
            if have_old:
                k = np.int64(math.floor(v * s_old)) - k_old
                if 0 <= k < nslots:
                    continue  # counted by _scan, then re-binned
            sub[i & (LANES - 1), np.int64(math.floor(v * s)) - k_lo] += 1


@njit(**_jit)
def _fold(counts, part):
    """Add the per-block, per-lane counts into ``counts``."""
    for b in range(part.shape[0]):
        for lane in range(LANES):
            for j in range(counts.size):
                counts[j] += part[b, lane, j]


@njit(**_jit)
def _pass_chunk(x, c, sub, s, k_lo, have_grid, cmin, cmax, nfin, nzero, outside):
    """``_scan`` of chunk ``c`` of ``x``, its results stored at index ``c``."""
    n = x.size
    lo, hi, m, z, out = _scan(x[c * CHUNK : min(n, (c + 1) * CHUNK)], sub, s, k_lo, have_grid)
    cmin[c] = lo
    cmax[c] = hi
    nfin[c] = m
    nzero[c] = z
    outside[c] = out > 0


@njit(**_jit)
def _chunk_arrays(n, nslots, nblocks):
    nchunks = (n + CHUNK - 1) // CHUNK
    return (np.full(nchunks, np.inf), np.full(nchunks, -np.inf), np.zeros(nchunks, np.int64),
            np.zeros(nchunks, np.int64), np.zeros(nchunks, np.bool_), np.zeros((nblocks, LANES, nslots), np.int64))


@njit(parallel=True, **_jit)
def hist_pass(x, counts, e, k_lo, have_grid, nblocks):
    """Scan every chunk once: finite min/max, and counts of what fits the current grid.

    Adds to ``counts`` in place. Returns ``(lo, hi, finite, zeros, outside_chunks)``:
    the batch's finite min/max, its number of finite values and exact zeros,
    and a per-chunk flag of chunks holding values the grid could not take.
    The per-chunk results do not depend on ``nblocks`` (nor on the order the
    chunks run in), so ``hist_pass_serial`` gives the same results.
    """
    cmin, cmax, nfin, nzero, outside, part = _chunk_arrays(x.size, counts.size, nblocks)
    nchunks = cmin.size
    s = math.ldexp(1.0, -e)
    for b in prange(nblocks):
        for c in range(b * nchunks // nblocks, (b + 1) * nchunks // nblocks):
            _pass_chunk(x, c, part[b], s, k_lo, have_grid, cmin, cmax, nfin, nzero, outside)
    _fold(counts, part)
    return cmin.min(), cmax.max(), nfin.sum(), nzero.sum(), outside


@njit(**_jit)
def hist_pass_serial(x, counts, e, k_lo, have_grid, nblocks):
    """``hist_pass`` on one thread (small tensors: no thread pool to wake; same results)."""
    cmin, cmax, nfin, nzero, outside, part = _chunk_arrays(x.size, counts.size, 1)
    s = math.ldexp(1.0, -e)
    for c in range(cmin.size):
        _pass_chunk(x, c, part[0], s, k_lo, have_grid, cmin, cmax, nfin, nzero, outside)
    _fold(counts, part)
    return cmin.min(), cmax.max(), nfin.sum(), nzero.sum(), outside


@njit(**_jit)
def _outside_chunk(x, c, sub, s, k_lo, s_old, k_old, have_old):
    n = x.size
    _scan_outside(x[c * CHUNK : min(n, (c + 1) * CHUNK)], sub, s, k_lo, s_old, k_old, have_old)


@njit(parallel=True, **_jit)
def hist_outside(x, counts, e, k_lo, e_old, k_old, have_old, outside, nblocks):
    """Count the values of the flagged chunks that the old grid ``(e_old, k_old)`` could not hold."""
    nchunks = outside.size
    part = np.zeros((nblocks, LANES, counts.size), np.int64)
    s = math.ldexp(1.0, -e)
    s_old = math.ldexp(1.0, -e_old)
    for b in prange(nblocks):
        for c in range(b * nchunks // nblocks, (b + 1) * nchunks // nblocks):
            if outside[c]:
                _outside_chunk(x, c, part[b], s, k_lo, s_old, k_old, have_old)
    _fold(counts, part)


@njit(**_jit)
def hist_outside_serial(x, counts, e, k_lo, e_old, k_old, have_old, outside, nblocks):
    """``hist_outside`` on one thread (same counts)."""
    part = np.zeros((1, LANES, counts.size), np.int64)
    s = math.ldexp(1.0, -e)
    s_old = math.ldexp(1.0, -e_old)
    for c in range(outside.size):
        if outside[c]:
            _outside_chunk(x, c, part[0], s, k_lo, s_old, k_old, have_old)
    _fold(counts, part)


# Below this many values a batch is counted on one thread (as ``minmax`` does).
PARALLEL_MIN = cpu.PARALLEL_MIN


class Histogram:
    """A running histogram of a tensor's finite values (see the module docstring).

    ``num_bins`` is the resolution: the observed range always spans at least
    ``num_bins`` bins (at most ``2 * num_bins``). Memory is ``2 * num_bins``
    int64 counts, whatever the number of values.
    """

    def __init__(self, num_bins: int = 2048):
        if int(num_bins) < 16:
            raise ValueError(f"num_bins must be at least 16, got {num_bins}")
        self.num_bins = int(num_bins)
        self.counts = np.zeros(2 * self.num_bins, np.int64)
        self.e = E_MIN
        self.k_lo = 0
        self.min = math.inf
        self.max = -math.inf
        self.total = 0  # finite values counted
        self.zeros = 0  # of which exactly 0 (quantized exactly at any range)
        self.nonfinite = 0  # NaN and +-inf seen (not counted)

    # -- building
    def update(self, x) -> Histogram:
        """Count the values of ``x`` (any shape; NaN and +-inf are skipped and tallied)."""
        x = np.asarray(x)
        if x.dtype not in (np.float32, np.float64):
            x = x.astype(np.float32)
        x = np.ascontiguousarray(x).reshape(-1)
        if x.size == 0:
            return self
        nblocks = max(1, min(get_num_threads(), -(-x.size // CHUNK)))
        serial = nblocks == 1 or x.size < PARALLEL_MIN
        hist_pass_, hist_outside_ = (hist_pass_serial, hist_outside_serial) if serial else (hist_pass, hist_outside)
        have = self.total > 0
        e_old, k_old = self.e, self.k_lo
        lo, hi, nfin, zeros, outside = hist_pass_(x, self.counts, np.int64(e_old), np.int64(k_old), have, nblocks)
        self.nonfinite += int(x.size - nfin)
        if nfin == 0:
            return self
        lo, hi = min(self.min, float(lo)), max(self.max, float(hi))
        if outside.any():
            self._regrid(lo, hi)  # counts so far move to the grown grid, exactly
            hist_outside_(x, self.counts, np.int64(self.e), np.int64(self.k_lo), np.int64(e_old), np.int64(k_old),
                          have, outside, nblocks)
        self.zeros += int(zeros)
        self.min, self.max = lo, hi
        self.total += int(nfin)
        return self

    def _regrid(self, lo, hi):
        e, k = grid_for(lo, hi, self.counts.size)
        e, k = int(e), int(k)
        if (e, k) != (self.e, self.k_lo):
            if self.total:
                self.counts = rebin(self.counts, np.int64(self.e), np.int64(self.k_lo), np.int64(e), np.int64(k))
            self.e, self.k_lo = e, k

    def merge(self, other: Histogram) -> Histogram:
        """Add ``other``'s counts (any grid) into this histogram, exactly."""
        if other.total == 0:
            self.nonfinite += other.nonfinite
            return self
        if other.counts.size != self.counts.size:
            raise ValueError("cannot merge histograms with different numbers of bins")
        lo, hi = min(self.min, other.min), max(self.max, other.max)
        self._regrid(lo, hi)
        add = rebin(other.counts, np.int64(other.e), np.int64(other.k_lo), np.int64(self.e), np.int64(self.k_lo))
        self.counts += add
        self.min, self.max = lo, hi
        self.total += other.total
        self.zeros += other.zeros
        self.nonfinite += other.nonfinite
        return self

    # -- reading
    @property
    def width(self) -> float:
        return math.ldexp(1.0, self.e)

    def edges(self) -> np.ndarray:
        """float64 bin edges of all slots (``2 * num_bins + 1`` values)."""
        return (np.arange(self.counts.size + 1, dtype=np.float64) + self.k_lo) * self.width

    def state(self) -> dict:
        return {"e": self.e, "k_lo": self.k_lo, "min": self.min, "max": self.max,
                "total": self.total, "zeros": self.zeros, "nonfinite": self.nonfinite}

    def nonzero_counts(self) -> np.ndarray:
        """The counts without the exact zeros (which any range containing 0 quantizes exactly)."""
        counts = self.counts
        if self.zeros:
            counts = counts.copy()
            counts[-self.k_lo] -= self.zeros
        return counts

    def percentile_range(self, percentile: float = 99.999):
        return percentile_range(self, percentile)

    def entropy_range(self, num_bits: int = 8, symmetric: bool = False):
        return entropy_range(self, num_bits=num_bits, symmetric=symmetric)

    def mse_range(self, num_bits: int = 8, symmetric: bool = False, narrow_range: bool = False, **kw):
        return mse_range(self, num_bits=num_bits, symmetric=symmetric, narrow_range=narrow_range, **kw)


def histogram(x, num_bins: int = 2048) -> Histogram:
    """A :class:`Histogram` of ``x``."""
    return Histogram(num_bins).update(x)


# --- percentile ---------------------------------------------------------------------
@njit(**_jit)
def _inverse_cdf(counts, target, k_lo, w):
    """The value below which ``target`` values lie, linear within a bin."""
    cum = 0.0
    for j in range(counts.size):
        c = counts[j]
        if c and cum + c >= target:
            return (k_lo + j + (target - cum) / c) * w
        cum += c
    return (k_lo + counts.size) * w


def percentile_range(h: Histogram, percentile: float = 99.999):
    """The range that keeps ``percentile`` % of the values, ``(100 - P) / 2`` % cut on each side.

    Returns ``(lo, hi)`` as floats, or None when the histogram is empty.
    """
    p = float(percentile)
    if not (0.0 < p <= 100.0):
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    if h.total == 0:
        return None
    if p == 100.0:
        return h.min, h.max
    cut = (100.0 - p) / 200.0 * h.total
    w = h.width
    lo = _inverse_cdf(h.counts, cut, h.k_lo, w)
    hi = _inverse_cdf(h.counts, h.total - cut, h.k_lo, w)
    lo = min(max(lo, h.min), h.max)
    hi = min(max(hi, lo), h.max)
    return lo, hi


# --- entropy (TensorRT KL search) -----------------------------------------------------
@njit(**_jit)
def _range_sum(pre, a, b):
    n = pre.size - 1
    a = min(max(a, 0), n)
    b = min(max(b, 0), n)
    return pre[b] - pre[a]


@njit(**_jit)
def _xlogx(c):
    return c * math.log(c) if c > 0 else 0.0


@njit(**_jit)
def _kl(counts, csum, cnz, clogc, left, right, L, total):
    """KL(p || q) for the window of slots ``[left, right)`` (may extend past the slots).

    ``p``: the window's counts, the clipped mass added to the two edge bins;
    ``q``: bin ``j`` of the window is in group ``j * L // W``; each group's
    in-window mass spread evenly over its bins where ``p`` is non-empty. With prefix sums of
    ``c``, ``c > 0`` and ``c log c`` this costs O(L) per window:
    ``sum p log(p/q) = sum p log p - sum_groups (group's p mass) * log(mass / nonzero)``.
    """
    n = counts.size
    W = right - left
    out_l = _range_sum(csum, -1, left)
    out_r = _range_sum(csum, right, n + 1)
    inside = total - out_l - out_r
    if inside <= 0:
        return np.inf
    c_l = counts[left] if 0 <= left < n else 0
    c_r = counts[right - 1] if 0 <= right - 1 < n else 0
    # an empty edge bin that receives clipped mass is non-empty in p, so q gets a share there too
    extra_l = 1 if (out_l > 0 and c_l == 0) else 0
    extra_r = 1 if (out_r > 0 and c_r == 0) else 0
    plogp = _range_sum(clogc, left, right)
    if out_l > 0:
        plogp += _xlogx(c_l + out_l) - _xlogx(c_l)
    if out_r > 0:
        plogp += _xlogx(c_r + out_r) - _xlogx(c_r)
    plogq = 0.0
    for g in range(L):
        j0 = left + (g * W + L - 1) // L
        j1 = left + ((g + 1) * W + L - 1) // L
        nz = _range_sum(cnz, j0, j1)
        mass = _range_sum(csum, j0, j1)
        s = mass
        if j0 <= left < j1:
            mass += out_l
            nz += extra_l
        if j0 <= right - 1 < j1:
            mass += out_r
            nz += extra_r
        if mass == 0:
            continue
        if s == 0:
            return np.inf  # p > 0 where q = 0 (the edge group holds nothing inside the window)
        plogq += mass * math.log(s / nz)
    # sum_i P_i log(P_i / Q_i) with P = p / total, Q = q / inside
    return (plogp - plogq) / total + math.log(inside / total)


@njit(parallel=True, **_jit)
def entropy_search(counts, k_lo, lo_bin, hi_bin, m_start, m_stop, m_step, L, symmetric):
    """KL divergence of every threshold ``m`` (bins from zero) in ``range(m_start, m_stop, m_step)``.

    ``lo_bin``/``hi_bin``: bin numbers (not slots) of the observed min and max.
    Returns ``(ms, kl)``.
    """
    n = counts.size
    csum = np.zeros(n + 1, np.float64)
    cnz = np.zeros(n + 1, np.float64)
    clogc = np.zeros(n + 1, np.float64)
    for j in range(n):
        c = np.float64(counts[j])
        csum[j + 1] = csum[j] + c
        cnz[j + 1] = cnz[j] + (1.0 if c > 0 else 0.0)
        clogc[j + 1] = clogc[j] + (c * math.log(c) if c > 0 else 0.0)
    total = csum[n]
    ncand = max(0, (m_stop - m_start + m_step - 1) // m_step)
    ms = np.empty(ncand, np.int64)
    kl = np.empty(ncand, np.float64)
    for t in prange(ncand):
        m = m_start + t * m_step
        ms[t] = m
        if symmetric:
            left, right = -m, m
        else:
            left, right = max(lo_bin, -m), min(hi_bin + 1, m)
        if right - left < L or _range_sum(cnz, left - k_lo, right - k_lo) < L:
            kl[t] = np.inf  # fewer (non-empty) bins than quantized bins: q would copy p
        else:
            kl[t] = _kl(counts, csum, cnz, clogc, left - k_lo, right - k_lo, L, total)
    return ms, kl


MAX_CANDIDATES = 4096


def _widened(h: Histogram):
    return min(h.min, 0.0), max(h.max, 0.0)


def entropy_range(h: Histogram, num_bits: int = 8, symmetric: bool = False, return_curve: bool = False):
    """The clipping range with the smallest KL divergence (TensorRT's method), or None when empty.

    Needs ``h.num_bins >= 4 * 2**num_bits`` so that the search always has
    candidates well inside the observed range.
    """
    L = 1 << int(num_bits)
    if h.num_bins < 4 * L:
        raise ValueError(
            f"entropy calibration with {num_bits}-bit activations needs at least {4 * L} histogram bins "
            f"(4 x 2**bits), got {h.num_bins}: with as many bins as quantized bins the search can only "
            "return min/max"
        )
    if h.total == 0:
        return None
    lo, hi = _widened(h)
    if hi == lo:
        return lo, hi
    w = h.width
    s = 1.0 / w
    lo_bin = math.floor(h.min * s)
    hi_bin = math.floor(h.max * s)
    m_full = max(-lo_bin, hi_bin + 1)  # thresholds beyond this clip nothing
    # smallest threshold whose window holds L bins
    m_start = max(1, L // 2) if symmetric else 1
    m_stop = m_full + 1
    m_step = max(1, -(-(m_stop - m_start) // MAX_CANDIDATES))
    counts = h.nonzero_counts()
    if h.total == h.zeros:
        return (h.min, h.max, (np.zeros(0), np.zeros(0))) if return_curve else (h.min, h.max)
    ms, kl = entropy_search(counts, np.int64(h.k_lo), np.int64(lo_bin), np.int64(hi_bin),
                            np.int64(m_start), np.int64(m_stop), np.int64(m_step), np.int64(L), bool(symmetric))
    if not np.isfinite(kl).any():
        rng = (h.min, h.max)
    else:
        m = int(ms[int(np.argmin(kl))])
        t = m * w
        if symmetric:
            rng = (max(-t, h.min), min(t, h.max))
        else:
            rng = (max(-t, h.min), min(t, h.max))
    if return_curve:
        return rng, (ms * w, kl)
    return rng


# --- MSE of the actual quantizer ---------------------------------------------------------
@njit(**_jit)
def _prepare(a, b, qminf, qmaxf, symmetric, narrow, num_bits):
    """Candidate ``[a, b]`` -> TF's widened (or symmetric) float32 range -> nudged parameters."""
    lo = np.float32(min(a, 0.0))
    hi = np.float32(max(b, 0.0))
    if symmetric:
        if narrow:
            r = np.float32(-1.0)
        else:
            r = np.float32(-((2.0**num_bits) - 2.0) / 2.0**num_bits)
        lo2 = min(lo, np.float32(hi / r))
        hi2 = max(hi, np.float32(lo * r))
        lo, hi = lo2, hi2
    return cpu.nudge(lo, hi, qminf, qmaxf)


@njit(**_jit)
def _mse_one(counts, j0, j1, k_lo, w, a, b, qminf, qmaxf, symmetric, narrow, num_bits, total):
    nmin, nmax, scale, inv_scale, zp, qz = _prepare(a, b, qminf, qmaxf, symmetric, narrow, num_bits)
    if not (scale > 0):
        return np.inf
    acc = 0.0
    step = np.float64(scale)
    # FakeQuant clamps first: every value at or below nmin (above nmax) gives fq(nmin) (fq(nmax))
    fq_lo = np.float64(cpu.fq_div(nmin, nmin, nmax, scale, qz))
    fq_hi = np.float64(cpu.fq_div(nmax, nmin, nmax, scale, qz))
    outside = w * w / 12.0
    for j in range(j0, j1):
        c = counts[j]
        if c == 0:
            continue
        x0 = (k_lo + j) * w
        x1 = x0 + w
        if x1 <= nmin or x0 >= nmax:  # one sub-interval, its centre clamped (float32(cx) stays outside)
            cx = x0 + 0.5 * w
            d = (fq_lo if x1 <= nmin else fq_hi) - cx
            acc += c * (d * d + outside)
            continue
        sub = min(64, max(1, int(math.ceil(4.0 * w / step))))
        sw = w / sub
        err = 0.0
        for t in range(sub):
            cx = x0 + (t + 0.5) * sw
            xf = np.float32(cx)
            d = np.float64(cpu.fq_div(xf, nmin, nmax, scale, qz)) - cx
            err += d * d
        acc += c * (err / sub + sw * sw / 12.0)
    return acc / total


@njit(parallel=True, **_jit)
def mse_search(counts, total, k_lo, w, cand_lo, cand_hi, num_bits, narrow, symmetric):
    """Mean squared FakeQuant error over the histogram's ``total`` values for each candidate range.

    ``counts`` leave out the exact zeros (their error is 0 at any range).
    """
    qminf = np.float32(1.0 if narrow else 0.0)
    qmaxf = np.float32(2.0**num_bits - 1.0)
    out = np.empty(cand_lo.size, np.float64)
    nz = np.nonzero(counts)[0]  # the slots that hold values: the others add nothing
    j0, j1 = (nz[0], nz[-1] + 1) if nz.size else (0, 0)
    for t in prange(cand_lo.size):
        out[t] = _mse_one(counts, j0, j1, k_lo, w, cand_lo[t], cand_hi[t], qminf, qmaxf, symmetric, narrow, num_bits, total)
    return out


MSE_GRID = 128


def _search_1d(h, make, num_bits, narrow, symmetric):
    """Coarse grid of ``MSE_GRID`` points on (0, 1], then a fine grid around the best."""
    counts = h.nonzero_counts()

    def run(fracs):
        cl, ch = make(fracs)
        return mse_search(counts, float(h.total), np.int64(h.k_lo), h.width, cl, ch, np.int64(num_bits), bool(narrow),
                          bool(symmetric)), cl, ch

    coarse = np.arange(1, MSE_GRID + 1, dtype=np.float64) / MSE_GRID
    err, cl, ch = run(coarse)
    k = int(np.argmin(err))
    f0 = coarse[k]
    fine = f0 + np.arange(-MSE_GRID // 2, MSE_GRID // 2 + 1, dtype=np.float64) / (MSE_GRID * MSE_GRID // 2)
    fine = fine[(fine > 0) & (fine <= 1)]
    err2, cl2, ch2 = run(fine)
    k2 = int(np.argmin(err2))
    if err2[k2] <= err[k]:
        return float(cl2[k2]), float(ch2[k2]), float(err2[k2])
    return float(cl[k]), float(ch[k]), float(err[k])


def mse_range(h: Histogram, num_bits: int = 8, symmetric: bool = False, narrow_range: bool = False,
              return_error: bool = False):
    """The range minimising the mean squared error of TF's FakeQuant over the histogram, or None.

    The error is that of the quantizer the range will get: widened to contain
    0 (or made symmetric with TF's formula), nudged, ``num_bits`` levels.
    """
    if h.total == 0:
        return None
    lo, hi = _widened(h)
    if hi == lo:
        return (lo, hi, 0.0) if return_error else (lo, hi)
    d = max(-lo, hi)
    if symmetric:
        a, b, err = _search_1d(h, lambda f: (-f * d, f * d), num_bits, narrow_range, True)
        a, b = max(a, h.min), min(b, h.max)
    else:
        a, b, err = _search_1d(h, lambda f: (np.maximum(-f * d, lo), np.minimum(f * d, hi)),
                               num_bits, narrow_range, False)
        if lo < 0:  # low end with the high end fixed
            a2, b2, err2 = _search_1d(h, lambda f: (f * lo, np.full_like(f, b)), num_bits, narrow_range, False)
            if err2 <= err:
                a, err = a2, err2
        if hi > 0:  # high end with the low end fixed
            a3, b3, err3 = _search_1d(h, lambda f: (np.full_like(f, a), f * hi), num_bits, narrow_range, False)
            if err3 <= err:
                b, err = b3, err3
    rng = (a, b)
    return (a, b, err) if return_error else rng


__all__ = ["Histogram", "histogram", "percentile_range", "entropy_range", "mse_range"]
