"""qtool's kernels against TensorFlow's own outputs, bit for bit.

The reference data ``tests/data/tf_vectors.npz`` was produced by running
TensorFlow 2.21 (CPU, eager) on a few hundred configurations; see
``tests/data/make_tf_vectors.py`` for how, and for the file layout.  TensorFlow
is not needed to run this test.

Every case replays one configuration through the forward op *and* its
gradient and compares:

* forward output and ``d_inputs``: bit-identical (compared as int32/int64
  views, so the sign of zero counts); where TF's output is NaN, qtool's must
  be NaN too (payloads are not compared);
* ``d_min``/``d_max`` (vars, per_channel): close (rtol 1e-5, atol 1e-6),
  since the spec allows any summation order.

Cases in group ``subnormal`` document that TF's CPU kernels flush subnormals
to zero (FTZ/DAZ): qtool's subnormal results are flushed to signed zero
before the comparison.  Group ``zero_sign`` (all-zero QDQ data mixing +0.0 and
-0.0, where TF's sign depends on Eigen's reduction order) is compared by value.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import qtool

DATA = Path(__file__).resolve().parent.parent / "data" / "tf_vectors.npz"

OPS = (
    "fake_quant_with_min_max_args",
    "fake_quant_with_min_max_vars",
    "fake_quant_with_min_max_vars_per_channel",
    "quantize_and_dequantize_v2",
)
GROUPS = ("exact", "nan", "subnormal", "zero_sign")
SHORT = {
    "fake_quant_with_min_max_args": "fq_args",
    "fake_quant_with_min_max_vars": "fq_vars",
    "fake_quant_with_min_max_vars_per_channel": "fq_per_channel",
    "quantize_and_dequantize_v2": "qdq_v2",
}


def _load():
    with np.load(DATA) as z:
        meta = json.loads(str(z["meta"]))
        n = int(meta["num_cases"])
        ops, attrs = z["op"], z["attrs"]
        groups, labels = z["group"], z["label"]
        assert len(ops) == len(attrs) == len(groups) == len(labels) == n
        cases = [
            dict(index=i, op=str(ops[i]), attrs=json.loads(str(attrs[i])),
                 group=str(groups[i]), label=str(labels[i]), arrays={})
            for i in range(n)
        ]
        for key in z.files:
            if key.startswith("case"):
                prefix, name = key.split("/", 1)
                cases[int(prefix[4:])]["arrays"][name] = z[key]
    return meta, cases


META, CASES = _load()


def _case_id(case):
    a = case["attrs"]
    parts = [f"{case['index']:04d}", SHORT.get(case["op"], case["op"]), case["group"],
             case["label"].replace("/", ".")]
    if "num_bits" in a:
        parts.append(f"nb{a['num_bits']}")
    if a.get("narrow_range"):
        parts.append("narrow")
    if "signed_input" in a:
        parts.append("signed" if a["signed_input"] else "unsigned")
    if "range_given" in a:
        parts.append("given" if a["range_given"] else "datarange")
    if "round_mode" in a:
        parts.append(a["round_mode"])
    if "axis" in a:
        parts.append(f"axis{a['axis']}")
    x = case["arrays"]["x"]
    parts.append(f"{x.dtype.name}_{'x'.join(map(str, x.shape))}")
    return "-".join(parts)


def _bits(a):
    return a.view(np.int64 if a.dtype == np.float64 else np.int32)


def _flush_subnormals(a):
    tiny = np.finfo(a.dtype).tiny
    return np.where(np.abs(a) < tiny, np.copysign(a.dtype.type(0), a), a)


def _hex(v):
    v = np.asarray(v)
    return f"{v.view(np.uint64 if v.dtype == np.float64 else np.uint32).item():#x}"


def _mismatch_report(what, x, actual, expected, bad):
    idx = np.argwhere(bad.reshape(expected.shape))[:10]
    lines = [f"{what}: {int(bad.sum())} of {bad.size} elements differ, e.g."]
    for i in (tuple(int(j) for j in row) for row in idx):
        lines.append(
            f"  at {i}: x={x[i]!r} expected(TF)={expected[i]!r} "
            f"[{_hex(expected[i])}] qtool={actual[i]!r} [{_hex(actual[i])}]")
    return "\n".join(lines)


def _compare_exact(what, x, actual, expected, group, errors):
    actual = np.asarray(actual)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        errors.append(f"{what}: qtool gave {actual.dtype}{actual.shape}, "
                      f"TF {expected.dtype}{expected.shape}")
        return
    if group == "zero_sign":
        bad = ~(actual == expected)
    else:
        if group == "subnormal":
            actual = _flush_subnormals(actual)
        a_nan, e_nan = np.isnan(actual), np.isnan(expected)
        bad = (a_nan != e_nan) | (~a_nan & ~e_nan & (_bits(actual) != _bits(expected)))
    if bad.any():
        errors.append(_mismatch_report(what, x, actual, expected, bad))


def _compare_sum(what, actual, expected, errors):
    actual = np.asarray(actual)
    if actual.shape != expected.shape:
        errors.append(f"{what}: qtool shape {actual.shape}, TF shape {expected.shape}")
        return
    if not np.allclose(actual, expected, rtol=1e-5, atol=1e-6):
        errors.append(f"{what}: qtool {actual!r} vs TF {expected!r}")


def _run_fake_quant(case):
    op, attrs, arr = case["op"], dict(case["attrs"]), case["arrays"]
    x, g = arr["x"], arr["grad"]
    fwd = getattr(qtool, op)
    bwd = getattr(qtool, op + "_gradient")
    if op == "fake_quant_with_min_max_args":
        # a missing min/max in the data means TF's default range was used
        if "min" in arr:
            attrs.update(min=float(arr["min"]), max=float(arr["max"]))
        out = fwd(x.copy(), **attrs)
        d_inputs = bwd(g.copy(), x.copy(), **attrs)
        return out, d_inputs, None, None
    mn, mx = arr["min"], arr["max"]
    out = fwd(x.copy(), mn.copy(), mx.copy(), **attrs)
    d_inputs, d_min, d_max = bwd(g.copy(), x.copy(), mn.copy(), mx.copy(), **attrs)
    return out, d_inputs, d_min, d_max


def _run_qdq(case):
    attrs, arr = case["attrs"], case["arrays"]
    x, g, mn, mx = arr["x"], arr["grad"], arr["min"], arr["max"]
    out = qtool.quantize_and_dequantize_v2(x.copy(), mn.copy(), mx.copy(), **attrs)
    gkw = {"axis": attrs["axis"]} if "axis" in attrs else {}
    d_inputs = qtool.quantize_and_dequantize_v2_gradient(
        g.copy(), x.copy(), mn.copy(), mx.copy(), **gkw)
    return out, d_inputs, None, None


def test_dataset_is_substantial():
    """Guard against a vacuous pass: the data set must be large and complete."""
    assert len(CASES) == META["num_cases"] >= 200
    per_op = Counter(c["op"] for c in CASES)
    assert set(per_op) == set(OPS), per_op
    assert min(per_op.values()) >= 50, per_op
    per_group = Counter(c["group"] for c in CASES)
    assert set(per_group) <= set(GROUPS), per_group
    assert per_group["exact"] >= 200 and per_group["nan"] >= 4, per_group
    for c in CASES:
        arr = c["arrays"]
        assert {"x", "out", "grad", "d_inputs"} <= set(arr), c["index"]
        assert arr["x"].size > 0 and arr["x"].shape == arr["out"].shape == arr["d_inputs"].shape
        if c["op"] in OPS[1:3]:
            assert {"min", "max", "d_min", "d_max"} <= set(arr), c["index"]
    # every num_bits 2..16 and both narrow_range values, for every FakeQuant op
    for op in OPS[:3]:
        seen = {(c["attrs"].get("num_bits"), c["attrs"].get("narrow_range"))
                for c in CASES if c["op"] == op}
        assert {(b, n) for b in range(2, 17) for n in (False, True)} <= seen, op


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_matches_tensorflow(case):
    arr, group = case["arrays"], case["group"]
    if case["op"] == "quantize_and_dequantize_v2":
        out, d_inputs, d_min, d_max = _run_qdq(case)
    else:
        out, d_inputs, d_min, d_max = _run_fake_quant(case)
    errors: list[str] = []
    x = arr["x"]
    _compare_exact("forward output", x, out, arr["out"], group, errors)
    _compare_exact("d_inputs", x, d_inputs, arr["d_inputs"], group, errors)
    if "d_min" in arr:
        _compare_sum("d_min", d_min, arr["d_min"], errors)
        _compare_sum("d_max", d_max, arr["d_max"], errors)
    if errors:
        args = {k: (v.tolist() if v.ndim <= 1 and v.size <= 16 else f"{v.dtype}{v.shape}")
                for k, v in arr.items() if k in ("min", "max")}
        pytest.fail(f"{case['op']} {case['attrs']} {args} (case {case['index']}, "
                    f"{case['label']}):\n" + "\n".join(errors), pytrace=False)
