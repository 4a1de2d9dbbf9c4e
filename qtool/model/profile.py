"""onnxruntime's per-node profile of a session, summed per op type: where a model's time goes.

A session made with the profiler on (:func:`profiling` around its creation)
runs one feed ``PROFILE_RUNS`` times after ``PROFILE_WARMUP``; each node's
median time is summed per op type of onnxruntime's optimized graph
(``QLinearConv``, ``QuantizeLinear``, a float model's ``FusedConv``...). The
profiler adds about a microsecond per node, so these sums explain a timing
taken without it, they do not replace it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

PROFILE_RUNS = 20
PROFILE_WARMUP = 5


@dataclass(frozen=True)
class OpTime:
    """One op type of onnxruntime's optimized graph: milliseconds per run (its nodes' medians summed)."""

    op: str
    ms: float
    nodes: int

    def to_dict(self) -> dict:
        return {"op": self.op, "ms": self.ms, "nodes": self.nodes}


@contextlib.contextmanager
def profiling(options: ort.SessionOptions):
    """Turn the profiler on in ``options``; yields the temporary folder its file goes to, to be kept alive as long
    as the session (it is removed with the last reference, or at once if the session is not made); None, profiler
    off, when no temporary folder can be made (the breakdown is then empty)."""
    try:
        folder = _Folder(tempfile.mkdtemp(prefix="qtool-profile-"))
    except OSError:
        yield None
        return
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(folder.path, "profile")
    try:
        yield folder
    except BaseException:
        folder.remove()
        raise


class _Folder:
    """A profiled session's temporary folder, removed with the session (the profile is written there at its end)."""

    def __init__(self, path: str):
        self.path = path

    def remove(self):
        shutil.rmtree(self.path, ignore_errors=True)

    def __del__(self):
        self.remove()


def node_times(session, feed: dict[str, np.ndarray], runs: int = PROFILE_RUNS,
               warmup: int = PROFILE_WARMUP) -> tuple[dict[tuple[str, str], float], float]:
    """``session`` (made inside :func:`profiling`) run on ``feed`` ``warmup + runs`` times: the median
    microseconds of each node of onnxruntime's optimized graph over the last ``runs``, by ``(op type, node name)``,
    and the median microseconds of a whole run (nothing when onnxruntime wrote no readable profile). Ends the
    session's profiling (once per session)."""
    run = functools.partial(session.run, feed, session.outputs[:1], "the profiled run")
    for _ in range(warmup + runs):
        run()
    path = session.session.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    except (OSError, ValueError):  # no file, or not onnxruntime's JSON: no breakdown (it only explains a timing)
        events = []
    finally:
        if path and os.path.exists(path):
            os.remove(path)
    starts = sorted((e["ts"], e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    since = starts[warmup][0] if len(starts) > warmup else 0
    per_node: dict[tuple[str, str], list[float]] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") == "Node" and name.endswith("_kernel_time") and e["ts"] >= since:
            per_node.setdefault((e["args"]["op_name"], name[:-len("_kernel_time")]), []).append(e["dur"])
    # a median per node: one preempted run on a shared machine would otherwise put milliseconds on one node
    whole = statistics.median(dur for _, dur in starts[warmup:]) if len(starts) > warmup else 0.0
    return {key: statistics.median(us) for key, us in per_node.items()}, whole


def op_times(session, feed: dict[str, np.ndarray], runs: int = PROFILE_RUNS,
             warmup: int = PROFILE_WARMUP) -> list[OpTime]:
    """Per op type of onnxruntime's optimized graph, the milliseconds of one run of ``session`` (made inside
    :func:`profiling`) on ``feed``: :func:`node_times` summed per op type, slowest first."""
    per_op: dict[str, list[float]] = {}
    for (op, _), us in node_times(session, feed, runs, warmup)[0].items():
        per_op.setdefault(op, []).append(us)
    times = [OpTime(op, sum(us) / 1e3, len(us)) for op, us in per_op.items()]
    return sorted(times, key=lambda t: (-t.ms, t.op))


def op_summary(times: list[dict], top: int = 5) -> list[str]:
    """``["QLinearConv 0.162 ms x33", ..., "7 more op types 0.05 ms"]``: the ``top`` slowest op types of a
    ``by_op`` list (``OpTime.to_dict`` items), each with its node count, and the rest summed."""
    parts = [f"{t['op']} {t['ms']:.3g} ms x{t['nodes']}" for t in times[:top]]
    rest = times[top:]
    if rest:
        parts.append(f"{len(rest)} more op type{'s' if len(rest) > 1 else ''} {sum(t['ms'] for t in rest):.3g} ms")
    return parts


def op_summary_lines(times: list[dict], width: int, top: int = 5) -> list[str]:
    """:func:`op_summary` joined by ", " into lines of at most ``width`` characters (an item is never split)."""
    lines = [""]
    items = op_summary(times, top)
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if lines[-1] and len(lines[-1]) + 1 + len(piece) > width:
            lines.append("")
        lines[-1] += (" " if lines[-1] else "") + piece
    return lines
