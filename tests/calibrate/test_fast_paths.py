"""The fast paths of histogram calibration give exactly (bit for bit) what the straightforward code gives.

- a batch below ``PARALLEL_MIN`` values is reduced (min/max) and counted on one thread, a larger one
  in parallel blocks: same counts, same min/max (signed zeros included);
- the MSE search gives a bin outside the nudged range the clamped FakeQuant
  value without calling the quantizer, and skips the empty slots at both ends:
  the same errors as ``calib_reference.mse_errors``;
- an observer's range does not depend on how the values were split into batches.
"""

from __future__ import annotations

import numpy as np
import pytest

import calib_reference as ref
from qtool.calibrate.observers import make_observer
from qtool.kernels import cpu
from qtool.kernels import histogram as hk
from qtool.kernels.histogram import Histogram


def awkward_batches():
    """Batches with NaN/inf, a constant tensor, signed zeros, one value, and a range that keeps growing."""
    rng = np.random.default_rng(7)
    big = rng.standard_normal(3 * hk.CHUNK + 11).astype(np.float32)
    big[5], big[hk.CHUNK + 3], big[-1] = np.nan, np.inf, -np.inf
    zeros = np.array([0.0, -0.0, 0.0, -0.0], np.float32)
    return [
        np.full(7, 0.25, np.float32),  # constant
        zeros,
        np.array([1e-3], np.float32),  # batch of one value
        big * 0.01,
        np.array([np.nan, np.nan], np.float32),  # no finite value
        big,  # the range grows: re-binning
        np.maximum(big, 0) * 50.0,  # grows again, a spike of zeros
        rng.laplace(0.0, 1e4, 2 * hk.CHUNK).astype(np.float32),
    ]


def build(batches, parallel_min, monkeypatch):
    monkeypatch.setattr(hk, "PARALLEL_MIN", parallel_min)
    h = Histogram(64)
    for b in batches:
        h.update(b)
    return h


def test_one_thread_and_parallel_blocks_count_the_same(monkeypatch):
    batches = awkward_batches()
    serial = build(batches, 1 << 62, monkeypatch)
    parallel = build(batches, 0, monkeypatch)
    assert serial.state() == parallel.state() and np.array_equal(serial.counts, parallel.counts)
    assert repr((serial.min, serial.max)) == repr((parallel.min, parallel.max))  # -0.0 is not 0.0 here
    assert serial.nonfinite == 3 + 3 + 2 + 2 and serial.total == sum(np.isfinite(b).sum() for b in batches)


def test_minmax_on_one_thread_equals_the_parallel_kernel():
    for b in awkward_batches():
        for x in (b, -b, b[::-1]):  # signed zeros: the last in memory order wins either way
            x = np.ascontiguousarray(x)
            assert repr(cpu.minmax_tensor_serial(x)) == repr(cpu.minmax_tensor(x))
    z = np.zeros(3 * cpu.CHUNK, np.float32)
    z[-cpu.CHUNK] = -0.0
    assert repr(cpu.minmax_tensor_serial(z)) == repr(cpu.minmax_tensor(z))


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bits", [4, 8])
def test_mse_search_equals_the_straightforward_loop(symmetric, bits):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.laplace(0.5, 1.0, 5000), [40.0, -3e-4], np.zeros(50)]).astype(np.float32)
    h = Histogram(32).update(x)
    counts = h.nonzero_counts()
    lo, hi = min(h.min, 0.0), max(h.max, 0.0)
    f = np.array([1 / 128, 0.01, 0.05, 0.1, 0.3, 0.5, 0.77, 1.0])
    if symmetric:
        cl, ch = -f * max(-lo, hi), f * max(-lo, hi)
    else:
        cl = np.concatenate([np.maximum(-f * hi, lo), f * lo])
        ch = np.concatenate([np.minimum(f * hi, hi), np.full_like(f, hi)])
    args = (float(h.total), np.int64(h.k_lo), h.width, cl, ch, np.int64(bits))
    got = hk.mse_search(counts, *args, False, symmetric)
    want = ref.mse_errors(counts, h.k_lo, h.width, cl, ch, bits, False, symmetric, float(h.total))
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_ranges_do_not_depend_on_the_batch_split(method):
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.standard_normal(1500), rng.laplace(2.0, 5.0, 998), [np.nan, np.inf]]).astype(np.float32)
    x = x.reshape(-1, 4)  # rows are samples
    whole = make_observer(method, num_bins=256, num_bits=6)
    whole.update(x)
    ones = make_observer(method, num_bins=256, num_bits=6)
    for row in x:  # batch-1 runs, the range growing as the samples come
        ones.update(row[None])
    assert repr(whole.range()) == repr(ones.range())
