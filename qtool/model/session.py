"""onnxruntime sessions over an in-memory model, with intermediate tensors tapped as outputs.

The weights are not serialized: the proto carries placeholders and
onnxruntime gets the tensors as OrtValues over the arrays qtool already holds
(memory-mapped for external data), so no serialized copy and no 2 GB limit
(onnxruntime 1.32 still copies them into the session when it creates it: +2.26 GB
for a 2.4 GB model, docs/rewrite-eval.md, Large models). Every
feature that runs a model (calibration, simulation) builds its session here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from qtool.errors import QtoolError
from qtool.model.io import light_proto
from qtool.model.opset import inferred_types

NUMPY_TYPES = {
    ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.INT8, ir.DataType.UINT8,
    ir.DataType.INT16, ir.DataType.UINT16, ir.DataType.INT32, ir.DataType.UINT32, ir.DataType.INT64,
    ir.DataType.UINT64, ir.DataType.BOOL,
}


def contiguous(array) -> np.ndarray:
    array = np.asarray(array)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(array.shape)


def value_map(graph: ir.Graph) -> dict[str, ir.Value]:
    """Every named tensor a session can compute or is fed: graph inputs and node outputs."""
    values = {v.name: v for v in graph.inputs if v.name}
    for node in graph:
        for out in node.outputs:
            if out.name:
                values[out.name] = out
    return values


@dataclass
class TappedSession:
    """An onnxruntime session whose outputs include tapped intermediate tensors."""

    session: ort.InferenceSession
    outputs: list[str]
    _keepalive: tuple = field(default=(), repr=False)  # arrays and OrtValues that must outlive the session

    def run(self, feed: dict[str, np.ndarray], names: list[str] | None = None, what: str = "the model"):
        """Run on one batch; returns OrtValues (read in place with ``.numpy()``, not copied). Each keeps
        the whole output vector alive: drop every one before the next run (peak memory doubles else)."""
        inputs = {k: ort.OrtValue.ortvalue_from_numpy(contiguous(v)) for k, v in feed.items()}
        try:
            return self.session.run_with_ort_values(names or self.outputs, inputs)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
            raise QtoolError(f"onnxruntime failed on {what}: {first_line(exc)}") from exc


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# (enable_mem_pattern, enable_cpu_mem_arena) for a session that runs batch after batch with many
# tapped outputs. Measured on a ResNet-50-shaped model (70 tapped tensors, batches of 16, onnxruntime
# 1.32, peak RSS at 16 -> 64 samples; docs/calibration.md, Memory):
# - memory pattern off: the pattern planned from the first run is one extra block allocated on
#   top of the tapped outputs from the second run on (+0.9 GB at every batch after the first);
#   with the arena it grows further (1.90 -> 3.56 GB);
# - CPU arena on: without it each batch's buffers are malloc'ed and freed, and glibc keeps about
#   0.65 GB of them (its mmap threshold rises after the first frees), so the second batch peaks
#   at 1.67 -> 2.32 GB; the arena reuses the first batch's blocks: 1.87 -> 1.88 GB, and 1.93 GB
#   at 256 samples. A shorter last batch fits in the same blocks (+0.07 GB at 72 samples).
#   Also faster: 3.5 s instead of 5.2 s per 32 samples, single-threaded.
SESSION_MEMORY_SETTINGS = (False, True)


# onnxruntime's own log, set in one place (``_create``) for every session qtool makes. Its warnings went to stderr
# from each of them: a tf2onnx model's Resize with the deprecated `tf_half_pixel_for_nn` printed one line per node
# per session, screens of them around qtool's progress. Most come from onnxruntime's default logger, which is
# process-wide and which session options do not reach: the CLI, whose process it is, keeps it to errors
# (``own_process_log``); a program that calls qtool's API keeps its own setting (onnxruntime has no getter to
# restore it from). The session's own logger is kept to fatal: qtool reports a failed run itself, in one line (ERROR
# lines of a failing node went to stderr before it). ``show_onnxruntime_warnings()`` (``qtool --debug``) gives both
# back onnxruntime's default, warnings.
QUIET_LOG = (3, 4)  # (default logger, session logger): onnxruntime's severities, 2 warning, 3 error, 4 fatal
WARNINGS_LOG = (2, 2)
_log = {"levels": QUIET_LOG, "process": False}


def own_process_log() -> None:
    """This process is qtool's (the CLI): the sessions made from now on set onnxruntime's process-wide logger too."""
    _log["process"] = True


def show_onnxruntime_warnings(show: bool = True) -> None:
    """Let onnxruntime print its warnings (its default) in the sessions made from now on, or keep them quiet."""
    _log["levels"] = WARNINGS_LOG if show else QUIET_LOG
    _log["process"] = True


def session_options(*, optimize: bool = True) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.enable_mem_pattern, options.enable_cpu_mem_arena = SESSION_MEMORY_SETTINGS
    return options


def tapped_session(model: ir.Model, taps: list[ir.Value], *, options: ort.SessionOptions | None = None,
                   what: str = "the model", dtypes: dict[str, ir.DataType] | None = None) -> TappedSession:
    """A session computing the model's outputs followed by ``taps`` (intermediate tensors).

    ``dtypes``: element types of taps the model does not type (else shape
    inference's, or float). The model is left as it was (the taps are graph
    outputs only in the proto).
    """
    graph = model.graph
    added = [v for v in taps if not v.is_graph_output()]
    typed = [v for v in added if v.type is None]
    dtypes = dtypes or {}
    if any(v.dtype is None and v.name not in dtypes for v in typed):
        dtypes = {**inferred_types(graph), **dtypes}  # a float16 model's taps are float16
    for v in typed:
        v.type = ir.TensorType(v.dtype or dtypes.get(v.name) or ir.DataType.FLOAT)
    count = len(graph.outputs)
    graph.outputs.extend(added)
    try:
        proto, saved = light_proto(model, movable=lambda t: t.dtype in NUMPY_TYPES)
        outputs = [v.name for v in graph.outputs]
    finally:
        while len(graph.outputs) > count:
            graph.outputs.pop()
        for v in typed:
            v.type = None
    options = options or session_options()
    # onnxruntime drops the initializers no node reads before it takes these: give it the used ones only
    used = {name for name, v in graph.initializers.items() if v.uses() or v.is_graph_output()}
    names = [name for name in saved if name in used]
    arrays = [contiguous(saved[name].numpy()) for name in names]
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
    if names:
        options.add_external_initializers(names, values)
    return TappedSession(_create(proto.SerializeToString(), options, what), outputs, (arrays, values))


def file_session(path: str, *, options: ort.SessionOptions | None = None, what: str = "the model") -> TappedSession:
    """A session of the model file itself, as a user opens it (external data next to the file)."""
    session = _create(path, options or session_options(), what)
    return TappedSession(session, [o.name for o in session.get_outputs()])


def _create(source, options: ort.SessionOptions, what: str) -> ort.InferenceSession:
    default_level, session_level = _log["levels"]
    if _log["process"]:
        ort.set_default_logger_severity(default_level)
    options.log_severity_level = session_level
    try:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise QtoolError(f"onnxruntime cannot run {what}: {first_line(exc)}") from exc


def available_memory() -> int | None:
    """Bytes of memory this process can still take: the kernel's ``MemAvailable``, within a cgroup (v2) limit when
    one is set; None where neither can be read (not Linux)."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            found.append(max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return min(found) if found else None
