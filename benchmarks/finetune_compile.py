"""Where ``qtool finetune``'s compile time and memory go: each jitted program of a run, lowered and compiled alone.

For a training graph (``rewrite-train``'s output) and its data, in a fresh process per program (so the peak
resident memory is that program's), with JAX's persistent compilation cache off:

- ``train``: the training step (teacher forward, student forward and backward, Adam, the next state);
- ``eval``: the validation forward (quantized, ranges held);
- ``teacher``: the float teacher's forward.

Per program: seconds to trace and lower, wall and process CPU seconds of XLA's compile (all its threads) and of
tracing, lowering and compiling together (``trace_compile_cpu_s``), the
compiled program's CPU seconds per call (median of ``--runs``), StableHLO ops, optimized HLO instructions, kernels
(fusions in the entry computation) and the process's peak resident memory. ``--compiler-option NAME=VALUE``
(repeatable) passes XLA debug options to this compile (``xla_backend_optimization_level=0``,
``xla_cpu_use_fusion_emitters=false``, ...). A training step run in segments (a graph of more than
``qtool.finetune.segmented.SEGMENT_NODES`` nodes; ``--segment-nodes N`` sets it, 0 for one program) is many
programs, and so are its teacher and validation forward: their ``trace_compile_cpu_s`` is the first call's process
CPU less a later call's (tracing, the abstract pass over the segments, every segment's compile)::

    python benchmarks/finetune_compile.py model.qat.onnx calib.npz [--batch-size 8] [--programs train eval teacher]
        [--compiler-option xla_cpu_use_fusion_emitters=false] [--segment-nodes 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's qtool


def _option(text: str):
    name, _, value = text.partition("=")
    parsed = {"true": True, "false": False}.get(value.lower())
    if parsed is None:
        parsed = int(value) if value.lstrip("-").isdigit() else value
    return name, parsed


def measure(model: str, data: str, program: str, batch_size: int, options: dict, runs: int,
            segment_nodes: int | None) -> dict:
    import jax.numpy as jnp
    import numpy as np

    from qtool.finetune import segmented
    from qtool.finetune import train as T
    from qtool.finetune.config import FinetuneConfig

    if segment_nodes is not None:
        segmented.SEGMENT_NODES = segment_nodes

    config = FinetuneConfig(steps=10, batch_size=batch_size).normalized()
    graph = T._open_graph(model, config, [])
    train, _, _ = T._open_data(data, config, graph)
    run = T._build_run(graph, config, 0, train.fixed)
    batch = train.feed(np.arange(T._batch_size(config, train, [])))
    if program == "train":
        fn = run.train_step
        hyper = T._schedule(1e-4, config.steps, 0, config.schedule)
        args = (run.params0, run.state0, run.opt_state, run.teacher_feed, batch, None, jnp.int32(0), hyper)
    elif program == "teacher":
        fn, args = run.teacher, (run.teacher_feed, batch)
    else:  # the validation's (as finetune builds it)
        fn = T._outputs_fn(run.forward, True, T._TEACHER_STEP, run.roles.data_outputs, train.fixed)
        args = ({**run.state0, **run.params0}, batch)
    if not hasattr(fn, "lower"):  # segmented: its programs compile at the first call
        return _measure_calls(program, fn, args, runs, len(segmented.split(graph.interp.nodes)))
    c0, t0 = time.process_time(), time.perf_counter()
    lowered = fn.lower(*args)
    lower_s, lower_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    stablehlo = sum(1 for line in lowered.as_text().splitlines() if " = stablehlo." in line or " = chlo." in line)
    c0, t0 = time.process_time(), time.perf_counter()
    compiled = lowered.compile(options or None)
    compile_s, compile_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    run_cpu_s = _median_cpu(compiled, args, runs)
    hlo = compiled.as_text()
    entry = next(c for c in re.split(r"\n(?=\S)", hlo) if c.startswith("ENTRY"))
    return {"program": program, "options": options, "lower_s": round(lower_s, 1), "compile_s": round(compile_s, 1),
            "compile_cpu_s": round(compile_cpu_s, 1), "trace_compile_cpu_s": round(lower_cpu_s + compile_cpu_s, 1),
            "run_cpu_s": round(run_cpu_s, 4),
            "stablehlo_ops": stablehlo, "hlo_instructions": sum(1 for line in hlo.splitlines() if " = " in line),
            "kernels": len(re.findall(r"= \S+ fusion\(", entry)),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def _median_cpu(fn, args, runs: int) -> float:
    """The median process CPU seconds of ``runs`` calls of ``fn(*args)``."""
    import jax

    seconds = []
    for _ in range(runs):
        c0 = time.process_time()
        jax.block_until_ready(fn(*args))
        seconds.append(time.process_time() - c0)
    return statistics.median(seconds)


def _measure_calls(program: str, fn, args, runs: int, segments: int) -> dict:
    """A program run in segments: the first call's process CPU (compiles and one run) and later calls'."""
    import jax

    c0, t0 = time.process_time(), time.perf_counter()
    jax.block_until_ready(fn(*args))
    first_s, first_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    run_cpu_s = _median_cpu(fn, args, runs)
    return {"program": program, "segments": segments, "first_call_s": round(first_s, 1),
            "trace_compile_cpu_s": round(first_cpu_s - run_cpu_s, 1), "run_cpu_s": round(run_cpu_s, 4),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("data")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--programs", nargs="+", default=["train", "eval", "teacher"])
    parser.add_argument("--compiler-option", action="append", default=[], type=_option)
    parser.add_argument("--runs", type=int, default=3, help="calls of the compiled program timed (median)")
    parser.add_argument("--segment-nodes", type=int, help="nodes per segment of the training step "
                        "(qtool.finetune.segmented.SEGMENT_NODES; 0: one program)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process: measure this program, print JSON
    args = parser.parse_args()
    options = dict(args.compiler_option)
    if args.one:
        print(json.dumps(measure(args.model, args.data, args.one, args.batch_size, options, args.runs,
                                 args.segment_nodes)))
        return
    env = {**os.environ, "QTOOL_JAX_CACHE": "0"}
    for program in args.programs:
        cmd = [sys.executable, __file__, args.model, args.data, "--batch-size", str(args.batch_size),
               "--runs", str(args.runs), "--one", program]
        if args.segment_nodes is not None:
            cmd += ["--segment-nodes", str(args.segment_nodes)]
        for name, value in options.items():
            cmd += ["--compiler-option", f"{name}={str(value).lower() if isinstance(value, bool) else value}"]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = out.stdout.strip().splitlines()
        print(lines[-1] if out.returncode == 0 and lines else
              json.dumps({"program": program, "error": (out.stderr.strip().splitlines() or ["?"])[-1]}), flush=True)


if __name__ == "__main__":
    main()
