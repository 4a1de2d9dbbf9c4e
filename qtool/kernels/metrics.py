"""Streaming error metrics for ``qtool simulate`` (numba, CPU).

Each call reduces one batch of a (reference, test) tensor pair to a few
float64 numbers that the caller adds up over batches, so no activation is
kept from one batch to the next:

- :func:`pair_stats` -> ``STATS`` slots: sums of squares of the reference,
  the test and the error, the dot product, the sum and max of ``|error|``,
  the count of compared (finite) pairs and of skipped (non-finite) pairs, and
  the min/max of both tensors, and how many reference values lie below and
  above a given range (the quantizer's: the values it clips). The test tensor is float32, or integer
  codes dequantized on the fly exactly as ``DequantizeLinear`` does
  (``float32(int(code) - zero_point) * scale``, one float32 multiply), so a
  quantized model's activations can be read as the codes it really holds.
  Differences and sums are float64: ``ref - test`` of two float32 values is
  exact in float64.
- :func:`histogram_update`: counts of a tensor in fixed bins over
  ``[lo, hi)`` plus one underflow and one overflow bin (NaN counts in
  neither); the last bin includes ``hi``.
- :func:`argmax_rows`: top-1 class per row with ``numpy.argmax``'s rule
  (first maximum; a NaN is the maximum); :func:`count_equal`.
- :func:`sorted_rows`: whether every row is sorted (descending, ascending):
  an output whose top-1 is always the first or the last place (TopK's
  values) has no top-1 worth comparing.

Kernels are ``@njit(parallel=True, cache=True, error_model="numpy")`` with a
serial twin for tensors under ``PARALLEL_MIN`` elements; reductions run over
fixed chunks of ``CHUNK`` elements combined in chunk order, so the numbers do
not depend on the number of threads or on which twin ran. Inside a chunk
the sums run in element order in float64 (no fastmath, no reassociation). Arrays are
1-D C-contiguous (callers ravel); :func:`combine` adds batch results.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

CHUNK = 1 << 14
# Below this many elements a kernel runs on the calling thread: waking a thread
# pool costs more than the work (milliseconds on a loaded machine). The chunks
# and their order are the same either way, so the numbers are too.
PARALLEL_MIN = 1 << 18

# slots of a pair_stats result
(SUM_REF2, SUM_TEST2, SUM_ERR2, DOT, SUM_ABS_ERR, MAX_ABS_ERR, COUNT, NONFINITE,
 REF_MIN, REF_MAX, TEST_MIN, TEST_MAX, CLIP_LOW, CLIP_HIGH) = range(14)
STATS = 14
_SUMS = (SUM_REF2, SUM_TEST2, SUM_ERR2, DOT, SUM_ABS_ERR, COUNT, NONFINITE, CLIP_LOW, CLIP_HIGH)


def empty_stats() -> np.ndarray:
    """The neutral element of :func:`combine`."""
    s = np.zeros(STATS, np.float64)
    s[REF_MIN] = s[TEST_MIN] = np.inf
    s[REF_MAX] = s[TEST_MAX] = -np.inf
    return s


def combine(total: np.ndarray, part: np.ndarray) -> None:
    """Add the batch result ``part`` into ``total`` (in place)."""
    for k in _SUMS:
        total[k] += part[k]
    total[MAX_ABS_ERR] = max(total[MAX_ABS_ERR], part[MAX_ABS_ERR])
    total[REF_MIN] = min(total[REF_MIN], part[REF_MIN])
    total[TEST_MIN] = min(total[TEST_MIN], part[TEST_MIN])
    total[REF_MAX] = max(total[REF_MAX], part[REF_MAX])
    total[TEST_MAX] = max(total[TEST_MAX], part[TEST_MAX])


@njit(cache=True, error_model="numpy")
def _chunk_stats(ref, test, dequantize, scale, zero_point, lo, hi, start, stop, row):
    """One chunk's slots into ``row``. Fast loop first; a careful one if a value was not finite."""
    s_r2 = 0.0
    s_t2 = 0.0
    s_e2 = 0.0
    s_dot = 0.0
    s_abs = 0.0
    m_abs = 0.0
    c_lo = 0
    c_hi = 0
    r_min = np.inf
    r_max = -np.inf
    t_min = np.inf
    t_max = -np.inf
    for i in range(start, stop):
        r = np.float64(ref[i])
        if dequantize:
            t = np.float64(np.float32(np.int64(test[i]) - zero_point) * scale)
        else:
            t = np.float64(test[i])
        e = r - t
        s_r2 += r * r
        s_t2 += t * t
        s_e2 += e * e
        s_dot += r * t
        a = abs(e)
        s_abs += a
        m_abs = a if a > m_abs else m_abs
        c_lo += r < lo
        c_hi += r > hi
        r_min = r if r < r_min else r_min
        r_max = r if r > r_max else r_max
        t_min = t if t < t_min else t_min
        t_max = t if t > t_max else t_max
    bad = 0
    if not (np.isfinite(s_r2) and np.isfinite(s_t2) and np.isfinite(s_dot)):
        # some value is inf or NaN (float32 squares cannot overflow float64): skip those pairs
        s_r2 = 0.0
        s_t2 = 0.0
        s_e2 = 0.0
        s_dot = 0.0
        s_abs = 0.0
        m_abs = 0.0
        for i in range(start, stop):
            r = np.float64(ref[i])
            if dequantize:
                t = np.float64(np.float32(np.int64(test[i]) - zero_point) * scale)
            else:
                t = np.float64(test[i])
            if np.isfinite(r) and np.isfinite(t):
                e = r - t
                s_r2 += r * r
                s_t2 += t * t
                s_e2 += e * e
                s_dot += r * t
                a = abs(e)
                s_abs += a
                m_abs = a if a > m_abs else m_abs
            else:
                bad += 1
    row[SUM_REF2] = s_r2
    row[SUM_TEST2] = s_t2
    row[SUM_ERR2] = s_e2
    row[DOT] = s_dot
    row[SUM_ABS_ERR] = s_abs
    row[MAX_ABS_ERR] = m_abs
    row[COUNT] = (stop - start) - bad
    row[NONFINITE] = bad
    row[REF_MIN] = r_min
    row[REF_MAX] = r_max
    row[TEST_MIN] = t_min
    row[TEST_MAX] = t_max
    row[CLIP_LOW] = c_lo
    row[CLIP_HIGH] = c_hi


@njit(cache=True, error_model="numpy")
def _combine_chunks(part):
    out = part[0].copy()
    for k in range(1, part.shape[0]):
        for j in range(MAX_ABS_ERR):
            out[j] += part[k, j]
        out[COUNT] += part[k, COUNT]
        out[NONFINITE] += part[k, NONFINITE]
        out[CLIP_LOW] += part[k, CLIP_LOW]
        out[CLIP_HIGH] += part[k, CLIP_HIGH]
        out[MAX_ABS_ERR] = max(out[MAX_ABS_ERR], part[k, MAX_ABS_ERR])
        out[REF_MIN] = min(out[REF_MIN], part[k, REF_MIN])
        out[TEST_MIN] = min(out[TEST_MIN], part[k, TEST_MIN])
        out[REF_MAX] = max(out[REF_MAX], part[k, REF_MAX])
        out[TEST_MAX] = max(out[TEST_MAX], part[k, TEST_MAX])
    return out


@njit(parallel=True, cache=True, error_model="numpy")
def _pair_stats(ref, test, dequantize, scale, zero_point, lo, hi):
    n = ref.size
    nchunks = max(1, (n + CHUNK - 1) // CHUNK)
    part = np.zeros((nchunks, STATS), np.float64)
    for k in prange(nchunks):
        _chunk_stats(ref, test, dequantize, scale, zero_point, lo, hi, k * CHUNK, min(n, (k + 1) * CHUNK), part[k])
    return _combine_chunks(part)


@njit(cache=True, error_model="numpy")
def _pair_stats_serial(ref, test, dequantize, scale, zero_point, lo, hi):
    n = ref.size
    nchunks = max(1, (n + CHUNK - 1) // CHUNK)
    part = np.zeros((nchunks, STATS), np.float64)
    for k in range(nchunks):
        _chunk_stats(ref, test, dequantize, scale, zero_point, lo, hi, k * CHUNK, min(n, (k + 1) * CHUNK), part[k])
    return _combine_chunks(part)


def _flat(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)


def pair_stats(
    ref: np.ndarray,
    test: np.ndarray,
    scale: float | None = None,
    zero_point: int = 0,
    clip_range: tuple[float, float] | None = None,
) -> np.ndarray:
    """Error statistics of ``test`` against ``ref`` (same number of elements).

    ``ref`` is float32. ``test`` is float32, or integer codes when ``scale``
    is given (dequantized as ``DequantizeLinear`` does with that scale and
    zero point). ``clip_range``: count the reference values below/above it
    (``CLIP_LOW``/``CLIP_HIGH``). Returns a float64 array of ``STATS`` slots.
    """
    lo, hi = (-np.inf, np.inf) if clip_range is None else (float(clip_range[0]), float(clip_range[1]))
    r = _flat(ref)
    t = _flat(test)
    if r.size != t.size:
        raise ValueError(f"pair_stats: {r.size} reference values but {t.size} test values")
    if r.dtype != np.float32:
        r = r.astype(np.float32)
    if scale is None:
        if t.dtype != np.float32:
            t = t.astype(np.float32)
        kernel = _pair_stats if r.size >= PARALLEL_MIN else _pair_stats_serial
        return kernel(r, t, False, np.float32(1.0), np.int64(0), lo, hi)
    if t.dtype.kind not in "iu":
        raise ValueError(f"pair_stats: codes must be integers, got {t.dtype}")
    kernel = _pair_stats if r.size >= PARALLEL_MIN else _pair_stats_serial
    return kernel(r, t, True, np.float32(scale), np.int64(zero_point), lo, hi)


@njit(cache=True, error_model="numpy")
def _chunk_histogram(x, lo, hi, nbins, start, stop, row):
    width = (hi - lo) / nbins
    for i in range(start, stop):
        v = np.float64(x[i])
        if v != v:
            continue
        if v < lo:
            row[nbins] += 1
        elif v > hi:
            row[nbins + 1] += 1
        else:
            b = int((v - lo) / width) if width > 0 else 0
            if b >= nbins:
                b = nbins - 1
            row[b] += 1


@njit(parallel=True, cache=True, error_model="numpy")
def _histogram(x, lo, hi, nbins, counts):
    n = x.size
    nchunks = max(1, (n + CHUNK - 1) // CHUNK)
    part = np.zeros((nchunks, nbins + 2), np.int64)
    for k in prange(nchunks):
        _chunk_histogram(x, lo, hi, nbins, k * CHUNK, min(n, (k + 1) * CHUNK), part[k])
    for k in range(nchunks):
        for j in range(nbins + 2):
            counts[j] += part[k, j]


@njit(cache=True, error_model="numpy")
def _histogram_serial(x, lo, hi, nbins, counts):
    _chunk_histogram(x, lo, hi, nbins, 0, x.size, counts)


def histogram_update(x: np.ndarray, lo: float, hi: float, counts: np.ndarray) -> None:
    """Add the values of ``x`` to ``counts`` (int64, ``nbins + 2``: bins, then under, over)."""
    nbins = counts.size - 2
    flat = _flat(x)
    kernel = _histogram if flat.size >= PARALLEL_MIN else _histogram_serial
    kernel(flat, np.float64(lo), np.float64(hi), nbins, counts)


@njit(cache=True, error_model="numpy")
def _argmax_row(x, i, cols):
    best = 0
    bv = x[i * cols]
    if bv == bv:
        for j in range(1, cols):
            v = x[i * cols + j]
            if v != v:
                return j
            if v > bv:
                bv = v
                best = j
    return best


@njit(parallel=True, cache=True, error_model="numpy")
def _argmax_rows(x, rows, cols, out):
    for i in prange(rows):
        out[i] = _argmax_row(x, i, cols)


@njit(cache=True, error_model="numpy")
def _argmax_rows_serial(x, rows, cols, out):
    for i in range(rows):
        out[i] = _argmax_row(x, i, cols)


def argmax_rows(x: np.ndarray) -> np.ndarray:
    """Top-1 index of each sample (first axis), over all its other elements flattened."""
    x = np.asarray(x)
    rows = x.shape[0] if x.ndim else 1
    flat = _flat(x)
    cols = flat.size // rows if rows else 0
    out = np.zeros(rows, np.int64)
    if rows and cols:
        kernel = _argmax_rows if flat.size >= PARALLEL_MIN else _argmax_rows_serial
        kernel(flat, rows, cols, out)
    return out


@njit(cache=True, error_model="numpy")
def _sorted_rows(x, rows, cols):
    descending = True
    ascending = True
    for i in range(rows):
        base = i * cols
        for j in range(1, cols):
            a = x[base + j - 1]
            b = x[base + j]
            if not a >= b:  # a NaN breaks both orders
                descending = False
            if not a <= b:
                ascending = False
            if not (descending or ascending):
                return 0
    return (1 if descending else 0) | (2 if ascending else 0)


SORTED_DESCENDING = 1
SORTED_ASCENDING = 2


def sorted_rows(x: np.ndarray) -> int:
    """Which orders every row (first axis; each row its other elements flattened) keeps: a mask of
    ``SORTED_DESCENDING`` (non-increasing) and ``SORTED_ASCENDING`` (non-decreasing); 0 as soon as neither
    holds (a classifier's logits: the first row or so). Serial: it stops early on all but sorted data."""
    x = np.asarray(x)
    rows = x.shape[0] if x.ndim else 1
    flat = _flat(x)
    cols = flat.size // rows if rows else 0
    if not rows or not cols:
        return SORTED_DESCENDING | SORTED_ASCENDING
    return int(_sorted_rows(flat, rows, cols))


@njit(cache=True, error_model="numpy")
def _count_equal(a, b):
    total = 0
    for i in range(a.size):
        total += a[i] == b[i]
    return total


def count_equal(a: np.ndarray, b: np.ndarray) -> int:
    """How many positions hold equal values (int64 arrays of one length; one value per sample)."""
    return int(_count_equal(_flat(a).astype(np.int64, copy=False), _flat(b).astype(np.int64, copy=False)))
