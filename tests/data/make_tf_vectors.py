"""Generate ``tf_vectors.npz``: TensorFlow reference outputs for qtool's kernels.

TensorFlow is *not* a dependency of qtool.  This script is run by hand, once,
in a separate environment that has TensorFlow (it was run with TensorFlow
2.21.0, CPU, eager mode), and its output file is committed::

    /path/to/tf-venv/bin/python tests/data/make_tf_vectors.py

The generation is deterministic (fixed numpy seed, no TF randomness).
``tests/kernels/test_tf_vectors.py`` replays every case through qtool and
compares the results bit for bit.

Layout of the npz
-----------------
``meta``: a 0-d unicode array holding a JSON object (TF and numpy versions,
seed, ``num_cases``).  The per-case strings are stored once, as 1-D unicode
arrays with one entry per case (a zip member per small string would double
the file size):

``op[i]``     the TF function name, one of ``fake_quant_with_min_max_args``,
              ``fake_quant_with_min_max_vars``,
              ``fake_quant_with_min_max_vars_per_channel``,
              ``quantize_and_dequantize_v2``.  Every case covers the forward
              op *and* its gradient (``<op>_gradient``).
``attrs[i]``  JSON object with the remaining keyword arguments exactly as
              passed to TF (TF's names: ``num_bits``, ``narrow_range``,
              ``signed_input``, ``range_given``, ``round_mode``, ``axis``).
              Keys not present were not passed (TF's default applies).
``group[i]``  how the test compares the outputs:

              ``exact``      bit-identical (``NaN`` never occurs).
              ``nan``        NaN in the input (or +-inf that makes QDQ's
                             computed range infinite): positions where TF
                             gives NaN must be NaN, the rest bit-identical.
              ``subnormal``  subnormal inputs / upstream gradients.  TF's CPU
                             kernels run with flush-to-zero and
                             denormals-are-zero, so a subnormal result of TF
                             is ``+-0``; the test flushes qtool's subnormal
                             results to signed zero before comparing.
              ``zero_sign``  QDQ with ``range_given=False`` on all-zero data
                             mixing ``+0.0`` and ``-0.0``: the sign of the
                             computed ``max(x)`` (and so of the output zeros)
                             depends on Eigen's reduction order; compared by
                             value only.
``label[i]``  a short description (range kind, source) used in test ids.

The arrays of case ``i`` (``0 <= i < num_cases``) have keys with the prefix
``case{i:04d}/``:

``x``       the input tensor (float32; float64 for some QDQ cases).
``min``,``max``
            FakeQuant ``min``/``max`` (0-d float32 for args/vars, 1-D for
            per_channel) or QDQ ``input_min``/``input_max`` (0-d, or 1-D of
            length ``x.shape[axis]``, in ``x``'s dtype; with
            ``range_given=False`` only the gradient's mask uses them).  For
            ``args`` a missing ``min``/``max`` key means TF's default was used
            (the argument was not passed).
``out``     TF's forward output.
``grad``    the upstream gradient fed to the gradient op.
``d_inputs``  gradient w.r.t. the input: ``<op>_gradient(grad, x, ...)``
            for FakeQuant (first output), ``tf.GradientTape`` on
            ``quantize_and_dequantize_v2`` for QDQ (TF runs
            ``QuantizeAndDequantizeV4Grad``).
``d_min``,``d_max``
            only for vars / per_channel: the gradient sums w.r.t. min/max.

What is deliberately *not* in the file: configurations that the spec
(``kernels.md``) calls errors, ``vars``/``per_channel`` with ``min >= max``
(TF returns garbage) except ``min == max == 0`` (defined: zeros, d_inputs = g),
QDQ with vector ranges and ``range_given=True`` (TF 2.21 rejects them), QDQ
with ``range_given=False`` and NaN in the data (TF's min/max reductions
propagate NaN or not depending on the NaN's position), unsigned QDQ with
``range_given=False`` on all-negative data, and QDQ with a given range of
``[0, 0]`` (every output is a signed zero chosen by the clamp's tie rule).

Worth knowing when reading the data: TF's clamps are Eigen's
``cwiseMin``/``cwiseMax`` with ``std::min``/``std::max`` semantics, which
return the *input* when it compares equal to the bound: a ``-0.0`` input
clamped to a ``+0.0`` bound stays ``-0.0`` (visible in unsigned QDQ with
``range_given=True``, whose lower bound is ``+0.0``), and a NaN input stays
NaN.  ``numpy.maximum(-0.0, 0.0)`` returns ``+0.0``.  Other TF behaviour
observed while making the data (all of it consistent with kernels.md):

* NaN inputs: FakeQuant (all three) and QDQ with ``range_given=True``
  propagate NaN to the output at the NaN's position, deterministically; the
  gradients mask NaN out (``g * 0``) and leave it out of ``d_min``/``d_max``.
* FakeQuant never outputs ``-0.0`` (``floor(v + 0.5)`` is never ``-0``);
  ``-0.0`` appears in ``d_inputs`` (masked negative ``g``) and in QDQ outputs
  (``rint(-0.3) == -0.0``, ``-0.0`` inputs).
* FakeQuant ``vars``/``per_channel`` treat ``min == max == 0`` per tensor /
  per channel as "zeros, d_inputs = g", also for ``min == -0.0``.
* QDQ float64 uses ``std::numeric_limits<double>::max()`` as the "no scale from
  this side" value (kernels.md writes FLT_MAX); three ``f64_below_flt_range*``
  cases (data or ranges around 1e-40, fine in double) only match with it.
* ``tf.quantization.quantize_and_dequantize_v2`` with a negative ``axis`` and
  a *numpy* input fails in TF 2.21's Python wrapper (AttributeError on
  ``shape.ndims``); with a ``tf.constant`` input it works, as used here.
* TF's CPU kernels flush subnormals (FTZ/DAZ): e.g. a subnormal upstream
  gradient gives ``d_inputs == 0``, and ``x = -1e-45`` counts as inside a
  range whose nudged minimum is 0.  Only the ``subnormal`` group has
  subnormals; inputs next to range ends skip the subnormal floats.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SEED = 20240611
HERE = os.path.dirname(os.path.abspath(__file__))
OUT_PATH = os.path.join(HERE, "tf_vectors.npz")

F32 = np.float32
rng = np.random.default_rng(SEED)


# --------------------------------------------------------------------------
# Spec helpers (float32), only used to place inputs on interesting points.
# --------------------------------------------------------------------------
def round_half_away(v):
    return np.sign(v) * np.floor(np.abs(v) + F32(0.5))


def fq_nudge(mn, mx, num_bits, narrow):
    """Nudged range of kernels.md 1.1, float32."""
    mn, mx = F32(mn), F32(mx)
    qmin = F32(1 if narrow else 0)
    qmax = F32(2**num_bits - 1)
    scale = (mx - mn) / (qmax - qmin)
    inv_scale = (qmax - qmin) / (mx - mn)
    zp_from_min = qmin - mn / scale
    if zp_from_min < qmin:
        zp = qmin
    elif zp_from_min > qmax:
        zp = qmax
    else:
        zp = F32(round_half_away(zp_from_min))
    nmin = (qmin - zp) * scale
    nmax = (qmax - zp) * scale
    quant_zero = np.floor(-nmin * inv_scale + F32(0.5))
    return dict(nmin=F32(nmin), nmax=F32(nmax), scale=F32(scale),
                inv_scale=F32(inv_scale), quant_zero=F32(quant_zero),
                levels=int(qmax - qmin))


def fq_pre_round(x, p, divide):
    """The value that FakeQuant rounds (before +0.5 and floor)."""
    x = np.asarray(x, F32)
    clamped = np.maximum(np.minimum(x, p["nmax"]), p["nmin"])
    shifted = clamped - p["nmin"]
    if divide:
        v = shifted / p["scale"]
    else:
        v = shifted * p["inv_scale"]
    return v - p["quant_zero"]


def next_normal(v, direction, dtype):
    """The next float after v, skipping subnormals (TF flushes them to 0)."""
    w = np.nextafter(v, dtype(direction))
    tiny = np.finfo(dtype).tiny
    if 0 < abs(w) < tiny:
        w = np.copysign(tiny if abs(w) > abs(v) else dtype(0.0), w)
    return dtype(w)


def neighbours(x0, k, dtype):
    """x0 and its k (normal) float neighbours on each side."""
    out = [dtype(x0)]
    up = down = dtype(x0)
    for _ in range(k):
        up = next_normal(up, np.inf, dtype)
        down = next_normal(down, -np.inf, dtype)
        out += [up, down]
    return out


def is_tie(v):
    v = np.asarray(v)
    return np.isfinite(v) & (v - np.floor(v) == 0.5)


def fq_ties(p, divide, n):
    """Inputs whose pre-round value is exactly j + 0.5 (plus near misses)."""
    vals = []
    levels = p["levels"]
    for _ in range(n):
        k = int(rng.integers(0, levels))
        x0 = F32(p["nmin"] + (F32(k) + F32(0.5)) * p["scale"])
        cands = neighbours(x0, 6, F32)
        hits = [c for c in cands if is_tie(fq_pre_round(c, p, divide))]
        if hits:
            vals.append(hits[int(rng.integers(0, len(hits)))])
            # a neighbour that rounds the other way
            vals.append(next_normal(hits[0], -np.inf, F32))
        else:
            vals.append(x0)
    return vals


def fq_inputs(p, divide, n, allow_inf=True):
    """A mix of interesting inputs for one nudged range, length n (n >= 16)."""
    nmin, nmax, scale = p["nmin"], p["nmax"], p["scale"]
    width = F32(nmax - nmin)
    specials = [F32(0.0), F32(-0.0), nmin, nmax]
    specials += neighbours(nmin, 2, F32)[1:] + neighbours(nmax, 2, F32)[1:]
    specials += [F32(1e30), F32(-1e30), F32(np.finfo(F32).max), F32(-np.finfo(F32).max)]
    if allow_inf:
        specials += [F32(np.inf), F32(-np.inf)]
    m = max(0, n - len(specials))
    vals = list(fq_ties(p, divide, max(1, m // 6)))
    k = rng.integers(0, p["levels"] + 1, size=max(1, m // 8))
    vals += list((nmin + k.astype(F32) * scale).astype(F32))
    vals += list(rng.uniform(nmin - width, nmin, size=max(1, m // 12)).astype(F32))
    vals += list(rng.uniform(nmax, nmax + width, size=max(1, m // 12)).astype(F32))
    vals = np.array(vals, F32)
    if len(vals) < m:
        vals = np.concatenate([vals, rng.uniform(nmin - width / 8, nmax + width / 8,
                                                 size=m - len(vals)).astype(F32)])
    vals = rng.permutation(vals)[:m]
    vals = np.concatenate([vals, np.array(specials, F32)])
    return rng.permutation(vals).astype(F32)


def upstream(shape, dtype=F32):
    # multiples of 1/16 (compresses well; the sums are compared with a tolerance)
    g = (rng.integers(-64, 65, size=shape) / 16 * rng.choice([0.5, 1.0, 3.0])).astype(dtype)
    flat = g.reshape(-1)
    if flat.size >= 8:
        idx = rng.choice(flat.size, 3, replace=False)
        flat[idx[0]] = 0.0
        flat[idx[1]] = -0.0
        flat[idx[2]] = -1.0
    return g


# --------------------------------------------------------------------------
# Range kinds
# --------------------------------------------------------------------------
FQ_KINDS = ["zero_inside", "symmetric", "positive", "negative", "tiny", "huge",
            "asymmetric", "pow2", "edge_zero"]


def fq_range(kind, num_bits, narrow):
    u = lambda a, b: float(rng.uniform(a, b))  # noqa: E731
    if kind == "zero_inside":
        return F32(-u(0.05, 10)), F32(u(0.05, 10))
    if kind == "symmetric":
        a = F32(rng.choice([1.0, 6.0, 0.5, u(0.1, 8)]))
        return -a, a
    if kind == "positive":
        lo = u(0.01, 5)
        return F32(lo), F32(lo + u(0.1, 10))
    if kind == "negative":
        hi = -u(0.01, 5)
        return F32(hi - u(0.1, 10)), F32(hi)
    if kind == "tiny":
        c = rng.choice([-3e-7, -5e-7, 1e-3, -2e-3])
        return F32(c), F32(F32(c) + F32(1e-6))
    if kind == "huge":
        return [(F32(-1e6), F32(1e6)), (F32(-2.5e5), F32(1e6)),
                (F32(-1e6), F32(3e4)), (F32(1e5), F32(1e6))][int(rng.integers(0, 4))]
    if kind == "asymmetric":
        a, b = F32(-u(0.001, 0.2)), F32(u(20, 100))
        return (a, b) if rng.random() < 0.5 else (-b, -a)
    if kind == "pow2":
        qmin = 1 if narrow else 0
        qmax = 2**num_bits - 1
        scale = F32(2.0 ** int(rng.integers(-8, 3)))
        zp = int(rng.integers(qmin, qmax + 1))
        return F32((qmin - zp) * scale), F32((qmax - zp) * scale)
    if kind == "edge_zero":
        return (F32(0.0), F32(u(0.1, 10))) if rng.random() < 0.5 else (F32(-u(0.1, 10)), F32(0.0))
    raise ValueError(kind)


# --------------------------------------------------------------------------
# TF runners
# --------------------------------------------------------------------------
cases: list[dict] = []


def tfc(a):
    return tf.constant(a)


def np_(t):
    return np.array(t.numpy())


def add_fq(op, x, mn, mx, attrs, group="exact", label="", g=None, pass_range=True):
    x = np.array(x, F32)  # copies: callers may reuse their arrays
    g = upstream(x.shape) if g is None else np.array(g, F32)
    case = dict(op=op, group=group, label=label, x=x, attrs=attrs, grad=g)
    q = tf.quantization
    if op == "fake_quant_with_min_max_args":
        kw = dict(attrs)
        if pass_range:
            kw.update(min=float(mn), max=float(mx))
            case.update(min=np.array(mn, F32), max=np.array(mx, F32))
        case["out"] = np_(q.fake_quant_with_min_max_args(tfc(x), **kw))
        case["d_inputs"] = np_(q.fake_quant_with_min_max_args_gradient(tfc(g), tfc(x), **kw))
    elif op in ("fake_quant_with_min_max_vars", "fake_quant_with_min_max_vars_per_channel"):
        mn = np.asarray(mn, F32)
        mx = np.asarray(mx, F32)
        case.update(min=mn, max=mx)
        fwd = getattr(q, op)
        bwd = getattr(q, op + "_gradient")
        case["out"] = np_(fwd(tfc(x), tfc(mn), tfc(mx), **attrs))
        di, dmn, dmx = bwd(tfc(g), tfc(x), tfc(mn), tfc(mx), **attrs)
        case.update(d_inputs=np_(di), d_min=np_(dmn), d_max=np_(dmx))
    else:
        raise ValueError(op)
    assert case["out"].shape == x.shape and case["out"].dtype == F32
    cases.append(case)
    return case


def add_qdq(x, mn, mx, attrs, group="exact", label="", g=None):
    x = np.array(x)  # copies: callers may reuse their arrays
    dt = x.dtype.type
    mn = np.array(mn, dt)
    mx = np.array(mx, dt)
    g = upstream(x.shape, dt) if g is None else np.array(g, dt)
    xt, mnt, mxt = tfc(x), tfc(mn), tfc(mx)
    out = np_(tf.quantization.quantize_and_dequantize_v2(xt, mnt, mxt, **attrs))
    with tf.GradientTape() as tape:
        tape.watch([xt, mnt, mxt])
        y = tf.quantization.quantize_and_dequantize_v2(xt, mnt, mxt, **attrs)
    di, dmn, dmx = tape.gradient(y, [xt, mnt, mxt], output_gradients=tfc(g))
    assert not np.any(np_(dmn)) and not np.any(np_(dmx)), "QDQ min/max grads should be 0"
    assert out.shape == x.shape and out.dtype == x.dtype
    case = dict(op="quantize_and_dequantize_v2", group=group, label=label, x=x,
                min=mn, max=mx, attrs=attrs, grad=g, out=out, d_inputs=np_(di))
    cases.append(case)
    return case


# --------------------------------------------------------------------------
# FakeQuant cases
# --------------------------------------------------------------------------
FQ_OPS = ["fake_quant_with_min_max_args", "fake_quant_with_min_max_vars",
          "fake_quant_with_min_max_vars_per_channel"]


def random_pc_shape(n_target):
    rank = int(rng.integers(1, 5))
    if rank == 1:
        return (int(rng.integers(64, 97)),)
    d = int(rng.integers(1, 9))
    rest = max(1, n_target // d)
    if rank == 2:
        return (rest, d)
    if rank == 3:
        a = int(rng.integers(1, 5))
        return (a, max(1, rest // a), d)
    a, b = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    return (a, b, max(1, rest // (a * b)), d)


def fq_main_cases():
    for oi, op in enumerate(FQ_OPS):
        divide = op == "fake_quant_with_min_max_vars"
        j = 0
        for num_bits in range(2, 17):
            for narrow in (False, True):
                for t in range(2):
                    kind = FQ_KINDS[(2 * j + t + 3 * oi) % len(FQ_KINDS)]
                    attrs = dict(num_bits=num_bits, narrow_range=narrow)
                    n = int(rng.integers(64, 161))
                    if op != "fake_quant_with_min_max_vars_per_channel":
                        mn, mx = fq_range(kind, num_bits, narrow)
                        p = fq_nudge(mn, mx, num_bits, narrow)
                        x = fq_inputs(p, divide, n)
                        add_fq(op, x, mn, mx, attrs, label=kind)
                    else:
                        shape = random_pc_shape(n)
                        d = shape[-1]
                        kinds = [kind] + [FQ_KINDS[int(rng.integers(0, len(FQ_KINDS)))]
                                          for _ in range(d - 1)]
                        rngs = [fq_range(k, num_bits, narrow) for k in kinds]
                        mn = np.array([r[0] for r in rngs], F32)
                        mx = np.array([r[1] for r in rngs], F32)
                        per = int(np.prod(shape[:-1]))
                        cols = []
                        for c in range(d):
                            p = fq_nudge(mn[c], mx[c], num_bits, narrow)
                            cols.append(fq_inputs(p, False, max(per, 24))[:per])
                        x = np.stack(cols, axis=-1).reshape(shape)
                        add_fq(op, x, mn, mx, attrs, label=f"{kind}/rank{len(shape)}")
                j += 1


# The published vectors of kernels.md section 3: (num_bits, narrow, min, max,
# inputs, expected outputs).
SPEC_FQ = [
    (8, False, -10.0, 53.75, [-10.1, -10.0, -9.9, -9.75, 53.75, 53.8],
     [-10, -10, -10, -9.75, 53.75, 53.75]),
    (8, False, -0.1, 63.65, [-0.1, 0, 0.1, 0.25, 63.75, 63.8], [0, 0, 0, 0.25, 63.75, 63.75]),
    (8, True, -0.1275, 63.3725, [-0.26, -0.25, -0.24, 0, 63.25, 63.3],
     [-0.25, -0.25, -0.25, 0, 63.25, 63.25]),
    (8, False, -63.65, 0.1, [-63.8, -63.75, -63.7, -63.5, 0, 0.1],
     [-63.75, -63.75, -63.75, -63.5, 0, 0]),
    (8, False, -0.125, 63.625, [-0.26, -0.25, -0.24, 0, 63.5, 63.6],
     [-0.25, -0.25, -0.25, 0, 63.5, 63.5]),
    (4, False, -6.0, 1.5, [-6.1, -6, -5.9, -5.5, 1.5, 1.6], [-6, -6, -6, -5.5, 1.5, 1.5]),
    (4, False, -7.3, 0.2, [-7.6, -7.5, -7.4, -7.2, 0, 0.1], [-7.5, -7.5, -7.5, -7.0, 0, 0]),
    (2, False, -0.1, 1.4, [-0.2, 0.1, 0.7, 1.0, 1.3, 1.6], [0, 0, 0.5, 1, 1.5, 1.5]),
    (2, True, -0.4, 0.6, [-0.6, -0.5, -0.24, 0, 0.5, 0.6], [-0.5, -0.5, -0, 0, 0.5, 0.5]),
    (-1, False, -1.0, 1.0, [-1.0, -0.9960785, 0.0, 0.5, 1.0, 1.0039216], None),
]
# nudged ranges (min, max, num_bits, narrow) -> (nudged_min, nudged_max)
SPEC_NUDGE = [(0.5, 128.0, 8, False, 0.0, 127.5), (-128.0, -0.5, 8, False, -127.5, 0.0),
              (0.1, 127.1, 8, True, 0.0, 127.0), (-0.1, 62.9, 7, True, 0.0, 63.0)]


def fq_spec_cases():
    for op in FQ_OPS:
        divide = op == "fake_quant_with_min_max_vars"
        for num_bits, narrow, mn, mx, xs, expected in SPEC_FQ:
            num_bits = 8 if num_bits < 0 else num_bits
            attrs = dict(num_bits=num_bits, narrow_range=narrow)
            x = np.array(xs, F32)
            if op == "fake_quant_with_min_max_vars_per_channel":
                for shape in [(6, 1), (6,)]:
                    d = shape[-1]
                    add_fq(op, x.reshape(shape), np.full(d, mn, F32), np.full(d, mx, F32),
                           attrs, label=f"spec_vector/{shape}")
                    c = cases[-1]
                    if expected is not None:
                        assert np.array_equal(c["out"].ravel(), np.array(expected, F32)), c
            else:
                c = add_fq(op, x, F32(mn), F32(mx), attrs, label="spec_vector")
                if expected is not None:
                    assert np.array_equal(c["out"], np.array(expected, F32)), (c, expected)
        for mn, mx, num_bits, narrow, emin, emax in SPEC_NUDGE:
            p = fq_nudge(mn, mx, num_bits, narrow)
            assert (p["nmin"], p["nmax"]) == (F32(emin), F32(emax)), (p, emin, emax)
            x = fq_inputs(p, divide, 64)
            attrs = dict(num_bits=num_bits, narrow_range=narrow)
            if op == "fake_quant_with_min_max_vars_per_channel":
                add_fq(op, x.reshape(16, 4), np.full(4, mn, F32), np.full(4, mx, F32), attrs,
                       label="spec_nudged_range")
            else:
                add_fq(op, x, F32(mn), F32(mx), attrs, label="spec_nudged_range")
        # the gradient vector of section 3
        x = np.array([-0.26, -0.25, -0.24, 0, 63.5, 63.6], F32)
        g = np.array([1.5, 2.0, -3.0, 4.0, 5.0, -6.5], F32)
        if op == "fake_quant_with_min_max_vars_per_channel":
            c = add_fq(op, x.reshape(6, 1), np.array([-0.125], F32), np.array([63.625], F32),
                       dict(num_bits=8, narrow_range=False), label="spec_gradient",
                       g=g.reshape(6, 1))
        else:
            c = add_fq(op, x, F32(-0.125), F32(63.625), dict(num_bits=8, narrow_range=False),
                       label="spec_gradient", g=g)
        assert np.array_equal(c["d_inputs"].ravel(), g * np.array([0, 1, 1, 1, 1, 0], F32))


def fq_extra_cases():
    # defaults: args without min/max (-6, 6) and without num_bits/narrow_range
    p = fq_nudge(-6.0, 6.0, 8, False)
    add_fq("fake_quant_with_min_max_args", fq_inputs(p, False, 120), -6.0, 6.0, {},
           label="defaults", pass_range=False)
    p = fq_nudge(-6.0, 6.0, 4, True)
    add_fq("fake_quant_with_min_max_args", fq_inputs(p, False, 100), -6.0, 6.0,
           dict(num_bits=4, narrow_range=True), label="default_range", pass_range=False)
    p = fq_nudge(-2.5, 7.0, 8, False)
    add_fq("fake_quant_with_min_max_args", fq_inputs(p, False, 100), F32(-2.5), F32(7.0), {},
           label="default_attrs")
    add_fq("fake_quant_with_min_max_vars", fq_inputs(p, True, 100), F32(-2.5), F32(7.0), {},
           label="default_attrs")
    add_fq("fake_quant_with_min_max_vars_per_channel", fq_inputs(p, False, 100).reshape(50, 2),
           np.array([-2.5, -1.0], F32), np.array([7.0, 3.0], F32), {}, label="default_attrs")

    # min == max == 0 (also with -0.0): zeros, d_inputs = g, d_min = d_max = 0
    for nb, narrow in [(8, False), (3, True)]:
        x = np.concatenate([rng.uniform(-3, 3, 90).astype(F32),
                            np.array([0.0, -0.0, np.inf, -np.inf, 1e30], F32)])
        add_fq("fake_quant_with_min_max_vars", x, F32(0.0), F32(0.0),
               dict(num_bits=nb, narrow_range=narrow), label="zero_range")
        add_fq("fake_quant_with_min_max_vars", x, F32(-0.0), F32(0.0),
               dict(num_bits=nb, narrow_range=narrow), label="zero_range_negzero_min")
        x = rng.uniform(-3, 3, (30, 4)).astype(F32)
        x[0] = [0.0, -0.0, np.inf, -np.inf]
        add_fq("fake_quant_with_min_max_vars_per_channel", x,
               np.array([0.0, -1.0, -0.0, 0.5], F32), np.array([0.0, 1.0, 0.0, 2.0], F32),
               dict(num_bits=nb, narrow_range=narrow), label="zero_range_some_channels")
        add_fq("fake_quant_with_min_max_vars_per_channel", x[:, :2].copy(),
               np.zeros(2, F32), np.zeros(2, F32),
               dict(num_bits=nb, narrow_range=narrow), label="zero_range_all_channels")

    # -0.0 and 0.0 inputs on every kind of range, with negative upstream grads
    for op in FQ_OPS:
        for kind in ["zero_inside", "positive", "negative", "edge_zero"]:
            nb = int(rng.integers(2, 17))
            mn, mx = fq_range(kind, nb, False)
            p = fq_nudge(mn, mx, nb, False)
            x = np.concatenate([np.tile(np.array([0.0, -0.0], F32), 20),
                                fq_inputs(p, op.endswith("vars"), 40)])
            g = -np.abs(upstream(x.shape)) - F32(0.25)
            attrs = dict(num_bits=nb, narrow_range=False)
            if op.endswith("per_channel"):
                add_fq(op, x.reshape(-1, 2), np.full(2, mn, F32), np.full(2, mx, F32), attrs,
                       label=f"signed_zeros/{kind}", g=g.reshape(-1, 2))
            else:
                add_fq(op, x, mn, mx, attrs, label=f"signed_zeros/{kind}", g=g)

    # NaN group: NaN at many positions (TF propagates NaN in the forward pass,
    # masks it out of the gradient).
    for op in FQ_OPS:
        for nb, narrow, kind in [(8, False, "zero_inside"), (5, True, "positive")]:
            mn, mx = fq_range(kind, nb, narrow)
            p = fq_nudge(mn, mx, nb, narrow)
            x = fq_inputs(p, op.endswith("vars"), 96)
            x[rng.choice(x.size, 13, replace=False)] = np.nan
            attrs = dict(num_bits=nb, narrow_range=narrow)
            if op.endswith("per_channel"):
                add_fq(op, x.reshape(-1, 3), np.full(3, mn, F32), np.full(3, mx, F32), attrs,
                       group="nan", label=f"nan/{kind}")
            else:
                add_fq(op, x, mn, mx, attrs, group="nan", label=f"nan/{kind}")

    # Subnormal group: subnormal inputs and upstream gradients on a range with
    # zero strictly inside (TF flushes subnormals to zero).
    sub = np.array([1e-45, -1e-45, 1e-40, -1e-40, 1e-39, -3e-39], F32)
    for op in FQ_OPS:
        p = fq_nudge(-1.0, 1.0, 8, False)
        x = np.concatenate([np.tile(sub, 6), fq_inputs(p, op.endswith("vars"), 60)])
        g = upstream(x.shape)
        g[rng.choice(g.size, 30, replace=False)] = np.tile(sub, 5)
        if op.endswith("per_channel"):
            add_fq(op, x.reshape(-1, 4), np.full(4, -1.0, F32), np.full(4, 1.0, F32),
                   dict(num_bits=8), group="subnormal", label="subnormal", g=g.reshape(-1, 4))
        else:
            add_fq(op, x, F32(-1.0), F32(1.0), dict(num_bits=8), group="subnormal",
                   label="subnormal", g=g)


# --------------------------------------------------------------------------
# QuantizeAndDequantizeV2 cases
# --------------------------------------------------------------------------
def qdq_qrange(signed, num_bits, narrow):
    if signed:
        return -(2 ** (num_bits - 1)) + (1 if narrow else 0), 2 ** (num_bits - 1) - 1
    return 0, 2**num_bits - 1


def qdq_scale(dt, signed, num_bits, narrow, min_range, max_range):
    """kernels.md 2.2 (with TF's numeric_limits<T>::max())."""
    min_q, max_q = qdq_qrange(signed, num_bits, narrow)
    min_q, max_q = dt(min_q), dt(max_q)
    min_range, max_range = dt(min_range), dt(max_range)
    big = dt(np.finfo(dt).max)
    sf_min = min_q / min_range if min_q * min_range > 0 else big
    sf_max = max_q / max_range if max_q * max_range > 0 else big
    if sf_min < sf_max:
        scale, inv = sf_min, min_range / min_q
        max_range = max_q * inv
    else:
        scale, inv = sf_max, max_range / max_q
        min_range = min_q * inv
    return dt(scale), dt(inv), dt(min_range), dt(max_range)


def qdq_ties(dt, scale, inv, lo, hi, n):
    """Values in [lo, hi] with x * scale exactly j + 0.5 (plus near misses)."""
    vals = []
    jlo, jhi = np.ceil(lo * scale), np.floor(hi * scale) - 1
    if not (np.isfinite(jlo) and np.isfinite(jhi)) or jhi < jlo:
        return vals
    for _ in range(n):
        j = dt(rng.integers(int(jlo), int(jhi) + 1))
        x0 = dt((j + dt(0.5)) * inv)
        cands = [c for c in neighbours(x0, 6, dt) if lo <= c <= hi]
        hits = [c for c in cands if is_tie(dt(c * scale))]
        if hits:
            vals.append(hits[int(rng.integers(0, len(hits)))])
            vals.append(next_normal(hits[0], np.inf, dt))
        elif cands:
            vals.append(cands[0])
    return vals


QDQ_GIVEN_KINDS = ["zero_inside", "symmetric", "positive", "negative", "tiny", "huge",
                   "asymmetric", "pow2", "edge_zero"]
QDQ_DATA_KINDS = ["zero_inside", "positive", "negative", "tiny", "huge", "pow2",
                  "unsigned_negative_data", "one_sided_zero"]


def qdq_given_range(kind, dt, signed, num_bits, narrow):
    u = lambda a, b: float(rng.uniform(a, b))  # noqa: E731
    if kind == "zero_inside":
        return dt(-u(0.05, 10)), dt(u(0.05, 10))
    if kind == "symmetric":
        a = dt(rng.choice([1.0, 6.0, u(0.1, 8)]))
        return -a, a
    if kind == "positive":
        lo = u(0.01, 5)
        return dt(lo), dt(lo + u(0.1, 10))
    if kind == "negative":
        hi = -u(0.01, 5)
        return dt(hi - u(0.1, 10)), dt(hi)
    if kind == "tiny":
        return (dt(-1e-6), dt(1e-6)) if rng.random() < 0.5 else (dt(-3e-7), dt(7e-7))
    if kind == "huge":
        return (dt(-1e6), dt(1e6)) if rng.random() < 0.5 else (dt(-2.5e5), dt(1e6))
    if kind == "asymmetric":
        return (dt(-10.0), dt(5.0)) if rng.random() < 0.5 else (dt(-u(0.01, 0.2)), dt(u(20, 90)))
    if kind == "pow2":
        min_q, max_q = qdq_qrange(signed, num_bits, narrow)
        e = dt(2.0 ** int(rng.integers(-6, 4)))
        return dt(min_q * e) if min_q else dt(-e), dt(max_q * e)
    if kind == "edge_zero":
        return (dt(0.0), dt(u(0.1, 10))) if rng.random() < 0.5 else (dt(-u(0.1, 10)), dt(0.0))
    raise ValueError(kind)


def qdq_given_inputs(dt, signed, num_bits, narrow, lo, hi, n):
    scale, inv, rmin, rmax = qdq_scale(dt, signed, num_bits, narrow, lo, hi)
    w = hi - lo
    vals = list(qdq_ties(dt, scale, inv, max(rmin, lo - w), min(rmax, hi + w), max(2, n // 6)))
    vals += list(rng.uniform(lo, hi, size=n // 3).astype(dt))
    vals += list(rng.uniform(lo - w / 2, lo, size=n // 10).astype(dt))
    vals += list(rng.uniform(hi, hi + w / 2, size=n // 10).astype(dt))
    specials = [lo, hi, rmin, rmax] + neighbours(lo, 1, dt)[1:] + neighbours(hi, 1, dt)[1:]
    specials += [dt(0.0), dt(-0.0), dt(np.inf), dt(-np.inf), dt(1e30), dt(-1e30)]
    vals += [dt(v) for v in specials]
    vals = np.array(vals, dt)
    if len(vals) < n:
        vals = np.concatenate([vals, rng.uniform(lo - w / 4, hi + w / 4, n - len(vals)).astype(dt)])
    rng.shuffle(vals)
    return vals


def qdq_data(kind, dt, signed, num_bits, narrow, n):
    """Data for range_given=False (range taken from the data)."""
    if kind == "zero_inside":
        x = rng.uniform(-rng.uniform(0.1, 10), rng.uniform(0.1, 10), n)
    elif kind == "positive":
        x = rng.uniform(rng.uniform(0.01, 2), rng.uniform(3, 10), n)
    elif kind == "negative":
        x = rng.uniform(-rng.uniform(3, 10), -rng.uniform(0.01, 2), n)
    elif kind == "tiny":
        x = rng.uniform(-1e-6, 1e-6, n)
    elif kind == "huge":
        x = rng.uniform(-1e6, 1e6, n)
    elif kind == "pow2":
        min_q, max_q = qdq_qrange(signed, num_bits, narrow)
        e = 2.0 ** int(rng.integers(-6, 4))
        x = rng.uniform(min_q * e, max_q * e, n)
        x[0], x[1] = min_q * e if min_q else -e, max_q * e
    elif kind == "unsigned_negative_data":
        x = rng.uniform(-rng.uniform(0.5, 4), rng.uniform(1, 4), n)
    elif kind == "one_sided_zero":
        x = rng.uniform(0, rng.uniform(1, 4), n)
        x[0] = 0.0
        if rng.random() < 0.5:
            x = -x
    else:
        raise ValueError(kind)
    x = x.astype(dt)
    if not signed and x.max() <= 0:
        x = -x  # unsigned needs a positive max (all-negative data is excluded)
    return x


def add_ties_in_data(x, dt, signed, num_bits, narrow, count):
    """Replace some entries (not the min/max) with exact ties of x's own range."""
    flat = x.reshape(-1)
    lo, hi = flat.min(), flat.max()
    scale, inv, _, _ = qdq_scale(dt, signed, num_bits, narrow, lo, hi)
    ties = qdq_ties(dt, scale, inv, lo, hi, count)
    if not ties:
        return
    protect = {int(flat.argmin()), int(flat.argmax())}
    idx = [i for i in rng.permutation(flat.size) if int(i) not in protect][: len(ties)]
    flat[idx] = np.array(ties, dt)[: len(idx)]
    if flat.size > 4:
        zi = [i for i in rng.permutation(flat.size) if int(i) not in protect][:2]
        if lo < 0 < hi:
            flat[zi[0]], flat[zi[1]] = dt(0.0), dt(-0.0)


def qdq_grad_range(x, axis):
    """input_min/input_max for range_given=False: only the gradient uses them."""
    if axis is None:
        v = np.sort(x.reshape(-1))
        return v[len(v) // 5], v[(4 * len(v)) // 5]
    moved = np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)
    v = np.sort(moved, axis=1)
    n = v.shape[1]
    return v[:, n // 5].copy(), v[:, (4 * n) // 5].copy()


def qdq_main_cases():
    j = 0
    for dt in (np.float32, np.float64):
        for signed in (True, False):
            for num_bits in range(2, 17):
                # config A: range given, per tensor
                narrow = bool((j // 2) % 2)
                mode = "HALF_TO_EVEN" if j % 2 else "HALF_UP"
                kind = QDQ_GIVEN_KINDS[j % len(QDQ_GIVEN_KINDS)]
                if not signed and kind in ("negative", "edge_zero"):
                    kind = "positive" if kind == "negative" else "zero_inside"
                lo, hi = qdq_given_range(kind, dt, signed, num_bits, narrow)
                n = int(rng.integers(64, 161))
                x = qdq_given_inputs(dt, signed, num_bits, narrow, lo, hi, n)
                attrs = dict(signed_input=signed, num_bits=num_bits, range_given=True,
                             round_mode=mode, narrow_range=narrow)
                add_qdq(x, lo, hi, attrs, label=f"given/{kind}")

                # config B: range from the data, per tensor or per axis
                narrow_b = not narrow
                mode_b = "HALF_UP" if mode == "HALF_TO_EVEN" else "HALF_TO_EVEN"
                dkind = QDQ_DATA_KINDS[j % len(QDQ_DATA_KINDS)]
                if signed and dkind == "unsigned_negative_data":
                    dkind = "zero_inside"
                per_axis = j % 3 != 0
                attrs = dict(signed_input=signed, num_bits=num_bits, range_given=False,
                             round_mode=mode_b, narrow_range=narrow_b)
                if not per_axis:
                    x = qdq_data(dkind, dt, signed, num_bits, narrow_b, int(rng.integers(64, 161)))
                    add_ties_in_data(x, dt, signed, num_bits, narrow_b, 12)
                    mn, mx = qdq_grad_range(x, None)
                    add_qdq(x, mn, mx, attrs, label=f"data/{dkind}")
                else:
                    rank = int(rng.integers(2, 5))
                    shape = [int(v) for v in rng.integers(2, 6, rank)]
                    while np.prod(shape) < 64:
                        shape[int(rng.integers(0, rank))] += 1
                    axis = [0, 1, -1, rank - 1][j % 4]
                    depth = shape[axis]
                    moved_shape = [depth] + [s for k, s in enumerate(shape) if k != axis % rank]
                    slices = []
                    for _ in range(depth):
                        k = dkind if rng.random() < 0.6 else QDQ_DATA_KINDS[int(rng.integers(0, 6))]
                        s = qdq_data(k, dt, signed, num_bits, narrow_b, int(np.prod(moved_shape[1:])))
                        add_ties_in_data(s, dt, signed, num_bits, narrow_b, 4)
                        slices.append(s)
                    x = np.moveaxis(np.stack(slices).reshape(moved_shape), 0, axis % rank).copy()
                    mn, mx = qdq_grad_range(x, axis % rank)
                    attrs["axis"] = axis
                    add_qdq(x, mn, mx, attrs, label=f"data/{dkind}/axis{axis}/rank{rank}")
                j += 1


SPEC_QDQ = [
    # (x, signed, num_bits, range_given, min, max, round_mode, expected)
    ([-3.5], True, 8, False, 0.0, 0.0, "HALF_TO_EVEN", [-3.5]),
    ([-1, -0.5, 0, 0.3125, 0.8, 0.555], True, 4, False, 0.0, 0.0, "HALF_TO_EVEN",
     [-1, -0.5, 0, 0.25, 0.75, 0.5]),
    ([-1, -0.5, 0, 0.3125, 0.8, 0.555], True, 4, False, 0.0, 0.0, "HALF_UP",
     [-1, -0.5, 0, 0.375, 0.75, 0.5]),
    ([-0.8, -0.5, 0, 0.3, 0.8, 0.555, -2, 33], True, 8, True, -1.0, 1.0, "HALF_TO_EVEN",
     np.array([-102, -64, 0, 38, 102, 70, -128, 127]) / 127),
    ([-0.8, -0.5, 0, 0.3, 0.8, 0.555, -2, 33], True, 8, True, -1.0, 1.0, "HALF_UP",
     np.array([-102, -63, 0, 38, 102, 70, -128, 127]) / 127),
    ([-0.5, 0, 0.3, 0.8], False, 8, True, 0.0, 1.0, "HALF_TO_EVEN",
     np.array([0, 0, 76, 204]) / 255),
    ([-0.5, 0, 0.3, 0.8], False, 8, True, 0.0, 1.0, "HALF_UP", np.array([0, 0, 77, 204]) / 255),
    ([-12.0, -10.0, -3.3, 0.0, 4.0, 5.0, 9.921875, 11.0], True, 8, True, -10.0, 5.0,
     "HALF_TO_EVEN", None),
    ([-12.0, -10.07874, -10.0, -3.3, 0.0, 4.0, 10.0, 11.0], True, 8, True, -10.0, 10.0,
     "HALF_TO_EVEN", None),
]


def qdq_spec_and_extra_cases():
    for dt in (np.float32, np.float64):
        for xs, signed, nb, given, mn, mx, mode, expected in SPEC_QDQ:
            x = np.array(xs, dt)
            attrs = dict(signed_input=signed, num_bits=nb, range_given=given, round_mode=mode)
            if not given:
                mn, mx = -0.75, 0.5  # only used by the gradient mask
            c = add_qdq(x, mn, mx, attrs, label="spec_vector")
            if expected is not None:
                assert np.allclose(c["out"], np.array(expected, dt), rtol=1e-6, atol=0), c

    # the 0.3 * 255 = 76.5 tie (float32), and many ties on a power-of-two grid
    for mode in ("HALF_TO_EVEN", "HALF_UP"):
        for narrow in (False, True):
            x = np.concatenate([np.array([0.3, -0.3, 0.3 + 1 / 255, -0.5, 0.5], np.float32),
                                (np.arange(-64, 64, dtype=np.float32) + np.float32(0.5))
                                / np.float32(255)])
            add_qdq(x, 0.0, 1.0, dict(signed_input=False, num_bits=8, range_given=True,
                                      round_mode=mode, narrow_range=narrow), label="tie_0.3x255")
            x = np.concatenate([np.arange(-20, 20) + 0.5, [-2.5, 2.5, -0.5, 0.5, -0.0, 0.0]])
            for dt in (np.float32, np.float64):
                add_qdq((x / 8).astype(dt), dt(-16.0), dt(127 / 8),
                        dict(signed_input=True, num_bits=8, range_given=True, round_mode=mode,
                             narrow_range=narrow), label="ties_pow2")
                xd = np.concatenate([x / 8, [127 / 8, -16.0]]).astype(dt)
                add_qdq(xd, dt(-1.0), dt(1.0),
                        dict(signed_input=True, num_bits=8, range_given=False, round_mode=mode,
                             narrow_range=narrow), label="ties_pow2_data")

    # unsigned 1-bit (allowed for unsigned)
    for given in (True, False):
        x = np.concatenate([rng.uniform(-0.5, 1.5, 60), [0.5, 0.25, 0.75, 0.0, -0.0, 1.0]])
        x = x.astype(np.float32)
        add_qdq(x, 0.0, 1.0, dict(signed_input=False, num_bits=1, range_given=given,
                                  round_mode="HALF_TO_EVEN"), label="unsigned_1bit")
    # min == max given (non zero)
    x = rng.uniform(-1, 1, 64).astype(np.float32)
    add_qdq(x, 0.5, 0.5, dict(signed_input=True, num_bits=8, range_given=True),
            label="given_min_eq_max")
    # defaults only (signed, 8 bits, range from data, HALF_TO_EVEN)
    x = rng.uniform(-2, 3, 100).astype(np.float32)
    add_qdq(x, -1.0, 1.0, {}, label="defaults")
    add_qdq(x, -1.0, 1.0, dict(range_given=True), label="defaults_given")
    # all-zero data of one sign: output all (+)zeros
    for z in (0.0, -0.0):
        for dt in (np.float32, np.float64):
            add_qdq(np.full(64, z, dt), -1.0, 1.0, dict(signed_input=True, num_bits=8),
                    label=f"all_zero/{'neg' if z == 0 and np.signbit(z) else 'pos'}")
    x = np.zeros((8, 8), np.float32)
    x[:, 2] = rng.uniform(-1, 1, 8)
    add_qdq(x, np.full(8, -0.5, np.float32), np.full(8, 0.5, np.float32),
            dict(signed_input=True, num_bits=8, axis=1), label="all_zero_slices")
    # float64 data whose magnitude is below FLT_MIN's reciprocal range:
    # TF uses numeric_limits<double>::max(), not FLT_MAX, as the "no scale" value.
    x = -rng.uniform(1e-40, 1e-39, 64)
    add_qdq(x, -1e-39, -1e-41, dict(signed_input=True, num_bits=8), label="f64_below_flt_range")
    x = rng.uniform(1e-40, 1e-39, 64)
    add_qdq(x, 1e-41, 1e-39, dict(signed_input=False, num_bits=8), label="f64_below_flt_range")
    add_qdq(x, 1e-41, 1e-39, dict(signed_input=True, num_bits=8, range_given=True),
            label="f64_below_flt_range_given")
    # huge values in data (no overflow of x * scale)
    x = np.concatenate([rng.uniform(-1, 1, 62), [3e38, -2e38]]).astype(np.float32)
    add_qdq(x, -1.0, 1.0, dict(signed_input=True, num_bits=8), label="data_near_flt_max")

    # NaN group: NaN with range_given=True propagates; +-inf in the data makes
    # the computed range infinite: scale 0, inverse inf, output all NaN.
    for dt in (np.float32, np.float64):
        x = qdq_given_inputs(dt, True, 8, False, dt(-1.0), dt(2.0), 96)
        x[rng.choice(x.size, 11, replace=False)] = np.nan
        add_qdq(x, -1.0, 2.0, dict(signed_input=True, num_bits=8, range_given=True),
                group="nan", label="nan_given")
    x = rng.uniform(-1, 1, 64).astype(np.float32)
    x[5] = np.inf
    add_qdq(x, -1.0, 1.0, dict(signed_input=True, num_bits=8), group="nan", label="inf_in_data")
    x[7] = -np.inf
    add_qdq(x, -1.0, 1.0, dict(signed_input=False, num_bits=8, round_mode="HALF_UP"),
            group="nan", label="inf_in_data")

    # subnormal group
    sub = np.array([1e-45, -1e-45, 1e-40, -1e-40, 1e-39, -3e-39], np.float32)
    x = np.concatenate([np.tile(sub, 5), rng.uniform(-1, 1, 40).astype(np.float32)])
    g = upstream(x.shape)
    g[:30] = np.tile(sub, 5)[::-1]
    add_qdq(x, -1.0, 1.0, dict(signed_input=True, num_bits=8, range_given=True),
            group="subnormal", label="subnormal", g=g)

    # zero_sign group: all-zero data with both signs (value comparison only)
    x = np.tile(np.array([0.0, -0.0, -0.0, 0.0], np.float32), 16)
    add_qdq(x, -1.0, 1.0, dict(signed_input=True, num_bits=8), group="zero_sign",
            label="mixed_signed_zeros")


# --------------------------------------------------------------------------
def main():
    fq_main_cases()
    fq_spec_cases()
    fq_extra_cases()
    qdq_main_cases()
    qdq_spec_and_extra_cases()

    arrays = {}
    for i, c in enumerate(cases):
        p = f"case{i:04d}/"
        for k in ("x", "min", "max", "out", "grad", "d_inputs", "d_min", "d_max"):
            if k in c:
                arrays[p + k] = np.asarray(c[k])
        if c["group"] == "exact":
            for k in ("out", "d_inputs"):
                assert not np.isnan(c[k]).any(), (i, c["label"], k)
    meta = dict(tensorflow=tf.__version__, numpy=np.__version__, seed=SEED,
                num_cases=len(cases), python=sys.version.split()[0])
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    arrays["op"] = np.array([c["op"] for c in cases])
    arrays["attrs"] = np.array([json.dumps(c["attrs"], sort_keys=True) for c in cases])
    arrays["group"] = np.array([c["group"] for c in cases])
    arrays["label"] = np.array([c["label"] for c in cases])
    np.savez_compressed(OUT_PATH, **arrays)

    counts: dict = {}
    for c in cases:
        counts[(c["op"], c["group"])] = counts.get((c["op"], c["group"]), 0) + 1
    for k in sorted(counts):
        print(f"{k[0]:45s} {k[1]:10s} {counts[k]}")
    print("total", len(cases), "cases,", os.path.getsize(OUT_PATH), "bytes ->", OUT_PATH)


if __name__ == "__main__":
    main()
