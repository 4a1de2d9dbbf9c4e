"""More standard ONNX ops for the JAX interpreter (:mod:`qtool.finetune.interpreter`).

Registered with the interpreter's ``op`` decorator when it is imported (the interpreter imports this
module once, at its end): activations (Mish, Celu, Softsign, ThresholdedRelu, Shrink, Swish, SwiGLU),
Tan and the inverse and hyperbolic trigonometry, IsInf, Hardmax, normalizations (GroupNormalization,
RMSNormalization, LRN, LpNormalization, MeanVarianceNormalization), ReduceLogSum, LpPool/GlobalLpPool,
data movement (DepthToSpace, SpaceToDepth, GatherND, ScatterElements/Scatter, OneHot, CumSum, CumProd,
ScatterND, EyeLike, ReverseSequence, CenterCropPad, TensorScatter), GridSample and AffineGrid, Attention and
RotaryEmbedding, DFT/STFT/MelWeightMatrix, Col2Im, DeformConv, RoiAlign, MaxRoiPool, the two
classification losses, Det, the window ops and the bitwise ops. Each computes what onnxruntime does (one
exception, MeanVarianceNormalization of a constant channel: 0 as ONNX defines it, where onnxruntime divides
0 by 0). Shapes, axes, depths and sizes must be constants, as for the other ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qtool.errors import QtoolError
from qtool.finetune.interpreter import (
    OPS, _axis, _binary, _divisor, _np_dtype, _pool_geometry, _result, _spatial_attrs, _sqrt, _static, _unary, _xp,
    concrete, cubic_far, cubic_near, op,
)

# --- elementwise ------------------------------------------------------------------------------------------
for _name, _fnp, _fj in [
    ("Tan", np.tan, jnp.tan), ("Atan", np.arctan, jnp.arctan), ("Asin", np.arcsin, jnp.arcsin),
    ("Acos", np.arccos, jnp.arccos), ("Sinh", np.sinh, jnp.sinh), ("Cosh", np.cosh, jnp.cosh),
    ("Asinh", np.arcsinh, jnp.arcsinh), ("Acosh", np.arccosh, jnp.arccosh), ("Atanh", np.arctanh, jnp.arctanh),
]:
    OPS[("", _name)] = _unary(_fnp, _fj)


def _f32(node, name: str, default: float):
    return np.float32(node.attr(name, default))


@op("IsInf", attrs=("detect_negative", "detect_positive"))
def _is_inf(ctx, node, inputs):
    x = inputs[0]
    xp = _xp(x)
    pos = xp.isposinf(x) if node.attr("detect_positive", 1) else xp.zeros(x.shape, bool)
    neg = xp.isneginf(x) if node.attr("detect_negative", 1) else xp.zeros(x.shape, bool)
    return [_result(xp.logical_or(pos, neg))]


# --- activations --------------------------------------------------------------------------------------------
@op("Mish")
def _mish(ctx, node, inputs):
    x = inputs[0]
    return [x * jnp.tanh(jax.nn.softplus(x))]


@op("Celu", attrs=("alpha",))
def _celu(ctx, node, inputs):
    x = inputs[0]
    alpha = _f32(node, "alpha", 1.0)
    return [jnp.maximum(x, 0) + jnp.minimum(0, alpha * (jnp.exp(jnp.minimum(x, 0) / alpha) - 1))]


@op("Softsign")
def _softsign(ctx, node, inputs):
    x = inputs[0]
    d = 1 + jnp.abs(x)
    return [x / _divisor(x, d)]


@op("ThresholdedRelu", attrs=("alpha",))
def _thresholded_relu(ctx, node, inputs):
    x = inputs[0]
    return [jnp.where(x > _f32(node, "alpha", 1.0), x, jnp.zeros_like(x))]


@op("Shrink", attrs=("bias", "lambd"))
def _shrink(ctx, node, inputs):
    x = inputs[0]
    xp = _xp(x)
    lambd, bias = _f32(node, "lambd", 0.5), _f32(node, "bias", 0.0)
    lo, hi = (x + bias).astype(x.dtype), (x - bias).astype(x.dtype)
    return [_result(xp.where(x < -lambd, lo, xp.where(x > lambd, hi, xp.zeros_like(x))))]


@op("Swish", attrs=("alpha",))
def _swish(ctx, node, inputs):
    x = inputs[0]
    return [x * jax.nn.sigmoid(_f32(node, "alpha", 1.0) * x)]


@op("Hardmax", attrs=("axis",))
def _hardmax(ctx, node, inputs):
    """1 at the first maximum along ``axis`` (opset < 13: of the input coerced to 2-D at ``axis``)."""
    x = jnp.asarray(inputs[0])
    shape = x.shape
    if node.opset < 13:
        axis = _axis(node.attr("axis", 1), x.ndim)
        x = jnp.reshape(x, (int(np.prod(shape[:axis], dtype=np.int64)), -1))
        axis = 1
    else:
        axis = _axis(node.attr("axis", -1), x.ndim)
    hot = jax.nn.one_hot(jnp.argmax(x, axis=axis), x.shape[axis], axis=axis, dtype=x.dtype)
    return [jnp.reshape(hot, shape)]


# --- normalization ------------------------------------------------------------------------------------------
def _mean(v, axes):
    total = jnp.sum(v, axis=axes, keepdims=True)
    return total / _divisor(total, jnp.asarray(float(np.prod([v.shape[a] for a in axes])), v.dtype))


def _standardize(x, axes, eps):
    mean = _mean(x, axes)
    centered = x - mean
    var = _mean(centered * centered, axes)
    return centered / _divisor(centered, jnp.sqrt(var + eps))


@op("GroupNormalization", attrs=("epsilon", "num_groups"))
def _group_norm(ctx, node, inputs):
    """Statistics per sample and group of channels; ``scale``/``bias`` per group (opset 18) or per
    channel (opset 21)."""
    x, scale, bias = jnp.asarray(inputs[0]), inputs[1], inputs[2]
    groups = int(node.attr("num_groups"))
    n, c = x.shape[0], x.shape[1]
    if c % groups:
        raise QtoolError(f"node {node.label()}: {c} channels do not split into {groups} groups")
    g = jnp.reshape(x, (n, groups, -1))
    y = jnp.reshape(_standardize(g, (2,), _f32(node, "epsilon", 1e-5)), x.shape)
    if np.shape(scale)[0] != c:  # opset 18: one per group
        scale, bias = jnp.repeat(jnp.asarray(scale), c // groups), jnp.repeat(jnp.asarray(bias), c // groups)
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    return [y * jnp.reshape(scale, per_channel) + jnp.reshape(bias, per_channel)]


@op("RMSNormalization", attrs=("axis", "epsilon"))
def _rms_norm(ctx, node, inputs):
    x, scale = jnp.asarray(inputs[0]), inputs[1]
    axes = tuple(range(_axis(node.attr("axis", -1), x.ndim), x.ndim))
    rms = jnp.sqrt(_mean(x * x, axes) + _f32(node, "epsilon", 1e-5))
    return [x / _divisor(x, rms) * scale]


@op("LRN", attrs=("alpha", "beta", "bias", "size"))
def _lrn(ctx, node, inputs):
    """``x / (bias + alpha / size * sum of squares)^beta``, the sum over the channels ``c - (size-1)//2``
    to ``c + ceil((size-1)/2)`` (onnxruntime's window)."""
    x = jnp.asarray(inputs[0])
    size = int(node.attr("size"))
    alpha, beta, bias = _f32(node, "alpha", 1e-4), _f32(node, "beta", 0.75), _f32(node, "bias", 1.0)
    lo = (size - 1) // 2
    window = (1, size) + (1,) * (x.ndim - 2)
    padding = [(0, 0), (lo, size - 1 - lo)] + [(0, 0)] * (x.ndim - 2)
    sq = lax.reduce_window(x * x, np.array(0, x.dtype), lax.add, window, (1,) * x.ndim, padding)
    d = jnp.power(bias + alpha / np.float32(size) * sq, beta)
    return [x / _divisor(x, d)]


@op("LpNormalization", attrs=("axis", "p"))
def _lp_norm(ctx, node, inputs):
    x = jnp.asarray(inputs[0])
    axis = _axis(node.attr("axis", -1), x.ndim)
    p = int(node.attr("p", 2))
    if p == 1:
        norm = jnp.sum(jnp.abs(x), axis=axis, keepdims=True)
    elif p == 2:
        sq = jnp.sum(x * x, axis=axis, keepdims=True)
        norm = jnp.sqrt(jnp.where(sq > 0, sq, 1))
    else:
        raise QtoolError(f"node {node.label()}: LpNormalization p={p} (ONNX allows 1 and 2)")
    safe = jnp.where(norm > 0, norm, 1)
    return [jnp.where(norm > 0, x / _divisor(x, safe), jnp.zeros_like(x))]


@op("MeanVarianceNormalization", attrs=("axes",))
def _mvn(ctx, node, inputs):
    """``(x - mean) / (sqrt(E[x^2] - mean^2) + 1e-9)`` over ``axes`` (default 0, 2, 3), ONNX's definition: a
    constant channel gives 0 (onnxruntime: NaN, 0 / 0), with a finite gradient."""
    x = jnp.asarray(inputs[0])
    axes = tuple(sorted(_axis(int(a), x.ndim) for a in (node.attr("axes") or [0, 2, 3])))
    mean = _mean(x, axes)
    var = _mean(x * x, axes) - mean * mean
    centered = x - mean
    return [centered / _divisor(centered, _sqrt(jnp.maximum(var, 0)) + np.float32(1e-9))]


@op("ReduceLogSum", attrs=("axes", "keepdims", "noop_with_empty_axes"))
def _reduce_log_sum(ctx, node, inputs):
    """``log`` of ReduceSum: the same axes (attribute before opset 18, input from 18), keepdims and
    noop_with_empty_axes."""
    if 13 <= node.opset < 18:  # ReduceSum takes its axes as an input from opset 13, ReduceLogSum from 18
        axes = node.attr("axes")
        inputs = list(inputs[:1]) + [None if axes is None else np.asarray(axes, np.int64)]
    s = OPS[("", "ReduceSum")](ctx, node, inputs)[0]
    return [_result(_xp(s).log(s))]


# --- pooling ---------------------------------------------------------------------------------------------------
def _lp(x, p: int):
    return x * x if p == 2 else jnp.power(jnp.abs(x), np.float32(p))


def _root(s, p: int):
    """``s ** (1/p)`` whose derivative at 0 is 0, not inf (an all-zero window after a ReLU)."""
    if p == 2:
        return _sqrt(s)
    positive = s > 0
    return jnp.where(positive, jnp.power(jnp.where(positive, s, 1), np.float32(1.0 / p)), jnp.zeros_like(s))


@op("LpPool", attrs=("auto_pad", "ceil_mode", "dilations", "kernel_shape", "p", "pads", "strides"))
def _lp_pool(ctx, node, inputs):
    """``(sum over the window of |x|^p)^(1/p)``; pads count as zeros."""
    x = jnp.asarray(inputs[0])
    p = int(node.attr("p", 2))
    kernel, strides, dilations, pads, extra = _pool_geometry(node, x)
    padding = [(0, 0), (0, 0)] + [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
    s = lax.reduce_window(_lp(x, p), np.array(0, x.dtype), lax.add, (1, 1) + tuple(kernel),
                          (1, 1) + tuple(strides), padding, window_dilation=(1, 1) + tuple(dilations))
    return [_root(s, p)]


@op("GlobalLpPool", attrs=("p",))
def _global_lp_pool(ctx, node, inputs):
    x = jnp.asarray(inputs[0])
    p = int(node.attr("p", 2))
    return [_root(jnp.sum(_lp(x, p), axis=tuple(range(2, x.ndim)), keepdims=True), p)]


# --- data movement ---------------------------------------------------------------------------------------------
def _rearranged(x, shape, perm, out):
    """``x`` reshaped to ``shape``, transposed by ``perm`` and reshaped to ``out`` (a block move)."""
    xp = _xp(x)
    return [_result(xp.reshape(xp.transpose(xp.reshape(x, shape), perm), out))]


@op("DepthToSpace", attrs=("blocksize", "mode"))
def _depth_to_space(ctx, node, inputs):
    x = inputs[0]
    b = int(node.attr("blocksize"))
    n, c, h, w = x.shape
    out = (n, c // (b * b), h * b, w * b)
    if node.attr("mode", "DCR") == "CRD":
        return _rearranged(x, (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3), out)
    return _rearranged(x, (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2), out)


@op("SpaceToDepth", attrs=("blocksize",))
def _space_to_depth(ctx, node, inputs):
    x = inputs[0]
    b = int(node.attr("blocksize"))
    n, c, h, w = x.shape
    return _rearranged(x, (n, c, h // b, b, w // b, b), (0, 3, 5, 1, 2, 4), (n, c * b * b, h // b, w // b))


def _wrap(idx, dim):
    """Negative indices counted from the end."""
    return _xp(idx).where(idx < 0, idx + dim, idx)


@op("GatherND", attrs=("batch_dims",))
def _gather_nd(ctx, node, inputs):
    x, idx = inputs
    batch = int(node.attr("batch_dims", 0))
    k = idx.shape[-1]
    xp = _xp(x, idx)
    lead = idx.shape[:-1]
    index = [np.arange(lead[i]).reshape([-1 if j == i else 1 for j in range(len(lead))]) for i in range(batch)]
    index += [_wrap(idx[..., j], x.shape[batch + j]) for j in range(k)]
    return [_result(xp.asarray(x)[tuple(index)])]


def _along(idx, axis: int, shape) -> tuple:
    """A full index of ``idx``'s shape: ``idx`` on ``axis``, positions elsewhere (ScatterElements)."""
    return tuple(idx if a == axis else np.arange(shape[a]).reshape([-1 if b == a else 1 for b in range(len(shape))])
                 for a in range(len(shape)))


_SCATTER = {"none": "set", "add": "add", "mul": "multiply", "max": "max", "min": "min"}


def _scattered(node, x, index: tuple, updates):
    """``updates`` written into a copy of ``x`` at ``index`` with the node's ``reduction`` (gradients flow to
    both)."""
    reduction = node.attr("reduction", "none")
    if reduction not in _SCATTER:
        raise QtoolError(f"node {node.label()}: reduction '{reduction}' is not none, add, mul, max or min")
    return [getattr(jnp.asarray(x).at[index], _SCATTER[reduction])(jnp.asarray(updates, x.dtype))]


@op("Scatter", attrs=("axis",))
@op("ScatterElements", attrs=("axis", "reduction"))
def _scatter_elements(ctx, node, inputs):
    x, idx, upd = inputs
    axis = _axis(int(node.attr("axis", 0)), x.ndim)
    return _scattered(node, x, _along(_wrap(idx, x.shape[axis]), axis, idx.shape), upd)


@op("ScatterND", attrs=("reduction",))
def _scatter_nd(ctx, node, inputs):
    """``updates`` at the index tuples along the last axis of ``indices``: how PyTorch exports
    ``cache[:, :, a:b] = x`` (a streaming model's caches: GTCRN writes 18 this way)."""
    x, idx, upd = inputs
    return _scattered(node, x, tuple(_wrap(idx[..., j], x.shape[j]) for j in range(idx.shape[-1])), upd)


@op("OneHot", attrs=("axis",))
def _one_hot(ctx, node, inputs):
    """``values[1]`` where the index (negative: from the end) is, ``values[0]`` elsewhere and for indices
    out of ``[-depth, depth)``; the new axis at ``axis`` (default last)."""
    idx, depth, values = inputs
    depth = int(np.asarray(_static(node, depth, "depth")).reshape(-1)[0])
    rank = idx.ndim + 1
    axis = _axis(int(node.attr("axis", -1)), rank)
    xp = _xp(idx, values)
    idx = xp.asarray(idx).astype(np.int32) if xp is jnp else np.asarray(idx).astype(np.int64)
    idx = xp.where(idx < 0, idx + depth, idx)
    positions = np.arange(depth).reshape([-1 if a == axis else 1 for a in range(rank)])
    hot = xp.expand_dims(idx, axis) == positions
    off, on = values[0], values[1]
    return [_result(xp.where(hot, on, off))]


def _cum(kind: str):
    def impl(ctx, node, inputs):
        x = jnp.asarray(inputs[0])
        axis = _axis(int(np.asarray(_static(node, inputs[1], "axis")).reshape(-1)[0]), x.ndim)
        reverse, exclusive = bool(node.attr("reverse", 0)), bool(node.attr("exclusive", 0))
        if reverse:
            x = jnp.flip(x, axis)
        fn, identity = (jnp.cumsum, 0) if kind == "sum" else (jnp.cumprod, 1)
        if exclusive:
            pad = [(0, 0)] * x.ndim
            pad[axis] = (1, 0)
            x = jnp.pad(lax.slice_in_dim(x, 0, x.shape[axis] - 1, axis=axis), pad, constant_values=identity)
        y = fn(x, axis=axis, dtype=x.dtype)
        return [jnp.flip(y, axis) if reverse else y]

    return impl


op("CumSum", attrs=("exclusive", "reverse"))(_cum("sum"))
op("CumProd", attrs=("exclusive", "reverse"))(_cum("prod"))


@op("EyeLike", attrs=("dtype", "k"))
def _eye_like(ctx, node, inputs):
    x = inputs[0]
    dtype = node.attr("dtype")
    dtype = np.dtype(x.dtype) if dtype is None else _np_dtype(node, int(dtype))
    return [np.eye(x.shape[0], x.shape[1], int(node.attr("k", 0)), dtype=dtype)]


@op("ReverseSequence", attrs=("batch_axis", "time_axis"))
def _reverse_sequence(ctx, node, inputs):
    """Each batch entry's first ``sequence_lens[b]`` steps along ``time_axis`` reversed, the rest kept."""
    x, lens = inputs
    batch_axis, time_axis = int(node.attr("batch_axis", 1)), int(node.attr("time_axis", 0))
    xp = _xp(x, lens)
    shape = [1] * x.ndim
    shape[time_axis] = x.shape[time_axis]
    t = np.arange(x.shape[time_axis]).reshape(shape)
    shape = [1] * x.ndim
    shape[batch_axis] = x.shape[batch_axis]
    n = xp.reshape(xp.asarray(lens).astype(np.int32), shape)
    src = xp.where(t < n, n - 1 - t, t)
    src = xp.broadcast_to(src, x.shape)
    return [_result(xp.take_along_axis(xp.asarray(x), src, axis=time_axis))]


# --- GridSample ------------------------------------------------------------------------------------------------
_GRID_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}


def _reflect(f, lo: float, hi: float):
    """onnxruntime's ``GsReflect``: reflected by the nearer border until inside ``[lo, hi]``."""
    span = np.float32(hi - lo)
    below, above = f < lo, f > hi
    d = jnp.where(below, lo - f, f - hi)
    n = jnp.floor(d / span)
    r = d - n * span
    even = jnp.mod(n, 2) == 0
    inside = jnp.where(below, jnp.where(even, lo + r, hi - r), jnp.where(even, hi - r, lo + r))
    return jnp.where(below | above, inside, f)


def _grid_pixels(xt, batch, index, padding: str, borders):
    """The pixels of ``xt`` ([N, *spatial, C]) at integer ``index`` (one array per spatial axis, [N, *out]),
    outside the image as onnxruntime's ``PixelAtGrid``: 0 (zeros), the nearest edge (border) or reflected
    (reflection, by the borders of the sampled area, then truncated). Returns [N, *out, C]."""
    sizes = xt.shape[1:-1]
    valid = None
    fixed = []
    for i, size, (lo, hi) in zip(index, sizes, borders):
        if padding == "zeros":
            ok = (i >= 0) & (i < size)
            valid = ok if valid is None else valid & ok
        elif padding == "reflection":
            i = _reflect(i.astype(xt.dtype), lo, hi).astype(jnp.int32)
        fixed.append(jnp.clip(i, 0, size - 1))
    pixels = xt[(batch, *fixed)]
    return pixels if valid is None else jnp.where(valid[..., None], pixels, jnp.zeros((), xt.dtype))


def _cubic_coeffs(t):
    """Keys' cubic convolution weights (a = -0.75) of the 4 pixels around a point ``t`` past the second."""
    a = np.float32(-0.75)
    return [cubic_far(t + 1, a), cubic_near(t, a), cubic_near(1 - t, a), cubic_far(2 - t, a)]


@op("GridSample", attrs=("align_corners", "mode", "padding_mode"))
def _grid_sample(ctx, node, inputs):
    """``x`` [N, C, *spatial] sampled at ``grid`` [N, *out, n] (the last axis x, y(, z): the spatial axes in
    reverse), as onnxruntime computes it: nearest (rounded half to even), (bi/tri)linear or bicubic (2-D);
    zeros, border or reflection padding applied per pixel; align_corners."""
    x, grid = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    mode = _GRID_MODES.get(node.attr("mode", "bilinear" if node.opset < 20 else "linear"))
    padding = node.attr("padding_mode", "zeros")
    align = bool(node.attr("align_corners", 0))
    n = x.ndim - 2
    if mode is None or padding not in ("zeros", "border", "reflection"):
        raise QtoolError(f"node {node.label()}: GridSample mode '{node.attr('mode')}' / padding_mode "
                         f"'{padding}' is not supported")
    if mode == "cubic" and n != 2:
        raise QtoolError(f"node {node.label()}: cubic GridSample is 2-D only (onnxruntime's too)")
    sizes = x.shape[2:]
    coords = []
    for d, size in enumerate(sizes):
        g = grid[..., n - 1 - d]
        coords.append((g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2)
    borders = [(0.0, size - 1.0) if align else (-0.5, size - 0.5) for size in sizes]
    xt = jnp.moveaxis(x, 1, -1)
    batch = jnp.arange(x.shape[0]).reshape((-1,) + (1,) * (grid.ndim - 2))
    if mode == "nearest":
        out = _grid_pixels(xt, batch, [jnp.round(c).astype(jnp.int32) for c in coords], padding, borders)
    else:
        base = [jnp.floor(c) for c in coords]
        frac = [c - b for c, b in zip(coords, base)]
        if mode == "linear":
            taps = [[(0, 1 - f), (1, f)] for f in frac]
        else:
            taps = [list(zip(range(-1, 3), _cubic_coeffs(f))) for f in frac]
        out = 0
        for corner in np.ndindex(*[len(t) for t in taps]):
            weight = 1
            index = []
            for d, k in enumerate(corner):
                offset, w = taps[d][k]
                weight = weight * w
                index.append(base[d].astype(jnp.int32) + offset)
            out = out + weight[..., None] * _grid_pixels(xt, batch, index, padding, borders)
    return [jnp.moveaxis(out, -1, 1)]


@op("AffineGrid", attrs=("align_corners",))
def _affine_grid(ctx, node, inputs):
    """The sampling grid [N, (D,) H, W, n] of ``theta`` [N, n, n+1] over the ``size`` [N, C, (D,) H, W] image
    (the grid's last axis x, y(, z)), the positions normalized to [-1, 1] as GridSample reads them."""
    theta = jnp.asarray(inputs[0])
    size = [int(s) for s in _static(node, inputs[1], "size").reshape(-1)]
    align = bool(node.attr("align_corners", 0))
    spatial = size[2:]
    axes = []
    for length in spatial:
        i = np.arange(length, dtype=np.float32)
        axes.append(np.linspace(-1, 1, length, dtype=np.float32) if align else (2 * i + 1) / length - 1)
    mesh = np.meshgrid(*axes, indexing="ij")
    base = np.stack(list(mesh[::-1]) + [np.ones(spatial, np.float32)], axis=-1)  # x, y(, z), 1
    return [jnp.einsum("...k,njk->n...j", base, theta, precision=lax.Precision.HIGHEST)]


# --- linear algebra, windows, bits -----------------------------------------------------------------------------
@op("Det")
def _det(ctx, node, inputs):
    x = inputs[0]
    return [_result(np.linalg.det(x).astype(x.dtype)) if concrete(x) else jnp.linalg.det(x)]


def _window(kind: str):
    def impl(ctx, node, inputs):
        size = int(np.asarray(_static(node, inputs[0], "size")).reshape(-1)[0])
        n = size if node.attr("periodic", 1) else size - 1
        phase = 2 * np.pi * np.arange(size, dtype=np.float64) / max(n, 1)
        if kind == "hann":
            w = 0.5 - 0.5 * np.cos(phase)
        elif kind == "hamming":
            w = 25 / 46 - 21 / 46 * np.cos(phase)
        else:
            w = 0.42 - 0.5 * np.cos(phase) + 0.08 * np.cos(2 * phase)
        return [w.astype(_np_dtype(node, int(node.attr("output_datatype", 1))))]

    return impl


for _name, _kind in [("HannWindow", "hann"), ("HammingWindow", "hamming"), ("BlackmanWindow", "blackman")]:
    op(_name, attrs=("output_datatype", "periodic"))(_window(_kind))

for _name, _fn in [("BitwiseAnd", "bitwise_and"), ("BitwiseOr", "bitwise_or"), ("BitwiseXor", "bitwise_xor")]:
    OPS[("", _name)] = _binary(_fn)
OPS[("", "BitwiseNot")] = _unary(np.bitwise_not, jnp.bitwise_not)


@op("BitShift", attrs=("direction",))
def _bit_shift(ctx, node, inputs):
    a, b = inputs
    xp = _xp(a, b)
    fn = xp.left_shift if node.attr("direction") == "LEFT" else xp.right_shift
    return [_result(fn(a, xp.asarray(b).astype(a.dtype)))]


@op("CenterCropPad", attrs=("axes",))
def _center_crop_pad(ctx, node, inputs):
    """Each of ``axes`` (default all) cropped or zero-padded to ``shape``, centered (the odd element at the
    end)."""
    x = inputs[0]
    shape = [int(s) for s in _static(node, inputs[1], "shape").reshape(-1)]
    axes = [_axis(int(a), x.ndim) for a in (node.attr("axes") or range(x.ndim))]
    xp = _xp(x)
    index, width = [slice(None)] * x.ndim, [(0, 0)] * x.ndim
    for a, target in zip(axes, shape):
        dim = x.shape[a]
        if target < dim:
            start = (dim - target) // 2
            index[a] = slice(start, start + target)
        elif target > dim:
            before = (target - dim) // 2
            width[a] = (before, target - dim - before)
    return [_result(xp.pad(x[tuple(index)], width))]


# --- losses ---------------------------------------------------------------------------------------------------
def _nll(node, log_prob, target, weight):
    """ONNX's NegativeLogLikelihoodLoss on log-probabilities [N, C, ...]: ``-log_prob[target] * weight[target]``,
    0 where ``target == ignore_index``; ``mean`` divides by the summed weights of the counted targets."""
    target = jnp.asarray(target).astype(jnp.int32)
    ignore = node.attr("ignore_index")
    counted = jnp.ones(target.shape, bool) if ignore is None else target != int(ignore)
    safe = jnp.where(counted, target, 0)
    picked = jnp.take_along_axis(jnp.asarray(log_prob), jnp.expand_dims(safe, 1), axis=1)[:, 0]
    w = jnp.ones(target.shape, log_prob.dtype) if weight is None else jnp.asarray(weight)[safe]
    w = jnp.where(counted, w, jnp.zeros((), log_prob.dtype))
    loss = -picked * w
    reduction = node.attr("reduction", "mean")
    if reduction == "none":
        return loss
    total = jnp.sum(loss)
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise QtoolError(f"node {node.label()}: reduction '{reduction}' is not none, sum or mean")
    return total / _divisor(total, jnp.sum(w))


@op("NegativeLogLikelihoodLoss", attrs=("ignore_index", "reduction"))
def _nll_loss(ctx, node, inputs):
    return [_nll(node, inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None)]


@op("SoftmaxCrossEntropyLoss", attrs=("ignore_index", "reduction"))
def _softmax_ce(ctx, node, inputs):
    log_prob = jax.nn.log_softmax(jnp.asarray(inputs[0]), axis=1)
    return [_nll(node, log_prob, inputs[1], inputs[2] if len(inputs) > 2 else None), log_prob]


# --- attention ------------------------------------------------------------------------------------------------
def _heads(v, num_heads: int):
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    b, s, hidden = v.shape
    return jnp.transpose(jnp.reshape(v, (b, s, num_heads, hidden // num_heads)), (0, 2, 1, 3))


def _attention_bias(node, mask, q_len: int, kv_len: int, past_len: int, nonpad, dtype):
    """The additive bias [.., q_len, kv_len]: the mask (boolean: 0 or -inf; shorter than the keys: padded
    with False/-inf), the causal frontier ``j <= i + offset`` (``offset``: the past length, or
    ``nonpad_kv_seqlen - q_len`` per batch), and -inf past each batch's ``nonpad_kv_seqlen``."""
    ninf = jnp.asarray(-jnp.inf, dtype)
    bias = jnp.zeros((q_len, kv_len), dtype)
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.dtype == jnp.bool_:
            mask = jnp.where(mask, jnp.zeros((), dtype), ninf)
        pad = kv_len - mask.shape[-1]
        if pad > 0:
            mask = jnp.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)], constant_values=-np.inf)
        bias = bias + mask
    i, j = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
    if int(node.attr("is_causal", 0)):
        if nonpad is not None and past_len == 0:
            offset = jnp.reshape(jnp.asarray(nonpad).astype(jnp.int32) - q_len, (-1, 1, 1, 1))
        else:
            offset = past_len
        bias = bias + jnp.where(j <= i + offset, jnp.zeros((), dtype), ninf)
    if nonpad is not None:
        valid = j < jnp.reshape(jnp.asarray(nonpad).astype(jnp.int32), (-1, 1, 1, 1))
        bias = bias + jnp.where(valid, jnp.zeros((), dtype), ninf)
    return bias


@op("Attention", attrs=("is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap",
                        "softmax_precision"))
def _attention(ctx, node, inputs):
    """Scaled dot-product attention (opset 23/24): 3-D inputs split into ``q_num_heads``/``kv_num_heads``
    heads, grouped-query heads (each K/V head repeated), ``scale`` (default 1/sqrt(head size), applied as
    its square root to Q and K), a boolean or additive mask, ``is_causal`` (bottom-right aligned), a past
    key/value cache (present outputs), ``nonpad_kv_seqlen``, ``softcap``, every ``qk_matmul_output_mode``;
    a fully masked query row gives 0."""
    padded = list(inputs) + [None] * (7 - len(inputs))
    q, k, v, mask, past_k, past_v, nonpad = padded[:7]
    if node.attr("softmax_precision", 1) != 1:
        raise QtoolError(f"node {node.label()}: Attention's softmax_precision={node.attr('softmax_precision')} is not "
                         "supported by the JAX interpreter (1, float32, is)")
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    three_d = q.ndim == 3
    if three_d:
        q = _heads(q, int(node.attr("q_num_heads")))
        k = _heads(k, int(node.attr("kv_num_heads")))
        v = _heads(v, int(node.attr("kv_num_heads")))
    scale = node.attr("scale")
    scale = np.float32(np.sqrt(1 / np.sqrt(q.shape[-1]) if scale is None else scale))
    past_len = 0
    if past_k is not None:
        past_len = past_k.shape[2]
        k, v = jnp.concatenate([jnp.asarray(past_k), k], axis=2), jnp.concatenate([jnp.asarray(past_v), v], axis=2)
    present_k, present_v = k, v
    bias = _attention_bias(node, mask, q.shape[2], k.shape[2], past_len, nonpad, q.dtype)
    if q.shape[1] != k.shape[1]:
        k, v = jnp.repeat(k, q.shape[1] // k.shape[1], axis=1), jnp.repeat(v, q.shape[1] // k.shape[1], axis=1)
    qk = jnp.matmul(q * scale, jnp.swapaxes(k * scale, -1, -2), precision=lax.Precision.HIGHEST)
    softcap = float(node.attr("softcap", 0.0))
    if softcap > 0:
        qk = jnp.tanh(qk / np.float32(softcap)) * np.float32(softcap)
    scores = qk + bias
    masked_row = jnp.isneginf(jnp.max(bias, axis=-1, keepdims=True))
    probs = jax.nn.softmax(jnp.where(masked_row, jnp.zeros((), q.dtype), scores), axis=-1)
    probs = jnp.where(masked_row, jnp.zeros((), q.dtype), probs)
    y = jnp.matmul(probs, v, precision=lax.Precision.HIGHEST)
    if three_d:
        y = jnp.transpose(y, (0, 2, 1, 3))
        y = jnp.reshape(y, y.shape[:2] + (-1,))
    mode = int(node.attr("qk_matmul_output_mode", 0))
    qk_out = {0: qk, 1: qk, 2: scores, 3: probs}[mode]
    return [y, present_k, present_v, jnp.broadcast_to(qk_out, probs.shape)]


@op("RotaryEmbedding", attrs=("interleaved", "num_heads", "rotary_embedding_dim"))
def _rotary_embedding(ctx, node, inputs):
    """RoPE (opset 23): ``x`` [batch, heads, seq, size] or [batch, seq, heads * size] (``num_heads``), the
    first ``rotary_embedding_dim`` (default all) of each head rotated by the cos/sin caches (indexed by
    ``position_ids`` when given), as halves or ``interleaved`` pairs."""
    x, cos, sin = jnp.asarray(inputs[0]), jnp.asarray(inputs[1]), jnp.asarray(inputs[2])
    positions = inputs[3] if len(inputs) > 3 else None
    shape = x.shape
    if x.ndim == 4:
        x = jnp.transpose(x, (0, 2, 1, 3))
    else:
        x = jnp.reshape(x, shape[:2] + (int(node.attr("num_heads")), -1))
    dim = int(node.attr("rotary_embedding_dim", 0)) or x.shape[-1]
    if positions is not None:
        index = jnp.asarray(positions).astype(jnp.int32)
        cos, sin = cos[index], sin[index]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    rot, keep = x[..., :dim], x[..., dim:]
    if int(node.attr("interleaved", 0)):
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., :dim // 2], rot[..., dim // 2:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if int(node.attr("interleaved", 0)):
        rot = jnp.reshape(jnp.stack([real, imag], axis=-1), rot.shape)
    else:
        rot = jnp.concatenate([real, imag], axis=-1)
    y = jnp.concatenate([rot, keep], axis=-1)
    return [jnp.transpose(y, (0, 2, 1, 3)) if len(shape) == 4 else jnp.reshape(y, shape)]


# --- Fourier transforms ---------------------------------------------------------------------------------------
def _complex(x):
    """A real ([..., 1]) or complex ([..., 2]) ONNX signal as a complex array without the last axis."""
    x = jnp.asarray(x)
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0].astype(jnp.complex64)


def _real_imag(z, dtype):
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1).astype(dtype)


@op("DFT", attrs=("axis", "inverse", "onesided"))
def _dft(ctx, node, inputs):
    """The (inverse) DFT along ``axis`` (attribute before opset 20, input from 20; counted over the input's
    rank), zero-padded or truncated to ``dft_length``; ``onesided`` keeps the first ``n // 2 + 1`` bins."""
    x = inputs[0]
    length = inputs[1] if len(inputs) > 1 else None
    if node.opset >= 20:
        axis = int(np.asarray(_static(node, inputs[2], "axis")).reshape(-1)[0]) if len(inputs) > 2 and \
            inputs[2] is not None else -2
    else:
        axis = int(node.attr("axis", 1))
    axis = _axis(axis, x.ndim)
    n = int(np.asarray(_static(node, length, "dft_length")).reshape(-1)[0]) if length is not None else x.shape[axis]
    z = _complex(x)
    z = (jnp.fft.ifft if node.attr("inverse", 0) else jnp.fft.fft)(z, n=n, axis=axis)
    if node.attr("onesided", 0):
        z = lax.slice_in_dim(z, 0, n // 2 + 1, axis=axis)
    return [_real_imag(z, x.dtype)]


@op("STFT", attrs=("onesided",))
def _stft(ctx, node, inputs):
    """Frames of ``frame_length`` (default the window's length) every ``frame_step`` samples, times the
    window, DFT'd: [batch, frames, bins, 2] (``onesided``, default 1: ``frame_length // 2 + 1`` bins)."""
    padded = list(inputs) + [None] * (4 - len(inputs))
    x, step, window, length = padded[:4]
    step = int(np.asarray(_static(node, step, "frame_step")).reshape(-1)[0])
    if length is not None:
        length = int(np.asarray(_static(node, length, "frame_length")).reshape(-1)[0])
    else:
        length = np.shape(window)[0]
    z = _complex(x)  # [batch, samples]
    frames = (z.shape[1] - length) // step + 1
    index = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    z = z[:, index]  # [batch, frames, length]
    if window is not None:
        z = z * jnp.asarray(window)
    z = jnp.fft.fft(z, axis=-1)
    if node.attr("onesided", 1):
        z = z[..., :length // 2 + 1]
    return [_real_imag(z, jnp.asarray(x).dtype)]


@op("MelWeightMatrix", attrs=("output_datatype",))
def _mel_weight_matrix(ctx, node, inputs):
    """The [dft_length // 2 + 1, num_mel_bins] triangular mel filters (ONNX's definition), on the host."""
    bins, dft, rate = (int(np.asarray(_static(node, v, "size")).reshape(-1)[0]) for v in inputs[:3])
    lo, hi = (float(np.asarray(_static(node, v, "edge")).reshape(-1)[0]) for v in inputs[3:5])
    mel_lo, mel_hi = 2595 * np.log10(1 + lo / 700), 2595 * np.log10(1 + hi / 700)
    mels = np.arange(bins + 2) * ((mel_hi - mel_lo) / (bins + 2)) + mel_lo
    edges = (((dft + 1) * (700 * (10 ** (mels / 2595) - 1))) // rate).astype(int)
    out = np.zeros((dft // 2 + 1, bins))
    for i in range(bins):
        left, center, right = edges[i:i + 3]
        if center == left:
            out[center, i] = 1
        else:
            out[left:center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    return [out.astype(_np_dtype(node, int(node.attr("output_datatype", 1))))]


@op("Col2Im", attrs=("dilations", "pads", "strides"))
def _col2im(ctx, node, inputs):
    """The adjoint of im2col: [N, C * prod(block), L] columns summed back into the [N, C, *image_shape] image
    (``strides``, ``pads``, ``dilations``), as the transpose of JAX's patch extraction."""
    cols = jnp.asarray(inputs[0])
    image = [int(s) for s in _static(node, inputs[1], "image_shape").reshape(-1)]
    block = [int(s) for s in _static(node, inputs[2], "block_shape").reshape(-1)]
    n = len(image)
    strides, dilations = ([int(v) for v in (node.attr(k) or [1] * n)] for k in ("strides", "dilations"))
    p = [int(v) for v in (node.attr("pads") or [0] * (2 * n))]
    channels = cols.shape[1] // int(np.prod(block))
    img_shape = (cols.shape[0], channels, *image)

    def patches(img):
        return lax.conv_general_dilated_patches(img, block, strides, [(p[i], p[i + n]) for i in range(n)],
                                                rhs_dilation=dilations, precision=lax.Precision.HIGHEST)

    out_shape = jax.eval_shape(patches, jax.ShapeDtypeStruct(img_shape, cols.dtype)).shape
    (img,) = jax.linear_transpose(patches, jax.ShapeDtypeStruct(img_shape, cols.dtype))(jnp.reshape(cols, out_shape))
    return [img]


@op("SwiGLU", attrs=("alpha",))
def _swiglu(ctx, node, inputs):
    a, b = inputs
    return [a * jax.nn.sigmoid(_f32(node, "alpha", 1.0) * a) * b]


@op("TensorScatter", attrs=("axis", "mode"))
def _tensor_scatter(ctx, node, inputs):
    """``update`` written into ``past_cache`` along ``axis`` (default -2) from each batch entry's
    ``write_indices`` (default 0); ``circular`` wraps around the cache's length."""
    cache, update = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    starts = inputs[2] if len(inputs) > 2 else None
    axis = _axis(int(node.attr("axis", -2)), cache.ndim)
    size, length = cache.shape[axis], update.shape[axis]
    starts = jnp.zeros(cache.shape[0], jnp.int32) if starts is None else jnp.asarray(starts).astype(jnp.int32)
    shape = [1] * cache.ndim
    shape[0], shape[axis] = cache.shape[0], length
    where = jnp.reshape(starts, [-1] + [1] * (cache.ndim - 1)) + jnp.reshape(jnp.arange(length), [1] * axis + [-1]
                                                                             + [1] * (cache.ndim - axis - 1))
    if node.attr("mode", "linear") == "circular":
        where = jnp.mod(where, size)
    where = jnp.broadcast_to(where, update.shape)
    return [cache.at[_along(where, axis, update.shape)].set(update)]


@op("DeformConv", attrs=("dilations", "group", "kernel_shape", "offset_group", "pads", "strides"))
def _deform_conv(ctx, node, inputs):
    """2-D deformable convolution (v1, and v2 with ``mask``): each kernel tap reads the input bilinearly
    (0 outside) at its place moved by ``offset`` [N, offset_group * kH * kW * 2 (dy, dx), oH, oW]; ``group``,
    ``offset_group``, ``strides``, ``pads``, ``dilations``, the bias."""
    padded = list(inputs) + [None] * (5 - len(inputs))
    x, w, offset, b, mask = (None if v is None else jnp.asarray(v) for v in padded[:5])
    if x.ndim != 4:
        raise QtoolError(f"node {node.label()}: only 2-D DeformConv is supported")
    n, c = x.shape[:2]
    kh, kw = (int(k) for k in (node.attr("kernel_shape") or w.shape[2:]))
    (sh, sw), (dh, dw) = _spatial_attrs(node, 2)
    pads = [int(p) for p in (node.attr("pads") or [0] * 4)]
    groups, offset_groups = int(node.attr("group", 1)), int(node.attr("offset_group", 1))
    oh, ow = offset.shape[2:]
    offset = jnp.reshape(offset, (n, offset_groups, kh, kw, 2, oh, ow))
    mask = None if mask is None else jnp.reshape(mask, (n, offset_groups, kh, kw, oh, ow))
    rows = (np.arange(kh)[:, None, None, None] * dh + np.arange(oh)[None, None, :, None] * sh - pads[0])
    cols = (np.arange(kw)[None, :, None, None] * dw + np.arange(ow)[None, None, None, :] * sw - pads[1])
    xt = jnp.moveaxis(x, 1, -1)
    batch = jnp.arange(n).reshape(-1, 1, 1, 1, 1)
    per = c // offset_groups
    sampled = []
    for g in range(offset_groups):
        y, xx = rows + offset[:, g, :, :, 0], cols + offset[:, g, :, :, 1]  # [N, kH, kW, oH, oW]
        y0, x0 = jnp.floor(y), jnp.floor(xx)
        fy, fx = y - y0, xx - x0
        y0, x0 = y0.astype(jnp.int32), x0.astype(jnp.int32)
        part = xt[..., g * per:(g + 1) * per]
        borders = [(-0.5, x.shape[2] - 0.5), (-0.5, x.shape[3] - 0.5)]
        v = sum(wy[..., None] * wx[..., None] * _grid_pixels(part, batch, [y0 + dy, x0 + dx], "zeros", borders)
                for dy, wy in ((0, 1 - fy), (1, fy)) for dx, wx in ((0, 1 - fx), (1, fx)))
        sampled.append(v if mask is None else v * mask[:, g, ..., None])
    taps = jnp.concatenate(sampled, axis=-1)  # [N, kH, kW, oH, oW, C]
    taps = jnp.reshape(taps, taps.shape[:-1] + (groups, c // groups))
    wg = jnp.reshape(w, (groups, -1) + w.shape[1:])  # [group, oC/group, C/group, kH, kW]
    y = jnp.einsum("nijhwgc,gocij->ngohw", taps, wg, precision=lax.Precision.HIGHEST)
    y = jnp.reshape(y, (n, -1, oh, ow))
    return [y if b is None else y + jnp.reshape(b, (1, -1, 1, 1))]


def _roi_axis(start, size: float, bins: int, grid: int, length: int):
    """RoiAlign's sample positions along one axis, [R, bins, grid], as onnxruntime clamps them: the low and
    high pixels, the high pixel's weight, and whether the sample is inside (``-1 <= v <= length``)."""
    step = size / bins
    v = start[:, None, None] + np.arange(bins)[None, :, None] * step[:, None, None] \
        + (np.arange(grid)[None, None, :] + 0.5) * (step / grid)[:, None, None]
    inside = (v >= -1.0) & (v <= length)
    v = jnp.maximum(v, 0)
    low = jnp.floor(v).astype(jnp.int32)
    edge = low >= length - 1
    low = jnp.where(edge, length - 1, low)
    high = jnp.where(edge, length - 1, low + 1)
    frac = jnp.where(edge, jnp.zeros_like(v), v - low)
    return low, high, frac, inside


@op("RoiAlign", attrs=("coordinate_transformation_mode", "mode", "output_height", "output_width", "sampling_ratio",
                      "spatial_scale"))
def _roi_align(ctx, node, inputs):
    """RoiAlign with a fixed ``sampling_ratio`` (> 0; 0, the adaptive count, depends on each box's size):
    ``avg`` or onnxruntime's ``max`` (the largest weighted corner over the samples), ``half_pixel`` (opset
    16's default) or ``output_half_pixel``, ``spatial_scale``; samples outside the map count 0."""
    x, rois, batch = jnp.asarray(inputs[0]), jnp.asarray(inputs[1]), jnp.asarray(inputs[2]).astype(jnp.int32)
    grid = int(node.attr("sampling_ratio", 0))
    if grid <= 0:
        raise QtoolError(f"node {node.label()}: RoiAlign with sampling_ratio 0 (a sample count per box that "
                         "depends on the box) is not supported by the JAX interpreter; a fixed sampling_ratio is")
    oh, ow = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    half = node.attr("coordinate_transformation_mode", "half_pixel" if node.opset >= 16 else "output_half_pixel")
    scale = _f32(node, "spatial_scale", 1.0)
    shift = np.float32(0.5 if half == "half_pixel" else 0.0)
    box = rois * scale - shift  # x1, y1, x2, y2
    width, height = box[:, 2] - box[:, 0], box[:, 3] - box[:, 1]
    if half != "half_pixel":
        width, height = jnp.maximum(width, 1.0), jnp.maximum(height, 1.0)
    h, w = x.shape[2:]
    ylo, yhi, ly, yin = _roi_axis(box[:, 1], height, oh, grid, h)  # [R, oh, grid]
    xlo, xhi, lx, xin = _roi_axis(box[:, 0], width, ow, grid, w)  # [R, ow, grid]
    xt = jnp.moveaxis(x, 1, -1)  # [N, H, W, C]
    b = batch[:, None, None, None, None]
    inside = (yin[:, :, :, None, None] & xin[:, None, None, :, :])[..., None]

    def corner(yi, xi, weight):  # [R, oh, grid, ow, grid, C]
        pixels = xt[b, yi[:, :, :, None, None], xi[:, None, None, :, :]]
        return jnp.where(inside, weight[..., None] * pixels, jnp.zeros((), x.dtype))

    wy = [(ylo, 1 - ly), (yhi, ly)]
    wx = [(xlo, 1 - lx), (xhi, lx)]
    values = [corner(yi, xi, a[:, :, :, None, None] * c[:, None, None, :, :]) for yi, a in wy for xi, c in wx]
    if node.attr("mode", "avg") == "max":
        y = jnp.max(jnp.maximum(jnp.maximum(values[0], values[1]), jnp.maximum(values[2], values[3])), axis=(2, 4))
    else:
        y = jnp.sum(values[0] + values[1] + values[2] + values[3], axis=(2, 4)) / np.float32(grid * grid)
    return [jnp.moveaxis(y, -1, 1)]


@op("MaxRoiPool", attrs=("pooled_shape", "spatial_scale"))
def _max_roi_pool(ctx, node, inputs):
    """Fast R-CNN's RoI max pooling as onnxruntime computes it: each box ([batch, x1, y1, x2, y2], scaled and
    rounded half away from zero) split into ``pooled_shape`` bins of whole pixels; an empty bin gives 0."""
    x, rois = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    ph, pw = (int(v) for v in node.attr("pooled_shape"))
    scaled = rois[:, 1:] * _f32(node, "spatial_scale", 1.0)
    x1, y1, x2, y2 = (jnp.sign(v) * jnp.floor(jnp.abs(v) + 0.5) for v in scaled.T)
    h, w = x.shape[2:]

    def bins(start, end, count: int, length: int):  # [R, count, length]: the pixels of each bin
        size = jnp.maximum(end - start + 1, 1) / count
        i = np.arange(count)[None, :]
        lo = jnp.clip(jnp.floor(i * size[:, None]) + start[:, None], 0, length)
        hi = jnp.clip(jnp.ceil((i + 1) * size[:, None]) + start[:, None], 0, length)
        pixel = np.arange(length)[None, None, :]
        return (pixel >= lo[..., None]) & (pixel < hi[..., None])

    rows, cols = bins(y1, y2, ph, h), bins(x1, x2, pw, w)
    inside = rows[:, :, None, :, None] & cols[:, None, :, None, :]  # [R, ph, pw, H, W]
    maps = x[jnp.asarray(rois[:, 0]).astype(jnp.int32)]  # [R, C, H, W]
    masked = jnp.where(inside[:, None], maps[:, :, None, None], -jnp.inf)
    y = jnp.max(masked, axis=(-2, -1))
    return [jnp.where(jnp.any(inside, axis=(-2, -1))[:, None], y, jnp.zeros((), x.dtype))]
