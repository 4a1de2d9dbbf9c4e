"""Calibration methods: streaming histograms and their ranges against straightforward numpy versions."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from qtool.calibrate.observers import EmaObserver, make_observer
from qtool.errors import QtoolError
from qtool.kernels.histogram import Histogram, entropy_range, histogram, mse_range, percentile_range

import calib_reference as ref

N = 200_000


def gaussian_with_outlier(n=N, seed=0):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    x[n // 3] = 40.0
    return x


def uniform(n=N, seed=1):
    return np.random.default_rng(seed).uniform(-1.0, 3.0, n).astype(np.float32)


def laplacian(n=N, seed=2):
    return np.random.default_rng(seed).laplace(0.5, 1.0, n).astype(np.float32)


def relu_like(n=N, seed=3):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 2
    return np.maximum(x, 0)


DISTRIBUTIONS = {"gaussian+outlier": gaussian_with_outlier, "uniform": uniform, "laplacian": laplacian,
                 "relu": relu_like}


def batches(x, sizes_seed=0):
    """``x`` cut into uneven batches, reordered so that the range keeps widening."""
    rng = np.random.default_rng(sizes_seed)
    cuts = np.sort(rng.choice(np.arange(1, x.size), 11, replace=False))
    parts = np.split(x, cuts)
    parts.sort(key=lambda p: float(np.ptp(p)) if p.size else 0.0)  # narrow ranges first: forces re-binning
    return parts


# --- the histogram ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_histogram_counts_equal_numpy_histogram_on_its_own_edges(name):
    x = DISTRIBUTIONS[name]()
    h = histogram(x, 512)
    counts, _ = np.histogram(x.astype(np.float64), bins=h.edges())
    # np.histogram closes the last bin on the right; qtool's bins are all half-open
    assert np.array_equal(counts, h.counts) or (counts.sum() == h.counts.sum() and
                                                np.abs(counts - h.counts).sum() <= 2)
    assert h.total == x.size and h.min == x.min() and h.max == x.max()
    used = math.floor(h.max / h.width) - math.floor(h.min / h.width) + 1
    assert 512 <= used <= 1024  # the range spans between num_bins and 2 * num_bins bins


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_many_batches_with_different_ranges_give_the_same_histogram_as_one(name):
    x = DISTRIBUTIONS[name]()
    one = histogram(x)
    many = Histogram()
    for part in batches(x):
        many.update(part)
    assert (many.e, many.k_lo, many.total, many.zeros) == (one.e, one.k_lo, one.total, one.zeros)
    assert np.array_equal(many.counts, one.counts)  # exact re-binning: no mass lost or moved
    assert many.percentile_range(99.99) == one.percentile_range(99.99)
    assert many.entropy_range() == one.entropy_range()


def test_merging_histograms_built_apart_is_exact():
    x = laplacian()
    a, b = histogram(x[: N // 4] * 0.01), histogram(x[N // 4 :])
    whole = histogram(np.concatenate([x[: N // 4] * 0.01, x[N // 4 :]]))
    a.merge(b)
    assert np.array_equal(a.counts, whole.counts) and (a.e, a.k_lo) == (whole.e, whole.k_lo)


def test_nan_and_inf_are_skipped_and_tallied():
    x = np.array([np.nan, -np.inf, 1.0, -2.0, np.inf, 0.0], np.float32)
    h = histogram(x, 64)
    assert (h.total, h.nonfinite, h.zeros, h.min, h.max) == (3, 3, 1, -2.0, 1.0)
    empty = histogram(np.array([np.nan], np.float32), 64)
    assert empty.total == 0 and percentile_range(empty) is None and mse_range(empty) is None


def test_constant_and_tiny_and_huge_tensors():
    for value in (0.0, 3.0, -1e-30, 1e30):
        h = histogram(np.full(1000, value, np.float32), 64)
        assert h.counts.sum() == 1000
        assert percentile_range(h, 99.0) == (float(np.float32(value)),) * 2
    h = histogram(np.array([1e30, -1e30, 1e-30], np.float32), 64)
    assert h.counts.sum() == 3


# --- percentile -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("p", [99.0, 99.99, 99.999])
def test_percentile_matches_numpy_within_one_bin(name, p):
    x = DISTRIBUTIONS[name]()
    h = histogram(x)
    lo, hi = percentile_range(h, p)
    want_lo, want_hi = ref.percentile_range(x, p)
    assert abs(lo - want_lo) <= h.width and abs(hi - want_hi) <= h.width


def test_percentile_known_answers():
    lo, hi = percentile_range(histogram(uniform()), 99.0)
    assert lo == pytest.approx(-0.98, abs=0.01) and hi == pytest.approx(2.98, abs=0.01)
    lo, hi = percentile_range(histogram(gaussian_with_outlier()), 99.9)  # +-3.29 sigma; the outlier is cut
    assert lo == pytest.approx(-3.29, abs=0.06) and hi == pytest.approx(3.29, abs=0.06)
    assert percentile_range(histogram(uniform()), 100.0) == (float(uniform().min()), float(uniform().max()))


# --- entropy --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_entropy_matches_the_straightforward_kl_search(name):  # 7 bits, 512 bins: a quick reference
    x = DISTRIBUTIONS[name]()
    h = histogram(x, 512)
    got, (ts, kls) = entropy_range(h, num_bits=7, return_curve=True)
    want, ref_ts, ref_kls = ref.entropy_range(h.nonzero_counts(), h.edges(), h.min, h.max, num_bits=7)
    same = np.searchsorted(ts, ref_ts)
    assert np.array_equal(ts[same], ref_ts)  # every valid threshold is a candidate
    assert np.isfinite(kls[same]).any() and np.array_equal(np.isinf(kls[same]), np.isinf(ref_kls))
    finite = np.isfinite(ref_kls)
    assert np.allclose(kls[same][finite], ref_kls[finite], rtol=1e-9, atol=1e-12)
    assert np.isinf(np.delete(kls, same)).all()  # the others hold fewer than 2**bits bins
    assert abs(got[0] - want[0]) <= h.width and abs(got[1] - want[1]) <= h.width


def test_entropy_clips_an_outlier_and_keeps_a_uniform_range():
    lo, hi = entropy_range(histogram(gaussian_with_outlier()))
    assert 2.5 < hi < 8.0 and -8.0 < lo < -2.5  # far below the outlier at 40
    lo, hi = entropy_range(histogram(uniform()))
    assert lo == pytest.approx(-1.0, abs=0.02) and hi == pytest.approx(3.0, abs=0.05)


def test_entropy_cannot_degenerate_to_min_max():
    # onnxruntime's EntropyCalibrater defaults (128 bins, 128 quantized bins) return min/max here
    with pytest.raises(ValueError, match="at least 1024 histogram bins"):
        entropy_range(histogram(gaussian_with_outlier(), 128))
    with pytest.raises(QtoolError, match="--num-bins >= 1024"):
        make_observer("entropy", num_bins=256)
    x = gaussian_with_outlier()
    assert entropy_range(histogram(x, 1024))[1] < 0.25 * x.max()


def test_entropy_on_discrete_data_is_min_max():
    x = np.random.default_rng(0).integers(0, 17, N).astype(np.float32) / 16  # 17 levels, like 8x8 digits
    assert entropy_range(histogram(x)) == (0.0, 1.0)


# --- mse ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("bits", [4, 8])
def test_mse_range_is_as_good_as_a_brute_force_search_on_the_samples(name, bits):
    x = DISTRIBUTIONS[name](20_000)
    lo, hi = mse_range(histogram(x), num_bits=bits)
    best, _, _ = ref.mse_range(x, num_bits=bits, steps=300)
    got = ref.mse(x, lo, hi, bits)
    assert got <= best * 1.02 + 1e-12
    assert ref.mse(x, float(x.min()), float(x.max()), bits) >= got  # never worse than min/max


def test_mse_error_estimate_is_the_quantizer_error():
    x = laplacian(50_000)
    lo, hi, err = mse_range(histogram(x), num_bits=6, return_error=True)
    assert err == pytest.approx(ref.mse(x, lo, hi, 6), rel=0.05)


def test_mse_known_answers():
    lo, hi = mse_range(histogram(uniform()), num_bits=8)  # a uniform wants its whole range
    assert lo == pytest.approx(-1.0, abs=0.03) and hi == pytest.approx(3.0, abs=0.03)
    lo, hi = mse_range(histogram(gaussian_with_outlier(1_000_000)), num_bits=4)
    assert hi < 10.0  # at 4 bits one outlier in a million is not worth 16x coarser steps


def test_symmetric_searches_return_ranges_in_the_observed_range():
    x = relu_like()
    for fn in (entropy_range, mse_range):
        lo, hi = fn(histogram(x), symmetric=True)
        assert lo == 0.0 and 0 < hi <= x.max()


# --- observers --------------------------------------------------------------------------------
def test_ema_is_tf_moving_average_zero_debiased():
    parts = batches(laplacian(), 3)
    obs = EmaObserver(ema_decay=0.9)
    m_lo = m_hi = 0.0
    for k, p in enumerate(parts, 1):
        obs.update(p)
        m_lo = 0.9 * m_lo + 0.1 * min(float(p.min()), 0.0)
        m_hi = 0.9 * m_hi + 0.1 * max(float(p.max()), 0.0)
    lo, hi = obs.range()
    debias = 1 - 0.9 ** len(parts)
    assert lo == pytest.approx(m_lo / debias, rel=1e-12) and hi == pytest.approx(m_hi / debias, rel=1e-12)
    first = EmaObserver()
    first.update(np.array([-1.0, 2.0], np.float32))
    assert first.range() == pytest.approx((-1.0, 2.0))
    with pytest.raises(QtoolError, match="ema-decay"):
        EmaObserver(ema_decay=1.0)


@pytest.mark.parametrize("method", ["percentile", "entropy", "mse"])
def test_histogram_observers_match_the_kernels(method):
    x = laplacian()
    obs = make_observer(method, num_bins=2048, percentile=99.9, num_bits=8, symmetric=False)
    for p in batches(x):
        obs.update(p.reshape(-1, 10) if p.size % 10 == 0 else p)
    h = histogram(x)
    want = {"percentile": lambda: percentile_range(h, 99.9), "entropy": lambda: entropy_range(h),
            "mse": lambda: mse_range(h)}[method]()
    assert obs.range() == pytest.approx(want)


def test_histogram_observer_memory_is_flat_in_the_number_of_batches():
    def peak(n):
        obs = make_observer("percentile")
        chunk = np.random.default_rng(0).standard_normal(50_000).astype(np.float32)
        obs.update(chunk)
        tracemalloc.start()
        for k in range(n):
            obs.update(chunk * (1 + k / n))
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    assert peak(40) < peak(4) * 1.2 + 50_000
