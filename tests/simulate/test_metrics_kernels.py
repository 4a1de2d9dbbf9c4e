"""The streaming metric kernels (qtool.kernels.metrics) against numpy float64 references."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qtool.kernels import metrics as m

floats32 = st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_infinity=False)


def reference(r, t):
    r, t = r.astype(np.float64).ravel(), t.astype(np.float64).ravel()
    e = r - t
    return {m.SUM_REF2: np.sum(r * r), m.SUM_TEST2: np.sum(t * t), m.SUM_ERR2: np.sum(e * e),
            m.DOT: np.sum(r * t), m.SUM_ABS_ERR: np.sum(np.abs(e)), m.MAX_ABS_ERR: np.max(np.abs(e)),
            m.COUNT: r.size, m.REF_MIN: r.min(), m.REF_MAX: r.max(), m.TEST_MIN: t.min(), m.TEST_MAX: t.max()}


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 3000), elements=floats32), st.data())
def test_pair_stats_matches_float64_sums(r, data):
    t = data.draw(hnp.arrays(np.float32, r.shape, elements=floats32))
    got = m.pair_stats(r, t)
    # DOT sums terms of both signs: its float64 rounding error is bounded by the sum of the
    # terms' magnitudes (n * eps * sum |r t|), not by the (possibly cancelled) result
    r64, t64 = r.astype(np.float64), t.astype(np.float64)
    dot_error = r.size * np.finfo(np.float64).eps * np.sum(np.abs(r64 * t64))
    for slot, want in reference(r, t).items():
        absolute = dot_error if slot == m.DOT else 1e-300
        assert got[slot] == pytest.approx(want, rel=1e-12, abs=absolute), slot
    assert got[m.NONFINITE] == 0


def test_codes_are_dequantized_like_dequantizelinear():
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, size=5000).astype(np.uint8)
    scale, zp = np.float32(0.0371), np.uint8(113)
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "dq",
        [helper.make_tensor_value_info("q", TensorProto.UINT8, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [float(scale)]), helper.make_tensor("z", TensorProto.UINT8, [], [int(zp)])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"q": codes})[0]
    ref = (y + rng.normal(0, 0.01, y.shape)).astype(np.float32)
    assert np.array_equal(m.pair_stats(ref, codes, scale, int(zp)), m.pair_stats(ref, y))


def test_parallel_and_serial_kernels_give_the_same_numbers():
    rng = np.random.default_rng(1)
    n = m.PARALLEL_MIN + 12345
    r = rng.normal(size=n).astype(np.float32)
    t = (r + rng.normal(0, 1e-2, n)).astype(np.float32)
    args = (r, t, False, np.float32(1), np.int64(0), -1.0, 1.0)
    assert np.array_equal(m._pair_stats(*args), m._pair_stats_serial(*args))
    h1 = np.zeros(18, np.int64)
    h2 = np.zeros(18, np.int64)
    m._histogram(r, -2.0, 2.0, 16, h1)
    m._histogram_serial(r, -2.0, 2.0, 16, h2)
    assert np.array_equal(h1, h2) and h1.sum() == n


def test_identical_tensors_have_no_error():
    x = np.linspace(-3, 3, 1000, dtype=np.float32)
    s = m.pair_stats(x, x)
    assert s[m.SUM_ERR2] == 0 and s[m.MAX_ABS_ERR] == 0 and s[m.SUM_REF2] > 0


def test_non_finite_pairs_are_counted_and_left_out():
    r = np.array([1, 2, np.inf, 4, np.nan], np.float32)
    t = np.array([1, 2, 3, 5, 5], np.float32)
    s = m.pair_stats(r, t, clip_range=(0.0, 3.0))
    assert s[m.NONFINITE] == 2 and s[m.COUNT] == 3
    assert s[m.SUM_ERR2] == 1.0 and s[m.MAX_ABS_ERR] == 1.0 and s[m.SUM_REF2] == 21.0
    assert s[m.CLIP_HIGH] == 2 and s[m.CLIP_LOW] == 0  # inf and 4 lie above the range


def test_combine_adds_batches():
    rng = np.random.default_rng(2)
    r = rng.normal(size=1000).astype(np.float32)
    t = rng.normal(size=1000).astype(np.float32)
    total = m.empty_stats()
    for i in range(0, 1000, 300):
        m.combine(total, m.pair_stats(r[i : i + 300], t[i : i + 300]))
    whole = m.pair_stats(r, t)
    assert total == pytest.approx(whole, rel=1e-12)


def test_argmax_rows_follows_numpy():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 3, size=(200, 7)).astype(np.float32)  # many ties
    x[5, 3] = np.nan
    x[9, 0] = np.nan
    assert np.array_equal(m.argmax_rows(x), np.argmax(x, axis=1))
    y = rng.normal(size=(4, 2, 3)).astype(np.float32)
    assert np.array_equal(m.argmax_rows(y), np.argmax(y.reshape(4, -1), axis=1))
    assert m.count_equal(np.array([1, 2, 3]), np.array([1, 0, 3])) == 2


def test_histogram_bins_and_outside_counts():
    x = np.array([-5, -1, -0.5, 0, 0.49, 0.5, 1, 7, np.nan], np.float32)
    h = np.zeros(4 + 2, np.int64)
    m.histogram_update(x, -1.0, 1.0, h)
    assert h.tolist() == [1, 1, 2, 2, 1, 1]  # [-1,-.5) [-.5,0) [0,.5) [.5,1] below above
