"""A large graph's training step compiled in segments (``finetune``; docs/finetune.md, "Where the compile time and
memory go").

XLA's compile of one training step costs time and memory per kernel, and more than in proportion for a large
program: captcha-whisperer's CRNN (6,263 training-graph nodes, an LSTM unrolled into 80 cells) passed 9 GB of
compile memory. Here the graph's nodes are cut, in their order, into segments of about ``SEGMENT_NODES`` nodes,
and each segment is a jitted function of the values it reads from the segments before it:

- the forward runs the segments one after the other; a training segment returns its outputs and its
  ``jax.vjp`` (the residuals, a ``jax.tree_util.Partial`` that a jitted function may return);
- the backward runs each segment's vjp in reverse order, the cotangents of a value read by several segments
  summed (the only difference from one program: the order of those sums);
- a value the interpreter computes on the host (a shape, a constant: a numpy array) stays a constant of the
  segments that read it, as in one program. Which values those are depends on the input shapes: a first
  abstract pass over the segments (``jax.eval_shape``) finds them, once per input shape.

Each segment is compiled alone, so the compile's peak memory is that of the largest segment, not of the graph.
A graph with no feed to differentiate (``diff_from`` empty: the teacher, the validation forward) runs forward
only: no residuals are kept, and a value no later segment reads is dropped after the segment that made it, so
its memory is one segment's buffers plus the values crossing to the next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from qtool.finetune.interpreter import Interpreter, Node, bodies

SEGMENT_NODES = 1000  # nodes per segment; a graph with more nodes than this is trained in segments


def _size(node: Node) -> int:
    return 1 + sum(_size(n) for body in bodies(node) for n in body.nodes)


def _reads(node: Node) -> set:
    return {i for i in node.inputs if i} | {r for body in bodies(node) for r in body.reads}


def split(nodes: list[Node], size: int | None = None) -> list[list[Node]]:
    """``nodes`` in order, cut into runs of about ``size`` nodes (default ``SEGMENT_NODES``; a node with subgraphs
    counts theirs); 0: one run."""
    size = SEGMENT_NODES if size is None else size
    if size <= 0:
        return [list(nodes)]
    chunks, chunk, count = [], [], 0
    for node in nodes:
        chunk.append(node)
        count += _size(node)
        if count >= size:
            chunks.append(chunk)
            chunk, count = [], 0
    return chunks + [chunk] if chunk else chunks


def _traced(v) -> bool:
    return isinstance(v, jax.core.Tracer)


def _is_float(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.floating)


@dataclass
class _Segment:
    inputs: list[str]  # traced values it reads (feeds or earlier segments' outputs)
    consts: dict  # the values it reads that are known on the host
    outputs: dict  # name -> ShapeDtypeStruct: the traced values it computes that are read after it
    fwd: Callable | None = None  # jitted (differentiated inputs, the others) -> (diff outputs, vjp, other outputs)
    bwd: Callable | None = None  # jitted (vjp, {output: cotangent}) -> ({input: cotangent},)
    diff_in: tuple = ()  # the float inputs computed from a trained feed (their cotangents are the backward's)
    diff_out: tuple = ()


class SegmentedGraph:
    """The graph as a chain of jitted segments. ``options``: the interpreter context's (``fake_quant``,
    ``range_grad``, ``no_grad``, ``trainable``); ``wanted``: the values the caller reads; ``diff_from``: the feeds
    gradients are taken for."""

    def __init__(self, interp: Interpreter, chunks: list[list[Node]], options: dict, wanted: list[str],
                 diff_from: frozenset):
        self.interp, self.chunks, self.options, self.wanted = interp, chunks, options, list(wanted)
        self.diff_from = diff_from
        self.differentiable = interp.reaching(diff_from)
        after = [set(self.wanted)]
        for chunk in reversed(chunks[1:]):
            after.append(after[-1] | set().union(*(_reads(n) for n in chunk)))
        self.read_after = after[::-1]  # per segment: the names read after it
        self.plans: dict = {}

    def _context(self):
        return self.interp.context(**self.options)

    def plan(self, feeds: dict) -> tuple[list[_Segment], dict]:
        """The segments for these feeds' shapes (traced feeds: jax arrays; host constants: numpy arrays), and the
        wanted values known on the host."""
        traced = {n: jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)) for n, v in feeds.items()
                  if not isinstance(v, np.ndarray)}
        key = (tuple(sorted((n, a.shape, str(a.dtype)) for n, a in traced.items())),  # the host constants too:
               tuple(sorted((n, v.shape, str(v.dtype), v.tobytes()) for n, v in feeds.items() if n not in traced)))
        if key not in self.plans:
            known = {n: v for n, v in self.interp.initializers.items() if n not in traced}
            known.update((n, v) for n, v in feeds.items() if n not in traced)
            segments = [self._segment(chunk, read_after, known, traced)
                        for chunk, read_after in zip(self.chunks, self.read_after)]
            self.plans[key] = segments, {n: known[n] for n in self.wanted if n in known}
        return self.plans[key]

    def _segment(self, chunk: list[Node], read_after: set, known: dict, avals: dict) -> _Segment:
        """One segment: what it reads, found by running it abstractly (``known`` and ``avals`` grow by its
        host-known and traced outputs)."""
        reads = set().union(*(_reads(n) for n in chunk))
        inputs = sorted(r for r in reads if r in avals)
        consts = {r: known[r] for r in reads if r in known and r not in avals}
        produced = [o for n in chunk for o in n.outputs if o and o in read_after]
        ctx = self._context()

        def probe(vals):
            env = {**consts, **vals}
            self.interp.run_nodes(chunk, env, ctx)
            for name in produced:
                v = env[name]
                if _traced(v):
                    avals[name] = jax.ShapeDtypeStruct(v.shape, v.dtype)
                else:
                    known[name] = v
                    avals.pop(name, None)

        jax.eval_shape(probe, {n: avals[n] for n in inputs})
        outputs = {n: avals[n] for n in produced if n in avals}

        def run(vals):
            env = {**consts, **vals}
            self.interp.run_nodes(chunk, env, self._context())
            return {n: env[n] for n in outputs}

        segment = _Segment(inputs, consts, outputs)
        self._differentiate(segment, run, avals)
        return segment

    def _differentiate(self, segment: _Segment, run: Callable, avals: dict) -> None:
        diff = self.differentiable
        segment.diff_in = tuple(n for n in segment.inputs if n in diff and _is_float(avals[n]))
        segment.diff_out = tuple(n for n, a in segment.outputs.items() if n in diff and _is_float(a))
        diff_out, shapes = segment.diff_out, segment.outputs
        if not self.diff_from:  # forward only: no vjp, no residuals
            segment.fwd = jax.jit(lambda d, rest: ({}, None, run(rest)))
            return

        def fwd(d, rest):
            def f(dd):
                outs = run({**dd, **rest})
                return {n: outs[n] for n in diff_out}, {n: v for n, v in outs.items() if n not in diff_out}

            return jax.vjp(f, d, has_aux=True)

        def bwd(vjp, given):
            return vjp({n: given[n] if n in given else jnp.zeros(shapes[n].shape, shapes[n].dtype) for n in diff_out})

        segment.fwd, segment.bwd = jax.jit(fwd), jax.jit(bwd)

    def forward_vjp(self, feeds: dict) -> tuple[dict, Callable]:
        """Every wanted value, and the backward: ``{wanted value: cotangent}`` -> ``{diff_from feed: gradient}``
        (zeros for a feed no value depends on)."""
        segments, constants = self.plan(feeds)
        values, vjps = {**constants, **feeds}, []
        for segment, read_after in zip(segments, self.read_after):
            diff = {n: values[n] for n in segment.diff_in}
            rest = {n: values[n] for n in segment.inputs if n not in diff}
            outs, vjp, aux = segment.fwd(diff, rest)
            values = {n: v for n, v in {**values, **outs, **aux}.items() if n in read_after}  # (the vjp holds its own)
            vjps.append(vjp)

        def backward(cotangents: dict) -> dict:
            cots = dict(cotangents)
            for segment, vjp in zip(reversed(segments), reversed(vjps)):
                given = {n: cots.pop(n) for n in segment.diff_out if n in cots}
                if not given:
                    continue
                (grads,) = segment.bwd(vjp, given)
                for n, g in grads.items():
                    cots[n] = cots[n] + g if n in cots else g
            return {n: cots[n] if n in cots else jnp.zeros_like(feeds[n]) for n in self.diff_from}

        return {n: values[n] for n in self.wanted}, backward

    def forward(self, feeds: dict) -> dict:
        """Every wanted value (built with no ``diff_from``: forward only)."""
        return self.forward_vjp(feeds)[0]
