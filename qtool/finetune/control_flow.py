"""Control flow for the JAX interpreter (:mod:`qtool.finetune.interpreter`): ``If``, ``Loop`` and ``Scan``.

A subgraph runs in a scope of its own that reads the enclosing scopes' values by name (its own
initializers and Constant nodes included); the values a body computes from constants alone stay numpy
arrays, as in the main graph, so shapes stay static inside it.

- ``If`` with a condition known at trace time (computed from constants and shapes: PyTorch's shape
  checks, or a sample rate fed whole with every batch, which ``finetune`` keeps on the host) runs the
  taken branch only, inlined. A condition computed from data runs ``lax.cond``: both branches must give
  the same shapes and types.
- ``Scan`` (opset 9 on) is a ``lax.scan``: every input and output axis and direction.
- ``Loop`` with a trip count known at trace time is a ``lax.scan`` of that length (differentiable); a
  condition computed from data masks the iterations after it turns false (the loop-carried values hold),
  which needs the loop to have no scan outputs (their length would depend on data). A trip count from
  data (or none: a while loop), or one over ``MAX_MASKED`` iterations with a data condition, is a
  ``lax.while_loop``: forward only, refused where it reads a trained value (JAX has no reverse-mode
  gradient for it).
- A loop whose every input is a constant runs on the host (numpy), as constant folding.
- A loop whose body needs a value it carries as a constant (a step counter a ``Slice`` starts at) is
  unrolled: its iterations run one after the other at trace time (up to ``MAX_UNROLLED``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qtool.errors import QtoolError
from qtool.finetune.interpreter import Body, Context, NeedsConstant, Node, _axis, concrete, op

MAX_MASKED = 4096  # a Loop with a data condition runs as a masked scan up to this trip count
MAX_UNROLLED = 1024  # a loop whose body needs a carried value as a constant is unrolled up to this many iterations


# --- If ------------------------------------------------------------------------------------------------------
@op("If", attrs=("then_branch", "else_branch"))
def _if(ctx: Context, node: Node, inputs):
    scope, cond = ctx.scope, inputs[0]
    then_body, else_body = node.attr("then_branch"), node.attr("else_branch")
    if concrete(cond):
        return ctx.run_body(then_body if bool(np.asarray(cond).reshape(-1)[0]) else else_body, scope, [])

    def branch(body: Body):
        return lambda: [jnp.asarray(v) for v in ctx.run_body(body, scope, [])]

    try:
        return lax.cond(jnp.reshape(cond, ()).astype(bool), branch(then_body), branch(else_body))
    except TypeError as exc:
        detail = " ".join(str(exc).split())
        raise QtoolError(f"node {node.label()}: its condition is computed from data and its branches give "
                         f"different shapes or types (the JAX interpreter runs both as lax.cond): {detail}") from exc


# --- Scan ------------------------------------------------------------------------------------------------------
@op("Scan", attrs=("body", "num_scan_inputs", "scan_input_axes", "scan_input_directions", "scan_output_axes",
                    "scan_output_directions"))
def _scan(ctx: Context, node: Node, inputs):
    if node.opset < 9:
        raise QtoolError(f"node {node.label()}: Scan of opset {node.opset} (a batch axis and sequence_lens) is "
                         "not supported by the JAX interpreter (opset 9 on is)")
    body: Body = node.attr("body")
    m = int(node.attr("num_scan_inputs"))
    n = len(node.inputs) - m
    k = len(body.outputs) - n
    states, seqs = list(inputs[:n]), [inputs[n + j] for j in range(m)]
    in_axes = node.attr("scan_input_axes") or [0] * m
    in_dirs = node.attr("scan_input_directions") or [0] * m
    xs = [_time_first(x, int(a), int(d)) for x, a, d in zip(seqs, in_axes, in_dirs)]
    length = int(np.shape(xs[0])[0])
    scope = ctx.scope

    def step(carry, slices, i):
        outs = ctx.run_body(body, scope, list(carry) + list(slices))
        return outs[:n], outs[n:]

    try:
        carry, ys = _iterate(ctx, node, body, step, states, xs, length, body.outputs[:n])
    except NeedsConstant as exc:
        carry, ys = _iterate(ctx, node, body, step, states, xs, length, body.outputs[:n], unroll=exc)
    out_axes = node.attr("scan_output_axes") or [0] * k
    out_dirs = node.attr("scan_output_directions") or [0] * k
    return list(carry) + [_time_back(y, int(a), int(d)) for y, a, d in zip(ys, out_axes, out_dirs)]


def _time_first(x, axis: int, direction: int):
    xp = np if concrete(x) else jnp
    x = xp.moveaxis(x, _axis(axis, x.ndim), 0)
    return xp.flip(x, 0) if direction else x


def _time_back(y, axis: int, direction: int):
    xp = np if concrete(y) else jnp
    y = xp.flip(y, 0) if direction else y
    return xp.moveaxis(y, 0, _axis(axis, y.ndim))


# --- Loop ------------------------------------------------------------------------------------------------------
class _DataCondition(Exception):
    """A Loop run as a plain scan met a condition computed from data (it then runs masked)."""


@op("Loop", attrs=("body",))
def _loop(ctx: Context, node: Node, inputs):
    body: Body = node.attr("body")
    inputs = list(inputs) + [None] * (len(node.inputs) - len(inputs))
    trips, cond, values = inputs[0], inputs[1], list(inputs[2:])
    cond = np.asarray(True) if cond is None else cond  # onnxruntime reads the body's condition even then
    k = len(body.outputs) - 1 - len(values)
    if trips is not None and concrete(trips):
        trips = int(np.asarray(trips).reshape(-1)[0])
    try:
        return _traced_loop(ctx, node, body, trips, cond, values, k)
    except NeedsConstant as exc:
        if not (isinstance(trips, int) and concrete(cond)):
            raise NeedsConstant(f"{exc}; in the body of a Loop whose trip count or condition is computed from "
                                "data, which the interpreter cannot unroll") from exc
        return _loop_scan(ctx, node, body, trips, cond, values, unroll=exc)


def _traced_loop(ctx: Context, node: Node, body: Body, trips, cond, values: list, k: int) -> list:
    """A Loop as a scan (plain, or masked by a data condition), a while loop, or on the host."""
    stopped = concrete(cond) and not bool(np.asarray(cond).reshape(-1)[0])  # no iteration runs
    host = isinstance(trips, int) and (stopped or _on_host(ctx, body, [cond, *values]))
    if not host and concrete(cond) and bool(np.asarray(cond).reshape(-1)[0]) and isinstance(trips, int):
        try:
            return _loop_scan(ctx, node, body, trips, None, values)
        except _DataCondition:
            pass
    if not isinstance(trips, int) or (trips > MAX_MASKED and not host):
        return _while(ctx, node, body, trips, cond, values, k)
    if k and not host:
        raise QtoolError(f"node {node.label()}: a Loop whose condition is computed from data has scan outputs (their "
                         "length would depend on the data); the JAX interpreter needs static shapes")
    return _loop_scan(ctx, node, body, trips, cond, values)


def _loop_scan(ctx: Context, node: Node, body: Body, trips: int, cond, values: list, unroll=None) -> list:
    """``trips`` iterations as a scan. ``cond`` None: every iteration runs (the body's condition must be the
    constant true, else :class:`_DataCondition`); else the first carried value is whether the loop still runs,
    and the values stop changing once it is false (on the host, or unrolled while it is a constant, the loop
    stops). ``unroll``: the :class:`NeedsConstant` that makes the loop unroll (see :func:`_iterate`)."""
    scope, n = ctx.scope, len(values)
    names = ["condition", *body.outputs[1:1 + n]] if cond is not None else body.outputs[1:1 + n]

    def step(carry, slices, i):
        active, vals = (carry[0], carry[1:]) if cond is not None else (np.asarray(True), carry)
        outs = ctx.run_body(body, scope, [i, active, *vals])
        go, new, ys = outs[0], outs[1:1 + n], outs[1 + n:]
        if cond is None:
            if not (concrete(go) and bool(np.asarray(go).reshape(-1)[0])):
                raise _DataCondition
            return new, ys
        if not (concrete(active) and concrete(go)):
            new = [jnp.where(active, jnp.asarray(v), old) for v, old in zip(new, vals)]
            return [jnp.logical_and(active, jnp.reshape(go, ()).astype(bool)), *new], ys
        return [np.asarray(bool(active) and bool(np.asarray(go).reshape(-1)[0])), *new], ys

    start = [] if cond is None else [np.asarray(cond).reshape(()) if concrete(cond) else
                                     jnp.reshape(cond, ()).astype(bool)]
    carry, ys = _iterate(ctx, node, body, step, [*start, *values], [], trips, names,
                         running=(lambda c: not concrete(c[0]) or bool(c[0])) if cond is not None else None,
                         unroll=unroll)
    if ys and start and not concrete(carry[0]):
        raise QtoolError(f"node {node.label()}: a Loop whose condition is computed from data has scan outputs (their "
                         "length would depend on the data); the JAX interpreter needs static shapes")
    return list(carry[len(start):]) + list(ys)


def _while(ctx: Context, node: Node, body: Body, trips, cond, values: list, k: int) -> list:
    """A Loop whose trip count is not static (or too long to mask): ``lax.while_loop``, forward only."""
    if k:
        raise QtoolError(f"node {node.label()}: a Loop whose trip count is computed from data has scan outputs "
                         "(their length would depend on the data); the JAX interpreter needs static shapes")
    scope = ctx.scope
    read = [name for name in [*node.inputs, *body.reads] if name and _floating(scope.get(name))]
    trained = next((name for name in read if ctx.trained(name)), None)
    if trained is not None:
        raise QtoolError(f"node {node.label()}: a Loop whose trip count is computed from data (a while loop) reads "
                         f"'{trained}', which depends on trained values; JAX cannot differentiate a while loop "
                         "in reverse mode (a static trip count can: it runs as a scan)")
    limit = None if trips is None else jnp.reshape(jnp.asarray(trips), ())
    start = jnp.reshape(jnp.asarray(cond), ()).astype(bool)

    def running(carry):
        i, active = carry[0], carry[1]
        return active if limit is None else jnp.logical_and(active, i < limit)

    def step(carry):
        i, active, vals = carry[0], carry[1], carry[2:]
        outs = ctx.run_body(body, scope, [i, active, *vals])
        go = jnp.reshape(jnp.asarray(outs[0]), ()).astype(bool)
        return [i + 1, go, *_same_types(node, outs[1:1 + len(vals)], vals, body.outputs[1:])]

    carry = [jnp.asarray(0, jnp.int32), start, *(jnp.asarray(v) for v in values)]
    return list(lax.while_loop(running, step, carry)[2:])


def _floating(value) -> bool:
    """Whether a gradient can flow through ``value`` (a trip count or a condition carries none)."""
    return value is not None and jnp.issubdtype(value.dtype, jnp.floating)


# --- the iteration shared by Loop and Scan ----------------------------------------------------------------------
def _on_host(ctx: Context, body: Body, values: list) -> bool:
    """Every value the iterations read is a constant: they run in numpy (constant folding)."""
    return all(concrete(v) for v in values) and all(concrete(ctx.scope[r]) for r in body.reads if r in ctx.scope)


def _iterate(ctx: Context, node: Node, body: Body, step, carry: list, xs: list, length: int, names: list,
             running=None, unroll: NeedsConstant | None = None):
    """``length`` iterations of ``step(carry, slices of xs, i) -> (carry, outputs)``: the last carry and
    each output stacked on a new first axis. In Python, one iteration after the other, on the host (numpy)
    when every value read is constant, or ``unroll``ed (traced, up to ``MAX_UNROLLED`` iterations: a body that
    needs a value it carries, a step counter, as a constant: paddle's decoders slice their buffers at it);
    ``running(carry)`` false stops early. Else as ``lax.scan``."""
    stopped = running is not None and not running(carry)
    if length > 0 and (unroll is not None or stopped or _on_host(ctx, body, [*carry, *xs])):
        outs = []
        for i in range(length):
            if running is not None and not running(carry):
                break
            if i == MAX_UNROLLED and unroll is not None:
                raise QtoolError(f"{unroll}; the loop around it needs it as a constant and was unrolled, but it "
                                 f"runs more than {MAX_UNROLLED} iterations")
            carry, ys = step(carry, [x[i] for x in xs], np.asarray(i, np.int64))
            outs.append(ys)
        if not outs:  # stopped before its first iteration: outputs of length 0, shaped as one would be
            shapes = jax.eval_shape(lambda: step(carry, [x[0] for x in xs], np.asarray(0, np.int64))[1])
            return carry, [np.zeros((0, *s.shape), s.dtype) for s in shapes]
        xp = np if all(concrete(o) for ys in outs for o in ys) else jnp
        stacked = [xp.stack([o[j] for o in outs]) for j in range(len(outs[0]))]
        if unroll is not None or all(concrete(v) for v in [*carry, *stacked]):
            return carry, stacked
        raise QtoolError(f"node {node.label()}: its body computed a traced value from constants")
    init = (jnp.asarray(0, jnp.int32), [jnp.asarray(v) for v in carry])

    def scan_step(c, slices):
        i, values = c
        new, ys = step(list(values), list(slices), i)
        return (i + 1, _same_types(node, new, values, names)), [jnp.asarray(y) for y in ys]

    (_, final), ys = lax.scan(scan_step, init, [jnp.asarray(x) for x in xs], length=length)
    return list(final), list(ys)


def _same_types(node: Node, new: list, old: list, names: list) -> list:
    """The loop-carried values of the next iteration in the types of this one's (a constant's int64 is
    JAX's int32); a shape that changes between iterations is an error naming the value."""
    out = []
    for v, o, name in zip(new, old, names):
        v = jnp.asarray(v)
        if v.shape != o.shape:
            raise QtoolError(f"node {node.label()}: its loop-carried value '{name}' changes shape from "
                             f"{list(o.shape)} to {list(v.shape)} between iterations; the JAX interpreter needs "
                             "fixed shapes")
        out.append(v.astype(o.dtype))
    return out
