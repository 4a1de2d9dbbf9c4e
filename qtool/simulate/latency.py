"""How fast onnxruntime runs the float model and each quantized one: what users quantize for.

One thread, batch 1 (the first sample of the data), all optimizations; the
models run round-robin, one ``session.run`` each per round, timed by the
calling thread's CPU time (``time.thread_time``: a shared machine's other
jobs do not count), and the median of the rounds after a warm-up is kept.
The result is a multiple of the float model's time measured in the same
loop, so the ratio holds on a busy machine where milliseconds wander.

Where the time goes: a second session of each model, made with onnxruntime's
profiler on, runs the same sample again (:mod:`qtool.model.profile`).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qtool.model.profile import OpTime, op_times, profiling
from qtool.model.session import file_session, session_options, tapped_session
from qtool.simulate.session import Runner

WARMUP = 10
FLOAT = "float"  # the float model's key in ``Latency.by_op``


@dataclass(frozen=True)
class Latency:
    rounds: int
    float_ms: float
    models: dict[str, float]  # model name -> median milliseconds
    # ``FLOAT`` and model name -> op types, slowest first (profiled; empty when not asked)
    by_op: dict[str, list[OpTime]] = field(default_factory=dict)

    def with_ops(self, by_op: dict[str, list[OpTime]]) -> Latency:
        return Latency(self.rounds, self.float_ms, self.models, by_op)

    def to_dict(self) -> dict:
        by_op = {"by_op": {name: [t.to_dict() for t in times] for name, times in self.by_op.items()}} \
            if self.by_op else {}
        return {"rounds": self.rounds, "threads": 1, "batch": 1, "clock": "thread_time", "float_ms": self.float_ms,
                "models": [{"name": name, "ms": ms, "x_float": ms / self.float_ms if self.float_ms else None}
                           for name, ms in self.models.items()], **by_op}


def timed_warnings(timed: Latency) -> list[str]:
    """A quantized model that onnxruntime runs no faster than the float one: not what anyone quantizes for."""
    return [f"onnxruntime runs the {name} model no faster than the float one on this machine ({ms / timed.float_ms:.2f}x "
            f"float's time: {ms:.3g} ms against {timed.float_ms:.3g} ms, one thread, batch 1): int8 pays where "
            "convolutions and matrix products dominate (the 'time by op' lines say where the time goes); see "
            "docs/deploy.md for what limits it"
            for name, ms in timed.models.items() if timed.float_ms and ms >= timed.float_ms]


def one_thread_session(model: ir.Model | None = None, path: str | None = None, what: str = "the model",
                       profiled: bool = False):
    """A session of ``model`` (or of the file ``path``, as a user opens it) that runs on one thread; ``profiled``:
    with onnxruntime's profiler on (for :func:`op_times` only: the profiler slows every node down)."""
    options = session_options()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    what = f"{what} (timing)"
    with profiling(options) if profiled else contextlib.nullcontext() as keep:
        session = file_session(path, options=options, what=what) if path else \
            tapped_session(model, [], options=options, what=what)
        if keep is not None:
            session._keepalive += (keep,)
    return session


def interleaved_medians(runs: Mapping[str, Callable[[], object]], rounds: int, warmup: int) -> dict[str, float]:
    """Median thread CPU seconds of one call of each of ``runs``, the calls interleaved round-robin
    (``warmup`` untimed rounds first): qtool's timing, and the benchmarks'."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(warmup + rounds):
        for name, run in runs.items():
            start = time.thread_time()
            run()
            if i >= warmup:
                times[name].append(time.thread_time() - start)
    return {name: statistics.median(spent) for name, spent in times.items()}


def measure(float_runner: Runner, runners: list[Runner], feed: dict[str, np.ndarray], rounds: int) -> Latency:
    """Median one-thread milliseconds of every model on ``feed`` (one sample), interleaved; and where the time
    of each goes (:func:`op_times`)."""
    everyone = [float_runner] + runners
    sessions = [one_thread_session(r.model, r.path, r.what) for r in everyone]
    result = timed(sessions[0], dict(zip([r.label for r in runners], sessions[1:])), feed, rounds)
    del sessions
    labels = [FLOAT] + [r.label for r in runners]
    by_op = {label: op_times(one_thread_session(r.model, r.path, r.what, profiled=True), feed)
             for label, r in zip(labels, everyone)}  # one at a time: a model's sessions are not all alive at once
    return result.with_ops(by_op)


def timed(float_session, sessions: dict, feed: dict[str, np.ndarray], rounds: int) -> Latency:
    """Median milliseconds of one run of the float session and of each of ``sessions`` (by label) on ``feed``
    (one sample), interleaved (:func:`interleaved_medians`); each computes its first output."""
    feed = {k: np.ascontiguousarray(v) for k, v in feed.items()}
    everyone = [float_session, *sessions.values()]
    runs = {str(i): functools.partial(s.run, feed, s.outputs[:1], "the timed run") for i, s in enumerate(everyone)}
    ms = [seconds * 1e3 for seconds in interleaved_medians(runs, rounds, WARMUP).values()]
    return Latency(rounds, ms[0], dict(zip(sessions, ms[1:])))
